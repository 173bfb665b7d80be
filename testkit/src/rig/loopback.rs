//! A loopback TCP server on a thread of its own with its own tokio runtime: every accepted
//! connection is handed to a callback (which spawns its task); stopped when dropped. The rig's
//! proxies ([`super::proxy`], [`super::link`]) are built on it.

use tokio::net::{TcpListener, TcpStream};

/// A running server.
pub struct LoopbackServer {
    port: u16,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LoopbackServer {
    /// Listens on a free loopback port and calls `accept` (inside the runtime) for every
    /// connection.
    pub fn start(accept: impl Fn(TcpStream) + Send + 'static) -> LoopbackServer {
        Self::start_on(std::net::Ipv4Addr::LOCALHOST, accept)
    }

    /// Like [`LoopbackServer::start`], listening on loopback address `ip` (any of 127.0.0.0/8,
    /// e.g. to give a server a host name of its own, as TLS verifies it).
    pub fn start_on(
        ip: std::net::Ipv4Addr,
        accept: impl Fn(TcpStream) + Send + 'static,
    ) -> LoopbackServer {
        assert!(ip.is_loopback(), "{ip} is not a loopback address");
        let std_listener = std::net::TcpListener::bind((ip, 0)).expect("bind loopback");
        std_listener.set_nonblocking(true).expect("nonblocking");
        let port = std_listener.local_addr().expect("addr").port();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("loopback runtime");
            rt.block_on(async move {
                let listener = TcpListener::from_std(std_listener).expect("listener");
                loop {
                    tokio::select! {
                        _ = &mut stopped => return,
                        accepted = listener.accept() => {
                            if let Ok((client, _)) = accepted {
                                accept(client);
                            }
                        }
                    }
                }
            });
        });
        LoopbackServer {
            port,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for LoopbackServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
