//! End-to-end tests of the standard `wasi:otel` interfaces and of what each request's instance
//! cost: the instrumented guest (tests/fixtures/otel-guest, the OpenTelemetry Rust SDK calling
//! the imports) and the hostile one, behind the real host, their spans received by a real UDP
//! Jaeger agent stand-in and a real OTLP receiver, log lines read from stdout, metrics from
//! `/metrics`.

mod support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::jaeger::{Agent, Span, TagValue, server_span};
use support::otlp::{Behaviour, Collector, ReceivedSpan};
use support::prometheus::{Sample, scrape, value};
use support::{Host, client, get, guest_path, hostile_host};

/// A host serving `guest` whose spans go to `agent` every 100 ms.
fn host_with_agent(agent: &Agent, guest: &str, extra: &[(&str, &str)]) -> Host {
    let port = agent.port.to_string();
    let mut env = vec![
        ("OTEL_EXPORTER_JAEGER_AGENT_HOST", "127.0.0.1"),
        ("OTEL_EXPORTER_JAEGER_AGENT_PORT", port.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    env.extend_from_slice(extra);
    Host::builder().guest(guest).env(&env).start()
}

/// A host serving the instrumented guest that sends all three signals to `collector` (HTTP).
fn host_with_collector(collector: &Collector) -> Host {
    let endpoint = collector.base_url();
    Host::builder()
        .guest("otel-guest")
        .env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_BLRP_SCHEDULE_DELAY", "100"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "100"),
        ])
        .start()
}

async fn get_with_id(host: &Host, path: &str, request_id: &str) -> u16 {
    support::get_with_id(host, path, request_id)
        .await
        .status()
        .as_u16()
}

fn child<'a>(spans: &'a [Span], parent: &Span, name: &str) -> Option<&'a Span> {
    spans.iter().find(|span| {
        span.operation_name == name
            && span.trace_id == parent.trace_id
            && span.parent_span_id == parent.span_id
    })
}

/// What `guest_telemetry_dropped_total` counts for `signal` in a scrape.
fn dropped(samples: &[Sample], signal: &str) -> f64 {
    value(
        samples,
        "guest_telemetry_dropped_total",
        &[("signal", signal)],
    )
}

fn double_tag(span: &Span, key: &str) -> Option<f64> {
    match span.tag(key)? {
        TagValue::Double(number) => Some(*number),
        TagValue::Long(number) => Some(*number as f64),
        _ => None,
    }
}

#[tokio::test]
async fn the_instrumented_guest_swapped_in_live_reports_through_the_running_host() {
    let mut agent = Agent::start();
    let live = support::tempdir().join("live.wasm");
    std::fs::copy(guest_path("guest"), &live).unwrap();
    let port = agent.port.to_string();
    let host = Host::builder()
        .guest_at(&live)
        .env(&[
            ("GUEST_WATCH", "1"),
            ("OTEL_EXPORTER_JAEGER_AGENT_HOST", "127.0.0.1"),
            ("OTEL_EXPORTER_JAEGER_AGENT_PORT", &port),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ])
        .start();
    assert_eq!(get(&host, "/api/greet/ada").await.0, 404);
    // Written aside and renamed over the served file, as `cargo` does.
    let aside = live.with_extension("next");
    std::fs::copy(guest_path("otel-guest"), &aside).unwrap();
    std::fs::rename(&aside, &live).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut attempt = 0;
    let request_id = loop {
        attempt += 1;
        let request_id = format!("after-swap-{attempt}");
        if get_with_id(&host, "/api/greet/ada", &request_id).await == 200 {
            break request_id;
        }
        assert!(
            Instant::now() < deadline,
            "the instrumented guest was never served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let spans = agent.wait_for(|spans| {
        server_span(spans, &request_id)
            .is_some_and(|server| child(spans, server, "greet").is_some())
    });
    assert!(
        server_span(&spans, &request_id)
            .is_some_and(|server| child(&spans, server, "greet").is_some())
    );
}

