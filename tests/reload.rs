//! End-to-end tests of swapping the guest while the host runs: `SIGHUP` and `--watch`, under
//! load, with bad components, and the compiled-component cache across starts.

mod support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::jaeger::Agent;
use support::swaps::{
    alternating, answers_while_swapping, assert_every_answer_ok, health, replace_by_rename,
    wait_for_version,
};
use support::{Host, client, guest_path};

const REAL_VERSION: &str = "0.1.0";
const MINIMAL_VERSION: &str = "2.0.0";

/// A copy of the real guest in a fresh directory, for a host to serve and a test to replace.
fn live_guest() -> PathBuf {
    let live = support::tempdir().join("live.wasm");
    std::fs::copy(guest_path("guest"), &live).unwrap();
    live
}

async fn reloads(host: &Host, result: &str) -> f64 {
    let samples = support::prometheus::scrape(host).await;
    support::prometheus::value(&samples, "guest_reloads_total", &[("result", result)])
}

fn count_lines(host: &Host, message: &str) -> usize {
    host.log_lines_where(|line| line["message"] == message)
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_swaps_under_steady_load_fail_not_one_request() {
    let live = live_guest();
    let host = Arc::new(Host::builder().guest_at(&live).start());
    let swaps = alternating(
        (guest_path("minimal-guest"), MINIMAL_VERSION),
        (guest_path("guest"), REAL_VERSION),
        10,
    );
    let answers = answers_while_swapping(&host, &live, &swaps).await;
    assert_every_answer_ok(&answers, &[REAL_VERSION, MINIMAL_VERSION]);
    assert_eq!(reloads(&host, "success").await, 10.0);
    assert_eq!(reloads(&host, "failure").await, 0.0);
    let reloaded = host.wait_for_log(|line| {
        line["message"] == "guest reloaded" && line["new_version"] == MINIMAL_VERSION
    });
    assert_eq!(reloaded["old_version"], REAL_VERSION);
}

#[tokio::test]
async fn garbage_another_world_and_a_failing_guest_are_rejected_while_the_old_guest_serves() {
    let live = live_guest();
    let host = Host::builder().guest_at(&live).start();
    let garbage = support::tempdir().join("garbage.wasm");
    std::fs::write(&garbage, b"\0asm\x0d\0\x01\0 and then nothing that parses").unwrap();
    let rejected = [
        garbage,
        guest_path("command-component"),
        guest_path("panicking-guest"),
    ];

    for (attempt, source) in rejected.iter().enumerate() {
        replace_by_rename(&live, source);
        host.signal("HUP");
        let deadline = Instant::now() + Duration::from_secs(20);
        while count_lines(
            &host,
            "guest reload rejected; the running guest keeps serving",
        ) < attempt + 1
        {
            assert!(
                Instant::now() < deadline,
                "{} was never rejected",
                source.display()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (status, body) = health(&host).await;
        assert_eq!(
            (status, body["version"].as_str()),
            (200, Some(REAL_VERSION)),
            "after {}",
            source.display()
        );
    }
    let errors: Vec<Value> = host.log_lines_where(|line| line["level"] == "ERROR");
    assert_eq!(
        errors.len(),
        3,
        "one error line per rejected reload: {errors:#?}"
    );
    assert!(
        errors
            .iter()
            .all(|line| line["error"].as_str().is_some_and(|why| !why.is_empty()))
    );
    assert_eq!(reloads(&host, "failure").await, 3.0);
    assert_eq!(reloads(&host, "success").await, 0.0);
}

/// Waits until `count` lines with `message` have been logged, or panics after 20 s.
async fn wait_for_lines(host: &Host, message: &str, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while count_lines(host, message) < count {
        assert!(
            Instant::now() < deadline,
            "never logged {count} x {message:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_probe_path_is_a_flag_and_off_swaps_in_a_guest_unprobed() {
    // Probed on a path the real guest answers 404: even the real guest is refused, at start as
    // on a reload (one rule for both), with the probe's answer in one line.
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_host"));
    command
        .args(["--port", "0", "--bind", "127.0.0.1", "--guest"])
        .arg(live_guest())
        .env("GUEST_PROBE_PATH", "/api/nope?x=1");
    let output = support::run_to_exit(command, Duration::from_secs(60));
    assert!(!output.status.success(), "a guest failing its probe served");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("failed its probe")
            && stderr.contains("/api/nope?x=1")
            && stderr.contains("404")
            && stderr.contains("--probe-path off")
            && stderr.trim().lines().count() == 1,
        "{stderr}"
    );
    // Probing off: a guest that fails every request is swapped in all the same.
    let live = live_guest();
    let host = Host::builder()
        .guest_at(&live)
        .env(&[("GUEST_PROBE_PATH", "off")])
        .start();
    replace_by_rename(&live, &guest_path("panicking-guest"));
    host.signal("HUP");
    wait_for_lines(&host, "guest reloaded", 1).await;
    assert_eq!(health(&host).await.0, 500);
    assert_eq!(reloads(&host, "success").await, 1.0);
}

#[test]
fn a_guest_that_traps_on_its_probe_is_refused_at_start() {
    let start = |probe: &str| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_host"));
        command
            .args([
                "--port",
                "0",
                "--bind",
                "127.0.0.1",
                "--probe-path",
                probe,
                "--guest",
            ])
            .arg(guest_path("panicking-guest"));
        // A host that starts keeps running: killed at the limit, which is failure enough here.
        support::run_to_exit(command, Duration::from_secs(20))
    };
    let refused = start("/api/health");
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("failed its probe"), "{stderr}");
    // The contract's start-up error: one line, naming the path and the fix.
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("panicking"), "{stderr}");
    assert!(stderr.contains("make build"), "{stderr}");
}

#[test]
fn a_probe_path_that_is_not_a_path_is_refused_at_start() {
    for bad in ["api/health", "/a b", "/tab\there"] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_host"))
            .args(["--probe-path", bad, "--port", "0"])
            .output()
            .unwrap();
        assert!(!output.status.success(), "{bad:?} was accepted");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("--probe-path"), "{bad:?}: {stderr}");
    }
}

