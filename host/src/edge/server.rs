//! The accept loop and the per-request path.
//!
//! For every request the host, in order: gives it a request id, reads the body within its
//! deadline and size limit (a body over it is answered 413 there, before any routing, as the
//! contract orders), serves its own pages (metrics, liveness, readiness) itself, runs the guest
//! in a fresh instance, turns a failed guest into a 500, and traces, logs and counts the answer
//! under the route the guest named. The guest decides everything else.

use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use http::{
    HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Version, header,
};
use http_body_util::BodyExt;
use hyper::body::{Body as _, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use crate::edge::client_stream::{ClientStream, DrainOnClose, Linger};
use crate::edge::connections::{AwaitNextHead, ConnectionTable, MAX_HEADER_BYTES, Phase, Ticket};
use crate::edge::request_body::{BodyBuffers, BodyError, GuestRequestBody, ReadBody, read_body};
use crate::edge::responses::{self, ResponseBody};
use crate::error::{RequestError, one_line};
use crate::observability::metrics::{self, Metrics};
use crate::observability::request_report::{RequestRecord, RequestSpan};
use crate::observability::routes::{HostPage, HostPages};
use crate::runtime::Serving;
use crate::runtime::store::RequestContext;
use crate::user_store::UserStore;

/// The header that carries a request's id, in both directions.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// The longest client-supplied request id that is kept.
pub const MAX_REQUEST_ID_LEN: usize = 128;
/// How long a client may take to send a request's head; a slower one is disconnected.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a `/metrics` scrape waits for the store's user count before it serves the last one.
pub const USERS_STORED_WAIT: Duration = Duration::from_millis(250);
/// How long in-flight requests may take to finish once shutdown starts.
/// Shorter than the 15 s `stop_grace_period` of `deploy/docker-compose.yml` (Docker's default is
/// 10 s), so spans and log lines are flushed before the container is killed, even when a slow
/// client holds a connection for the whole grace.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(8);
/// How long connections already accepted keep reading before shutdown starts: hyper closes at
/// once a connection that has read nothing yet, even one whose request already waits in its
/// socket (accepted while the workers were busy), and that client would get no answer.
pub const SHUTDOWN_SETTLE: Duration = Duration::from_millis(250);

/// Everything the per-request path needs, shared by all connections.
pub struct App {
    /// The guest serving new requests; a reload swaps it while running requests keep theirs.
    serving: Arc<Serving>,
    users: Arc<UserStore>,
    metrics: Arc<Metrics>,
    limits: ClientLimits,
    /// The connections the host serves at once.
    connections: Arc<ConnectionTable>,
    /// The bytes of request bodies held host-wide.
    body_buffers: Arc<BodyBuffers>,
    /// Where the host answers with its own pages instead of the guest.
    pages: HostPages,
}

/// What one client may use of the host.
#[derive(Debug, Clone, Copy)]
pub struct ClientLimits {
    /// The largest request body; larger ones get 413.
    pub max_body_bytes: usize,
    /// How long a request's body may take to arrive once its head has; slower ones get 408.
    pub body_timeout: Duration,
    /// Bytes of request bodies all connections together may hold; a body that finds no room
    /// gets 503.
    pub body_buffer_bytes: usize,
    /// Connections served at once; when full, one that is not being answered gives way to a
    /// newcomer (see [`crate::edge::connections`]), and only otherwise is the newcomer answered 503.
    pub max_connections: usize,
    /// How long a client may accept none of a response before it is disconnected
    /// (`--response-stall-ms`).
    pub response_stall: Duration,
}

impl App {
    /// The service around the guest `serving` names, with `users` as its store, counted in
    /// `metrics`, within `limits`.
    pub fn new(
        serving: Arc<Serving>,
        users: Arc<UserStore>,
        metrics: Arc<Metrics>,
        limits: ClientLimits,
    ) -> App {
        App {
            serving,
            users,
            metrics,
            connections: ConnectionTable::new(limits.max_connections),
            body_buffers: BodyBuffers::new(limits.body_buffer_bytes, limits.max_body_bytes),
            limits,
            pages: HostPages::default(),
        }
    }

    /// The same service with the host's own pages where `pages` says, not at their defaults.
    pub fn with_host_pages(self, pages: HostPages) -> App {
        App { pages, ..self }
    }

    /// Answers one request that came on `connection`. Never fails: every fault becomes a JSON
    /// error response.
    async fn handle(
        &self,
        request: Request<Incoming>,
        connection: &ClientConnection,
    ) -> Response<ResponseBody> {
        let started = Instant::now();
        let request_id = request_id(request.headers());
        let method = request.method().clone();
        let span = RequestSpan::start(
            &method,
            request.uri(),
            request_id.to_str().unwrap_or_default(),
            request.headers(),
        );
        let record = Arc::new(RequestRecord::default());
        let mut response = span
            .instrument(self.respond(request, connection, &request_id, &span, &record))
            .await;
        response.headers_mut().insert(REQUEST_ID, request_id);

        let status = response.status().as_u16();
        let (route, span_lacks_route) = record.route();
        // One line per failed request, with its cause when the host knows it; a 5xx span says
        // it too.
        let cause = record.take_fault();
        span.record_answer(&method, &route, span_lacks_route, status, cause.as_deref());
        span.in_scope(|| {
            if status >= 500 {
                tracing::error!(status, error = cause.as_deref(), "request failed");
            } else if status >= 400 {
                tracing::warn!(status, error = cause.as_deref(), "request refused");
            }
        });
        self.metrics
            .observe_request(&method, &route, status, started.elapsed());
        response
    }

    async fn respond(
        &self,
        request: Request<Incoming>,
        connection: &ClientConnection,
        request_id: &HeaderValue,
        span: &RequestSpan,
        record: &Arc<RequestRecord>,
    ) -> Response<ResponseBody> {
        if !has_valid_host(request.version(), request.headers()) {
            let refused = responses::error(StatusCode::BAD_REQUEST, responses::BAD_HOST);
            return connection.closing_if_unread(refused, request.body());
        }
        let peer = Some(connection.peer);
        let (mut parts, body) = request.into_parts();
        let reading = read_body(
            body,
            &parts.headers,
            self.limits.max_body_bytes,
            &self.body_buffers,
            peer,
        );
        let read = tokio::time::timeout(self.limits.body_timeout, reading)
            .await
            .unwrap_or(Err(BodyError::TooSlow));
        let (body, reservation) = match read {
            Ok(read) => read,
            Err(BodyError::NoRoom) => {
                record.deciding_fault("the request bodies held host-wide fill their budget".into());
                // The rest of the body is still on the connection.
                return connection.closing(responses::error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    responses::BUSY,
                ));
            }
            Err(BodyError::TooSlow) => {
                // The rest of the body may still come: the connection cannot carry another request.
                return connection.closing(responses::error(
                    StatusCode::REQUEST_TIMEOUT,
                    responses::BODY_TOO_SLOW,
                ));
            }
            Err(BodyError::Unreadable) => {
                // A body that broke off may still be followed by its rest.
                return connection.closing(responses::error(
                    StatusCode::BAD_REQUEST,
                    responses::UNREADABLE_BODY,
                ));
            }
        };
        // The whole request is here: from now on the connection is doing work.
        connection.ticket.enter(Phase::Answering);
        // The host's own pages are labelled as such, whatever they answer.
        let own_page = self.pages.at(parts.uri.path());
        if let Some((_, path)) = own_page
            && let Some(route) = record.name_route(Arc::clone(path))
        {
            span.record_route(&route);
        }
        let ReadBody::Complete(body) = body else {
            // The contract's first rule, whatever the path and method: the host knows no routes.
            // The unread rest of the body is still on the connection.
            record.deciding_fault(format!(
                "the body is over --max-body-bytes ({})",
                self.limits.max_body_bytes
            ));
            return connection.closing(responses::error(
                StatusCode::PAYLOAD_TOO_LARGE,
                responses::BODY_TOO_LARGE,
            ));
        };
        if let Some((page, _)) = own_page {
            // A page reads no body: its bytes go back to the budget now.
            drop((body, reservation));
            if parts.method != Method::GET && parts.method != Method::HEAD {
                // Its WARN line is written in `handle`.
                return responses::method_not_allowed(&[Method::GET, Method::HEAD]);
            }
            return self.own_page(page, record).await;
        }
        let body = GuestRequestBody::new(body, reservation);
        parts.headers.insert(REQUEST_ID, request_id.clone());
        let no_host = parts
            .headers
            .get(header::HOST)
            .is_none_or(HeaderValue::is_empty);
        if no_host && parts.uri.authority().is_none() {
            // HTTP/1.0 clients may omit `Host`; wasi:http needs an authority.
            parts
                .headers
                .insert(header::HOST, HeaderValue::from_static("localhost"));
        }
        let request = Request::from_parts(parts, body);
        let context = RequestContext::new(
            Arc::clone(&self.users),
            peer,
            Arc::clone(&self.metrics),
            span.clone(),
            Arc::clone(record),
        )
        .with_client_stalled(Arc::clone(&connection.stalled));
        let serving = self.serving.current();
        // The guest changes with a swap: each request span says which one answered it.
        span.record_guest_version(serving.version.as_str());
        match serving.guest.handle(context, request).await {
            Ok(response) => response.map(BodyExt::boxed_unsync),
            Err(error) => {
                let (status, message) = match error {
                    RequestError::Timeout => {
                        (StatusCode::SERVICE_UNAVAILABLE, responses::TIMED_OUT)
                    }
                    RequestError::Busy | RequestError::OverBudget(_) => {
                        (StatusCode::SERVICE_UNAVAILABLE, responses::BUSY)
                    }
                    _ => (StatusCode::INTERNAL_SERVER_ERROR, responses::INTERNAL_ERROR),
                };
                if matches!(
                    error,
                    RequestError::Trapped(_) | RequestError::OverLimit(_) | RequestError::Timeout
                ) {
                    self.metrics.observe_guest_trap(metrics::TRAP_MOMENTS[0]);
                }
                // The request's log line says why (this error wins over any earlier fault).
                record.deciding_fault(one_line(&error));
                responses::error(status, message)
            }
        }
    }

    /// The guest serving new requests, which a reload swaps.
    pub fn serving(&self) -> &Serving {
        &self.serving
    }

    /// The host's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// One of the host's own pages. Each writes a log line, as the spec asks of every endpoint.
    async fn own_page(&self, page: HostPage, record: &RequestRecord) -> Response<ResponseBody> {
        match page {
            HostPage::Metrics => {
                tracing::info!("metrics page served");
                let page = self.metrics.render(self.users_stored().await);
                responses::full(StatusCode::OK, metrics::CONTENT_TYPE, page)
            }
            HostPage::Live => {
                tracing::info!("liveness page served");
                responses::json(StatusCode::OK, &serde_json::json!({ "status": "alive" }))
            }
            HostPage::Ready => {
                // Serving at all means the guest is loaded and passed its probe: start-up and
                // every swap wait for both. What can fail later is the store.
                match self.users.check() {
                    Ok(()) => {
                        tracing::info!("readiness page served");
                        let ready = serde_json::json!({
                            "status": "ready",
                            "guest_version": self.serving.current().version,
                            "store": self.users.kind(),
                        });
                        responses::json(StatusCode::OK, &ready)
                    }
                    Err(unavailable) => {
                        // Its ERROR line, with the cause, is written in `handle`.
                        record.deciding_fault(format!("not ready: {unavailable}"));
                        responses::error(
                            StatusCode::SERVICE_UNAVAILABLE,
                            responses::STORE_UNAVAILABLE,
                        )
                    }
                }
            }
        }
    }

    /// The store's user count; `None` when it cannot answer in time (`users_stored` then keeps
    /// its last value, and the page is served all the same).
    async fn users_stored(&self) -> Option<u64> {
        tokio::time::timeout(USERS_STORED_WAIT, self.users.count())
            .await
            .ok()
            .flatten()
    }

    /// Sets `users_stored` from the store every `every`, for a push that no scrape precedes.
    pub async fn refresh_users_stored(self: Arc<App>, every: Duration) {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            self.metrics.observe_users_stored(self.users_stored().await);
        }
    }
}

