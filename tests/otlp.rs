//! End-to-end tests of OTLP export: the real host sends its spans to a real OTLP receiver in
//! this process, over HTTP (protobuf) and over gRPC, chosen by the SDK's standard variables.

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::otlp::{Behaviour, Collector, ReceivedPoint, ReceivedSpan};
use support::{Host, client, guest_path};

/// `SpanKind` values of the OTLP protocol.
const SERVER: i32 = 2;
const CLIENT: i32 = 3;

#[derive(Debug, Clone, Copy)]
enum Protocol {
    Http,
    Grpc,
}

impl Protocol {
    fn collector(self, behaviour: Behaviour) -> Collector {
        match self {
            Protocol::Http => Collector::http(behaviour),
            Protocol::Grpc => Collector::grpc(behaviour),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Protocol::Http => "http/protobuf",
            Protocol::Grpc => "grpc",
        }
    }
}

/// A host exporting OTLP to `collector` every `schedule_ms`, with `extra` variables.
fn host_exporting_to(
    collector: &Collector,
    protocol: Protocol,
    schedule_ms: &str,
    extra: &[(&str, &str)],
) -> Host {
    let endpoint = collector.base_url();
    let mut env = vec![
        ("OTEL_TRACES_EXPORTER", "otlp"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol.name()),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", schedule_ms),
    ];
    env.extend_from_slice(extra);
    Host::builder().env(&env).start()
}

async fn create_user_with_id(host: &Host, request_id: &str, traceparent: Option<&str>) {
    let mut request = client()
        .post(host.url("/api/users"))
        .header("x-request-id", request_id)
        .json(&json!({"name": "Ada", "email": format!("{request_id}@example.com")}));
    if let Some(traceparent) = traceparent {
        request = request.header("traceparent", traceparent);
    }
    assert_eq!(request.send().await.unwrap().status(), 201);
}

fn server_span<'a>(spans: &'a [ReceivedSpan], request_id: &str) -> Option<&'a ReceivedSpan> {
    spans
        .iter()
        .find(|span| span.kind == SERVER && span.str_attribute("request_id") == Some(request_id))
}

fn children_of<'a>(spans: &'a [ReceivedSpan], parent: &ReceivedSpan) -> Vec<&'a ReceivedSpan> {
    spans
        .iter()
        .filter(|span| span.parent_span_id == parent.span_id)
        .collect()
}

/// The spans of one `POST /api/users`: the server span and the guest's `users.create` child.
fn creation_spans(collector: &Collector, request_id: &str) -> (ReceivedSpan, ReceivedSpan) {
    let spans = collector.wait_for(|spans| {
        server_span(spans, request_id).is_some_and(|server| {
            children_of(spans, server)
                .iter()
                .any(|child| child.name == "users.create" && !children_of(spans, child).is_empty())
        })
    });
    let server = server_span(&spans, request_id)
        .unwrap_or_else(|| panic!("no server span for {request_id} in {spans:#?}"))
        .clone();
    let create = children_of(&spans, &server)
        .into_iter()
        .find(|child| child.name == "users.create")
        .unwrap_or_else(|| panic!("no users.create under {server:#?}"))
        .clone();
    (server, create)
}

