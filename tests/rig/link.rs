//! A loopback TCP link that can be cut: it forwards every connection to `127.0.0.1:upstream`
//! until [`CuttableLink::cut`] closes every live connection and refuses new ones (accepted, then
//! closed at once), as a network partition between two SM hosts would; [`CuttableLink::heal`]
//! forwards again. Runs on its own thread with its own tokio runtime; stopped when dropped.

use std::sync::Arc;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A running link.
pub struct CuttableLink {
    port: u16,
    cut: Arc<watch::Sender<bool>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl CuttableLink {
    /// Listens on a free loopback port, forwarding to `127.0.0.1:upstream`.
    pub fn start(upstream: u16) -> CuttableLink {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind link");
        std_listener.set_nonblocking(true).expect("nonblocking");
        let port = std_listener.local_addr().expect("addr").port();
        let (cut, _) = watch::channel(false);
        let cut = Arc::new(cut);
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let shared = cut.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("link runtime");
            rt.block_on(async move {
                let listener = TcpListener::from_std(std_listener).expect("listener");
                loop {
                    tokio::select! {
                        _ = &mut stopped => return,
                        accepted = listener.accept() => {
                            let Ok((client, _)) = accepted else { continue };
                            if *shared.borrow() {
                                drop(client);
                                continue;
                            }
                            tokio::spawn(forward(client, upstream, shared.subscribe()));
                        }
                    }
                }
            });
        });
        CuttableLink {
            port,
            cut,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The port to connect to instead of `upstream`.
    pub fn port(&self) -> u16 {
        self.port
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

impl Drop for CuttableLink {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
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