/// The client's `x-request-id` when it is 1 to 128 visible ASCII characters, else a new UUID v4.
fn request_id(headers: &HeaderMap) -> HeaderValue {
    headers
        .get(REQUEST_ID)
        .filter(|value| {
            let bytes = value.as_bytes();
            (1..=MAX_REQUEST_ID_LEN).contains(&bytes.len())
                && bytes.iter().all(u8::is_ascii_graphic)
        })
        .cloned()
        .unwrap_or_else(|| {
            let mut text = [0; uuid::fmt::Hyphenated::LENGTH];
            let id = uuid::Uuid::new_v4().hyphenated().encode_lower(&mut text);
            HeaderValue::from_str(id).expect("a UUID is a valid header value")
        })
}

/// One client's connection, as each of its requests sees it: handed down as an argument.
struct ClientConnection {
    /// Its place in the host's connection table.
    ticket: Arc<Ticket>,
    /// Who the client is, as the host shares out request bodies and instance slots: its IPv4
    /// address, or the /64 network of its IPv6 address (what one IPv6 client is given). Behind
    /// a proxy every client is the proxy.
    peer: IpAddr,
    /// Set when the client took too little of a response for the stall bound, so the response
    /// body that was cut says why.
    stalled: Arc<AtomicBool>,
    drain_on_close: DrainOnClose,
}