async fn a_creation_is_a_server_span_with_its_store_child_and_the_resource(protocol: Protocol) {
    let collector = protocol.collector(Behaviour::Answers);
    let host = host_exporting_to(
        &collector,
        protocol,
        "100",
        &[
            ("OTEL_SERVICE_NAME", "otlp-test"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "deployment.environment=ci,team=a%20b",
            ),
        ],
    );
    create_user_with_id(&host, "otlp-create-1", None).await;
    let (server, create) = creation_spans(&collector, "otlp-create-1");
    let spans = collector.spans();
    let insert = children_of(&spans, &create)
        .into_iter()
        .find(|span| span.name == "INSERT users")
        .unwrap_or_else(|| panic!("no store call under {create:#?}"))
        .clone();

    assert_eq!(server.name, "HTTP POST /api/users");
    assert_eq!(
        server.parent_span_id, "",
        "a request without traceparent is a root"
    );
    assert_eq!(server.str_attribute("http.request.method"), Some("POST"));
    assert_eq!(server.str_attribute("http.route"), Some("/api/users"));
    assert_eq!(server.str_attribute("url.path"), Some("/api/users"));
    assert_eq!(
        server.attributes.get("http.response.status_code"),
        Some(&json!(201))
    );
    // The real guest's version, as its `/api/health` reports it.
    assert_eq!(server.str_attribute("guest.version"), Some("0.1.0"));

    assert_eq!(create.trace_id, server.trace_id);
    assert_eq!(create.parent_span_id, server.span_id);
    assert!(create.str_attribute("user.id").is_some(), "{create:#?}");
    assert_eq!(insert.trace_id, server.trace_id);
    assert_eq!(insert.kind, CLIENT);
    assert_eq!(insert.str_attribute("db.operation.name"), Some("INSERT"));
    assert_eq!(insert.str_attribute("db.system.name"), Some("memory"));
    assert_eq!(insert.str_attribute("db.collection.name"), Some("users"));

    for span in [&server, &create, &insert] {
        let resource = &span.resource;
        assert_eq!(resource["service.name"], json!("otlp-test"));
        assert_eq!(
            resource["service.version"],
            json!(env!("CARGO_PKG_VERSION"))
        );
        assert!(
            resource["service.instance.id"]
                .as_str()
                .is_some_and(uuid_like),
            "{resource:?}"
        );
        assert!(
            resource["host.name"]
                .as_str()
                .is_some_and(|name| !name.is_empty())
        );
        assert_eq!(resource["deployment.environment"], json!("ci"));
        assert_eq!(resource["team"], json!("a b"));
    }
}

fn uuid_like(text: &str) -> bool {
    text.len() == 36 && text.chars().filter(|&c| c == '-').count() == 4
}

async fn headers_reach_the_collector(protocol: Protocol) {
    let collector = protocol.collector(Behaviour::Answers);
    let host = host_exporting_to(
        &collector,
        protocol,
        "100",
        &[(
            "OTEL_EXPORTER_OTLP_HEADERS",
            "x-api-key=s%3D1,x-tenant=blue",
        )],
    );
    create_user_with_id(&host, "otlp-headers", None).await;
    creation_spans(&collector, "otlp-headers");
    let headers = collector.headers();
    assert!(!headers.is_empty());
    for export in headers {
        assert_eq!(
            export.get("x-api-key").map(String::as_str),
            Some("s=1"),
            "{export:?}"
        );
        assert_eq!(export.get("x-tenant").map(String::as_str), Some("blue"));
    }
}

#[tokio::test]
async fn the_spans_own_headers_variable_replaces_the_general_one_over_both_protocols() {
    for protocol in [Protocol::Http, Protocol::Grpc] {
        let collector = protocol.collector(Behaviour::Answers);
        let endpoint = collector.base_url();
        let host = Host::builder()
            .env(&[
                ("OTEL_TRACES_EXPORTER", "otlp"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol.name()),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
                ("OTEL_BSP_SCHEDULE_DELAY", "100"),
                (
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    "x-tenant=from-variable,x-other=1",
                ),
                ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-tenant=from-traces"),
            ])
            .start();
        create_user_with_id(&host, "otlp-header-traces", None).await;
        creation_spans(&collector, "otlp-header-traces");
        for export in collector.headers() {
            assert_eq!(
                export.get("x-tenant").map(String::as_str),
                Some("from-traces"),
                "{protocol:?}: {export:?}"
            );
            assert_eq!(export.get("x-other"), None, "{protocol:?}: {export:?}");
        }
    }
}

