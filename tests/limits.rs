//! End-to-end tests of isolation and limits: hostile guests (`fixtures/hostile-guest`,
//! `fixtures/panicking-guest`), hostile clients, and graceful shutdown. The host must answer with
//! the contract's errors and keep serving.

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::jaeger::Agent;
use support::{Host, client, get, hostile_host, raw_request};

async fn assert_still_serving(host: &Host) {
    assert_eq!(
        get(host, "/api/health").await.0,
        200,
        "the host stopped serving"
    );
}

#[tokio::test]
async fn a_trapping_guest_gets_500_quickly() {
    // It fails its probe as it fails everything: loaded unprobed.
    let host = Host::builder()
        .guest("panicking-guest")
        .env(&[("GUEST_PROBE_PATH", "off")])
        .start();
    let started = Instant::now();
    let (status, body) = get(&host, "/api/health").await;
    assert_eq!(
        (status, body),
        (500, json!({"error": "Internal server error"}))
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_looping_guest_is_stopped_at_the_deadline_with_503() {
    let host = hostile_host(&[("REQUEST_TIMEOUT_MS", "500")]);
    let started = Instant::now();
    let (status, body) = get(&host, "/loop").await;
    let elapsed = started.elapsed();
    assert_eq!((status, body), (503, json!({"error": "Request timed out"})));
    assert!(
        elapsed >= Duration::from_millis(500) && elapsed < Duration::from_secs(5),
        "took {elapsed:?}"
    );
    assert_still_serving(&host).await;
}

#[tokio::test]
async fn a_body_that_makes_progress_is_sent_whole_past_the_deadline() {
    // 31 values, one every 100 ms: 3 s of body against a 500 ms deadline and a 1 s stall bound.
    let host = hostile_host(&[("REQUEST_TIMEOUT_MS", "500"), ("RESPONSE_STALL_MS", "1000")]);
    let started = Instant::now();
    let (status, body) = get(&host, "/trickle").await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!(vec![0; 31]),
        "the body, after {:?}",
        started.elapsed()
    );
    assert!(started.elapsed() > Duration::from_millis(2500));
    let errors = host.log_lines_where(|line| line["level"] == "ERROR");
    assert!(errors.is_empty(), "{errors:#?}");
}

/// Sends `GET path` and reads until the host closes the connection: a 200 whose chunked body
/// was cut short, never ended like a whole one. Returns it and how long it took.
async fn read_until_cut(host: &Host, path: &str) -> (String, Duration) {
    let started = Instant::now();
    let request = format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n");
    let answer = raw_request(host.authority(), request.as_bytes()).await;
    let took = started.elapsed();
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "{}",
        &answer[..answer.len().min(200)]
    );
    assert!(
        !answer.ends_with("0\r\n\r\n"),
        "a cut body ended like a whole one"
    );
    (answer, took)
}

/// The ERROR line of a body cut short, with the request's id and the `bound` that cut it.
fn assert_cut_by(host: &Host, bound: &str) {
    let line = host.wait_for_log(|line| {
        line["level"] == "ERROR"
            && line["message"] == "guest failed while streaming its body; response cut short"
    });
    let error = line["error"].as_str().unwrap_or_default();
    assert!(error.contains(bound), "{line}");
    assert!(line["request_id"].is_string(), "{line}");
}

#[tokio::test]
async fn a_guest_that_streams_for_ever_is_stopped_at_the_response_timeout() {
    let host = hostile_host(&[
        ("RESPONSE_TIMEOUT_MS", "1500"),
        ("RESPONSE_STALL_MS", "1000"),
    ]);
    let (_, took) = read_until_cut(&host, "/stream-forever").await;
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(10),
        "cut after {took:?}"
    );
    assert_cut_by(&host, "--response-timeout-ms");
    assert_still_serving(&host).await;
}