impl ClientConnection {
    /// `response`, with the connection closed after it: the host answers before it has read
    /// the whole request, and what is left of it must not be read as the next one. The
    /// connection drains what the client still sends before it closes, so the client gets to
    /// read this answer ([`crate::edge::client_stream`]).
    fn closing(&self, mut response: Response<ResponseBody>) -> Response<ResponseBody> {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        self.drain_on_close.mark();
        response
    }

    /// `response`, [`ClientConnection::closing`] when `body` is not read to its end yet.
    fn closing_if_unread(
        &self,
        response: Response<ResponseBody>,
        body: &Incoming,
    ) -> Response<ResponseBody> {
        if body.is_end_stream() {
            response
        } else {
            self.closing(response)
        }
    }
}

/// Whether the request's `Host` is as RFC 9112 (section 3.2) requires: exactly one, a host and
/// an optional port of digits (no user info), and present in every HTTP/1.1 request. A client
/// error otherwise, never handed to the guest (wasi:http would refuse some of these).
fn has_valid_host(version: Version, headers: &HeaderMap) -> bool {
    let mut hosts = headers.get_all(header::HOST).iter();
    match (hosts.next(), hosts.next()) {
        // HTTP/1.0 clients may omit it.
        (None, _) => version < Version::HTTP_11,
        // Empty is allowed: the form a client sends for a target without an authority.
        (Some(host), None) => host.is_empty() || is_host_and_port(host.as_bytes()),
        (Some(_), Some(_)) => false,
    }
}