#[tokio::test]
async fn the_guests_spans_are_children_of_the_server_span_at_a_jaeger_agent() {
    let mut agent = Agent::start();
    let host = host_with_agent(&agent, "otel-guest", &[]);
    assert_eq!(get_with_id(&host, "/api/greet/ada", "greet-1").await, 200);
    let found = |spans: &[Span]| {
        let server = server_span(spans, "greet-1")?;
        let greet = child(spans, server, "greet")?;
        child(spans, greet, "compose")
            .map(|compose| (server.clone(), greet.clone(), compose.clone()))
    };
    let spans = agent.wait_for(|spans| found(spans).is_some());
    let (server, greet, _compose) = found(&spans).expect("server > greet > compose");
    assert_eq!(greet.str_tag("greeting.name"), Some("ada"));
    assert_eq!(greet.str_tag("otel.scope.name"), Some("otel-guest"));
    assert_eq!(server.str_tag("span.kind"), Some("server"));
}

#[tokio::test]
async fn the_guests_spans_logs_and_metrics_reach_an_otlp_receiver() {
    let collector = Collector::http(Behaviour::Answers);
    let host = host_with_collector(&collector);
    for name in ["ada", "grace", "alan"] {
        assert_eq!(
            get_with_id(&host, &format!("/api/greet/{name}"), name).await,
            200
        );
    }
    let found = |spans: &[ReceivedSpan], name: &str| -> Option<(ReceivedSpan, ReceivedSpan)> {
        let server = spans
            .iter()
            .find(|span| span.kind == 2 && span.str_attribute("request_id") == Some(name))?;
        let greet = spans.iter().find(|span| {
            span.name == "greet"
                && span.trace_id == server.trace_id
                && span.parent_span_id == server.span_id
        })?;
        Some((server.clone(), greet.clone()))
    };
    let spans = collector.wait_for(|spans| {
        ["ada", "grace", "alan"]
            .iter()
            .all(|name| found(spans, name).is_some())
    });
    let (server, greet) = found(&spans, "ada").expect("the greet span of ada's request");
    assert!(spans.iter().any(|span| span.name == "compose"
        && span.trace_id == server.trace_id
        && span.parent_span_id == greet.span_id));

    // The log record carries the request's trace and the guest span it was emitted in.
    let logs = collector.wait_for_logs(|logs| logs.iter().any(|log| log.body == "greeted ada"));
    let record = logs
        .iter()
        .find(|log| log.body == "greeted ada")
        .expect("the guest's log record");
    assert_eq!(record.trace_id, server.trace_id);
    assert_eq!(record.span_id, greet.span_id);
    assert_eq!(record.severity_number, 9);

    // The guest's counter and histogram, summed over the three requests.
    let points = collector.wait_for_points(|points| {
        points
            .iter()
            .any(|point| point.metric == "guest.otel.greetings" && point.value == 3.0)
    });
    let greetings = points
        .iter()
        .find(|point| point.metric == "guest.otel.greetings")
        .expect("guest.greetings pushed");
    assert_eq!(greetings.value, 3.0);
    assert_eq!(greetings.attributes["greeting.kind"], "plain");
    let lengths = points
        .iter()
        .find(|point| point.metric == "guest.otel.greeting.length")
        .expect("guest.greeting.length pushed");
    assert_eq!(lengths.count, 3);
    assert_eq!(lengths.bounds, vec![8.0, 16.0, 32.0, 64.0]);
    // "Hello, ada!" is 11 bytes, "Hello, grace!" 13, "Hello, alan!" 12.
    assert_eq!(lengths.value, 36.0);
    assert_eq!(lengths.bucket_counts, vec![0, 3, 0, 0, 0]);
}