#[tokio::test]
async fn a_guest_that_stops_writing_mid_body_is_cut_at_the_stall_bound() {
    let host = hostile_host(&[("RESPONSE_STALL_MS", "1000")]);
    let (answer, took) = read_until_cut(&host, "/stall-mid-body").await;
    assert!(answer.contains("[0,"), "{answer}");
    // Well before the 10 s deadline, which no longer bounds a body.
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(8),
        "cut after {took:?}"
    );
    assert_cut_by(&host, "--response-stall-ms");
    // The instance was stopped, not left computing: the host is idle once the body is cut.
    // Read from /proc in 10 ms ticks: `process_cpu_seconds_total` counts whole seconds, and a
    // window across one of them read as a second spent.
    let before = support::cpu_seconds(host.pid());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let spent = support::cpu_seconds(host.pid()) - before;
    assert!(spent < 1.0, "{spent} s of CPU in 2 s after the cut");
    assert_still_serving(&host).await;
}

#[tokio::test]
async fn metrics_and_health_answer_while_guests_loop_on_every_core() {
    let host = hostile_host(&[("REQUEST_TIMEOUT_MS", "4000")]);
    let loops: Vec<_> = (0..2)
        .map(|_| {
            let url = host.url("/loop");
            tokio::spawn(async move { client().get(url).send().await.unwrap().status().as_u16() })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    for path in ["/metrics", "/api/health"] {
        let started = Instant::now();
        assert_eq!(
            client().get(host.url(path)).send().await.unwrap().status(),
            200
        );
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{path} took {:?}",
            started.elapsed()
        );
    }
    for looping in loops {
        assert_eq!(looping.await.unwrap(), 503);
    }
}

#[tokio::test]
async fn a_guest_that_hoards_memory_gets_500_at_its_cap() {
    let host = hostile_host(&[("GUEST_MEMORY_MB", "32")]);
    let started = Instant::now();
    let (status, body) = get(&host, "/hoard").await;
    assert_eq!(
        (status, body),
        (500, json!({"error": "Internal server error"}))
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    // Its log line says the limit was what it met.
    let failed = host.wait_for_log(|line| line["url.path"] == "/hoard" && line["status"] == 500);
    assert!(
        failed["error"].as_str().is_some_and(|cause| {
            cause.starts_with("the guest failed after its memory limit (--guest-memory-mb)")
        }),
        "{failed}"
    );
    assert_still_serving(&host).await;
}

#[tokio::test]
async fn the_sandboxed_guest_gets_errors_never_the_hosts_files_env_or_network() {
    let host = hostile_host(&[("SECRET_FOR_THE_GUEST", "leak")]);
    let (status, body) = get(&host, "/escape").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["file"].as_str().unwrap().starts_with("denied"),
        "{body}"
    );
    assert!(
        body["http"].as_str().unwrap().starts_with("denied"),
        "{body}"
    );
    assert_eq!(body["env"], "0 variables");
}

#[tokio::test(flavor = "multi_thread")]
async fn every_request_gets_a_fresh_instance_whatever_the_last_one_wrote() {
    let host = hostile_host(&[]);
    let fresh = json!({"counter": 0, "dirty_words": 0, "dirty_grown_bytes": 0});
    // One after the other (the pool hands the same slot back), then in bursts of 8.
    for _ in 0..20 {
        assert_eq!(get(&host, "/remember").await, (200, fresh.clone()));
    }
    for _ in 0..5 {
        let burst: Vec<_> = (0..8)
            .map(|_| {
                let url = host.url("/remember");
                tokio::spawn(async move {
                    let response = client().get(url).send().await.unwrap();
                    (
                        response.status().as_u16(),
                        response.json::<Value>().await.unwrap(),
                    )
                })
            })
            .collect();
        for answer in burst {
            assert_eq!(answer.await.unwrap(), (200, fresh.clone()));
        }
    }
}

#[tokio::test]
async fn a_read_past_the_end_of_memory_traps_even_where_an_earlier_instance_grew() {
    // One instance at a time, so the second request gets the memory the first one grew.
    let host = hostile_host(&[("MAX_INSTANCES", "1")]);
    for _ in 0..3 {
        assert_eq!(get(&host, "/remember").await.0, 200);
        let (status, body) = get(&host, "/past-the-end").await;
        assert_eq!(
            (status, body),
            (500, json!({"error": "Internal server error"}))
        );
    }
    assert_still_serving(&host).await;
}

#[tokio::test]
async fn too_many_concurrent_requests_wait_briefly_then_get_503() {
    let host = hostile_host(&[("MAX_INSTANCES", "1"), ("REQUEST_TIMEOUT_MS", "3000")]);
    let url = host.url("/loop");
    let looping =
        tokio::spawn(async move { client().get(url).send().await.unwrap().status().as_u16() });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let (status, body) = get(&host, "/api/health").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body.as_object().unwrap().len(), 1);
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "answered without waiting"
    );
    assert_eq!(looping.await.unwrap(), 503);
    assert_still_serving(&host).await;
}