#[tokio::test]
async fn a_traces_endpoint_is_used_as_is_and_an_empty_variable_counts_as_unset() {
    // Over HTTP the full URL; the base endpoint, wrong, is ignored.
    let collector = Collector::http(Behaviour::Answers);
    let traces_url = format!("{}/v1/traces", collector.base_url());
    let host = host_exporting_to(
        &collector,
        Protocol::Http,
        "100",
        &[
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", traces_url.as_str()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9"),
        ],
    );
    create_user_with_id(&host, "otlp-traces-endpoint", None).await;
    creation_spans(&collector, "otlp-traces-endpoint");
    // Over gRPC an empty traces endpoint falls back to the base one.
    let collector = Collector::grpc(Behaviour::Answers);
    let host = host_exporting_to(
        &collector,
        Protocol::Grpc,
        "100",
        &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")],
    );
    create_user_with_id(&host, "otlp-empty-endpoint", None).await;
    creation_spans(&collector, "otlp-empty-endpoint");
}

#[tokio::test]
async fn each_host_process_has_its_own_service_instance_id() {
    let collector = Collector::http(Behaviour::Answers);
    let first = host_exporting_to(&collector, Protocol::Http, "100", &[]);
    let second = host_exporting_to(&collector, Protocol::Http, "100", &[]);
    create_user_with_id(&first, "instance-1", None).await;
    create_user_with_id(&second, "instance-2", None).await;
    let (one, _) = creation_spans(&collector, "instance-1");
    let (two, _) = creation_spans(&collector, "instance-2");
    assert_ne!(
        one.resource["service.instance.id"],
        two.resource["service.instance.id"]
    );
    assert_eq!(one.resource["service.name"], json!("tutorial-service"));
}

#[tokio::test]
async fn an_incoming_traceparent_is_continued_over_otlp() {
    let collector = Collector::grpc(Behaviour::Answers);
    let host = host_exporting_to(&collector, Protocol::Grpc, "100", &[]);
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let traceparent = format!("00-{trace_id}-{caller_span}-01");
    create_user_with_id(&host, "otlp-traceparent", Some(&traceparent)).await;
    let (server, create) = creation_spans(&collector, "otlp-traceparent");
    assert_eq!(server.trace_id, trace_id);
    assert_eq!(server.parent_span_id, caller_span);
    assert_eq!(create.trace_id, trace_id);
}

#[tokio::test]
async fn sigterm_flushes_the_last_span_over_otlp() {
    for protocol in [Protocol::Http, Protocol::Grpc] {
        let collector = protocol.collector(Behaviour::Answers);
        // A minute between scheduled exports: only the shutdown flush can send the span.
        let mut host = host_exporting_to(&collector, protocol, "60000", &[]);
        let request_id = format!("otlp-flush-{}", protocol.name());
        create_user_with_id(&host, &request_id, None).await;
        assert!(host.terminate().success());
        let spans = collector.spans();
        assert!(
            server_span(&spans, &request_id).is_some(),
            "{protocol:?}: the last span was not flushed at SIGTERM: {spans:#?}"
        );
    }
}

/// The 99th percentile of 200 `GET /api/health` latencies, one at a time.
async fn p99_of_health(host: &Host) -> Duration {
    let client = client();
    let mut latencies = Vec::with_capacity(200);
    for _ in 0..200 {
        let started = Instant::now();
        let response = client.get(host.url("/api/health")).send().await.unwrap();
        assert_eq!(response.status(), 200);
        response.bytes().await.unwrap();
        latencies.push(started.elapsed());
    }
    latencies.sort();
    latencies[197]
}

#[tokio::test]
async fn an_export_to_a_collector_that_never_answers_is_given_up_at_the_timeout() {
    for protocol in [Protocol::Http, Protocol::Grpc] {
        let collector = protocol.collector(Behaviour::NeverAnswers);
        let host = host_exporting_to(
            &collector,
            protocol,
            "10",
            &[("OTEL_EXPORTER_OTLP_TIMEOUT", "300")],
        );
        // One export at a time: a second one starts only once the first was given up.
        let deadline = Instant::now() + Duration::from_secs(10);
        while collector.exports() < 3 && Instant::now() < deadline {
            let _ = client().get(host.url("/api/health")).send().await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            collector.exports() >= 3,
            "{protocol:?}: {} exports in 10 s with a 300 ms timeout",
            collector.exports()
        );
    }
}

