//! Serving connections so that slow, idle or hostile clients cannot take
//! the server down:
//!
//! - a new connection has `header_timeout` to send its first request's
//!   headers (whatever protocol it speaks: a half-sent HTTP/2 preface is
//!   cut off like a half-sent HTTP/1 request line), and a kept-alive one
//!   as long from the first byte of each later request;
//! - each request has `body_timeout` in all to send its whole body, not
//!   per frame, so one byte a second does not keep it alive;
//! - a connection with no request in progress for `idle_timeout` is closed
//!   (an HTTP/2 connection that only answers PINGs included);
//! - at most `max_connections` are served at once (the rest wait in the
//!   kernel's listen queue rather than exhausting file descriptors), and
//!   one client address holds at most `max_per_client` of them, so a
//!   single client cannot fill every slot; a trusted proxy is not limited
//!   (it carries everyone), and should limit its own clients;
//! - the process asks for as many open files as it is allowed, and
//!   shutdown stops accepting, lets in-flight requests finish up to a
//!   deadline, and leaves the rest to resume (R11).

use axum::extract::ConnectInfo;
use axum::Router;
use http_body_util::BodyExt as _;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use std::collections::HashMap;
use std::future::Future as _;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tower::ServiceExt as _;

#[derive(Clone, Debug)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    /// Connections one client address may hold; capped at a quarter of
    /// `max_connections` so no one client can take them all.
    pub max_per_client: Option<usize>,
    /// Addresses not limited per client (reverse proxies).
    pub unlimited: Arc<Vec<IpAddr>>,
    /// From accepting a connection to its first request's headers.
    pub header_timeout: Duration,
    /// For each request's whole body.
    pub body_timeout: Duration,
    /// A connection with no request in progress this long is closed.
    pub idle_timeout: Duration,
    /// How long shutdown waits for in-flight requests (and open event
    /// streams) before it lets them go; whatever was cut off resumes from
    /// the log.
    pub shutdown_grace: Duration,
}

impl ConnectionLimits {
    fn per_client(&self) -> usize {
        let quarter = self.max_connections / 4;
        self.max_per_client.unwrap_or(quarter).min(quarter).max(1)
    }
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

/// The network a client's connections are counted under: an IPv4 address,
/// or an IPv6 address's /64 (one subscriber can use any address in it).
fn client_network(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(bits.into())
        }
        v4 => v4,
    }
}

/// Open connections per client network. An entry exists only while its
/// client has a connection open, so it is bounded by `max_connections`.
#[derive(Default)]
struct PerClient(Mutex<HashMap<IpAddr, usize>>);

impl PerClient {
    fn admit(self: &Arc<Self>, ip: IpAddr, limit: usize) -> Option<ClientSlot> {
        let network = client_network(ip);
        let mut open = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let count = open.entry(network).or_insert(0);
        if *count >= limit {
            return None;
        }
        *count += 1;
        Some(ClientSlot {
            network,
            table: self.clone(),
        })
    }
}

/// One connection counted against its client; given back when dropped.
struct ClientSlot {
    network: IpAddr,
    table: Arc<PerClient>,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = self.table.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = open.get_mut(&self.network) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.network);
            }
        }
    }
}

/// What a connection's watchdog reads: whether a request has begun, how
/// many are in progress, since when none has been, and when bytes of a
/// next request began to arrive while none was.
struct Activity {
    started: std::sync::atomic::AtomicBool,
    in_progress: AtomicUsize,
    idle_since: Mutex<Instant>,
    heard_since: Mutex<Option<Instant>>,
    changed: tokio::sync::Notify,
}

impl Activity {
    fn new() -> Arc<Activity> {
        Arc::new(Activity {
            started: Default::default(),
            in_progress: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            heard_since: Mutex::new(None),
            changed: tokio::sync::Notify::new(),
        })
    }

    fn begin(self: &Arc<Self>) -> InProgress {
        self.started.store(true, Ordering::SeqCst);
        self.in_progress.fetch_add(1, Ordering::SeqCst);
        *lock(&self.heard_since) = None;
        self.changed.notify_one();
        InProgress(self.clone())
    }

    /// Bytes arrived. On a kept-alive connection with nothing in progress
    /// they begin the next request, whose headers then have
    /// `header_timeout` to arrive whole.
    fn heard(&self) {
        if !self.started.load(Ordering::SeqCst) || self.in_progress.load(Ordering::SeqCst) > 0 {
            return;
        }
        let mut heard = lock(&self.heard_since);
        if heard.is_none() {
            *heard = Some(Instant::now());
            self.changed.notify_one();
        }
    }

