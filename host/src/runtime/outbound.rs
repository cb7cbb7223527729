//! Outgoing HTTP: what a guest may call. Nothing, unless the operator allows a destination
//! (`--allow-outbound`, patterns as Spin's: `http://host:port`, `http://host:*` for any port).
//!
//! A denied call fails in the guest with `HTTP-request-denied`, and its cause goes into a WARN
//! line and into the request's ERROR line should the request fail. An allowed call goes out
//! over plain HTTP/1.1 (no TLS stack in this build) in a client span of the request's trace,
//! carrying that span's `traceparent`, and ends with the request's deadline: connecting, the
//! answer's head and the connection's life all stop there. Its answer's head is read into at
//! most [`MAX_RESPONSE_HEAD_BYTES`], its body streamed to the guest a frame at a time as the
//! guest reads (the objects the guest holds meanwhile are weighed as any other, `held.rs`). A
//! request makes at most [`MAX_CALLS_PER_REQUEST`] calls, allowed or not (the rest are denied,
//! said once), and its connections are closed when its instance ends. Host-wide, at most
//! [`MAX_OUTBOUND_SOCKETS`] calls hold a socket at once (the connection cap keeps their
//! descriptors back) and at most [`MAX_NAME_LOOKUPS`] names are looked up at once, each within
//! the call's connect deadline: the system's resolver blocks a thread of the pool the whole
//! host shares.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use http::{Request, Response};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt};
use opentelemetry::{Context, KeyValue};
use opentelemetry_http::HeaderInjector;
use tokio::sync::Semaphore;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody};

use crate::observability::request_report::{self, RequestRecord};
use crate::observability::routes;

/// The largest answer head an outgoing call reads (hyper's read buffer bound, as the edge's).
pub const MAX_RESPONSE_HEAD_BYTES: usize = 64 << 10;
/// The longest destination a log line or a span names; longer ones are cut.
const MAX_LOGGED_DESTINATION: usize = 256;
/// Outgoing calls one request may make, allowed or denied: a guest calling in a loop neither
/// floods a destination nor the log, nor holds more than this many connections.
pub const MAX_CALLS_PER_REQUEST: usize = 32;

/// Outgoing connections open at once, host-wide; the connection cap keeps their descriptors
/// back (`edge::connections::RESERVED_FILE_DESCRIPTORS`).
pub const MAX_OUTBOUND_SOCKETS: usize = 128;
/// Outgoing connections one request holds open at once: a few requests cannot take the host's.
pub const MAX_SOCKETS_PER_REQUEST: usize = 8;
/// How long a call waits for a socket (its request's, then the host's) before it fails with
/// `connection-limit-reached`: a call past the bounds fails soon, not at the deadline.
const SOCKET_WAIT: std::time::Duration = std::time::Duration::from_secs(1);
/// Name lookups at once, host-wide. Each blocks a thread of tokio's blocking pool until the
/// system's resolver answers, whatever the call's deadline: this bounds how many threads of
/// that pool, which the whole host shares, calls can hold.
pub const MAX_NAME_LOOKUPS: usize = 4;

/// The host's sockets and name lookups for outgoing calls, shared by every request.
#[derive(Clone)]
pub struct OutboundSockets {
    sockets: Arc<Semaphore>,
    lookups: Arc<Semaphore>,
}

impl Default for OutboundSockets {
    fn default() -> OutboundSockets {
        OutboundSockets {
            sockets: Arc::new(Semaphore::new(MAX_OUTBOUND_SOCKETS)),
            lookups: Arc::new(Semaphore::new(MAX_NAME_LOOKUPS)),
        }
    }
}

impl OutboundSockets {
    /// The addresses of `authority` (`host:port`): at once for an IP address, else from the
    /// system's resolver, one of [`MAX_NAME_LOOKUPS`] at a time.
    async fn resolve(&self, authority: &str) -> Result<Vec<SocketAddr>, Error> {
        if let Ok(address) = authority.parse::<SocketAddr>() {
            return Ok(vec![address]);
        }
        let lookup = Arc::clone(&self.lookups)
            .acquire_owned()
            .await
            .map_err(|_| Error::DnsTimeout)?;
        let authority = authority.to_string();
        // The thread keeps its place until the resolver answers, even when the call has gone.
        let found = tokio::task::spawn_blocking(move || {
            let _lookup = lookup;
            std::net::ToSocketAddrs::to_socket_addrs(&authority).map(Iterator::collect::<Vec<_>>)
        })
        .await
        .map_err(|join| Error::InternalError(Some(join.to_string())))?;
        match found {
            Ok(addresses) if !addresses.is_empty() => Ok(addresses),
            Ok(_) => Err(Error::DestinationNotFound),
            Err(error) => Err(Error::DnsError {
                rcode: Some(error.to_string()),
                info_code: None,
            }),
        }
    }
}