#[tokio::test]
async fn sigterm_with_a_collector_that_never_answers_still_exits_promptly() {
    let collector = Collector::http(Behaviour::NeverAnswers);
    // The longest export timeout allowed: only the exit's own flush deadline ends the wait.
    let mut host = host_exporting_to(
        &collector,
        Protocol::Http,
        "60000",
        &[("OTEL_EXPORTER_OTLP_TIMEOUT", "60000")],
    );
    create_user_with_id(&host, "otlp-silent-exit", None).await;
    let stopping = Instant::now();
    assert!(host.terminate().success());
    let took = stopping.elapsed();
    assert!(took < Duration::from_secs(8), "exit took {took:?}");
    assert!(collector.exports() >= 1, "the last batch was not even sent");
}

/// The p99 of `GET /api/health` of a host that exports no spans, after a warm-up: what a
/// collector must not slow.
async fn p99_of_health_without_export() -> Duration {
    let quiet = Host::builder()
        .env(&[("OTEL_TRACES_EXPORTER", "none")])
        .start();
    p99_of_health(&quiet).await; // warm-up
    p99_of_health(&quiet).await
}

#[tokio::test]
async fn a_collector_that_never_answers_does_not_slow_requests() {
    let baseline = p99_of_health_without_export().await;
    for protocol in [Protocol::Http, Protocol::Grpc] {
        let collector = protocol.collector(Behaviour::NeverAnswers);
        // Small batches sent often and a short timeout: exports pile up against the receiver.
        let host = host_exporting_to(
            &collector,
            protocol,
            "10",
            &[
                ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "8"),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "500"),
            ],
        );
        p99_of_health(&host).await;
        let exporting = p99_of_health(&host).await;
        assert!(
            collector.exports() > 0,
            "{protocol:?}: the receiver got no export, so the test proves nothing"
        );
        // Loosely: twice the baseline, with 20 ms of slack for a noisy machine.
        assert!(
            exporting <= baseline * 2 + Duration::from_millis(20),
            "{protocol:?}: p99 {exporting:?} against {baseline:?} with no export"
        );
        let health = client().get(host.url("/api/health")).send().await.unwrap();
        assert_eq!(health.status(), 200);
    }
}

/// Starts the host with `variable=value` and expects it refused before serving: the one line
/// it wrote on stderr.
fn refused_at_start(variable: &str, value: &str) -> String {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_host"));
    command
        .args(["--bind", "127.0.0.1", "--port", "0", "--guest"])
        .arg(guest_path("guest"))
        .env(variable, value);
    let output = support::run_to_exit(command, Duration::from_secs(20));
    assert!(!output.status.success(), "{variable}={value} was accepted");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let lines: Vec<&str> = stderr.lines().filter(|line| !line.is_empty()).collect();
    assert_eq!(lines.len(), 1, "{variable}={value}: {stderr}");
    assert!(
        output.stdout.is_empty(),
        "{variable}: the host started before refusing: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    lines[0].to_string()
}

#[test]
fn a_bad_otel_variable_is_a_one_line_error_at_start_naming_it() {
    let cases = [
        ("OTEL_TRACES_EXPORTER", "zipkin"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "ten"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "authorization"),
        ("OTEL_RESOURCE_ATTRIBUTES", "=x"),
        ("OTEL_SDK_DISABLED", "maybe"),
    ];
    for (variable, value) in cases {
        let line = refused_at_start(variable, value);
        assert!(line.contains(variable), "{variable}={value}: {line}");
    }
}

#[tokio::test]
async fn with_otel_sdk_disabled_nothing_is_exported() {
    let collector = Collector::http(Behaviour::Answers);
    let host = host_exporting_to(
        &collector,
        Protocol::Http,
        "50",
        &[("OTEL_SDK_DISABLED", "true")],
    );
    create_user_with_id(&host, "disabled", None).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(collector.exports(), 0);
    let _: Value = support::get_json(&host, "/api/health").await;
}

/// A host pushing only `signals` (`metrics`, `logs`, `traces`) to `collector`, with `extra`
/// variables: each other signal's exporter is `none`.
fn host_pushing(
    collector: &Collector,
    protocol: Protocol,
    signals: &[&str],
    extra: &[(&str, &str)],
) -> Host {
    let endpoint = collector.base_url();
    let exporter = |signal: &str| {
        if signals.contains(&signal) {
            "otlp"
        } else {
            "none"
        }
    };
    let mut env = vec![
        ("OTEL_TRACES_EXPORTER", exporter("traces")),
        ("OTEL_METRICS_EXPORTER", exporter("metrics")),
        ("OTEL_LOGS_EXPORTER", exporter("logs")),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol.name()),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
    ];
    env.extend_from_slice(extra);
    Host::builder().env(&env).start()
}