    /// When this connection may be closed for doing nothing, if it is
    /// doing nothing now.
    fn idle_deadline(&self, limits: &ConnectionLimits, accepted: Instant) -> Option<Instant> {
        if !self.started.load(Ordering::SeqCst) {
            return Some(accepted + limits.header_timeout);
        }
        if self.in_progress.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let idle = *lock(&self.idle_since) + limits.idle_timeout;
        Some(match *lock(&self.heard_since) {
            Some(heard) => idle.min(heard + limits.header_timeout),
            None => idle,
        })
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// A connection's stream, telling its watchdog when bytes of an HTTP/1
/// request arrive. (An HTTP/2 connection's idle frames, PINGs and window
/// updates, begin no request; its requests are streams the watchdog
/// already sees.)
struct Heard {
    stream: tokio::net::TcpStream,
    activity: Arc<Activity>,
    /// The connection's first bytes, until they tell HTTP/1 from HTTP/2.
    opening: Vec<u8>,
    http1: Option<bool>,
}

impl Heard {
    fn new(stream: tokio::net::TcpStream, activity: Arc<Activity>) -> Heard {
        Heard {
            stream,
            activity,
            opening: Vec::new(),
            http1: None,
        }
    }

    fn arrived(&mut self, bytes: &[u8]) {
        const HTTP2: &[u8] = b"PRI ";
        if self.http1.is_none() {
            let wanted = HTTP2.len() - self.opening.len();
            self.opening
                .extend_from_slice(&bytes[..wanted.min(bytes.len())]);
            if !HTTP2.starts_with(&self.opening) {
                self.http1 = Some(true);
            } else if self.opening.len() == HTTP2.len() {
                self.http1 = Some(false);
            }
        }
        if self.http1 == Some(true) {
            self.activity.heard();
        }
    }
}

impl tokio::io::AsyncRead for Heard {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.arrived(&buf.filled()[before..]);
        }
        read
    }
}

impl tokio::io::AsyncWrite for Heard {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// A request in progress, from its headers until its answer's body is
/// finished or dropped.
struct InProgress(Arc<Activity>);

impl Drop for InProgress {
    fn drop(&mut self) {
        if self.0.in_progress.fetch_sub(1, Ordering::SeqCst) == 1 {
            *lock(&self.0.idle_since) = Instant::now();
        }
        self.0.changed.notify_one();
    }
}

/// A request body that must arrive whole by a deadline.
struct BodyByDeadline<B> {
    body: B,
    deadline: Pin<Box<tokio::time::Sleep>>,
    allowed: Duration,
}

/// The error a request body gives once its time is up; the handler
/// reading it answers as for any unreadable body.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?}")]
struct BodyTooSlow(Duration);

impl<B> hyper::body::Body for BodyByDeadline<B>
where
    B: hyper::body::Body + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = B::Data;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        match this.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTooSlow(this.allowed))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
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
    let per_client = Arc::new(PerClient::default());
    let (stopping, _) = tokio::sync::watch::channel(false);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // Headers' deadlines are the watchdog's (`Activity`): hyper's own
    // would start when a kept-alive connection falls idle, and so close
    // it after `header_timeout` of idling, racing a client's pool that
    // reuses it within `idle_timeout`.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(30)));
    let builder = Arc::new(builder);
    // Told to HTTP/1.1 clients, whose pools then retire a connection
    // before the server closes it rather than racing the close.
    let keep_alive =
        hyper::header::HeaderValue::from_str(&format!("timeout={}", limits.idle_timeout.as_secs()))
            .expect("digits are a header value");
    let mut connections = tokio::task::JoinSet::new();
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
        // Reap finished connection tasks so the set does not grow.
        while connections.try_join_next().is_some() {}
        let slot = if limits.unlimited.contains(&remote.ip()) {
            None
        } else {
            match per_client.admit(remote.ip(), limits.per_client()) {
                Some(slot) => Some(slot),
                None => {
                    // Closed at once: it costs the client its connection
                    // and nobody else anything.
                    tracing::debug!(%remote, "refused: too many connections from this client");
                    continue;
                }
            }
        };
        let _ = stream.set_nodelay(true);
        let connection = Connection {
            router: router.clone(),
            builder: builder.clone(),
            limits: limits.clone(),
            keep_alive: keep_alive.clone(),
            stopping: stopping.subscribe(),
        };
        connections.spawn(async move {
            connection.serve(stream, remote).await;
            drop((permit, slot));
        });
    }
    drop(listener);
    let _ = stopping.send(true);
    let finished = async { while connections.join_next().await.is_some() {} };
    tokio::select! {
        () = finished => {}
        () = tokio::time::sleep(limits.shutdown_grace) => {
            tracing::warn!("shutdown grace period over; cutting the remaining connections");
            connections.abort_all();
        }
    }
    Ok(())
}

/// How long the harness's own clients of its API (the benchmark, the eval,
/// the demo's agent) keep an idle pooled connection: well under the
/// server's idle timeout, so a reused connection is never one the server
/// is closing at that moment. (The server tells HTTP/1.1 clients its idle
/// timeout in `Keep-Alive`; this client library does not read it.)
pub const CLIENT_POOL_IDLE: Duration = Duration::from_secs(5);