/// Whether `text` is `host[:port]`: an authority without user info whose port, if any, is
/// digits (the `http` crate's parser also takes `a@b` and `a:b`).
fn is_host_and_port(text: &[u8]) -> bool {
    let Ok(authority) = http::uri::Authority::try_from(text) else {
        return false;
    };
    if authority.as_str().contains('@') || authority.host().is_empty() {
        return false;
    }
    match authority.as_str().strip_prefix(authority.host()) {
        Some(rest) => rest.strip_prefix(':').map_or(rest.is_empty(), |port| {
            port.bytes().all(|byte| byte.is_ascii_digit())
        }),
        None => false,
    }
}

/// The peer of a connection from `address`: see [`ClientConnection::peer`].
fn peer_of(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        },
    }
}

/// Bytes of a response the kernel holds for a client beyond what is in flight to it.
const MAX_UNSENT_BYTES: u32 = 16 * 1024;

/// Caps what the kernel buffers for a connection that is not being read, so a client that reads
/// nothing of a long list costs a few pages of it (7 of 256 users measured), not the send
/// buffer's autotuned megabytes (133 pages, 3.7 MB, on loopback), every byte of which a guest
/// first computes. Data in flight is not limited: a fast client over a long link keeps its
/// throughput.
fn bound_unsent_bytes(stream: &tokio::net::TcpStream) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let _ = socket2::SockRef::from(stream).set_tcp_notsent_lowat(MAX_UNSENT_BYTES);
}

