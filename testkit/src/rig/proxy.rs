//! A loopback TCP proxy between a node agent and the SM-host agent that can lose replies: while
//! armed, it forwards every byte of the node's requests, and when the SM host starts answering a
//! request (the first HTTP/2 HEADERS frame on a stream other than 0, which tonic sends only once
//! the handler finished), it closes the node's connection instead of forwarding it. The SM host
//! did the work; the node never hears of it. Connection-level frames (SETTINGS, PING, window
//! updates) pass, so a connection opened while armed still gets its request to the SM host.
//!
//! Stopped when dropped ([`LoopbackServer`]).

use super::loopback::LoopbackServer;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// HTTP/2 frame type of HEADERS.
const HEADERS: u8 = 0x1;
/// The client connection preface is passed through untouched; frames start after it on the
/// client side only, and the proxy parses only the server's side, which has no preface.
const FRAME_HEADER: usize = 9;

/// The proxy's shared switches and counters.
#[derive(Debug, Default)]
struct Shared {
    armed: AtomicBool,
    dropped: AtomicUsize,
    connections: AtomicUsize,
}

/// A running reply-dropping proxy.
pub struct ReplyDropper {
    server: LoopbackServer,
    shared: Arc<Shared>,
}

impl ReplyDropper {
    /// Listens on a free loopback port and forwards every connection to `127.0.0.1:upstream`.
    pub fn start(upstream: u16) -> ReplyDropper {
        let shared = Arc::new(Shared::default());
        let inner = shared.clone();
        let server = LoopbackServer::start(move |client| {
            inner.connections.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve(client, upstream, inner.clone()));
        });
        ReplyDropper { server, shared }
    }

    /// The port nodes connect to.
    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// While armed, every reply is lost (the node's connection is closed instead).
    pub fn arm(&self, armed: bool) {
        self.shared.armed.store(armed, Ordering::SeqCst);
    }

    /// Replies lost so far.
    pub fn dropped(&self) -> usize {
        self.shared.dropped.load(Ordering::SeqCst)
    }
}

async fn serve(client: TcpStream, upstream: u16, shared: Arc<Shared>) {
    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let requests = async {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
        let _ = server_write.shutdown().await;
    };
    let replies = async {
        // Frame by frame: header (length 24 bits, type, flags, stream id 31 bits), payload.
        loop {
            let mut header = [0u8; FRAME_HEADER];
            if server_read.read_exact(&mut header).await.is_err() {
                break;
            }
            let len = (usize::from(header[0]) << 16)
                | (usize::from(header[1]) << 8)
                | usize::from(header[2]);
            let stream =
                u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
            let mut payload = vec![0u8; len];
            if server_read.read_exact(&mut payload).await.is_err() {
                break;
            }
            if header[3] == HEADERS && stream != 0 && shared.armed.load(Ordering::SeqCst) {
                shared.dropped.fetch_add(1, Ordering::SeqCst);
                // Lost: close the node's side without a word.
                return;
            }
            if client_write.write_all(&header).await.is_err()
                || client_write.write_all(&payload).await.is_err()
            {
                break;
            }
        }
        let _ = client_write.shutdown().await;
    };
    // Whichever side ends first ends the connection (dropping both halves closes both sockets).
    tokio::select! {
        _ = requests => {}
        _ = replies => {}
    }
}