#[tokio::test]
async fn the_guests_log_lines_carry_the_request_id_and_the_guest_spans_id() {
    let mut agent = Agent::start();
    let host = host_with_agent(&agent, "otel-guest", &[]);
    assert_eq!(
        get_with_id(&host, "/api/greet/grace", "greet-log").await,
        200
    );
    let line = host.wait_for_log(|line| line["message"] == "greeted grace");
    assert_eq!(line["request_id"], "greet-log");
    assert_eq!(line["target"], "guest");
    assert_eq!(line["level"], "INFO");
    assert_eq!(line["greeting.name"], "grace");
    let found = |spans: &[Span]| {
        let server = server_span(spans, "greet-log")?;
        child(spans, server, "greet").map(|greet| (server.clone(), greet.clone()))
    };
    let spans = agent.wait_for(|spans| found(spans).is_some());
    let (server, greet) = found(&spans).expect("the greet span");
    assert_eq!(line["trace_id"], format!("{:032x}", server.trace_id));
    assert_eq!(line["span_id"], format!("{:016x}", greet.span_id));
}

#[tokio::test]
async fn the_guests_metrics_are_shown_at_metrics_under_the_guest_prefix() {
    let agent = Agent::start();
    let host = host_with_agent(&agent, "otel-guest", &[]);
    for name in ["a", "b"] {
        assert_eq!(get(&host, &format!("/api/greet/{name}")).await.0, 200);
    }
    let samples = scrape(&host).await;
    assert_eq!(
        value(
            &samples,
            "guest_otel_greetings",
            &[("greeting_kind", "plain")]
        ),
        2.0
    );
    assert_eq!(
        value(&samples, "guest_otel_greeting_length_count", &[]),
        2.0
    );
    assert_eq!(value(&samples, "guest_otel_greeting_length_sum", &[]), 18.0);
    assert_eq!(
        value(
            &samples,
            "guest_otel_greeting_length_bucket",
            &[("le", "8")]
        ),
        0.0
    );
    assert_eq!(
        value(
            &samples,
            "guest_otel_greeting_length_bucket",
            &[("le", "16")]
        ),
        2.0
    );
}

#[tokio::test]
async fn each_server_span_and_route_carries_what_its_instance_cost() {
    let mut agent = Agent::start();
    let host = host_with_agent(&agent, "otel-guest", &[]);
    assert_eq!(get_with_id(&host, "/api/grow/16", "grow-16").await, 200);
    let spans = agent.wait_for(|spans| {
        server_span(spans, "grow-16").is_some_and(|span| span.tag("wasm.memory.peak").is_some())
    });
    let server = server_span(&spans, "grow-16").expect("the server span");
    let peak = server
        .long_tag("wasm.memory.peak")
        .expect("wasm.memory.peak");
    assert!(
        peak >= 16 << 20,
        "peak {peak} under the 16 MiB the guest grew by"
    );
    assert!(peak < 32 << 20, "peak {peak}: far more than the guest used");
    let instantiation = double_tag(server, "wasm.instantiation.duration").unwrap();
    let running = double_tag(server, "wasm.run.duration").unwrap();
    assert!(instantiation > 0.0 && instantiation < 1.0);
    assert!(running > 0.0 && running < 5.0);
    // outer-span-context, on-start and on-end of `grow`, export.
    assert_eq!(server.long_tag("wasm.host_calls.otel"), Some(4));
    // An interface never called has no attribute.
    assert_eq!(server.tag("wasm.host_calls.users"), None);
    assert_eq!(server.tag("wasm.host_calls.telemetry"), None);

    let samples = scrape(&host).await;
    let route = [("route", "unmatched")];
    assert_eq!(value(&samples, "wasm_memory_peak_bytes_count", &route), 1.0);
    assert_eq!(
        value(
            &samples,
            "wasm_memory_peak_bytes_bucket",
            &[("route", "unmatched"), ("le", "16777216")]
        ),
        0.0
    );
    assert_eq!(
        value(
            &samples,
            "wasm_memory_peak_bytes_bucket",
            &[("route", "unmatched"), ("le", "67108864")]
        ),
        1.0
    );
    assert_eq!(value(&samples, "wasm_run_seconds_count", &route), 1.0);
    assert_eq!(
        value(&samples, "wasm_instantiation_seconds_count", &route),
        1.0
    );
    assert_eq!(
        value(
            &samples,
            "wasm_host_calls_total",
            &[("route", "unmatched"), ("interface", "otel")]
        ),
        4.0
    );
}