/// `labels` as the page writes them: sorted by name, `name="value"` joined by commas.
fn label_text(labels: &std::collections::HashMap<String, String>) -> String {
    let mut pairs: Vec<_> = labels.iter().collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(name, value)| format!("{name}=\"{value}\""))
        .collect::<Vec<_>>()
        .join(",")
}

/// The value the page gives the sample `name{labels}`.
fn page_value(page: &str, name: &str, labels: &str) -> Option<f64> {
    let series = if labels.is_empty() {
        format!("{name} ")
    } else {
        format!("{name}{{{labels}}} ")
    };
    page.lines()
        .find_map(|line| line.strip_prefix(&series))
        .and_then(|value| value.trim().parse().ok())
}

async fn metric_points_match_what_the_page_says(protocol: Protocol) {
    let collector = protocol.collector(Behaviour::Answers);
    let host = host_pushing(
        &collector,
        protocol,
        &["metrics"],
        &[("OTEL_METRIC_EXPORT_INTERVAL", "100")],
    );
    for _ in 0..3 {
        let response = client().get(host.url("/api/health")).send().await.unwrap();
        assert_eq!(response.status(), 200);
    }
    let missing = "/api/users/00000000-0000-4000-8000-000000000000";
    assert_eq!(
        client()
            .get(host.url(missing))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    create_user_with_id(&host, "otlp-metrics", None).await;
    let is_health = |point: &ReceivedPoint| {
        point.metric == "http_requests_total"
            && point.attributes.get("route").map(String::as_str) == Some("/api/health")
    };
    let users_stored = |points: &[ReceivedPoint]| {
        points
            .iter()
            .find(|point| point.metric == "users_stored")
            .map(|point| point.value)
    };
    let points = collector.wait_for_points(|points| {
        points
            .iter()
            .any(|point| is_health(point) && point.value == 3.0)
            && points.iter().any(|point| {
                point.metric == "http_requests_total"
                    && point.attributes.get("route").map(String::as_str) == Some("/api/users")
            })
            && users_stored(points) == Some(1.0)
    });
    // Read from the store before each push, with no scrape to do it.
    assert_eq!(users_stored(&points), Some(1.0), "{protocol:?}");
    assert!(
        points
            .iter()
            .any(|point| is_health(point) && point.value == 3.0),
        "{protocol:?}: {points:#?}"
    );
    // No request between the push and the scrape but the scrape itself, which counts only once
    // answered, and instantiates no guest.
    let page = support::prometheus::text(&host).await;
    let mut compared = 0;
    for point in &points {
        let labels = label_text(&point.attributes);
        let (name, value) = match point.kind {
            "histogram" => (format!("{}_count", point.metric), point.count as f64),
            _ => (point.metric.clone(), point.value),
        };
        if point.metric == "users_stored" || point.metric.starts_with("process_") {
            continue; // Read afresh at each collection: checked apart.
        }
        let on_page = page_value(&page, &name, &labels);
        assert_eq!(
            on_page,
            Some(value),
            "{protocol:?}: {name}{{{labels}}} pushed {value}, the page says {on_page:?}"
        );
        if point.kind == "histogram" {
            let unit = if point.metric.ends_with("_bytes") {
                "By"
            } else {
                "s"
            };
            assert_eq!(point.unit, unit, "{}", point.metric);
            for (bound, _) in point.bounds.iter().zip(&point.bucket_counts) {
                let bucket = if labels.is_empty() {
                    format!("le=\"{bound}\"")
                } else {
                    format!("{labels},le=\"{bound}\"")
                };
                assert!(
                    page_value(&page, &format!("{}_bucket", point.metric), &bucket).is_some(),
                    "{protocol:?}: {}_bucket{{{bucket}}} is not on the page",
                    point.metric
                );
            }
        }
        compared += 1;
    }
    let resident = points
        .iter()
        .find(|point| point.metric == "process_resident_memory_bytes");
    assert!(
        resident.is_some_and(|point| point.kind == "gauge" && point.value > 1e6),
        "{protocol:?}: {resident:?}"
    );
    assert!(page_value(&page, "process_resident_memory_bytes", "").is_some());
    for name in [
        "http_requests_total",
        "http_request_duration_seconds",
        "user_lookups_total",
        "user_store_operation_seconds",
        "guest_instantiation_seconds",
        "process_cpu_seconds_total",
        "process_open_fds",
    ] {
        assert!(
            points.iter().any(|point| point.metric == name),
            "{protocol:?}: {name} was not pushed"
        );
    }
    assert!(
        compared >= 10,
        "{protocol:?}: only {compared} points compared"
    );
    let failures = points.iter().find(|point| {
        point.metric == "user_lookups_total"
            && point.attributes.get("result").map(String::as_str) == Some("failure")
    });
    assert_eq!(failures.map(|point| point.value), Some(1.0));
    let resource = &points[0].resource;
    assert_eq!(resource["service.name"], "tutorial-service");
}

async fn log_records_carry_the_ids_of_their_request(protocol: Protocol) {
    let collector = protocol.collector(Behaviour::Answers);
    let host = host_pushing(
        &collector,
        protocol,
        &["traces", "logs"],
        &[
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
            ("OTEL_BLRP_SCHEDULE_DELAY", "50"),
        ],
    );
    // A body the guest refuses, which it says in a WARN line.
    let response = client()
        .post(host.url("/api/users"))
        .header("x-request-id", "otlp-log")
        .json(&json!({"name": "", "email": "not an address"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let spans = collector.wait_for(|spans| server_span(spans, "otlp-log").is_some());
    let server = server_span(&spans, "otlp-log")
        .unwrap_or_else(|| panic!("{protocol:?}: no server span: {spans:#?}"))
        .clone();
    let is_rejection = |log: &support::otlp::ReceivedLog| {
        log.body
            .as_str()
            .is_some_and(|body| body.contains("rejected"))
    };
    let logs = collector.wait_for_logs(|logs| logs.iter().any(is_rejection));
    let record = logs
        .iter()
        .find(|log| is_rejection(log))
        .unwrap_or_else(|| panic!("{protocol:?}: no rejection record: {logs:#?}"));
    assert_eq!(record.severity_text, "WARN");
    assert_eq!(record.severity_number, 13, "WARN is severity 13");
    assert_eq!(record.trace_id, server.trace_id, "{record:#?}");
    let of_the_request: Vec<&str> = spans
        .iter()
        .filter(|span| span.trace_id == server.trace_id)
        .map(|span| span.span_id.as_str())
        .collect();
    assert!(
        of_the_request.contains(&record.span_id.as_str()),
        "{protocol:?}: span {} is not one of the request's {of_the_request:?}",
        record.span_id
    );
    // The guest's attributes ride as one JSON object, as on the log line.
    let guest_fields: serde_json::Map<String, Value> = record.attributes["guest_fields"]
        .as_str()
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_else(|| panic!("{protocol:?}: no guest_fields object: {record:#?}"));
    assert!(guest_fields["error"].is_string(), "{guest_fields:?}");
    assert_eq!(record.resource["service.name"], "tutorial-service");
    // The host's own line of the request is a record of its server span.
    let is_refusal = |log: &support::otlp::ReceivedLog| log.body == "request refused";
    let logs = collector.wait_for_logs(|logs| logs.iter().any(is_refusal));
    let refusal = logs.iter().find(|log| is_refusal(log)).unwrap();
    assert_eq!(
        (refusal.trace_id.as_str(), refusal.span_id.as_str()),
        (server.trace_id.as_str(), server.span_id.as_str()),
        "{refusal:#?}"
    );
    // The host's own lines outside a request go too, without ids.
    let listening = logs
        .iter()
        .find(|log| {
            log.body
                .as_str()
                .is_some_and(|body| body.starts_with("listening on"))
        })
        .unwrap_or_else(|| panic!("{protocol:?}: no start-up line: {logs:#?}"));
    assert_eq!(listening.severity_text, "INFO");
    assert_eq!(listening.trace_id, "");
    // stdout keeps its line.
    host.wait_for_log(|line| {
        line["message"]
            .as_str()
            .is_some_and(|message| message.contains("rejected"))
    });
}

#[tokio::test]
async fn sigterm_flushes_the_last_metrics_and_log_records() {
    for protocol in [Protocol::Http, Protocol::Grpc] {
        let collector = protocol.collector(Behaviour::Answers);
        // Ten minutes between pushes: only the shutdown flush can send anything.
        let mut host = host_pushing(
            &collector,
            protocol,
            &["metrics", "logs"],
            &[
                ("OTEL_METRIC_EXPORT_INTERVAL", "600000"),
                ("OTEL_BLRP_SCHEDULE_DELAY", "600000"),
            ],
        );
        for _ in 0..2 {
            client().get(host.url("/api/health")).send().await.unwrap();
        }
        assert_eq!(collector.metric_exports(), 0, "{protocol:?}");
        assert!(host.terminate().success());
        let health = collector.points().into_iter().find(|point| {
            point.metric == "http_requests_total"
                && point.attributes.get("route").map(String::as_str) == Some("/api/health")
        });
        assert_eq!(
            health.map(|point| point.value),
            Some(2.0),
            "{protocol:?}: the last metrics were not flushed at SIGTERM"
        );
        let logs = collector.logs();
        assert!(
            logs.iter().any(|log| log
                .body
                .as_str()
                .is_some_and(|body| body.starts_with("listening on"))),
            "{protocol:?}: the log records were not flushed at SIGTERM: {logs:#?}"
        );
    }
}

#[tokio::test]
async fn a_silent_collector_of_metrics_or_logs_costs_requests_nothing_and_holds_no_exit() {
    let baseline = p99_of_health_without_export().await;
    for protocol in [Protocol::Http, Protocol::Grpc] {
        for signal in ["metrics", "logs"] {
            let collector = protocol.collector(Behaviour::NeverAnswers);
            // Pushes every 10 ms, each given up after 60 s: exports stay stuck on the receiver.
            let mut host = host_pushing(
                &collector,
                protocol,
                &[signal],
                &[
                    ("OTEL_METRIC_EXPORT_INTERVAL", "10"),
                    ("OTEL_BLRP_SCHEDULE_DELAY", "10"),
                    ("OTEL_EXPORTER_OTLP_TIMEOUT", "60000"),
                ],
            );
            p99_of_health(&host).await;
            let exporting = p99_of_health(&host).await;
            let exports = collector.metric_exports() + collector.log_exports();
            assert!(
                exports > 0,
                "{protocol:?} {signal}: no export reached the receiver"
            );
            assert!(
                exporting <= baseline * 2 + Duration::from_millis(20),
                "{protocol:?} {signal}: p99 {exporting:?} against {baseline:?} with no export"
            );
            let stopping = Instant::now();
            assert!(host.terminate().success());
            let took = stopping.elapsed();
            assert!(
                took < Duration::from_secs(8),
                "{protocol:?} {signal}: exit took {took:?}"
            );
        }
    }
}

#[test]
fn a_bad_metrics_or_logs_variable_is_a_one_line_error_at_start_naming_it() {
    for (variable, value) in [
        ("OTEL_METRICS_EXPORTER", "zipkin"),
        ("OTEL_LOGS_EXPORTER", "jaeger"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "0"),
        (
            "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
            "https://collector:4318/v1/logs",
        ),
        ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "forever"),
        ("OTEL_BLRP_MAX_QUEUE_SIZE", "0"),
    ] {
        let line = refused_at_start(variable, value);
        assert!(line.contains(variable), "{variable}={value}: {line}");
    }
}

#[tokio::test]
async fn with_only_the_endpoint_set_metrics_and_logs_flow_there_too() {
    let collector = Collector::http(Behaviour::Answers);
    let endpoint = collector.base_url();
    let host = Host::builder()
        .env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_METRIC_EXPORT_INTERVAL", "100"),
            ("OTEL_BLRP_SCHEDULE_DELAY", "50"),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ])
        .start();
    create_user_with_id(&host, "endpoint-only", None).await;
    let spans = collector.wait_for(|spans| server_span(spans, "endpoint-only").is_some());
    assert!(server_span(&spans, "endpoint-only").is_some(), "{spans:#?}");
    let points = collector.wait_for_points(|points| !points.is_empty());
    assert!(!points.is_empty(), "no metrics pushed");
    let logs = collector.wait_for_logs(|logs| !logs.is_empty());
    assert!(!logs.is_empty(), "no log records sent");
}

#[tokio::test]
async fn a_span_collector_that_never_answers_costs_the_last_metrics_and_logs_nothing_at_exit() {
    let silent = Collector::http(Behaviour::NeverAnswers);
    let answering = Collector::http(Behaviour::Answers);
    let endpoint = answering.base_url();
    let traces = format!("{}/v1/traces", silent.base_url());
    // Nothing leaves before the exit; there, the span flush waits on a receiver that never
    // answers, with the longest timeout allowed.
    let mut host = Host::builder()
        .env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", traces.as_str()),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "60000"),
            ("OTEL_BSP_SCHEDULE_DELAY", "600000"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "600000"),
            ("OTEL_BLRP_SCHEDULE_DELAY", "600000"),
        ])
        .start();
    create_user_with_id(&host, "silent-spans", None).await;
    let stopping = Instant::now();
    assert!(host.terminate().success());
    let took = stopping.elapsed();
    assert!(took < Duration::from_secs(8), "exit took {took:?}");
    assert!(
        silent.exports() >= 1,
        "the span flush never reached its receiver"
    );
    let created = answering.points().into_iter().find(|point| {
        point.metric == "http_requests_total"
            && point.attributes.get("route").map(String::as_str) == Some("/api/users")
    });
    assert_eq!(created.map(|point| point.value), Some(1.0));
    assert!(
        answering.logs().iter().any(|log| log
            .body
            .as_str()
            .is_some_and(|body| body.starts_with("listening on"))),
        "the log records were not flushed"
    );
}

/// The rules that hold over both transports, each run over OTLP/HTTP and over gRPC: one test per
/// rule and transport, `over_http::<rule>` and `over_grpc::<rule>`.
macro_rules! over_both_protocols {
    ($($rule:ident),* $(,)?) => {
        mod over_http {
            $(#[tokio::test]
            async fn $rule() {
                super::$rule(super::Protocol::Http).await;
            })*
        }
        mod over_grpc {
            $(#[tokio::test]
            async fn $rule() {
                super::$rule(super::Protocol::Grpc).await;
            })*
        }
    };
}

over_both_protocols!(
    a_creation_is_a_server_span_with_its_store_child_and_the_resource,
    headers_reach_the_collector,
    metric_points_match_what_the_page_says,
    log_records_carry_the_ids_of_their_request,
);