#[tokio::test]
async fn garbage_bytes_are_refused_by_hyper_and_the_host_serves_on() {
    let host = Host::builder().start();
    let answer = raw_request(host.authority(), b"\x00\x01\x02 not http at all\r\n\r\n").await;
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 400"),
        "{answer:?}"
    );
    assert_still_serving(&host).await;
}

#[tokio::test]
async fn what_hyper_refuses_to_parse_is_answered_in_the_contracts_json_with_a_request_id() {
    let host = Host::builder().start();
    // A target over hyper's buffer is a 414, or a 431 when its buffer fills before the target
    // is all read.
    let malformed: [(&[u8], &[&str]); 7] = [
        (b"GET /api/health HTTP/1.1\r\nBad Header: y\r\n\r\n", &["400"]),
        (b"GET /api/health HTTP/1.1\r\nHost: t\r\nx-request-id: a\x7fb\r\n\r\n", &["400"]),
        (
            b"GET /api/health HTTP/1.1\r\nHost: t\r\nContent-Length: 99999999999999999999999\r\n\r\n",
            &["400"],
        ),
        (b"GET /api/he alth HTTP/1.1\r\nHost: t\r\n\r\n", &["400"]),
        (b"GET /api/health HTTP/9.9\r\nHost: t\r\n\r\n", &["400"]),
        (b"\x00\x01\x02 not http at all\r\n\r\n", &["400"]),
        (&[b"GET /", &[b'a'; 70_000][..], b" HTTP/1.1\r\nHost: t\r\n\r\n"].concat(), &["414", "431"]),
    ];
    for (request, statuses) in malformed {
        let answer = raw_request(host.authority(), request).await;
        let shown = &answer[..answer.len().min(300)];
        assert!(
            statuses
                .iter()
                .any(|status| answer.starts_with(&format!("HTTP/1.1 {status} "))),
            "{shown}"
        );
        let (head, body) = answer.split_once("\r\n\r\n").expect("a whole head");
        assert!(
            head.contains("\r\ncontent-type: application/json\r\n"),
            "{shown}"
        );
        let request_id = head
            .split("\r\nx-request-id: ")
            .nth(1)
            .and_then(|rest| rest.split("\r\n").next())
            .unwrap_or_else(|| panic!("no x-request-id: {shown}"));
        // The id leads to the log line of the refusal.
        host.wait_for_log(|line| {
            line["request_id"] == request_id
                && line["level"] == "WARN"
                && line["message"] == "request refused"
        });
        let body: Value = serde_json::from_str(body).expect("a JSON body");
        assert_eq!(
            body.as_object().map(|object| object.len()),
            Some(1),
            "{body}"
        );
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|message| !message.is_empty()),
            "{body}"
        );
    }
    assert_still_serving(&host).await;
}