#[tokio::test]
async fn the_real_guests_host_calls_are_counted_per_interface_under_its_route() {
    let mut agent = Agent::start();
    let host = host_with_agent(&agent, "guest", &[]);
    assert_eq!(get_with_id(&host, "/api/users", "list-calls").await, 200);
    let spans = agent.wait_for(|spans| {
        server_span(spans, "list-calls")
            .is_some_and(|span| span.tag("wasm.host_calls.users").is_some())
    });
    let server = server_span(&spans, "list-calls").unwrap();
    assert_eq!(server.long_tag("wasm.host_calls.users"), Some(1));
    assert!(server.long_tag("wasm.host_calls.telemetry").unwrap() >= 2);
    assert_eq!(server.tag("wasm.host_calls.otel"), None);
    let samples = scrape(&host).await;
    assert_eq!(
        value(
            &samples,
            "wasm_host_calls_total",
            &[("route", "/api/users"), ("interface", "users")]
        ),
        1.0
    );
}

#[tokio::test]
async fn a_guest_that_never_ends_is_shown_at_its_deadline_with_what_it_cost_so_far() {
    let mut agent = Agent::start();
    let host = host_with_agent(&agent, "otel-guest", &[("REQUEST_TIMEOUT_MS", "1000")]);
    let started = Instant::now();
    let status = get_with_id(&host, "/api/spin", "spin-1").await;
    assert!(status >= 500, "a request past its deadline fails: {status}");
    assert!(started.elapsed() < Duration::from_secs(5));
    let spans = agent.wait_for(|spans| {
        server_span(spans, "spin-1").is_some_and(|span| span.tag("wasm.run.duration").is_some())
    });
    let server = server_span(&spans, "spin-1").unwrap();
    let running = double_tag(server, "wasm.run.duration").unwrap();
    assert!(running >= 0.5, "it ran until its deadline: {running} s");
    assert!(running < 3.0, "and no further: {running} s");
    assert!(server.long_tag("wasm.memory.peak").unwrap() > 0);
    // The span it never ended never reached the host.
    assert!(!spans.iter().any(|span| span.operation_name == "spin"));
}

#[tokio::test]
async fn malformed_spans_records_and_metrics_are_dropped_and_counted() {
    let mut agent = Agent::start();
    let mut host = host_with_agent(&agent, "hostile-guest", &[]);
    let response = client()
        .get(host.url("/otel-malformed"))
        .header("x-request-id", "malformed")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["export_refused"], true);
    let spans = agent.wait_for(|spans| {
        server_span(spans, "malformed")
            .is_some_and(|server| child(spans, server, "valid").is_some())
    });
    let server = server_span(&spans, "malformed").unwrap();
    assert!(child(&spans, server, "valid").is_some());
    // Nothing else of the guest's: not in this trace, not anywhere.
    let guest_spans: Vec<&str> = spans
        .iter()
        .filter(|span| span.str_tag("otel.scope.name") == Some("hostile"))
        .map(|span| span.operation_name.as_str())
        .collect();
    assert_eq!(guest_spans, ["valid"]);
    let samples = scrape(&host).await;
    assert_eq!(dropped(&samples, "span"), 9.0);
    assert_eq!(dropped(&samples, "metric"), 2.0);
    // Records whose ids name no span of the request stay in the request's span.
    let records = host.wait_for_logs(2, |line| line["message"] == "hostile record");
    assert_eq!(records.len(), 2);
    for record in &records {
        assert_eq!(record["request_id"], "malformed");
        assert_eq!(record["span_id"], format!("{:016x}", server.span_id));
    }
    assert!(host.is_running());
}