/// One destination the operator allows.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Destination {
    /// The host name or address, lower-case (an IPv6 address in its brackets).
    host: String,
    /// The port, or `None` for any (`*`).
    port: Option<u16>,
}

/// The destinations guests may call: none by default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutboundRules(Vec<Destination>);

impl OutboundRules {
    /// `--allow-outbound`: destinations separated by commas, each `http://host:port`,
    /// `http://host:*` or `http://host` (port 80); empty allows none.
    pub fn parse(value: &str) -> Result<OutboundRules, String> {
        value
            .split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .map(destination)
            .collect::<Result<Vec<_>, _>>()
            .map(OutboundRules)
    }

    /// Whether a call to `host` on `port` is allowed.
    fn allows(&self, host: &str, port: u16) -> bool {
        self.0.iter().any(|allowed| {
            allowed.host.eq_ignore_ascii_case(host) && allowed.port.is_none_or(|only| only == port)
        })
    }
}

fn destination(item: &str) -> Result<Destination, String> {
    let refused = |why: &str| format!("`{item}`: {why}");
    let Some(rest) = item.strip_prefix("http://") else {
        return Err(refused(
            "expected http://host:port, http://host:* or http://host (plain HTTP only)",
        ));
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    // An IPv6 address keeps its brackets; the port follows the last colon outside them.
    let (host, port) = match rest.rfind(':') {
        Some(colon) if !rest[colon..].contains(']') => (&rest[..colon], Some(&rest[colon + 1..])),
        _ => (rest, None),
    };
    if host.is_empty() || host.len() > 253 || host.contains(['/', '@', '?', '#', ' ']) {
        return Err(refused("not a host name or address"));
    }
    let port = match port {
        None => Some(80),
        Some("*") => None,
        Some(digits) => Some(
            digits
                .parse::<u16>()
                .ok()
                .filter(|port| *port > 0)
                .ok_or_else(|| refused("the port is not a number from 1 to 65535 or *"))?,
        ),
    };
    Ok(Destination {
        host: host.to_ascii_lowercase(),
        port,
    })
}

/// The `wasi:http` hook that sends one request's outgoing calls, or refuses them.
pub struct OutgoingCalls {
    rules: Arc<OutboundRules>,
    /// The request's deadline: no call outlives it.
    deadline: Instant,
    /// The span the calls' client spans start under.
    parent: Context,
    /// The request's record, where a denial goes for its ERROR line.
    record: Arc<RequestRecord>,
    /// Calls made so far, allowed or denied.
    made: usize,
    /// The connections of the calls sent, closed when the request's instance ends.
    connections: Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
    /// The host's sockets and lookups, which every request's calls share.
    sockets: OutboundSockets,
    /// The request's own sockets, [`MAX_SOCKETS_PER_REQUEST`].
    own_sockets: Arc<Semaphore>,
}

impl Drop for OutgoingCalls {
    fn drop(&mut self) {
        let connections = self
            .connections
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for connection in connections.iter() {
            connection.abort();
        }
    }
}

impl OutgoingCalls {
    /// The calls of a request due by `deadline`, within `rules` and the host's `sockets`,
    /// traced under `parent`, their denials noted in `record`.
    pub fn new(
        rules: Arc<OutboundRules>,
        sockets: OutboundSockets,
        deadline: Instant,
        parent: Context,
        record: Arc<RequestRecord>,
    ) -> OutgoingCalls {
        OutgoingCalls {
            rules,
            deadline,
            parent,
            record,
            made: 0,
            connections: Arc::default(),
            sockets,
            own_sockets: Arc::new(Semaphore::new(MAX_SOCKETS_PER_REQUEST)),
        }
    }

    /// Sends `request` if its destination is allowed; the answer's head, and a future that
    /// ends with the connection.
    pub fn send(
        &mut self,
        request: Request<WasiBody>,
        options: Option<RequestOptions>,
    ) -> Result<SentCall, Error> {
        self.made += 1;
        if self.made > MAX_CALLS_PER_REQUEST {
            if self.made == MAX_CALLS_PER_REQUEST + 1 {
                tracing::warn!(
                    max_calls = MAX_CALLS_PER_REQUEST,
                    "the guest's outgoing requests are past their bound for this request: the \
                     rest are denied"
                );
            }
            return Err(Error::HttpRequestDenied);
        }
        let uri = request.uri();
        let host = uri.host().unwrap_or_default().to_string();
        let port = uri.port_u16().unwrap_or(80);
        let destination = format!("{}://{host}:{port}", uri.scheme_str().unwrap_or("http"));
        let cause = if uri.scheme_str() != Some("http") {
            Some("only plain http:// calls can be allowed")
        } else if !self.rules.allows(&host, port) {
            Some("not in --allow-outbound")
        } else {
            None
        };
        if let Some(cause) = cause {
            let destination =
                &destination[..destination.floor_char_boundary(MAX_LOGGED_DESTINATION)];
            tracing::warn!(destination, cause, "outgoing request denied");
            self.record
                .fault(|| format!("its outgoing request to {destination} was denied: {cause}"));
            return Err(Error::HttpRequestDenied);
        }
        // A method the guest made up is `_OTHER`, as the conventions say: a span name from a
        // bounded set. The URL without its query, which may hold credentials.
        let method = routes::standard_method(request.method()).unwrap_or(routes::OTHER_METHOD);
        let url = format!("{destination}{}", uri.path());
        let span = request_report::start_child(
            &self.parent,
            if method == "_OTHER" { "HTTP" } else { method },
            SpanKind::Client,
            vec![
                KeyValue::new("http.request.method", method),
                KeyValue::new(
                    "server.address",
                    host[..host.floor_char_boundary(MAX_LOGGED_DESTINATION)].to_string(),
                ),
                KeyValue::new("server.port", i64::from(port)),
                KeyValue::new(
                    "url.full",
                    url[..url.floor_char_boundary(MAX_LOGGED_DESTINATION)].to_string(),
                ),
            ],
        );
        let mut request = request;
        opentelemetry::global::get_text_map_propagator(|propagator| {
            propagator.inject_context(&span, &mut HeaderInjector(request.headers_mut()))
        });
        let deadline = tokio::time::Instant::from_std(self.deadline);
        let connect_by = earliest(
            deadline,
            options.and_then(|options| options.connect_timeout),
        );
        let answer_by = earliest(
            deadline,
            options.and_then(|options| options.first_byte_timeout),
        );
        Ok(SentCall {
            authority: format!("{host}:{port}"),
            request,
            span,
            deadline,
            connect_by,
            answer_by,
            connections: Arc::clone(&self.connections),
            sockets: self.sockets.clone(),
            own_sockets: Arc::clone(&self.own_sockets),
        })
    }
}

/// The earlier of `deadline` and `timeout` from now.
fn earliest(
    deadline: tokio::time::Instant,
    timeout: Option<std::time::Duration>,
) -> tokio::time::Instant {
    timeout.map_or(deadline, |timeout| {
        deadline.min(tokio::time::Instant::now() + timeout)
    })
}

/// An allowed call, ready to go out.
pub struct SentCall {
    authority: String,
    request: Request<WasiBody>,
    span: Context,
    deadline: tokio::time::Instant,
    connect_by: tokio::time::Instant,
    answer_by: tokio::time::Instant,
    /// Where its connection's task is kept, to be closed with the request's instance.
    connections: Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
    sockets: OutboundSockets,
    own_sockets: Arc<Semaphore>,
}

/// The future a `wasi:http` send hook returns for the connection's end.
pub type ConnectionEnd = Box<dyn Future<Output = Result<(), Error>> + Send>;

impl SentCall {
    /// Connects, sends, and waits for the answer's head; the connection is driven on a task of
    /// its own until the body is read or the deadline comes.
    pub async fn exchange(self) -> Result<(Response<WasiBody>, ConnectionEnd), Error> {
        let SentCall {
            authority,
            mut request,
            span,
            deadline,
            connect_by,
            answer_by,
            connections,
            sockets,
            own_sockets,
        } = self;
        let outcome = async {
            let addresses = tokio::time::timeout_at(connect_by, sockets.resolve(&authority))
                .await
                .map_err(|_| Error::DnsTimeout)??;
            // The request's socket, then the host's: held for as long as the connection, in
            // its task.
            let socket_by = connect_by.min(tokio::time::Instant::now() + SOCKET_WAIT);
            let socket = async {
                let own = own_sockets.acquire_owned().await.ok()?;
                let host = Arc::clone(&sockets.sockets).acquire_owned().await.ok()?;
                Some((own, host))
            };
            let socket = tokio::time::timeout_at(socket_by, socket)
                .await
                .ok()
                .flatten()
                .ok_or(Error::ConnectionLimitReached)?;
            let stream =
                tokio::time::timeout_at(connect_by, tokio::net::TcpStream::connect(&*addresses))
                    .await
                    .map_err(|_| Error::ConnectionTimeout)?
                    .map_err(Error::Connect)?;
            let (mut sender, connection) = tokio::time::timeout_at(
                connect_by,
                hyper::client::conn::http1::Builder::new()
                    .max_buf_size(MAX_RESPONSE_HEAD_BYTES)
                    .handshake(TokioIo::new(stream)),
            )
            .await
            .map_err(|_| Error::ConnectionTimeout)??;
            let connection = tokio::spawn(async move {
                let _socket = socket;
                match tokio::time::timeout_at(deadline, connection).await {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(error)) => Err(Error::from(error)),
                    Err(_) => Err(Error::HttpResponseTimeout),
                }
            });
            connections
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(connection.abort_handle());
            // The request line names the path alone: scheme and authority are for proxies.
            let path = request
                .uri()
                .path_and_query()
                .map_or("/", |path| path.as_str())
                .parse()
                .map_err(|_| Error::HttpRequestUriInvalid)?;
            *request.uri_mut() = path;
            let response = tokio::time::timeout_at(answer_by, sender.send_request(request))
                .await
                .map_err(|_| Error::ConnectionReadTimeout)??;
            let end: ConnectionEnd = Box::new(async move {
                connection
                    .await
                    .unwrap_or_else(|join| Err(Error::InternalError(Some(join.to_string()))))
            });
            Ok::<_, Error>((
                response.map(|body| body.map_err(Error::from).boxed_unsync()),
                end,
            ))
        }
        .await;
        let active = span.span();
        match &outcome {
            Ok((response, _)) => {
                let status = response.status().as_u16();
                active.set_attribute(KeyValue::new(
                    "http.response.status_code",
                    i64::from(status),
                ));
                if status >= 400 {
                    active.set_attribute(KeyValue::new("error.type", status.to_string()));
                    active.set_status(Status::error(""));
                }
            }
            Err(error) => {
                active.set_attribute(KeyValue::new("error.type", format!("{error:?}")));
                active.set_status(Status::error(error.to_string()));
            }
        }
        active.end();
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_destination_is_a_plain_http_host_with_a_port_any_port_or_port_80() {
        let rules = OutboundRules::parse(
            "http://api.example.com:8080, http://LocalHost:*,http://[::1]:9000,http://plain/",
        )
        .unwrap();
        assert!(rules.allows("api.example.com", 8080));
        assert!(!rules.allows("api.example.com", 8081));
        assert!(rules.allows("localhost", 1));
        assert!(rules.allows("localhost", 65535));
        assert!(rules.allows("[::1]", 9000));
        assert!(rules.allows("plain", 80));
        assert!(!rules.allows("plain", 8080));
        assert!(!rules.allows("other.example.com", 8080));
    }

    fn call_to(uri: &str) -> Request<WasiBody> {
        let body = http_body_util::Empty::new()
            .map_err(|never| match never {})
            .boxed_unsync();
        Request::builder().uri(uri).body(body).unwrap()
    }

    #[test]
    fn a_request_makes_at_most_its_calls_allowed_or_not() {
        let rules = OutboundRules::parse("http://127.0.0.1:9").unwrap();
        let deadline = Instant::now() + std::time::Duration::from_secs(1);
        let mut calls = OutgoingCalls::new(
            Arc::new(rules),
            OutboundSockets::default(),
            deadline,
            Context::new(),
            Arc::default(),
        );
        assert!(
            calls.send(call_to("http://127.0.0.1:10/"), None).is_err(),
            "not allowed"
        );
        assert!(
            calls.send(call_to("https://127.0.0.1:9/"), None).is_err(),
            "not plain HTTP"
        );
        let allowed = (2..MAX_CALLS_PER_REQUEST + 10)
            .filter(|_| calls.send(call_to("http://127.0.0.1:9/x"), None).is_ok())
            .count();
        assert_eq!(
            allowed,
            MAX_CALLS_PER_REQUEST - 2,
            "the denied ones count too"
        );
    }

    #[tokio::test]
    async fn an_address_needs_no_lookup_and_a_name_waits_for_one_of_the_hosts_lookups() {
        let sockets = OutboundSockets::default();
        let all = Arc::clone(&sockets.lookups)
            .try_acquire_many_owned(MAX_NAME_LOOKUPS as u32)
            .unwrap();
        let address: SocketAddr = "127.0.0.1:80".parse().unwrap();
        assert_eq!(sockets.resolve("127.0.0.1:80").await.unwrap(), [address]);
        let waited = tokio::time::timeout(
            std::time::Duration::from_millis(100),
            sockets.resolve("localhost:80"),
        )
        .await;
        assert!(waited.is_err(), "looked up with every lookup taken");
        drop(all);
        assert!(!sockets.resolve("localhost:80").await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_call_past_the_hosts_sockets_fails_at_its_connect_deadline_as_connection_limit_reached()
     {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let sockets = OutboundSockets::default();
        let _all = Arc::clone(&sockets.sockets)
            .try_acquire_many_owned(MAX_OUTBOUND_SOCKETS as u32)
            .unwrap();
        let rules = OutboundRules::parse(&format!("http://127.0.0.1:{port}")).unwrap();
        let wait = std::time::Duration::from_millis(200);
        let mut calls = OutgoingCalls::new(
            Arc::new(rules),
            sockets,
            Instant::now() + wait,
            Context::new(),
            Arc::default(),
        );
        let call = calls
            .send(call_to(&format!("http://127.0.0.1:{port}/")), None)
            .unwrap();
        let started = Instant::now();
        let Err(error) = call.exchange().await else {
            panic!("the call got a socket past the host's bound");
        };
        assert!(matches!(error, Error::ConnectionLimitReached), "{error:?}");
        assert!(started.elapsed() >= wait - std::time::Duration::from_millis(20));
    }

    #[tokio::test]
    async fn a_call_past_its_requests_sockets_fails_within_the_socket_wait_not_the_deadline() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let rules = OutboundRules::parse(&format!("http://127.0.0.1:{port}")).unwrap();
        let mut calls = OutgoingCalls::new(
            Arc::new(rules),
            OutboundSockets::default(),
            Instant::now() + std::time::Duration::from_secs(30),
            Context::new(),
            Arc::default(),
        );
        let _own = Arc::clone(&calls.own_sockets)
            .try_acquire_many_owned(MAX_SOCKETS_PER_REQUEST as u32)
            .unwrap();
        let call = calls
            .send(call_to(&format!("http://127.0.0.1:{port}/")), None)
            .unwrap();
        let started = Instant::now();
        let Err(error) = call.exchange().await else {
            panic!("the call got a socket past its request's bound");
        };
        assert!(matches!(error, Error::ConnectionLimitReached), "{error:?}");
        let waited = started.elapsed();
        assert!(waited < std::time::Duration::from_secs(3), "{waited:?}");
    }

    #[test]
    fn nothing_is_allowed_by_default_and_a_bad_pattern_is_refused_with_its_text() {
        assert_eq!(OutboundRules::parse("").unwrap(), OutboundRules::default());
        assert!(!OutboundRules::default().allows("localhost", 80));
        for bad in [
            "https://api.example.com:443",
            "api.example.com:80",
            "http://:80",
            "http://host:0",
            "http://host:70000",
            "http://host:x",
            "http://user@host:80",
            "http://host/path",
        ] {
            let error = OutboundRules::parse(bad).unwrap_err();
            assert!(error.contains(bad), "{bad}: {error}");
        }
    }
}
