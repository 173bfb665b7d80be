//! A loopback TCP link that can be cut: it forwards every connection to `127.0.0.1:upstream`
//! until [`CuttableLink::cut`] closes every live connection and refuses new ones (accepted, then
//! closed at once), as a network partition between two SM hosts would; [`CuttableLink::heal`]
//! forwards again. Stopped when dropped ([`LoopbackServer`]).

use super::loopback::LoopbackServer;
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio::sync::watch;

/// A running link.
pub struct CuttableLink {
    server: LoopbackServer,
    cut: Arc<watch::Sender<bool>>,
}

impl CuttableLink {
    /// Listens on a free loopback port, forwarding to `127.0.0.1:upstream`.
    pub fn start(upstream: u16) -> CuttableLink {
        Self::start_on(std::net::Ipv4Addr::LOCALHOST, upstream)
    }

    /// Like [`CuttableLink::start`], listening on loopback address `ip` (the upstream stays
    /// `127.0.0.1:upstream`): a second SM host reached at 127.0.0.2 has a name of its own in
    /// the certificates its clients verify.
    pub fn start_on(ip: std::net::Ipv4Addr, upstream: u16) -> CuttableLink {
        let (cut, _) = watch::channel(false);
        let cut = Arc::new(cut);
        let shared = cut.clone();
        let server = LoopbackServer::start_on(ip, move |client| {
            if !*shared.borrow() {
                tokio::spawn(forward(client, upstream, shared.subscribe()));
            }
        });
        CuttableLink { server, cut }
    }

    /// The port to connect to instead of `upstream`.
    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// Closes every live connection and refuses new ones until [`CuttableLink::heal`].
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Forwards again.
    pub fn heal(&self) {
        self.cut.send_replace(false);
    }
}

async fn forward(mut client: TcpStream, upstream: u16, mut cut: watch::Receiver<bool>) {
    let Ok(mut server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
        return;
    };
    // Either side's end or a cut ends the connection (dropping both streams closes both).
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
        _ = cut.wait_for(|c| *c) => {}
    }
}