/// How long a connection asked to close may take to finish what it is
/// sending before it is dropped.
const CLOSING_GRACE: Duration = Duration::from_secs(1);

struct Connection {
    router: Router,
    builder: Arc<auto::Builder<TokioExecutor>>,
    limits: ConnectionLimits,
    /// `Keep-Alive: timeout=N`, N the idle timeout.
    keep_alive: hyper::header::HeaderValue,
    stopping: tokio::sync::watch::Receiver<bool>,
}

impl Connection {
    async fn serve(mut self, stream: tokio::net::TcpStream, remote: SocketAddr) {
        let accepted = Instant::now();
        let activity = Activity::new();
        let router = self.router.clone();
        let body_timeout = self.limits.body_timeout;
        let keep_alive = self.keep_alive.clone();
        let watched = activity.clone();
        let service = hyper::service::service_fn(
            move |mut request: hyper::Request<hyper::body::Incoming>| {
                let in_progress = watched.begin();
                let http11 = request.version() == hyper::Version::HTTP_11;
                let keep_alive = keep_alive.clone();
                request
                    .extensions_mut()
                    .insert(ConnectInfo::<SocketAddr>(remote));
                let request = request.map(|body| {
                    axum::body::Body::new(BodyByDeadline {
                        body,
                        deadline: Box::pin(tokio::time::sleep(body_timeout)),
                        allowed: body_timeout,
                    })
                });
                let answered = router.clone().oneshot(request);
                async move {
                    let mut response = answered.await?;
                    if http11 {
                        response.headers_mut().insert(
                            hyper::header::HeaderName::from_static("keep-alive"),
                            keep_alive,
                        );
                    }
                    // In progress until the answer's body is sent or dropped
                    // (an event stream stays in progress while it is open).
                    Ok::<_, std::convert::Infallible>(response.map(move |body| {
                        axum::body::Body::new(body.map_frame(move |frame| {
                            let _ = &in_progress;
                            frame
                        }))
                    }))
                }
            },
        );
        let connection = self.builder.serve_connection_with_upgrades(
            TokioIo::new(Heard::new(stream, activity.clone())),
            service,
        );
        tokio::pin!(connection);
        let why_closed = loop {
            let deadline = activity.idle_deadline(&self.limits, accepted);
            let idle = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                ended = connection.as_mut() => {
                    if let Err(err) = ended {
                        tracing::debug!(%err, %remote, "connection ended with an error");
                    }
                    return;
                }
                () = activity.changed.notified() => continue,
                () = idle => {
                    // Re-read: a request may have begun as the time ran out.
                    match activity.idle_deadline(&self.limits, accepted) {
                        Some(at) if at <= Instant::now() => break "idle",
                        _ => continue,
                    }
                }
                changed = self.stopping.changed() => {
                    if changed.is_err() || *self.stopping.borrow() {
                        break "shutting down";
                    }
                }
            }
        };
        tracing::debug!(%remote, why_closed, "closing a connection");
        connection.as_mut().graceful_shutdown();
        let grace = if why_closed == "idle" {
            CLOSING_GRACE
        } else {
            self.limits.shutdown_grace
        };
        if tokio::time::timeout(grace, connection).await.is_err() {
            tracing::debug!(%remote, "connection did not close in time; dropped");
        }
    }
}

/// The client's address: the connection's, or, when the connection comes
/// from a trusted reverse proxy, the nearest untrusted address its
/// `X-Forwarded-For` names.
pub fn client_address(
    peer: std::net::IpAddr,
    forwarded_for: Option<&str>,
    trusted: &[std::net::IpAddr],
) -> std::net::IpAddr {
    if !trusted.contains(&peer) {
        return peer;
    }
    forwarded_for
        .into_iter()
        .flat_map(|list| list.rsplit(','))
        .filter_map(|hop| hop.trim().parse::<std::net::IpAddr>().ok())
        .find(|hop| !trusted.contains(hop))
        .unwrap_or(peer)
}

#[cfg(test)]
mod tests {
    use super::client_network;
    use std::net::IpAddr;

    #[test]
    fn ipv6_clients_are_counted_by_their_64_network() {
        let a: IpAddr = "2001:db8:0:1::1".parse().unwrap();
        let b: IpAddr = "2001:db8:0:1:ffff:ffff:ffff:ffff".parse().unwrap();
        let c: IpAddr = "2001:db8:0:2::1".parse().unwrap();
        assert_eq!(client_network(a), client_network(b));
        assert_ne!(client_network(a), client_network(c));
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(
            client_network(mapped),
            "192.0.2.7".parse::<IpAddr>().unwrap()
        );
    }
}