/// Serves HTTP/1.1 on `listener` until `shutdown` completes, then stops accepting, lets the
/// connections it accepted read their requests for [`SHUTDOWN_SETTLE`], and gives in-flight
/// requests [`SHUTDOWN_GRACE`] to finish.
pub async fn serve(listener: TcpListener, app: Arc<App>, shutdown: impl Future<Output = ()>) {
    let connections = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (mut stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => (stream, peer.ip()),
                Err(error) => {
                    // Usually out of file descriptors: back off instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        bound_unsent_bytes(&stream);
        let Some(ticket) = app.connections.admit() else {
            // Every connection is being answered: say so and close, rather than queue a client
            // with no answer.
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                let answer = responses::over_connection_cap();
                let _ = tokio::time::timeout(HEADER_READ_TIMEOUT, stream.write_all(&answer)).await;
            });
            continue;
        };
        let linger = Linger::for_body_limit(app.limits.max_body_bytes);
        let response_stall = app.limits.response_stall;
        let app = Arc::clone(&app);
        let client = Arc::new(ClientConnection {
            ticket: Arc::clone(&ticket),
            peer: peer_of(peer),
            stalled: Arc::default(),
            drain_on_close: DrainOnClose::default(),
        });
        let stream = ClientStream::new(
            stream,
            response_stall,
            client.drain_on_close.clone(),
            linger,
        )
        .marking_stalls(Arc::clone(&client.stalled));
        let service = service_fn(move |request: Request<Incoming>| {
            let app = Arc::clone(&app);
            let client = Arc::clone(&client);
            async move {
                client.ticket.enter(Phase::ReadingBody);
                let response = app.handle(request, &client).await;
                let ticket = Arc::clone(&client.ticket);
                Ok::<_, Infallible>(
                    response.map(|body| AwaitNextHead::new(body, ticket).boxed_unsync()),
                )
            }
        });
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            // The head's own bound, exact however its bytes arrive; the buffer's alone let a head
            // that came in one burst pass it by up to half.
            .max_header_size(MAX_HEADER_BYTES)
            .max_buf_size(MAX_HEADER_BYTES)
            .serve_connection(TokioIo::new(stream), service);
        let connection = connections.watch(connection);
        tokio::spawn(async move {
            // A client that vanishes or speaks garbage ends its own connection, nothing more; a
            // connection the full table sheds is dropped, which closes it.
            tokio::select! {
                _ = connection => {}
                () = ticket.shed() => {}
            }
            drop(ticket);
        });
    }
    drop(listener);
    tokio::time::sleep(SHUTDOWN_SETTLE).await;
    if tokio::time::timeout(SHUTDOWN_GRACE, connections.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("shutdown grace period over; closing remaining connections");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers_with_id(id: &[u8]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(REQUEST_ID, HeaderValue::from_bytes(id).unwrap());
        headers
    }

    #[test]
    fn a_peer_is_an_ipv4_address_or_the_64_network_of_an_ipv6_one() {
        let peer = |text: &str| peer_of(text.parse().unwrap()).to_string();
        assert_eq!(peer("127.0.0.2"), "127.0.0.2");
        assert_eq!(peer("::ffff:10.0.0.7"), "10.0.0.7");
        assert_eq!(peer("2001:db8:1:2:aaaa:bbbb:cccc:dddd"), "2001:db8:1:2::");
        assert_eq!(peer("2001:db8:1:2::1"), peer("2001:db8:1:2:ffff::9"));
    }

    #[test]
    fn a_host_header_must_be_one_valid_authority() {
        let with_hosts = |hosts: &[&[u8]]| {
            let mut headers = HeaderMap::new();
            for host in hosts {
                headers.append(header::HOST, HeaderValue::from_bytes(host).unwrap());
            }
            headers
        };
        let valid = |hosts: &[&[u8]]| has_valid_host(Version::HTTP_11, &with_hosts(hosts));
        for host in [
            &b""[..],
            b"localhost",
            b"localhost:8080",
            b"localhost:",
            b"127.0.0.1:80",
            b"[::1]",
            b"[::1]:80",
        ] {
            assert!(valid(&[host]), "{}", String::from_utf8_lossy(host));
        }
        for host in [
            &b"\xff"[..],
            b"a b",
            b"a:b",
            b"a:8o",
            b"a@b",
            b"user:pw@a:80",
            b"[::1]x",
            b":80",
        ] {
            assert!(!valid(&[host]), "{}", String::from_utf8_lossy(host));
        }
        assert!(!valid(&[b"a", b"b"]));
    }

    #[test]
    fn only_a_request_older_than_http_1_1_may_omit_its_host() {
        assert!(!has_valid_host(Version::HTTP_11, &HeaderMap::new()));
        assert!(has_valid_host(Version::HTTP_10, &HeaderMap::new()));
    }

    #[test]
    fn a_valid_client_request_id_is_kept() {
        for id in [&b"abc-123"[..], b"x", &[b'a'; 128]] {
            assert_eq!(request_id(&headers_with_id(id)).as_bytes(), id);
        }
    }

    #[test]
    fn a_missing_or_invalid_request_id_is_replaced_by_a_uuid() {
        for headers in [
            HeaderMap::new(),
            headers_with_id(b""),
            headers_with_id(b"has space"),
            headers_with_id(&[b'a'; 129]),
        ] {
            let id = request_id(&headers);
            let id = uuid::Uuid::parse_str(id.to_str().unwrap()).unwrap();
            assert_eq!(id.get_version_num(), 4);
        }
    }
}