/// Sends `method path` with `body` and request id `request_id`; the status and JSON body.
async fn send(
    host: &Host,
    method: &str,
    path: &str,
    body: Vec<u8>,
    request_id: &str,
) -> (u16, Value) {
    let response = client()
        .request(method.parse().unwrap(), host.url(path))
        .header("x-request-id", request_id)
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_guest_with_routes_the_host_never_heard_of_is_labelled_and_limited_by_them() {
    let mut agent = Agent::start();
    let port = agent.port.to_string();
    let live = live_guest();
    let host = Host::builder()
        .guest_at(&live)
        .env(&[
            ("MAX_BODY_BYTES", "1024"),
            ("OTEL_EXPORTER_JAEGER_AGENT_HOST", "127.0.0.1"),
            ("OTEL_EXPORTER_JAEGER_AGENT_PORT", &port),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ])
        .start();
    replace_by_rename(&live, &guest_path("orders-guest"));
    host.signal("HUP");
    wait_for_version(&host, "3.0.0").await;

    let small = b"hello".to_vec();
    let large = vec![b'x'; 2048];
    assert_eq!(
        send(&host, "PUT", "/api/orders/42", small.clone(), "put-small").await,
        (200, json!({"id": "42", "bytes": 5}))
    );
    // Over the limit: the host answers 413 before the guest runs, whatever the path and method.
    assert_eq!(
        send(&host, "PUT", "/api/orders/42", large.clone(), "put-large").await,
        (413, json!({"error": "Request body too large"}))
    );
    for (method, path) in [
        ("GET", "/api/health"),
        ("POST", "/api/orders/42"),
        ("GET", "/api/users"),
    ] {
        assert_eq!(
            send(&host, method, path, large.clone(), "large").await.0,
            413,
            "{method} {path}"
        );
    }
    // Within the limit, a method the guest does not answer (405) and an unknown path (no route
    // named, 404) are the guest's.
    assert_eq!(
        send(&host, "POST", "/api/orders/42", small.clone(), "post-small")
            .await
            .0,
        405
    );
    assert_eq!(
        send(&host, "GET", "/api/users", small, "old-route").await.0,
        404
    );
    let samples = support::prometheus::scrape(&host).await;
    let requests = |method: &str, route: &str, status: &str| {
        support::prometheus::value(
            &samples,
            "http_requests_total",
            &[("method", method), ("route", route), ("status", status)],
        )
    };
    assert_eq!(requests("PUT", "/api/orders/{id}", "200"), 1.0);
    assert_eq!(requests("PUT", "unmatched", "413"), 1.0);
    assert_eq!(requests("POST", "/api/orders/{id}", "405"), 1.0);
    assert_eq!(requests("GET", "unmatched", "404"), 1.0);
    assert!(
        samples
            .iter()
            .all(|sample| !sample.labels.values().any(|value| value.contains("/42"))),
        "a raw path reached a label"
    );
    let spans = agent.wait_for(|spans| {
        spans
            .iter()
            .any(|span| span.str_tag("request_id") == Some("old-route"))
    });
    let server_span = |request_id: &str| {
        spans
            .iter()
            .find(|span| {
                span.str_tag("span.kind") == Some("server")
                    && span.str_tag("request_id") == Some(request_id)
            })
            .unwrap_or_else(|| panic!("no server span for {request_id}"))
            .clone()
    };
    let put = server_span("put-small");
    assert_eq!(put.operation_name, "HTTP PUT /api/orders/{id}");
    assert_eq!(put.str_tag("http.route"), Some("/api/orders/{id}"));
    assert_eq!(put.str_tag("url.path"), Some("/api/orders/42"));
    assert_eq!(
        server_span("put-large").long_tag("http.response.status_code"),
        Some(413)
    );
    assert_eq!(
        server_span("old-route").operation_name,
        "HTTP GET unmatched"
    );

    // The real guest back: its API and its labels again, the orders gone; no restart.
    replace_by_rename(&live, &guest_path("guest"));
    host.signal("HUP");
    wait_for_version(&host, REAL_VERSION).await;
    assert_eq!(
        send(&host, "PUT", "/api/orders/42", Vec::new(), "orders-gone")
            .await
            .0,
        404
    );
    let (status, _) = send(&host, "GET", "/api/users/nobody", Vec::new(), "lookup").await;
    assert_eq!(status, 404);
    let samples = support::prometheus::scrape(&host).await;
    assert_eq!(
        support::prometheus::value(
            &samples,
            "http_requests_total",
            &[
                ("method", "GET"),
                ("route", "/api/users/{id}"),
                ("status", "404")
            ],
        ),
        1.0
    );
    assert_eq!(
        support::prometheus::value(&samples, "user_lookups_total", &[("result", "failure")]),
        1.0
    );
}

#[tokio::test]
async fn a_guest_naming_routes_in_a_loop_grows_neither_its_span_nor_its_labels() {
    let mut agent = Agent::start();
    let port = agent.port.to_string();
    let host = Host::builder()
        .guest("orders-guest")
        .env(&[
            ("OTEL_EXPORTER_JAEGER_AGENT_HOST", "127.0.0.1"),
            ("OTEL_EXPORTER_JAEGER_AGENT_PORT", &port),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ])
        .start();
    let (status, _) = send(&host, "GET", "/api/renaming", Vec::new(), "renaming").await;
    assert_eq!(status, 200);
    let spans = agent.wait_for(|spans| {
        spans
            .iter()
            .any(|span| span.str_tag("request_id") == Some("renaming"))
    });
    let span = spans
        .iter()
        .find(|span| span.str_tag("request_id") == Some("renaming"))
        .unwrap();
    // The first route named, then the last at the answer: not 100,000 tags.
    let routes: Vec<_> = span
        .tags
        .iter()
        .filter(|(key, _)| key == "http.route")
        .collect();
    assert!(routes.len() <= 2, "{routes:?}");
    assert_eq!(span.operation_name, "HTTP GET /api/b");
    assert_eq!(span.long_tag("http.response.status_code"), Some(200));
    let samples = support::prometheus::scrape(&host).await;
    assert_eq!(
        support::prometheus::value(
            &samples,
            "http_requests_total",
            &[("method", "GET"), ("route", "/api/b"), ("status", "200")],
        ),
        1.0
    );
}

#[tokio::test]
async fn a_guest_naming_a_template_per_request_gets_64_labels_then_other() {
    let host = Host::builder().guest("orders-guest").start();
    for n in 0..80 {
        let (status, _) = send(&host, "GET", &format!("/api/many/{n}"), Vec::new(), "many").await;
        assert_eq!(status, 200);
    }
    let samples = support::prometheus::scrape(&host).await;
    let labelled: Vec<&str> = samples
        .iter()
        .filter(|sample| sample.name == "http_requests_total")
        .filter_map(|sample| sample.labels.get("route").map(String::as_str))
        .filter(|route| route.starts_with("/api/many/"))
        .collect();
    assert_eq!(labelled.len(), 64, "{labelled:?}");
    assert_eq!(
        support::prometheus::value(
            &samples,
            "http_requests_total",
            &[("method", "GET"), ("route", "_OTHER"), ("status", "200")],
        ),
        16.0
    );
    assert_eq!(
        support::prometheus::value(
            &samples,
            "guest_telemetry_dropped_total",
            &[("signal", "route")]
        ),
        16.0
    );
    let warnings = host.log_lines_where(|line| {
        line["level"] == "WARN"
            && line["message"]
                .as_str()
                .is_some_and(|m| m.contains("route"))
    });
    assert_eq!(warnings.len(), 1, "said once per guest: {warnings:#?}");
}

#[tokio::test]
async fn a_sighup_as_soon_as_the_host_says_it_listens_reloads_and_never_kills_it() {
    for _ in 0..5 {
        let live = live_guest();
        let mut host = Host::builder().guest_at(&live).start();
        replace_by_rename(&live, &guest_path("minimal-guest"));
        host.signal("HUP");
        wait_for_version(&host, MINIMAL_VERSION).await;
        assert!(host.is_running(), "the host ended on SIGHUP");
    }
}

#[tokio::test]
async fn users_created_before_a_swap_are_listed_after_it() {
    let live = live_guest();
    let host = Host::builder().guest_at(&live).start();
    let mut created = Vec::new();
    for i in 0..3 {
        created.push(
            support::create_user(&host, &format!("U{i}"), &format!("u{i}@example.com")).await,
        );
    }
    // Away to a guest that cannot even see the store, and back.
    replace_by_rename(&live, &guest_path("minimal-guest"));
    host.signal("HUP");
    wait_for_version(&host, MINIMAL_VERSION).await;
    replace_by_rename(&live, &guest_path("guest"));
    host.signal("HUP");
    wait_for_version(&host, REAL_VERSION).await;

    assert_eq!(support::get_json(&host, "/api/users").await, json!(created));
}

#[tokio::test]
async fn with_watch_a_replaced_or_rewritten_file_is_served_without_a_signal() {
    let live = live_guest();
    let host = Host::builder()
        .guest_at(&live)
        .env(&[("GUEST_WATCH", "1")])
        .start();
    // It says so at start, naming the file it watches.
    let watching =
        host.wait_for_log(|line| line["message"] == "watching the guest file: a change reloads it");
    assert_eq!(watching["path"], live.display().to_string());
    replace_by_rename(&live, &guest_path("minimal-guest"));
    wait_for_version(&host, MINIMAL_VERSION).await;
    // Written in place this time, as a plain `cp` does.
    std::fs::write(&live, std::fs::read(guest_path("guest")).unwrap()).unwrap();
    wait_for_version(&host, REAL_VERSION).await;
}

#[test]
fn a_second_start_with_an_unchanged_guest_uses_the_compiled_component_cache() {
    let cache = support::tempdir().join("cache"); // created by the host, private
    let cache_dir = cache.to_str().unwrap();
    let start = || {
        let host = Host::builder()
            .env(&[("GUEST_CACHE_DIR", cache_dir)])
            .start();
        host.wait_for_log(|line| line["message"] == "guest loaded")
    };
    let first = start();
    let second = start();
    assert_eq!(first["cache"], "miss");
    assert_eq!(second["cache"], "hit");
    eprintln!(
        "guest load: first start {} ms (compiled), second start {} ms (cached)",
        first["load_ms"], second["load_ms"]
    );
}
