//! End-to-end tests of the telemetry the host owns: spans received by a real UDP listener and
//! decoded as Jaeger Thrift, JSON log lines on stdout and in the log file, and `/metrics` parsed
//! as Prometheus text.

mod support;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde_json::{Value, json};
use support::jaeger::{Agent, Span};
use support::{Host, client, get_with_id};

/// A host serving `guest` whose spans go to `agent`, exported every `schedule_ms`, under
/// `service_name`.
fn host_exporting_to(agent: &Agent, guest: &str, service_name: &str, schedule_ms: &str) -> Host {
    let port = agent.port.to_string();
    // A guest that fails every request fails its probe too: it is loaded unprobed.
    let probe = if guest == "panicking-guest" {
        "off"
    } else {
        "/api/health"
    };
    Host::builder()
        .guest(guest)
        .env(&[
            ("OTEL_SERVICE_NAME", service_name),
            ("OTEL_EXPORTER_JAEGER_AGENT_HOST", "127.0.0.1"),
            ("OTEL_EXPORTER_JAEGER_AGENT_PORT", &port),
            ("OTEL_BSP_SCHEDULE_DELAY", schedule_ms),
            ("GUEST_PROBE_PATH", probe),
        ])
        .start()
}

/// A host serving the real guest whose spans go to `agent`, exported every 100 ms, under
/// `service_name`.
fn traced_host(agent: &Agent, service_name: &str) -> Host {
    host_exporting_to(agent, "guest", service_name, "100")
}

/// Every span `agent` received, once each of `request_ids` has its server span among them.
fn wait_for_server_spans(agent: &mut Agent, request_ids: &[&str]) -> Vec<Span> {
    agent.wait_for(|spans| {
        request_ids
            .iter()
            .all(|id| !server_span_for(spans, id).is_empty())
    })
}

fn server_span_for<'a>(spans: &'a [Span], request_id: &str) -> Vec<&'a Span> {
    spans
        .iter()
        .filter(|span| {
            span.str_tag("span.kind") == Some("server")
                && span.str_tag("request_id") == Some(request_id)
        })
        .collect()
}

/// `POST /api/users` of a user named `A` with `email`, with `x-request-id: request_id`.
async fn create_with_id(host: &Host, request_id: &str, email: &str) -> reqwest::Response {
    let user = json!({"name": "A", "email": email});
    post_with_id(host, "/api/users", request_id, user).await
}

