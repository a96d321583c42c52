//! A TCP proxy between a harness and its PostgreSQL that a test can cut:
//! `down()` resets every connection through it and refuses new ones, as a
//! crashed server, a failed network or a restarting pooler would look from
//! the harness; `up()` lets connections through again.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::net::{TcpListener, TcpStream};

pub struct CutProxy {
    pub addr: SocketAddr,
    up: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    accepting: tokio::task::JoinHandle<()>,
}

impl CutProxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> CutProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let addr = listener.local_addr().expect("its address");
        let up = Arc::new(AtomicBool::new(true));
        let open: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Default::default();
        let accepting = tokio::spawn({
            let (up, open) = (up.clone(), open.clone());
            async move {
                while let Ok((mut client, _)) = listener.accept().await {
                    if !up.load(Ordering::SeqCst) {
                        // Refused: closed at once.
                        drop(client);
                        continue;
                    }
                    let forwarding = tokio::spawn(async move {
                        if let Ok(mut server) = TcpStream::connect(upstream).await {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        }
                    });
                    open.lock().unwrap().push(forwarding.abort_handle());
                }
            }
        });
        CutProxy {
            addr,
            up,
            open,
            accepting,
        }
    }

    /// Cuts every connection through the proxy and refuses new ones.
    pub fn down(&self) {
        self.up.store(false, Ordering::SeqCst);
        for connection in self.open.lock().unwrap().drain(..) {
            connection.abort();
        }
    }

    /// Lets connections through again.
    pub fn up(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.accepting.abort();
        self.down();
    }
}

impl CutProxy {
    /// Resets one connection through the proxy, picked at random (each
    /// with the same chance): a connection cut mid-statement.
    pub fn cut_one(&self, pick: usize) -> bool {
        let mut open = self.open.lock().unwrap();
        open.retain(|c| !c.is_finished());
        if open.is_empty() {
            return false;
        }
        let at = pick % open.len();
        let victim = open.swap_remove(at);
        victim.abort();
        true
    }
}
