//! Serving connections so that slow or hostile clients cannot take the
//! server down: a client has a few seconds to send its request headers
//! (and, through the router's layer, its body), at most `max_connections`
//! are served at once (the rest wait in the kernel's listen queue rather
//! than exhausting file descriptors), the process asks for as many open
//! files as it is allowed, and shutdown stops accepting, lets in-flight
//! requests finish up to a deadline, and leaves the rest to resume (R11).

use axum::extract::ConnectInfo;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tower::ServiceExt as _;

#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    /// For the request line and headers of each request.
    pub header_timeout: Duration,
    /// How long shutdown waits for in-flight requests (and open event
    /// streams) before it lets them go; whatever was cut off resumes from
    /// the log.
    pub shutdown_grace: Duration,
}

/// Raises the soft limit on open files to the hard limit, so the
/// connection cap (not the descriptor table) is what bounds clients.
/// Returns the limit now in force, where the platform has one.
pub fn raise_open_file_limit() -> Option<u64> {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => Some(limit),
        Err(err) => {
            tracing::warn!(%err, "cannot raise the open-file limit");
            None
        }
    }
}

/// Serves `router` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    if let Some(limit) = raise_open_file_limit() {
        tracing::info!(limit, "open files allowed");
    }
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(30)));
    tokio::pin!(shutdown);
    loop {
        // A free slot first: at the cap, new clients wait in the listen
        // queue instead of each costing a descriptor and a task.
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(err) => {
                    // Out of descriptors or similar: back off briefly
                    // rather than spin; connections already open go on.
                    tracing::warn!(%err, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let service = hyper::service::service_fn(
            move |mut request: hyper::Request<hyper::body::Incoming>| {
                request
                    .extensions_mut()
                    .insert(ConnectInfo::<SocketAddr>(remote));
                router.clone().oneshot(request.map(axum::body::Body::new))
            },
        );
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(%err, %remote, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(limits.shutdown_grace) => {
            tracing::warn!("shutdown grace period over; cutting the remaining connections");
        }
    }
    Ok(())
}
