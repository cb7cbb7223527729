//! Guests the project did not write in Rust: `tests/fixtures/python-guest` (componentize-py)
//! and `tests/fixtures/js-guest` (componentize-js), as `make build` leaves them in
//! `target/guest-tools`. The host answers them as `wasmtime serve` does, logs what they print,
//! logs a trap however late it comes, and lets them own `/metrics` when told to.

mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::{Host, client, prometheus};

/// The fixtures, by the name `make` gives their component.
const FIXTURES: [&str; 2] = ["python-guest", "js-guest"];

/// A component `make build` built with another language's toolchain.
fn toolchain_guest(name: &str) -> PathBuf {
    let path = workspace_root().join(format!("target/guest-tools/{name}.wasm"));
    assert!(
        path.exists(),
        "{} is missing: run `make build` first",
        path.display()
    );
    path
}

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The host serving fixture `name`, probed on the path every fixture answers.
fn host_of(name: &str, flags: &[&str]) -> Host {
    let mut all = vec!["--probe-path", "/hello"];
    all.extend_from_slice(flags);
    Host::builder()
        .guest_at(&toolchain_guest(name))
        .flags(&all)
        .start()
}

/// `wasmtime serve` 48 (`make build` installs its CLI into `target/guest-tools`), killed when
/// dropped.
struct WasmtimeServe {
    child: Child,
    authority: String,
}

impl WasmtimeServe {
    /// Serves `component` with WASI's cli interfaces, as a Python or JavaScript guest needs.
    fn start(component: &std::path::Path) -> WasmtimeServe {
        let cli = workspace_root().join("target/guest-tools/wasmtime");
        assert!(
            cli.exists(),
            "{} is missing: run `make build` first",
            cli.display()
        );
        let authority = format!("127.0.0.1:{}", support::free_port());
        let child = Command::new(cli)
            .args(["serve", "-S", "cli", "--addr", &authority])
            .arg(component)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("wasmtime serve starts");
        let serve = WasmtimeServe { child, authority };
        // Compiling a 20 MB component takes seconds on two cores.
        let deadline = Instant::now() + Duration::from_secs(120);
        while std::net::TcpStream::connect(&serve.authority).is_err() {
            assert!(Instant::now() < deadline, "wasmtime serve never listened");
            std::thread::sleep(Duration::from_millis(100));
        }
        serve
    }
}

impl Drop for WasmtimeServe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What is compared of an answer: its status, its headers but for those that differ by
/// server (date, request id, framing), and its body.
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

const SERVER_HEADERS: [&str; 4] = [
    "date",
    "x-request-id",
    "content-length",
    "transfer-encoding",
];

async fn answer(response: reqwest::Response) -> Answer {
    let status = response.status().as_u16();
    let mut headers: Vec<(String, String)> = response
        .headers()
        .iter()
        .filter(|(name, _)| !SERVER_HEADERS.contains(&name.as_str()))
        .map(|(name, value)| (name.to_string(), value.to_str().unwrap_or("").to_string()))
        .collect();
    headers.sort();
    let body = response.bytes().await.unwrap().to_vec();
    Answer {
        status,
        headers,
        body,
    }
}

/// The answers of `authority` to every request of the comparison, in order.
async fn answers_of(authority: &str) -> Vec<Answer> {
    let url = |path: &str| format!("http://{authority}{path}");
    let http = client();
    let mut answers = Vec::new();
    for path in ["/hello", "/nope", "/stream?mib=x", "/fail", "/metrics"] {
        answers.push(answer(http.get(url(path)).send().await.unwrap()).await);
    }
    answers.push(answer(http.head(url("/hello")).send().await.unwrap()).await);
    answers.push(answer(http.post(url("/hello")).send().await.unwrap()).await);
    let mebibyte: Vec<u8> = (0..1 << 20).map(|index| (index % 251) as u8).collect();
    answers.push(answer(http.post(url("/echo")).body(mebibyte).send().await.unwrap()).await);
    answers.push(answer(http.get(url("/stream")).send().await.unwrap()).await);
    // A chunked body, which reqwest sends only from a stream: raw, its answer's body compared.
    let chunked = b"POST /echo HTTP/1.1\r\nHost: guest\r\nTransfer-Encoding: chunked\r\n\
        Connection: close\r\n\r\n5\r\nhello\r\n7\r\n, guest\r\n0\r\n\r\n";
    let raw = support::raw_request(authority, chunked).await;
    let (head, body) = raw.split_once("\r\n\r\n").expect("an answer");
    assert!(head.starts_with("HTTP/1.1 200"), "chunked echo: {head}");
    answers.push(Answer {
        status: 200,
        headers: Vec::new(),
        body: dechunked(head, body).into_bytes(),
    });
    let together = (0..20).map(|_| {
        let http = http.clone();
        let url = url("/hello");
        async move { answer(http.get(url).send().await.unwrap()).await }
    });
    answers.extend(futures_util::future::join_all(together).await);
    answers
}