async fn post_with_id(host: &Host, path: &str, request_id: &str, body: Value) -> reqwest::Response {
    client()
        .post(host.url(path))
        .header("x-request-id", request_id)
        .json(&body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn every_request_gets_one_server_span_under_the_configured_service_name() {
    let mut agent = Agent::start();
    let host = traced_host(&agent, "telemetry-test-service");
    let requests = [
        ("/api/health", "span-a"),
        ("/metrics", "span-b"),
        ("/nowhere", "span-c"),
    ];
    for (path, id) in requests {
        get_with_id(&host, path, id).await;
    }
    let spans = agent.wait_for(|spans| {
        requests
            .iter()
            .all(|(_, id)| !server_span_for(spans, id).is_empty())
    });
    assert!(
        agent
            .batches()
            .iter()
            .all(|batch| batch.service_name == "telemetry-test-service")
    );

    // Let any duplicate arrive before counting.
    std::thread::sleep(Duration::from_millis(300));
    let spans = [spans, agent.wait_for(|_| true)].concat();
    let names: HashMap<&str, &str> = [
        ("span-a", "HTTP GET /api/health"),
        ("span-b", "HTTP GET /metrics"),
        ("span-c", "HTTP GET unmatched"),
    ]
    .into();
    for (path, id) in requests {
        let unique: HashSet<u64> = server_span_for(&spans, id)
            .iter()
            .map(|span| span.span_id)
            .collect();
        assert_eq!(unique.len(), 1, "{id}");
        let span = server_span_for(&spans, id)[0];
        assert_eq!(span.operation_name, names[id]);
        assert_eq!(span.str_tag("http.request.method"), Some("GET"));
        assert_eq!(span.str_tag("url.path"), Some(path));
        assert!(span.long_tag("http.response.status_code").is_some());
    }
    let health = server_span_for(&spans, "span-a")[0];
    assert_eq!(health.str_tag("http.route"), Some("/api/health"));
    assert_eq!(health.long_tag("http.response.status_code"), Some(200));
}

#[tokio::test]
async fn a_burst_leaves_in_batches_of_128_spans_without_waiting_for_the_schedule() {
    let mut agent = Agent::start();
    // A ten-minute schedule: within the test, only a full batch can leave.
    let host = host_exporting_to(&agent, "guest", "tutorial-service", "600000");
    let ids: Vec<String> = (0..256).map(|i| format!("burst-{i}")).collect();
    for id in &ids {
        get_with_id(&host, "/api/health", id).await;
    }
    let spans = agent.wait_for(|spans| spans.len() >= ids.len());
    let sizes: Vec<usize> = agent.batches().iter().map(|b| b.spans.len()).collect();
    assert_eq!(sizes, [128, 128]);
    for id in &ids {
        assert_eq!(server_span_for(&spans, id).len(), 1, "{id}");
    }
}

#[tokio::test]
async fn the_guest_spans_are_children_of_the_request_span_with_their_attributes() {
    let mut agent = Agent::start();
    let host = traced_host(&agent, "tutorial-service");
    let created: Value = create_with_id(&host, "create-1", "a@x.io")
        .await
        .json()
        .await
        .unwrap();
    let user_id = created["id"].as_str().unwrap().to_string();
    get_with_id(&host, &format!("/api/users/{user_id}"), "get-1").await;
    get_with_id(&host, "/api/users", "list-1").await;
    post_with_id(&host, "/api/compute", "compute-1", json!({"n": 15})).await;

    let expected = [
        ("create-1", "users.create"),
        ("get-1", "users.get"),
        ("list-1", "users.list"),
        ("compute-1", "compute.fibonacci"),
    ];
    let child_of = |spans: &[Span], request_id: &str, name: &str| -> Option<Span> {
        let parent = server_span_for(spans, request_id).first().copied()?;
        spans
            .iter()
            .find(|span| {
                span.operation_name == name
                    && span.parent_span_id == parent.span_id
                    && span.trace_id == parent.trace_id
            })
            .cloned()
    };
    let spans = agent.wait_for(|spans| {
        expected
            .iter()
            .all(|(id, name)| child_of(spans, id, name).is_some())
    });

    let create = child_of(&spans, "create-1", "users.create").unwrap();
    assert_eq!(create.str_tag("user.id"), Some(user_id.as_str()));
    let get = child_of(&spans, "get-1", "users.get").unwrap();
    assert_eq!(get.str_tag("user.id"), Some(user_id.as_str()));
    let list = child_of(&spans, "list-1", "users.list").unwrap();
    assert_eq!(list.long_tag("user.count"), Some(1));
    let compute = child_of(&spans, "compute-1", "compute.fibonacci").unwrap();
    assert_eq!(compute.long_tag("compute.n"), Some(15));
    assert!(compute.long_tag("compute.duration_ms").is_some());
}

#[tokio::test]
async fn error_responses_record_their_status_on_the_span() {
    let mut agent = Agent::start();
    let host = traced_host(&agent, "tutorial-service");
    get_with_id(&host, "/api/users/not-a-uuid", "miss-1").await;
    create_with_id(&host, "bad-1", "nope").await;
    let spans = wait_for_server_spans(&mut agent, &["miss-1", "bad-1"]);
    assert_eq!(
        server_span_for(&spans, "miss-1")[0].long_tag("http.response.status_code"),
        Some(404)
    );
    assert_eq!(
        server_span_for(&spans, "bad-1")[0].long_tag("http.response.status_code"),
        Some(400)
    );
}

#[tokio::test]
async fn a_5xx_marks_the_request_span_as_an_error_that_says_why_as_its_log_line_does() {
    let mut agent = Agent::start();
    let host = host_exporting_to(&agent, "panicking-guest", "tutorial-service", "100");
    get_with_id(&host, "/api/health", "boom-1").await;
    let spans = agent.wait_for(|spans| !server_span_for(spans, "boom-1").is_empty());
    let span = server_span_for(&spans, "boom-1")[0];
    assert_eq!(span.long_tag("http.response.status_code"), Some(500));
    assert_eq!(
        span.tag("error"),
        Some(&support::jaeger::TagValue::Bool(true))
    );
    // OpenTelemetry's HTTP conventions: a server error's `error.type` is its status code.
    assert_eq!(span.str_tag("error.type"), Some("500"));
    let line = host.wait_for_log(|line| line["request_id"] == "boom-1" && line["status"] == 500);
    let cause = line["error"].as_str().expect("the log line's cause");
    assert!(cause.starts_with("the guest failed"), "{cause}");
    assert_eq!(span.str_tag("otel.status_code"), Some("ERROR"));
    // The same words, cut at the span's bound when longer.
    let description = span.str_tag("otel.status_description").unwrap_or_default();
    assert!(
        description.starts_with("the guest failed") && cause.starts_with(description),
        "span: {description:?}, log: {cause:?}"
    );
}

#[tokio::test]
async fn the_request_span_carries_the_scheme_and_the_query_apart_from_the_path() {
    let mut agent = Agent::start();
    let host = traced_host(&agent, "tutorial-service");
    get_with_id(&host, "/api/health?verbose=1&x=y", "query-1").await;
    get_with_id(&host, "/api/health", "query-2").await;
    let spans = wait_for_server_spans(&mut agent, &["query-1", "query-2"]);
    let with_query = server_span_for(&spans, "query-1")[0];
    assert_eq!(with_query.str_tag("url.scheme"), Some("http"));
    assert_eq!(with_query.str_tag("url.path"), Some("/api/health"));
    assert_eq!(with_query.str_tag("url.query"), Some("verbose=1&x=y"));
    assert_eq!(with_query.str_tag("error.type"), None);
    let without = server_span_for(&spans, "query-2")[0];
    assert_eq!(without.str_tag("url.scheme"), Some("http"));
    assert_eq!(without.str_tag("url.query"), None);
}

#[tokio::test]
async fn an_incoming_traceparent_continues_the_callers_trace() {
    let mut agent = Agent::start();
    let host = traced_host(&agent, "tutorial-service");
    client()
        .get(host.url("/api/health"))
        .header("x-request-id", "continued-1")
        .header(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        )
        .send()
        .await
        .unwrap();
    let spans = agent.wait_for(|spans| !server_span_for(spans, "continued-1").is_empty());
    let span = server_span_for(&spans, "continued-1")[0];
    assert_eq!(span.trace_id, 0x0af7651916cd43dd8448eb211c80319c);
    assert_eq!(span.parent_span_id, 0xb7ad6b7169203331);
}

#[tokio::test]
async fn log_lines_are_json_and_carry_the_request_id_and_trace_id() {
    let host = Host::builder().start();
    get_with_id(&host, "/api/health", "log-me-1").await;
    get_with_id(
        &host,
        "/api/users/00000000-0000-4000-8000-000000000000",
        "log-me-2",
    )
    .await;

    let health = host.wait_for_log(|line| line["request_id"] == "log-me-1");
    for field in [
        "timestamp",
        "level",
        "message",
        "target",
        "trace_id",
        "span_id",
    ] {
        assert!(health[field].is_string(), "{field} missing in {health}");
    }
    assert_eq!(health["level"], "INFO");
    assert_eq!(health["http.request.method"], "GET");
    assert_eq!(health["http.route"], "/api/health");
    let health_lines: Vec<Value> = host.log_lines_where(|l| l["request_id"] == "log-me-1");
    assert_eq!(
        health_lines.iter().filter(|l| l["level"] == "INFO").count(),
        1,
        "{health_lines:#?}"
    );

    // A miss is logged at WARN, and the error response with its status and context.
    host.wait_for_log(|line| {
        line["request_id"] == "log-me-2"
            && line["message"] == "user not found"
            && line["level"] == "WARN"
    });
    let refused = host.wait_for_log(|line| {
        line["request_id"] == "log-me-2" && line["message"] == "request refused"
    });
    assert_eq!(refused["status"], 404);
    assert_eq!(refused["http.route"], "/api/users/{id}");
    assert!(refused["trace_id"].is_string());
}

#[tokio::test]
async fn log_lines_carry_a_trace_id_when_spans_are_not_exported() {
    for settings in [
        ("OTEL_TRACES_EXPORTER", "none"),
        ("OTEL_SDK_DISABLED", "true"),
    ] {
        let host = Host::builder().env(&[settings]).start();
        client()
            .get(host.url("/api/health"))
            .header("x-request-id", "untraced-1")
            .header(
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            )
            .send()
            .await
            .unwrap();
        get_with_id(&host, "/api/health", "untraced-2").await;
        get_with_id(&host, "/api/health", "untraced-3").await;

        let continued = host.wait_for_log(|line| line["request_id"] == "untraced-1");
        assert_eq!(
            continued["trace_id"], "0af7651916cd43dd8448eb211c80319c",
            "{settings:?}: {continued}"
        );
        let ids = |request_id: &str| {
            let line = host.wait_for_log(|line| line["request_id"] == request_id);
            let trace_id = line["trace_id"].as_str().unwrap_or_default().to_string();
            let span_id = line["span_id"].as_str().unwrap_or_default().to_string();
            assert_eq!(trace_id.len(), 32, "{settings:?}: {line}");
            assert_eq!(span_id.len(), 16, "{settings:?}: {line}");
            assert_ne!(trace_id, "0".repeat(32), "{settings:?}: {line}");
            trace_id
        };
        // A request without a caller's trace starts one of its own.
        assert_ne!(ids("untraced-2"), ids("untraced-3"), "{settings:?}");
    }
}

#[tokio::test]
async fn a_scrape_of_the_metrics_page_is_logged_like_any_request() {
    let host = Host::builder().start();
    get_with_id(&host, "/metrics", "scrape-1").await;
    let line = host.wait_for_log(|line| line["request_id"] == "scrape-1");
    assert_eq!(line["level"], "INFO", "{line}");
    assert_eq!(line["message"], "metrics page served", "{line}");
    assert_eq!(line["http.route"], "/metrics", "{line}");
    assert!(line["trace_id"].is_string(), "{line}");
}

#[tokio::test]
async fn creations_computations_and_validation_failures_are_logged() {
    let host = Host::builder().start();
    create_with_id(&host, "c-1", "a@x.io").await;
    create_with_id(&host, "c-2", "broken").await;
    post_with_id(&host, "/api/compute", "c-3", json!({"n": 12})).await;
    get_with_id(&host, "/api/users", "c-4").await;

    let created =
        host.wait_for_log(|line| line["request_id"] == "c-1" && line["message"] == "user created");
    assert!(created["user.id"].is_string());
    let rejected = host.wait_for_log(|line| {
        line["request_id"] == "c-2"
            && line["level"] == "WARN"
            && line["message"] == "user creation rejected"
    });
    assert_eq!(rejected["error"], "Invalid email format");
    host.wait_for_log(|line| {
        line["request_id"] == "c-3"
            && line["message"] == "compute started"
            && line["compute.n"] == 12
    });
    let finished = host
        .wait_for_log(|line| line["request_id"] == "c-3" && line["message"] == "compute finished");
    assert!(finished["compute.duration_ms"].is_i64());
    let listed =
        host.wait_for_log(|line| line["request_id"] == "c-4" && line["message"] == "listed users");
    assert_eq!(listed["user.count"], 1);
}

#[tokio::test]
async fn rust_log_warn_hides_every_info_line() {
    let host = Host::builder()
        .free_port()
        .env(&[("RUST_LOG", "warn")])
        .start();
    get_with_id(&host, "/api/health", "quiet-1").await;
    get_with_id(&host, "/api/users/nope", "quiet-2").await;
    host.wait_for_log(|line| line["request_id"] == "quiet-2" && line["level"] == "WARN");
    let lines = host.log_lines();
    assert!(
        lines
            .iter()
            .all(|line| line["level"] == "WARN" || line["level"] == "ERROR"),
        "{lines:#?}"
    );
}

#[tokio::test]
async fn the_log_file_receives_the_same_lines_as_stdout() {
    let log_file = support::tempdir().join("nested/dir/app.log");
    let host = Host::builder()
        .env(&[("LOG_FILE", log_file.to_str().unwrap())])
        .start();
    get_with_id(&host, "/api/health", "to-file-1").await;
    host.wait_for_log(|line| line["request_id"] == "to-file-1");

    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let stdout: Vec<String> = host.stdout.lock().unwrap().clone();
    loop {
        let file = std::fs::read_to_string(&log_file).unwrap_or_default();
        let file_lines: Vec<&str> = file.lines().collect();
        if stdout
            .iter()
            .all(|line| file_lines.contains(&line.as_str()))
        {
            assert!(file_lines.iter().any(|line| line.contains("to-file-1")));
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "file {file_lines:#?} lacks lines of {stdout:#?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test]
async fn an_unwritable_log_file_is_one_warning_and_the_service_runs_on() {
    let blocker = support::tempdir().join("not-a-directory");
    std::fs::write(&blocker, b"a file where a directory should be").unwrap();
    let log_file = blocker.join("app.log");
    let host = Host::builder()
        .env(&[("LOG_FILE", log_file.to_str().unwrap())])
        .start();
    assert_eq!(
        client()
            .get(host.url("/api/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let warnings: Vec<Value> = host.log_lines_where(|line| line["level"] == "WARN");
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert!(
        warnings[0]["message"]
            .as_str()
            .unwrap()
            .contains("log file")
    );
}

/// The value of the sample `name` with exactly `labels`, from a fresh `/metrics` scrape.
async fn sample(host: &Host, name: &str, labels: &[(&str, &str)]) -> f64 {
    support::prometheus::value(&support::prometheus::scrape(host).await, name, labels)
}

#[tokio::test]
async fn a_health_call_adds_exactly_one_200_to_http_requests_total() {
    let host = Host::builder().start();
    let labels = [
        ("method", "GET"),
        ("route", "/api/health"),
        ("status", "200"),
    ];
    let before = sample(&host, "http_requests_total", &labels).await;
    client().get(host.url("/api/health")).send().await.unwrap();
    assert_eq!(
        sample(&host, "http_requests_total", &labels).await,
        before + 1.0
    );
}

#[tokio::test]
async fn lookup_successes_and_failures_are_counted_apart() {
    let host = Host::builder().start();
    let user = support::create_user(&host, "A", "a@x.io").await;
    let id = user["id"].as_str().unwrap();
    for _ in 0..2 {
        client()
            .get(host.url(&format!("/api/users/{id}")))
            .send()
            .await
            .unwrap();
    }
    for missing in [
        "not-a-uuid",
        "00000000-0000-4000-8000-000000000000",
        "x",
        "y",
        "z",
    ] {
        client()
            .get(host.url(&format!("/api/users/{missing}")))
            .send()
            .await
            .unwrap();
    }
    assert_eq!(
        sample(&host, "user_lookups_total", &[("result", "success")]).await,
        2.0
    );
    assert_eq!(
        sample(&host, "user_lookups_total", &[("result", "failure")]).await,
        5.0
    );
    assert_eq!(sample(&host, "users_stored", &[]).await, 1.0);
}

#[tokio::test]
async fn a_thousand_random_ids_make_one_bounded_route_label() {
    let host = Host::builder().start();
    for _ in 0..1000 {
        let id = uuid::Uuid::new_v4();
        client()
            .get(host.url(&format!("/api/users/{id}")))
            .send()
            .await
            .unwrap();
    }
    for path in ["/random/1", "/random/2", "/api/users/a/b"] {
        client().get(host.url(path)).send().await.unwrap();
    }
    let routes: HashSet<String> = support::prometheus::scrape(&host)
        .await
        .into_iter()
        .filter(|sample| sample.name == "http_requests_total")
        .filter_map(|sample| sample.labels.get("route").cloned())
        .collect();
    let allowed = HashSet::from(["/api/users/{id}", "unmatched", "/metrics"].map(String::from));
    assert!(routes.is_subset(&allowed), "{routes:?}");
    assert!(
        routes.contains("/api/users/{id}") && routes.contains("unmatched"),
        "{routes:?}"
    );
    let misses = [
        ("method", "GET"),
        ("route", "/api/users/{id}"),
        ("status", "404"),
    ];
    assert_eq!(sample(&host, "http_requests_total", &misses).await, 1000.0);
    assert_eq!(
        sample(
            &host,
            "http_requests_total",
            &[("method", "GET"), ("route", "unmatched"), ("status", "404")]
        )
        .await,
        3.0
    );
}

#[tokio::test]
async fn metrics_include_instantiation_time_and_process_metrics() {
    let host = Host::builder().start();
    client().get(host.url("/api/health")).send().await.unwrap();
    let text = support::prometheus::text(&host).await;
    assert!(
        text.contains("guest_instantiation_seconds_count 1"),
        "{text}"
    );
    assert!(text.contains("process_resident_memory_bytes"), "{text}");
    assert!(text.contains("http_request_duration_seconds_bucket{method=\"GET\",route=\"/api/health\",le=\"0.0005\"}"), "{text}");
}