#[tokio::test]
async fn a_head_of_64_kib_passes_one_byte_more_is_431_however_it_arrives_as_is_a_101st_field() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = Host::builder().start();
    // A head of exactly `size` bytes: the request line, two fields, and one padding it out.
    let head_of = |size: usize| {
        let start = "GET /api/health HTTP/1.1\r\nHost: t\r\nConnection: close\r\nx-pad: ";
        let pad = size - start.len() - "\r\n\r\n".len();
        format!("{start}{}\r\n\r\n", "a".repeat(pad)).into_bytes()
    };
    let status =
        |answer: &[u8]| String::from_utf8_lossy(answer.get(9..12).unwrap_or_default()).into_owned();
    for (size, expected) in [(65_536, "200"), (65_537, "431"), (110_000, "431")] {
        let head = head_of(size);
        assert_eq!(head.len(), size);
        let answer = raw_request(host.authority(), &head).await;
        assert_eq!(
            status(answer.as_bytes()),
            expected,
            "{size} bytes in one write"
        );
        // In 4 KiB pieces, the client pausing between them.
        let mut stream = tokio::net::TcpStream::connect(host.authority())
            .await
            .unwrap();
        for piece in head.chunks(4096) {
            if stream.write_all(piece).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let mut answer = Vec::new();
        let _ =
            tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
        assert_eq!(status(&answer), expected, "{size} bytes in 4 KiB pieces");
    }
    // hyper parses at most 100 fields: Host, Connection and 98 more pass; one more is 431.
    for (more, expected) in [(98, "200"), (99, "431")] {
        let fields: String = (0..more).map(|i| format!("x-h{i}: v\r\n")).collect();
        let request =
            format!("GET /api/health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n{fields}\r\n");
        let answer = raw_request(host.authority(), request.as_bytes()).await;
        assert_eq!(status(answer.as_bytes()), expected, "{} fields", more + 2);
    }
    assert_still_serving(&host).await;
}

#[tokio::test]
async fn a_100_kb_request_line_is_refused_and_the_host_serves_on() {
    let host = Host::builder().start();
    let request = format!(
        "GET /{} HTTP/1.1\r\nhost: x\r\n\r\n",
        "a".repeat(100 * 1024)
    );
    let answer = raw_request(host.authority(), request.as_bytes()).await;
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 4"),
        "{}",
        &answer[..answer.len().min(200)]
    );
    assert_still_serving(&host).await;
}