#[tokio::test]
async fn ids_written_without_their_leading_zeros_are_padded_and_an_all_zero_id_is_dropped() {
    let mut agent = Agent::start();
    let mut host = host_with_agent(&agent, "hostile-guest", &[]);
    // A trace id whose top three digits are 0, as one in 4,096 is.
    let trace = 0x0000_af76_5191_6cd4_3dd8_448e_b211_c803_u128;
    let response = client()
        .get(host.url("/otel-short-ids"))
        .header("x-request-id", "short-ids")
        .header(
            "traceparent",
            format!("00-{trace:032x}-b7ad6b7169203331-01"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        body["trace_id"],
        format!("{trace:x}"),
        "the guest wrote 29 digits"
    );
    let spans = agent.wait_for(|spans| {
        server_span(spans, "short-ids").is_some_and(|server| {
            child(spans, server, "short")
                .is_some_and(|short| child(spans, short, "short-child").is_some())
        })
    });
    let server = server_span(&spans, "short-ids").unwrap();
    assert_eq!(server.trace_id, trace);
    let short = child(&spans, server, "short").unwrap();
    assert_eq!((short.trace_id, short.span_id), (trace, 0xb1));
    let short_child = child(&spans, short, "short-child").unwrap();
    assert_eq!(
        (short_child.span_id, short_child.parent_span_id),
        (0xb2, 0xb1)
    );
    assert!(!spans.iter().any(|span| span.operation_name == "short-zero"));
    assert_eq!(dropped(&scrape(&host).await, "span"), 1.0);
    assert!(host.is_running());
}

#[tokio::test]
async fn a_flood_through_wasi_otel_leaves_the_host_alive_bounded_and_counting() {
    let mut agent = Agent::start();
    let mut host = host_with_agent(&agent, "hostile-guest", &[]);
    let started = Instant::now();
    let response = client()
        .get(host.url("/otel-flood"))
        .header("x-request-id", "flood")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(get(&host, "/api/health").await.0, 200);
    let spans = agent.wait_for(|spans| {
        server_span(spans, "flood").is_some_and(|server| child(spans, server, "repeated").is_some())
    });
    let server = server_span(&spans, "flood").unwrap();
    let crowded = child(&spans, server, "crowded").expect("the crowded span, cut to its budget");
    // 100,000 attributes of ~70 bytes: the span keeps what 16 KiB holds.
    assert!(crowded.tags.len() < 300, "{} tags", crowded.tags.len());
    let repeated = spans
        .iter()
        .filter(|span| span.operation_name == "repeated")
        .count();
    assert_eq!(repeated, 1, "one span id ends once");
    let samples = scrape(&host).await;
    assert_eq!(dropped(&samples, "span"), 999_999.0);
    assert_eq!(dropped(&samples, "log"), 1_000_000.0 - 256.0);
    assert_eq!(dropped(&samples, "metric"), 100_000.0 - 255.0);
    assert!(dropped(&samples, "attribute") > 99_000.0);
    let records = host.wait_for_logs(256, |line| line["message"] == "hostile record");
    assert_eq!(records.len(), 256);
    assert!(host.is_running());
}

#[tokio::test]
async fn ids_names_and_severity_texts_past_their_limits_are_read_once_per_request_at_most() {
    let host = hostile_host(&[]);
    let started = Instant::now();
    // 8,000 rounds of the four calls with 4 MiB strings: read each time (160 GiB), they would
    // take minutes, and the deadline would answer 503.
    let (status, body) = get(&host, "/otel-long-strings").await;
    assert_eq!(status, 200, "{body} after {:?}", started.elapsed());
    assert_eq!(get(&host, "/api/health").await.0, 200);
    let samples = scrape(&host).await;
    assert_eq!(
        dropped(&samples, "span"),
        8_000.0,
        "every span, its ids unread or refused"
    );
    assert!(
        dropped(&samples, "metric") >= 1.0,
        "the long-named metric is dropped"
    );
}