/// A raw answer's body, unframed when its head says it is chunked.
fn dechunked(head: &str, body: &str) -> String {
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return body.to_string();
    }
    let mut rest = body;
    let mut whole = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        whole.push_str(&after[..size]);
        rest = &after[size + 2..];
    }
    whole
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_fixture_answers_every_request_as_wasmtime_serve_does() {
    for name in FIXTURES {
        let host = host_of(name, &["--metrics-path", "off"]);
        let serve = WasmtimeServe::start(&toolchain_guest(name));
        let from_host = answers_of(host.authority()).await;
        let from_serve = answers_of(&serve.authority).await;
        assert_eq!(from_host.len(), from_serve.len());
        for (index, (ours, theirs)) in from_host.iter().zip(&from_serve).enumerate() {
            assert_eq!(
                (ours.status, &ours.headers, ours.body.len()),
                (theirs.status, &theirs.headers, theirs.body.len()),
                "{name}: request {index}"
            );
            assert!(ours.body == theirs.body, "{name}: request {index}'s body");
        }
        assert_eq!(
            from_host[8].body.len(),
            10 << 20,
            "{name}: the streamed answer"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guests_stdout_and_stderr_lines_are_log_lines_of_its_request() {
    for name in FIXTURES {
        let host = host_of(name, &[]);
        let response = support::get_with_id(&host, "/log", "printing-1").await;
        assert_eq!(response.status(), 200);
        let ours = |line: &serde_json::Value| line["request_id"] == "printing-1";
        let stdout = host.wait_for_log(|line| ours(line) && line["stream"] == "stdout");
        assert_eq!(stdout["message"], "a line on stdout", "{name}");
        assert_eq!(stdout["level"], "INFO");
        let stderr = host.wait_for_log(|line| ours(line) && line["stream"] == "stderr");
        assert_eq!(stderr["message"], "a line on stderr", "{name}");
        assert_eq!(stderr["level"], "WARN");
        let trace_id = stderr["trace_id"].as_str().unwrap_or_default();
        assert_eq!(
            trace_id.len(),
            32,
            "{name}: the line carries the request's trace id"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_stderr_is_cut_at_the_requests_bounds_and_the_rest_counted() {
    let host = host_of("python-guest", &[]);
    let response = support::get_with_id(&host, "/log-flood", "flood-1").await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "flooded\n");
    let warned = host.wait_for_log(|line| {
        line["request_id"] == "flood-1"
            && line["message"]
                .as_str()
                .is_some_and(|message| message.contains("past its bounds"))
    });
    assert_eq!(warned["level"], "WARN");
    let samples = prometheus::scrape(&host).await;
    let dropped = prometheus::value(
        &samples,
        "guest_telemetry_dropped_total",
        &[("signal", "output")],
    );
    // 20,000 lines of 100 bytes: 256 lines fit a request's bounds.
    assert_eq!(dropped, 20_000.0 - 256.0);
    let logged =
        host.log_lines_where(|line| line["request_id"] == "flood-1" && line["stream"] == "stderr");
    assert_eq!(logged.len(), 256);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_owns_metrics_once_the_host_moves_its_page_or_serves_none() {
    let guests_page = "# the guest's own metrics\n";
    let off = host_of("js-guest", &["--metrics-path", "off"]);
    let page = client().get(off.url("/metrics")).send().await.unwrap();
    assert_eq!(page.text().await.unwrap(), guests_page);

    let moved = host_of("js-guest", &["--metrics-path", "/host/metrics"]);
    let page = client().get(moved.url("/metrics")).send().await.unwrap();
    assert_eq!(page.text().await.unwrap(), guests_page);
    let hosts = client()
        .get(moved.url("/host/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(hosts.status(), 200);
    assert!(hosts.text().await.unwrap().contains("http_requests_total"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trap_while_a_head_requests_body_streams_is_logged_and_counted() {
    // StarlingMonkey ends a body whose stream failed without trapping: Python's uncaught
    // exception traps.
    for name in ["python-guest"] {
        let host = host_of(name, &[]);
        let response = client()
            .head(host.url("/trap-in-body"))
            .header("x-request-id", "head-trap")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{name}: the head was sent");
        let failed =
            host.wait_for_log(|line| line["request_id"] == "head-trap" && line["level"] == "ERROR");
        assert!(
            failed["message"]
                .as_str()
                .is_some_and(|message| message.contains("after its response head")),
            "{name}: {failed}"
        );
        let samples = prometheus::scrape(&host).await;
        let traps = prometheus::value(&samples, "guest_traps_total", &[("when", "in_body")]);
        assert_eq!(traps, 1.0, "{name}");
    }
}

/// A plain HTTP server on loopback that answers every request `pong` and keeps each request's
/// head, as an allowed destination would.
struct Destination {
    port: u16,
    heads: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Destination {
    async fn start() -> Destination {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = std::sync::Arc::clone(&heads);
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let kept = std::sync::Arc::clone(&kept);
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") && head.len() < 65536 {
                        if socket.read(&mut byte).await.unwrap_or(0) == 0 {
                            return;
                        }
                        head.push(byte[0]);
                    }
                    kept.lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&head).into_owned());
                    let answer =
                        b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\nconnection: close\r\n\r\npong";
                    let _ = socket.write_all(answer).await;
                });
            }
        });
        Destination { port, heads }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_outbound_call_succeeds_with_the_requests_traceparent_in_a_child_span() {
    let destination = Destination::start().await;
    let mut agent = support::jaeger::Agent::start();
    let agent_port = agent.port.to_string();
    let allowed = format!("http://127.0.0.1:{}", destination.port);
    let host = Host::builder()
        .guest_at(&toolchain_guest("js-guest"))
        .flags(&["--probe-path", "/hello", "--allow-outbound", &allowed])
        .env(&[
            ("OTEL_EXPORTER_JAEGER_AGENT_HOST", "127.0.0.1"),
            ("OTEL_EXPORTER_JAEGER_AGENT_PORT", agent_port.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ])
        .start();
    let to = format!("http://127.0.0.1:{}/ping", destination.port);
    let response = client()
        .get(host.url("/call"))
        .query(&[("to", to.as_str())])
        .header("x-request-id", "calling-out")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "called: 200 pong");

    let spans = agent.wait_for(|spans| {
        spans
            .iter()
            .any(|span| span.str_tag("span.kind") == Some("client"))
            && spans
                .iter()
                .any(|span| span.str_tag("span.kind") == Some("server"))
    });
    let server = spans
        .iter()
        .find(|span| {
            span.str_tag("span.kind") == Some("server") && span.operation_name.contains("/call")
        })
        .or_else(|| {
            spans
                .iter()
                .find(|span| span.str_tag("span.kind") == Some("server"))
        })
        .expect("the request's server span");
    let call = spans
        .iter()
        .find(|span| span.str_tag("span.kind") == Some("client"))
        .expect("the call's client span");
    assert_eq!(call.trace_id, server.trace_id, "one trace");
    assert_eq!(
        call.parent_span_id, server.span_id,
        "the call is the request's child"
    );
    assert_eq!(call.operation_name, "GET");
    assert_eq!(call.long_tag("http.response.status_code"), Some(200));
    let heads = destination.heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 1);
    let traceparent = format!("00-{:032x}-{:016x}-01", call.trace_id, call.span_id);
    assert!(
        heads[0]
            .to_ascii_lowercase()
            .contains(&format!("traceparent: {traceparent}")),
        "the destination saw {}",
        heads[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_outbound_call_is_logged_with_its_cause_and_never_leaves() {
    let destination = Destination::start().await;
    let host = host_of("js-guest", &[]);
    let to = format!("http://127.0.0.1:{}/ping", destination.port);
    let response = client()
        .get(host.url("/call"))
        .query(&[("to", to.as_str())])
        .header("x-request-id", "denied-call")
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        502,
        "the guest's own answer to a failed fetch"
    );
    let denied = host.wait_for_log(|line| {
        line["request_id"] == "denied-call" && line["message"] == "outgoing request denied"
    });
    assert_eq!(denied["level"], "WARN");
    assert_eq!(denied["cause"], "not in --allow-outbound");
    assert_eq!(
        denied["destination"],
        format!("http://127.0.0.1:{}", destination.port)
    );
    assert!(destination.heads.lock().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_call_that_never_answers_ends_with_the_requests_deadline() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    // Accepts, then says nothing for as long as the test runs.
    let _holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            held.push(socket);
        }
    });
    let allowed = format!("http://127.0.0.1:{port}");
    let host = host_of(
        "js-guest",
        &["--allow-outbound", &allowed, "--request-timeout-ms", "1000"],
    );
    let started = Instant::now();
    let to = format!("http://127.0.0.1:{port}/never");
    let response = client()
        .get(host.url("/call"))
        .query(&[("to", to.as_str())])
        .send()
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(
        [502, 503].contains(&response.status().as_u16()),
        "{}",
        response.status()
    );
    assert!(
        took < Duration::from_secs(4),
        "the call outlived the deadline: {took:?}"
    );
}