#[tokio::test]
async fn a_half_sent_request_left_idle_is_disconnected() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = Host::builder().start();
    let mut stream = tokio::net::TcpStream::connect(host.authority())
        .await
        .unwrap();
    stream
        .write_all(b"GET /api/health HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let closed =
        tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut answer)).await;
    assert!(closed.is_ok(), "the idle connection was never closed");
    assert_still_serving(&host).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_every_request_already_sent_on_an_accepted_connection() {
    use std::io::{Read, Write};
    let mut host = Host::builder().start();
    let request = "POST /api/compute HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\
                   Content-Length: 8\r\n\r\n{\"n\":35}";
    // More computes than cores: while the first run, the host has not read the others yet.
    let mut sent: Vec<_> = (0..12)
        .map(|_| {
            let mut stream = std::net::TcpStream::connect(host.authority()).unwrap();
            stream.write_all(request.as_bytes()).unwrap();
            stream
        })
        .collect();
    std::thread::sleep(Duration::from_millis(50));
    let status = host.terminate();
    assert!(status.success(), "exit status {status:?}");
    for stream in &mut sent {
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
        assert!(answer.contains("9227465"), "{answer}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_a_running_compute_finish_flushes_spans_and_exits_0() {
    let mut agent = Agent::start();
    let port = agent.port.to_string();
    let mut host = Host::builder()
        .env(&[("OTEL_EXPORTER_JAEGER_AGENT_PORT", &port)])
        .start();
    let url = host.url("/api/compute");
    let compute = tokio::spawn(async move {
        let response = client()
            .post(url)
            .header("x-request-id", "last-words")
            .json(&json!({"n": 35}))
            .send()
            .await
            .unwrap();
        (
            response.status().as_u16(),
            response.json::<Value>().await.unwrap(),
        )
    });
    host.wait_for_log(|line| {
        line["request_id"] == "last-words" && line["message"] == "compute started"
    });
    let status = host.terminate();

    assert!(status.success(), "exit status {status:?}");
    let (code, body) = compute.await.unwrap();
    assert_eq!((code, &body["result"]), (200, &json!(9_227_465)), "{body}");
    // Spans are batched every 5 s by default: these arrive only because shutdown flushed them.
    let spans = agent.wait_for(|spans| {
        spans
            .iter()
            .any(|span| span.str_tag("request_id") == Some("last-words"))
    });
    assert!(
        spans
            .iter()
            .any(|span| span.operation_name == "compute.fibonacci")
    );
}

#[tokio::test]
async fn a_deeply_nested_body_is_a_400_not_a_stack_overflow() {
    let host = Host::builder().start();
    for depth in [100, 10_000] {
        let body = format!(r#"{{"n":{}{}}}"#, "[".repeat(depth), "]".repeat(depth));
        let response = client()
            .post(host.url("/api/compute"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "depth {depth}");
    }
    assert_still_serving(&host).await;
}

#[tokio::test]
async fn ten_thousand_leaked_nested_spans_cost_a_quota_not_the_host() {
    let mut host = hostile_host(&[]);
    for _ in 0..3 {
        assert_eq!(get(&host, "/nested-spans").await.0, 200);
    }
    assert!(host.is_running(), "the host survived the leaked spans");
    assert_still_serving(&host).await;
    let samples = support::prometheus::scrape(&host).await;
    let dropped = support::prometheus::value(
        &samples,
        "guest_telemetry_dropped_total",
        &[("signal", "span")],
    );
    assert_eq!(dropped, 3.0 * (10_000 - 128) as f64);
    let is_quota_warning = |line: &Value| {
        line["message"]
            .as_str()
            .is_some_and(|message| message.contains("telemetry quota"))
    };
    let warnings = host.wait_for_logs(3, is_quota_warning);
    assert_eq!(warnings.len(), 3, "one WARN line per request");
    assert_eq!(warnings[0]["level"], "WARN");
    assert_eq!(warnings[0]["dropped_spans"], 10_000 - 128);
}

#[tokio::test]
async fn a_log_flood_writes_a_bounded_amount_and_cannot_forge_fields() {
    let host = hostile_host(&[]);
    let before = std::fs::metadata(&host.log_file).map_or(0, |meta| meta.len());
    assert_eq!(get(&host, "/logs").await.0, 200);
    // Flushed by the log writer's thread shortly after.
    let line = host.wait_for_log(|line| line["message"] == "real message");
    let grown = std::fs::metadata(&host.log_file).unwrap().len() - before;
    assert!(grown < 1 << 20, "the log file grew by {grown} bytes");
    assert_ne!(line["request_id"], "forged");
    assert_ne!(line["trace_id"], "forged");
    assert_ne!(line["span_id"], "forged");
    assert_eq!(line["level"], "WARN");
    assert_eq!(line["guest.request_id"], "forged");
    assert_eq!(line["guest.message"], "forged");
    let samples = support::prometheus::scrape(&host).await;
    let dropped = support::prometheus::value(
        &samples,
        "guest_telemetry_dropped_total",
        &[("signal", "log")],
    );
    assert!(dropped > 19_000.0, "{dropped}");
}

#[tokio::test]
async fn an_attribute_flood_is_bounded_and_the_host_serves_on() {
    let host = hostile_host(&[]);
    let idle = host.resident_bytes();
    for _ in 0..5 {
        assert_eq!(get(&host, "/attributes").await.0, 200);
    }
    assert_still_serving(&host).await;
    let samples = support::prometheus::scrape(&host).await;
    let dropped = support::prometheus::value(
        &samples,
        "guest_telemetry_dropped_total",
        &[("signal", "attribute")],
    );
    // 256 KiB of 4 KiB values per request: at most 63 of the 20,000 get through.
    assert!(dropped >= 5.0 * 19_900.0, "{dropped}");
    assert!(
        host.resident_bytes() < idle + (64 << 20),
        "resident memory grew from {} to {} MiB",
        idle >> 20,
        host.resident_bytes() >> 20
    );
}

#[tokio::test]
async fn a_host_header_that_is_not_an_authority_is_a_400_not_a_server_fault() {
    let host = Host::builder().start();
    for request in [
        &b"GET /api/health HTTP/1.1\r\nHost: \xff\r\nConnection: close\r\n\r\n"[..],
        b"GET /api/health HTTP/1.1\r\nHost: a b\r\nConnection: close\r\n\r\n",
        b"GET /api/health HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: close\r\n\r\n",
        b"GET /api/health HTTP/1.1\r\nHost: a:b\r\nConnection: close\r\n\r\n",
        b"GET /api/health HTTP/1.1\r\nHost: a@b\r\nConnection: close\r\n\r\n",
        // RFC 9112: an HTTP/1.1 request without `Host` is a 400 (HTTP/1.0 may omit it).
        b"GET /api/health HTTP/1.1\r\nConnection: close\r\n\r\n",
    ] {
        let answer = raw_request(host.authority(), request).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        assert!(
            answer.ends_with(r#"{"error":"Invalid Host header"}"#),
            "{answer}"
        );
    }
    let empty_host = b"GET /api/health HTTP/1.1\r\nHost:\r\nConnection: close\r\n\r\n";
    let answer = raw_request(host.authority(), empty_host).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        host.log_lines_where(|line| line["level"] == "ERROR")
            .is_empty(),
        "a client's mistake is not a server fault"
    );
}

#[tokio::test]
async fn unknown_and_huge_methods_are_recorded_as_other_and_cut_short() {
    let host = Host::builder().start();
    let huge = "X".repeat(5_000);
    for method in ["BREW", huge.as_str()] {
        let request =
            format!("{method} /api/health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        let answer = raw_request(host.authority(), request.as_bytes()).await;
        assert!(
            answer.starts_with("HTTP/1.1 405"),
            "{}",
            &answer[..answer.len().min(100)]
        );
    }
    // Log lines reach stdout from the writer's thread, a moment after the answer.
    host.wait_for_log(|line| {
        line["message"] == "request refused" && line["http.request.method_original"] != "BREW"
    });
    let refused = host.log_lines_where(|line| line["message"] == "request refused");
    assert_eq!(refused.len(), 2, "{refused:?}");
    for line in &refused {
        assert_eq!(line["http.request.method"], "_OTHER");
        let original = line["http.request.method_original"].as_str().unwrap();
        assert!(original.len() <= 32, "{original}");
    }
    assert_eq!(refused[0]["http.request.method_original"], "BREW");
    // Both are one `_OTHER` label in the metrics; neither method appears there.
    let metrics = support::prometheus::text(&host).await;
    assert!(
        metrics
            .contains(r#"http_requests_total{method="_OTHER",route="/api/health",status="405"} 2"#),
        "{metrics}"
    );
    assert!(!metrics.contains("BREW") && !metrics.contains("XXXX"));
    // A standard method is itself, and has no original.
    get(&host, "/api/health").await;
    let health = host.wait_for_log(|line| line["message"] == "health check");
    assert_eq!(health["http.request.method"], "GET");
    assert!(health.get("http.request.method_original").is_none());
}

#[tokio::test]
async fn half_sent_bodies_get_408_at_the_body_deadline_and_lose_their_connection() {
    let host = hostile_host(&[("BODY_TIMEOUT_MS", "500")]);
    let started = Instant::now();
    let half_sent = b"POST /api/compute HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\
                      Content-Length: 1048576\r\n\r\n{\"n\": 1, ";
    let answers: Vec<_> = (0..100)
        .map(|_| {
            let authority = host.authority().to_string();
            tokio::spawn(async move { raw_request(&authority, half_sent).await })
        })
        .collect();
    for answer in answers {
        let answer = answer.await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.ends_with(r#"{"error":"Request body not received in time"}"#));
    }
    // raw_request returns when the host closes the connection.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_still_serving(&host).await;
}

/// Sends `head` and `body_bytes` of spaces whole, over a blocking socket, then reads the answer
/// to its end: what the write and the read gave, the answer, and how long it all took.
async fn send_whole(
    host: &Host,
    head: &str,
    body_bytes: usize,
) -> (
    std::io::Result<()>,
    std::io::Result<usize>,
    String,
    Duration,
) {
    let authority = host.authority().to_string();
    let head = head.replace("{length}", &body_bytes.to_string());
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let started = Instant::now();
        let mut stream = std::net::TcpStream::connect(authority).unwrap();
        // A host that neither reads nor closes fails the test instead of hanging it.
        stream
            .set_write_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let sent = stream
            .write_all(head.as_bytes())
            .and_then(|()| stream.write_all(&vec![b' '; body_bytes]));
        let mut answer = String::new();
        let read = stream.read_to_string(&mut answer);
        (sent, read, answer, started.elapsed())
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn the_metrics_page_answers_a_body_over_the_limit_413_whatever_the_method() {
    let host = Host::builder().env(&[("MAX_BODY_BYTES", "100")]).start();
    let over = "x".repeat(101);
    let requests = [
        (
            format!("GET /metrics HTTP/1.1\r\nHost: t\r\nContent-Length: 101\r\n\r\n{over}"),
            "413",
        ),
        // 0x65 = 101 bytes, known over the limit only once read.
        (
            format!(
                "GET /metrics HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n\
                 65\r\n{over}\r\n0\r\n\r\n"
            ),
            "413",
        ),
        (
            format!("POST /metrics HTTP/1.1\r\nHost: t\r\nContent-Length: 101\r\n\r\n{over}"),
            "413",
        ),
        (
            "POST /metrics HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nConnection: close\r\n\r\nsmall"
                .to_string(),
            "405",
        ),
        (
            "GET /metrics HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nConnection: close\r\n\r\nsmall"
                .to_string(),
            "200",
        ),
    ];
    for (request, status) in requests {
        let answer = raw_request(host.authority(), request.as_bytes()).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{request:?}: {answer}"
        );
        if status == "413" {
            assert!(
                answer.ends_with(r#"{"error":"Request body too large"}"#),
                "{answer}"
            );
            assert!(answer.contains("x-request-id: "), "{answer}");
        }
    }
    // Labelled as the host's own route, and the refusal's line says why.
    let samples = support::prometheus::scrape(&host).await;
    let labels = [("method", "GET"), ("route", "/metrics"), ("status", "413")];
    let refused = support::prometheus::value(&samples, "http_requests_total", &labels);
    assert_eq!(refused, 2.0);
    let lines = host.wait_for_logs(3, |line| line["status"] == 413);
    assert_eq!(lines.len(), 3, "{lines:?}");
    for line in lines {
        let cause = line["error"].as_str().unwrap_or_default();
        assert!(cause.contains("--max-body-bytes"), "{line}");
    }
    assert_still_serving(&host).await;
}

#[tokio::test]
async fn a_client_that_sends_all_of_a_body_the_host_will_not_read_still_reads_its_answer() {
    use host::edge::client_stream::LINGER_IDLE;
    let host = Host::builder().start();
    // Far more than the default 1 MiB limit, and more than the kernel's buffers on both ends
    // hold: the host must read and discard the rest, or the client's write fails on a reset.
    let body_bytes = 48 << 20;
    let over_the_limit = "POST /api/compute HTTP/1.1\r\nHost: t\r\n\
                          Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n";
    let bad_host = "POST /api/compute HTTP/1.1\r\nHost: a b\r\n\
                    Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n";
    for (head, status) in [(over_the_limit, "413"), (bad_host, "400")] {
        let (sent, read, answer, took) = send_whole(&host, head, body_bytes).await;
        sent.expect("the body was not taken in full");
        read.expect("the answer was not read in full");
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{answer}"
        );
        assert!(answer.contains("connection: close"), "{answer}");
        // The host ended its side before it drained: the client read the end at once, not
        // when the drain gave up.
        assert!(took < LINGER_IDLE, "{took:?}");
    }
    assert_still_serving(&host).await;
}

#[tokio::test]
async fn a_full_table_of_idle_connections_gives_way_to_a_newcomer() {
    let host = hostile_host(&[("MAX_CONNECTIONS", "8")]);
    let mut idle = Vec::new();
    for _ in 0..8 {
        idle.push(
            tokio::net::TcpStream::connect(host.authority())
                .await
                .unwrap(),
        );
    }
    // Give the accept loop the time to take all eight.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let answer = raw_request(
        host.authority(),
        b"GET /api/health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // The idle connection that waited longest was closed for it.
    use tokio::io::AsyncReadExt;
    let mut first = idle.remove(0);
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(2), first.read_to_end(&mut rest)).await;
    assert!(matches!(closed, Ok(Ok(0))), "{closed:?}");
}

#[tokio::test]
async fn connections_over_the_cap_all_being_answered_get_503_and_the_host_serves_again_after() {
    let host = hostile_host(&[
        ("MAX_CONNECTIONS", "4"),
        ("MAX_INSTANCES", "4"),
        ("REQUEST_TIMEOUT_MS", "1500"),
    ]);
    let looping: Vec<_> = (0..4)
        .map(|_| {
            let authority = host.authority().to_string();
            tokio::spawn(async move {
                raw_request(&authority, b"GET /loop HTTP/1.1\r\nHost: t\r\n\r\n").await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answer = raw_request(
        host.authority(),
        b"GET /api/health HTTP/1.1\r\nHost: t\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.ends_with(r#"{"error":"Server busy, try again"}"#),
        "{answer}"
    );
    drop(looping);
    let deadline = Instant::now() + Duration::from_secs(10);
    let healthy = || async {
        let response = client().get(host.url("/api/health")).send().await;
        response.is_ok_and(|response| response.status() == 200)
    };
    while !healthy().await {
        assert!(
            Instant::now() < deadline,
            "the host did not take connections again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_client_that_never_reads_its_answers_loses_its_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = hostile_host(&[("RESPONSE_STALL_MS", "2000")]);
    let mut stalled = tokio::net::TcpStream::connect(host.authority())
        .await
        .unwrap();
    // A thousand pipelined scrapes, about 10 MB of answers the client does not read.
    let requests = b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n".repeat(1000);
    let (mut reader, mut writer) = stalled.split();
    let _ = tokio::time::timeout(Duration::from_secs(2), writer.write_all(&requests)).await;
    // Past the host's stall bound (`--response-stall-ms`, 2 s here) the connection is closed:
    // reading now finds an end long before the thousandth answer.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut answers = Vec::new();
    let read =
        tokio::time::timeout(Duration::from_secs(20), reader.read_to_end(&mut answers)).await;
    assert!(read.is_ok(), "the stalled connection was never closed");
    let answered = String::from_utf8_lossy(&answers)
        .matches("HTTP/1.1 200")
        .count();
    assert!(
        answered < 1000,
        "all {answered} answers were written: never stalled"
    );
    assert_still_serving(&host).await;
}

#[tokio::test]
async fn a_client_that_never_reads_gives_way_to_a_newcomer_when_the_table_is_full() {
    use tokio::io::AsyncWriteExt;
    // One connection at a time: the stalled one is waiting on its client, not answering.
    let host = hostile_host(&[("MAX_CONNECTIONS", "1")]);
    let mut stalled = tokio::net::TcpStream::connect(host.authority())
        .await
        .unwrap();
    let requests = b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n".repeat(1000);
    let writing = tokio::spawn(async move {
        let _ = stalled.write_all(&requests).await;
        stalled
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let answer = raw_request(
        host.authority(),
        b"GET /api/health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    drop(writing);
}

#[tokio::test]
async fn guest_arguments_are_read_within_the_quotas_not_copied_whole() {
    let mut host = hostile_host(&[]);
    let idle = host.resident_bytes();
    // A thousand attribute keys that all point at one 64 MiB string in guest memory.
    assert_eq!(get(&host, "/aliased-attributes").await.0, 200);
    assert!(host.is_running());
    assert_still_serving(&host).await;
    assert!(
        host.resident_bytes() < idle + (256 << 20),
        "resident memory grew from {} to {} MiB",
        idle >> 20,
        host.resident_bytes() >> 20
    );
    let samples = support::prometheus::scrape(&host).await;
    let dropped = support::prometheus::value(
        &samples,
        "guest_telemetry_dropped_total",
        &[("signal", "attribute")],
    );
    assert_eq!(dropped, 1_000.0);
}

#[tokio::test]
async fn a_guest_passing_a_100_mib_name_to_the_store_traps_before_it_is_copied() {
    let mut host = hostile_host(&[]);
    let idle = host.resident_bytes();
    let (status, body) = get(&host, "/huge-name").await;
    assert_eq!(status, 500, "{body}");
    assert!(host.is_running());
    // The guest's own 100 MiB are host memory too (its linear memory); a copy would add more.
    assert!(
        host.resident_bytes() < idle + (128 << 20) + (32 << 20),
        "resident memory grew from {} to {} MiB",
        idle >> 20,
        host.resident_bytes() >> 20
    );
    assert_still_serving(&host).await;
}
