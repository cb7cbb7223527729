//! End-to-end tests of WASIp3 guests (`wasi:http/handler@0.3.0`), over real sockets: served
//! with a fresh instance per request like WASIp2 ones, within the same deadline and memory
//! limit, calling the host's `users` interface, and swapped with a WASIp2 guest while serving;
//! and with instance reuse on (`--max-instance-reuse-count`), within the counts it is given,
//! which reuses WASIp2 guests' instances too, one request at a time.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::jaeger::{Agent, server_span};
use support::swaps::{answers_while_swapping, assert_every_answer_ok};
use support::{Host, client, client_from, get, guest_path, hostile_host};

/// The p3 fixture's version (tests/fixtures/p3-guest).
const P3_VERSION: &str = "3.0.0";
/// The minimal WASIp2 fixture's version.
const P2_VERSION: &str = "2.0.0";

#[tokio::test]
async fn a_wasip3_guest_gets_a_fresh_instance_for_every_request() {
    let host = p3_host(&[]);
    for _ in 0..5 {
        let response = client().get(host.url("/api/health")).send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(
            response.headers()["content-type"],
            "application/json",
            "the guest's own headers"
        );
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["version"], P3_VERSION);
        // The instance's count of requests: a fresh instance has served only this one.
        assert_eq!(body["served"], 1, "{body}");
    }
}

#[tokio::test]
async fn a_wasip3_guest_stores_and_reads_users_through_the_hosts_users_interface() {
    let host = Host::builder().guest("p3-users-guest").start();
    let (status, created) = get(&host, "/users/new").await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["name"], "WASIp3");
    let id = created["id"].as_str().expect("the stored user's id");
    // Another fresh instance finds it: the store is the host's, not the instance's.
    let (status, found) = get(&host, &format!("/users/{id}")).await;
    assert_eq!((status, &found), (200, &created));
    let (status, _) = get(&host, "/users/new").await;
    assert_eq!(
        status, 409,
        "the host's store refuses the same e-mail twice"
    );
    let (status, _) = get(&host, "/users/00000000-0000-4000-8000-000000000000").await;
    assert_eq!(status, 404);
}

/// The host serving the p3 fixture with `env`.
fn p3_host(env: &[(&str, &str)]) -> Host {
    Host::builder().guest("p3-guest").env(env).start()
}

/// The status `GET path` gets from `host`, and the cause its ERROR line gives; a fresh
/// instance answers the next request all the same.
async fn failure_and_recovery(host: &Host, path: &str) -> (u16, String) {
    let (status, _) = get(host, path).await;
    let failed = host.wait_for_log(|line| line["url.path"] == path && line["status"] == status);
    let (after, body) = get(host, "/api/health").await;
    assert_eq!(
        (after, &body["served"]),
        (200, &Value::from(1)),
        "after {path}"
    );
    (
        status,
        failed["error"].as_str().unwrap_or_default().to_string(),
    )
}

#[tokio::test]
async fn a_wasip3_guest_that_traps_gets_500_and_the_next_request_is_served() {
    let host = p3_host(&[]);
    let (status, cause) = failure_and_recovery(&host, "/trap").await;
    assert_eq!(status, 500);
    assert!(cause.starts_with("the guest failed"), "{cause}");
}

#[tokio::test]
async fn a_wasip3_guest_that_loops_is_stopped_at_the_deadline_with_503() {
    let host = p3_host(&[("REQUEST_TIMEOUT_MS", "200")]);
    let started = Instant::now();
    let (status, _) = get(&host, "/loop").await;
    let answered = started.elapsed();
    assert_eq!(status, 503);
    // The epoch deadline stops it, inside the instance's event loop: not the backstop, a
    // second after the deadline, which cannot stop a guest that never yields.
    assert!(answered < Duration::from_secs(1), "{answered:?}");
    let (status, cause) = failure_and_recovery(&host, "/loop").await;
    assert_eq!(status, 503);
    assert!(cause.contains("deadline"), "{cause}");
}

#[tokio::test]
async fn a_wasip3_guest_past_its_memory_limit_gets_500() {
    // It asks for 64 MiB more than it may have.
    let host = p3_host(&[("GUEST_MEMORY_MB", "32")]);
    let (status, cause) = failure_and_recovery(&host, "/grow").await;
    assert_eq!(status, 500);
    assert!(
        cause.starts_with("the guest failed after its memory limit (--guest-memory-mb)"),
        "{cause}"
    );
}

#[tokio::test]
async fn a_wasip3_guest_making_streams_without_end_is_stopped_at_the_handle_bound_with_500() {
    let host = p3_host(&[]);
    let (status, cause) = failure_and_recovery(&host, "/streams").await;
    assert_eq!(status, 500);
    assert!(cause.contains("handle limit exceeded"), "{cause}");
}

#[tokio::test]
async fn a_wasip3_request_may_hold_2048_handles_at_once_and_no_more() {
    let host = p3_host(&[]);
    // Two handles a stream, beside the few the request itself holds (its request, response,
    // fields, body): 1,000 streams fit, 1,030 do not.
    let (status, _) = get(&host, "/streams?n=1000").await;
    assert_eq!(status, 200);
    let (status, _) = get(&host, "/streams?n=1030").await;
    assert_eq!(status, 500);
    let failed = host.wait_for_log(|line| line["url.path"] == "/streams" && line["status"] == 500);
    let cause = failed["error"].as_str().unwrap_or_default();
    assert!(cause.contains("handle limit exceeded"), "{failed}");
}

#[tokio::test]
async fn a_wasip3_guest_holding_requests_with_huge_authorities_is_stopped_at_its_memory_limit() {
    let host = p3_host(&[]);
    let idle = host.resident_bytes();
    let (status, cause) = failure_and_recovery(&host, "/authorities").await;
    assert_eq!(status, 500);
    assert!(cause.contains("host objects would hold"), "{cause}");
    // Its 128 MiB limit, not gigabytes of copied strings.
    let grown = host.resident_bytes().saturating_sub(idle);
    assert!(grown < 512 << 20, "{} MiB", grown >> 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swapping_between_a_wasip2_and_a_wasip3_guest_fails_not_one_request() {
    let live = support::tempdir().join("live.wasm");
    std::fs::copy(guest_path("minimal-guest"), &live).unwrap();
    let host = Arc::new(Host::builder().guest_at(&live).start());
    let swaps: Vec<_> = (0..6)
        .map(|swap| {
            if swap % 2 == 0 {
                (guest_path("p3-guest"), P3_VERSION)
            } else {
                (guest_path("minimal-guest"), P2_VERSION)
            }
        })
        .collect();
    let answers = answers_while_swapping(&host, &live, &swaps).await;
    assert_every_answer_ok(&answers, &[P2_VERSION, P3_VERSION]);
}

/// The host serving the p3 fixture with reuse on: `requests` per instance, `concurrent` at once.
fn reusing_host(requests: &str, concurrent: &str, env: &[(&str, &str)]) -> Host {
    let mut all = vec![
        ("MAX_INSTANCE_REUSE_COUNT", requests),
        ("MAX_INSTANCE_CONCURRENT_REUSE_COUNT", concurrent),
    ];
    all.extend_from_slice(env);
    p3_host(&all)
}

#[tokio::test]
async fn with_reuse_an_instance_serves_up_to_the_reuse_count_then_a_fresh_one_starts() {
    let host = reusing_host("3", "1", &[]);
    let mut counts = Vec::new();
    for _ in 0..7 {
        let (status, body) = get(&host, "/api/health").await;
        assert_eq!(status, 200, "{body}");
        counts.push(body["served"].as_u64().unwrap());
    }
    assert_eq!(counts, [1, 2, 3, 1, 2, 3, 1]);
}

#[tokio::test]
async fn with_reuse_an_idle_instance_is_dropped_after_the_idle_timeout() {
    let host = reusing_host("100", "1", &[("IDLE_INSTANCE_TIMEOUT_MS", "200")]);
    assert_eq!(get(&host, "/api/health").await.1["served"], 1);
    assert_eq!(get(&host, "/api/health").await.1["served"], 2);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(get(&host, "/api/health").await.1["served"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_concurrent_reuse_an_instance_holds_at_most_the_configured_requests_at_once() {
    let host = Arc::new(reusing_host("1000", "2", &[]));
    // One at a time, so each finds the instances the ones before it started waiting.
    let mut requests = Vec::new();
    for _ in 0..8 {
        let host = Arc::clone(&host);
        requests.push(tokio::spawn(async move { get(&host, "/sleep").await }));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut peaks = Vec::new();
    for request in requests {
        let (status, body) = request.await.unwrap();
        assert_eq!(status, 200, "{body}");
        peaks.push(body["peak"].as_u64().unwrap());
    }
    assert!(peaks.iter().all(|&peak| peak <= 2), "{peaks:?}");
    assert!(
        peaks.contains(&2),
        "no two requests shared an instance: {peaks:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trap_in_a_reused_instance_fails_the_requests_inside_it_and_no_other() {
    let host = Arc::new(reusing_host("1000", "2", &[]));
    // Two waiting requests fill the first instance; the third waits in a second one, where
    // the trap then lands, the only instance with room.
    let mut waiting = Vec::new();
    for _ in 0..3 {
        let host = Arc::clone(&host);
        waiting.push(tokio::spawn(async move { get(&host, "/sleep").await.0 }));
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    let (status, _) = get(&host, "/trap").await;
    assert_eq!(status, 500);
    let mut waited = Vec::new();
    for request in waiting {
        waited.push(request.await.unwrap());
    }
    assert_eq!(
        waited,
        [200, 200, 500],
        "the third shared the trapped instance"
    );
    let trapped = host.wait_for_log(|line| line["url.path"] == "/trap" && line["status"] == 500);
    assert!(
        trapped["error"]
            .as_str()
            .is_some_and(|error| error.contains("the reused instance serving it failed")),
        "{trapped}"
    );
    // The request that shared the instance names its failure without the trap's own text,
    // which is another request's (the instance's WARN line has it).
    let shared = host.wait_for_log(|line| line["url.path"] == "/sleep" && line["status"] == 500);
    let shared_error = shared["error"].as_str().unwrap_or_default();
    assert!(
        shared_error.contains("the reused instance serving it failed")
            && !shared_error.contains("unreachable"),
        "{shared}"
    );
    host.wait_for_log(|line| {
        line["message"] == "a reused guest instance ended"
            && line["error"]
                .as_str()
                .is_some_and(|error| error.contains("unreachable"))
    });
    // The first instance lives on: the next request is its third.
    let (status, body) = get(&host, "/api/health").await;
    assert_eq!((status, &body["served"]), (200, &Value::from(3)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_a_reused_instance_puts_its_text_in_no_other_requests_line() {
    const MARKER: &str = "marker-4f1d9c-of-another-request";
    let host = Arc::new(reusing_host("1000", "2", &[]));
    // A request from another address shares the instance when the panic ends it.
    let sharing = {
        let host = Arc::clone(&host);
        tokio::spawn(async move {
            let response = client_from([127, 0, 0, 3])
                .get(host.url("/sleep"))
                .header("x-request-id", "sharing")
                .send()
                .await
                .unwrap();
            response.status().as_u16()
        })
    };
    tokio::time::sleep(Duration::from_millis(60)).await;
    let panicking = client_from([127, 0, 0, 2])
        .get(host.url(&format!("/panic?{MARKER}")))
        .header("x-request-id", "panicking")
        .send()
        .await
        .unwrap();
    assert_eq!(panicking.status(), 500);
    assert_eq!(sharing.await.unwrap(), 500, "it shared the instance");
    let shared = host.wait_for_log(|line| line["request_id"] == "sharing" && line["status"] == 500);
    assert!(
        shared["error"]
            .as_str()
            .is_some_and(|error| error.contains("the reused instance serving it failed")),
        "{shared}"
    );
    host.wait_for_log(|line| line["message"] == "a reused guest instance ended");
    let leaked: Vec<_> = host
        .log_lines()
        .into_iter()
        .filter(|line| line["request_id"].is_string() && line["request_id"] != "panicking")
        .filter(|line| line.to_string().contains(MARKER))
        .collect();
    assert!(leaked.is_empty(), "{leaked:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_reuse_a_request_past_the_running_slots_waits_for_one_as_a_fresh_one_does() {
    let host = Arc::new(reusing_host(
        "100",
        "1",
        &[("MAX_INSTANCES", "2"), ("IDLE_INSTANCE_TIMEOUT_MS", "5000")],
    ));
    // Two requests take both slots; the third waits in line for the first to end (300 ms),
    // then sleeps its own 300 ms.
    let mut requests = Vec::new();
    for _ in 0..3 {
        let host = Arc::clone(&host);
        requests.push(tokio::spawn(async move {
            let sent = Instant::now();
            (get(&host, "/sleep").await.0, sent.elapsed())
        }));
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    let mut answers = Vec::new();
    for request in requests {
        answers.push(request.await.unwrap());
    }
    let statuses: Vec<u16> = answers.iter().map(|(status, _)| *status).collect();
    assert_eq!(statuses, [200, 200, 200]);
    let third = answers[2].1;
    assert!(
        third >= Duration::from_millis(500),
        "{third:?}: it did not wait"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_reuse_a_request_whose_client_leaves_keeps_its_slot_until_its_instance_is_done() {
    let host = reusing_host("100", "1", &[("MAX_INSTANCES", "1")]);
    // The one running slot's request sleeps 300 ms in its instance; its client leaves at 50.
    let sent = Instant::now();
    let leaving = client_from([127, 0, 0, 2])
        .get(host.url("/sleep"))
        .timeout(Duration::from_millis(50))
        .send()
        .await;
    assert!(leaving.is_err());
    let response = client_from([127, 0, 0, 3])
        .get(host.url("/api/health"))
        .send()
        .await
        .unwrap();
    let waited = sent.elapsed();
    assert_eq!(response.status(), 200);
    assert!(
        waited >= Duration::from_millis(250),
        "answered {waited:?} after the sleeper came: its slot was free while it slept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_under_reuse_frees_the_places_of_the_old_guests_idle_instances_at_once() {
    let host = Arc::new(reusing_host(
        "100",
        "1",
        &[
            ("MAX_INSTANCES", "2"),
            ("MAX_STREAMING", "0"),
            ("IDLE_INSTANCE_TIMEOUT_MS", "3600000"),
        ],
    ));
    // Two instances of the old guest, idle now, hold both places for reused instances (as
    // many as there are slots) for the next hour.
    let sleepers: Vec<_> = (0..2)
        .map(|_| {
            let host = Arc::clone(&host);
            tokio::spawn(async move { get(&host, "/sleep").await.0 })
        })
        .collect();
    for sleeper in sleepers {
        assert_eq!(sleeper.await.unwrap(), 200);
    }
    let signalled = Instant::now();
    host.signal("HUP");
    host.wait_for_log(|line| line["message"] == "guest reloaded");
    // The new guest's instances: a fresh one, then two at once, in both slots.
    let (status, body) = get(&host, "/api/health").await;
    assert_eq!((status, &body["served"]), (200, &Value::from(1)), "{body}");
    assert!(
        signalled.elapsed() < Duration::from_secs(3),
        "answered {:?} after SIGHUP",
        signalled.elapsed()
    );
    let sleepers: Vec<_> = (0..2)
        .map(|_| {
            let host = Arc::clone(&host);
            tokio::spawn(async move { get(&host, "/sleep").await.0 })
        })
        .collect();
    for sleeper in sleepers {
        assert_eq!(
            sleeper.await.unwrap(),
            200,
            "both slots are the new guest's"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_reuse_an_instance_that_waits_then_computes_keeps_no_other_clients_request_waiting() {
    let host = Arc::new(reusing_host("100", "16", &[("REQUEST_TIMEOUT_MS", "8000")]));
    // Its task waits 100 ms, the instance saying it is free, then computes: the instance
    // takes no request until its deadline.
    let computing = {
        let host = Arc::clone(&host);
        tokio::spawn(async move {
            let response = client_from([127, 0, 0, 2])
                .get(host.url("/wait-then-loop"))
                .send()
                .await
                .unwrap();
            response.status().as_u16()
        })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    let other = client_from([127, 0, 0, 3]);
    for request in 0..20 {
        let sent = Instant::now();
        let response = other.get(host.url("/api/health")).send().await.unwrap();
        let took = sent.elapsed();
        assert_eq!(response.status(), 200, "request {request}");
        assert!(
            took < Duration::from_secs(1),
            "request {request} took {took:?}"
        );
    }
    assert!(!computing.is_finished(), "it was computing all along");
    assert_eq!(computing.await.unwrap(), 503, "stopped at its deadline");
    // The first health check's copy, left in the queue, was taken by an instance made for it
    // and stopped before it did any work: the next request's instance has served it alone.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, body) = get(&host, "/api/health").await;
    assert_eq!((status, &body["served"]), (200, &Value::from(1)), "{body}");
    let ended = host.log_lines_where(|line| line["message"] == "a reused guest instance ended");
    assert_eq!(ended.len(), 1, "only the computing instance: {ended:#?}");
}

#[tokio::test]
async fn a_reused_instance_that_loops_is_stopped_at_the_deadline_with_503() {
    let host = reusing_host("100", "16", &[("REQUEST_TIMEOUT_MS", "200")]);
    let started = Instant::now();
    let (status, _) = get(&host, "/loop").await;
    assert_eq!(status, 503);
    let answered = started.elapsed();
    assert!(answered < Duration::from_secs(2), "{answered:?}");
    let (status, body) = get(&host, "/api/health").await;
    assert_eq!((status, &body["served"]), (200, &Value::from(1)));
}

#[tokio::test]
async fn a_reused_instance_past_its_memory_limit_gets_500() {
    let host = reusing_host("100", "16", &[("GUEST_MEMORY_MB", "32")]);
    let (status, _) = get(&host, "/grow").await;
    assert_eq!(status, 500);
    let failed = host.wait_for_log(|line| line["url.path"] == "/grow" && line["status"] == 500);
    assert!(
        failed["error"]
            .as_str()
            .is_some_and(|error| error.contains("memory limit")),
        "{failed}"
    );
}

#[tokio::test]
async fn requests_sharing_a_reused_instance_each_get_their_own_span_and_user_store_calls() {
    let mut agent = Agent::start();
    let port = agent.port.to_string();
    let host = Host::builder()
        .guest("p3-users-guest")
        .env(&[
            ("MAX_INSTANCE_REUSE_COUNT", "100"),
            ("OTEL_EXPORTER_JAEGER_AGENT_HOST", "127.0.0.1"),
            ("OTEL_EXPORTER_JAEGER_AGENT_PORT", port.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ])
        .start();
    // One after the other: the second is served by the instance the first left idle.
    let created = support::get_with_id(&host, "/users/new", "create").await;
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    let id = created["id"].as_str().expect("the stored user's id");
    let found = support::get_with_id(&host, &format!("/users/{id}"), "read").await;
    assert_eq!(found.status(), 200);
    let spans = agent.wait_for(|spans| {
        ["create", "read"].iter().all(|id| {
            server_span(spans, id).is_some_and(|span| span.tag("wasm.host_calls.users").is_some())
        })
    });
    for request_id in ["create", "read"] {
        let server = server_span(&spans, request_id).unwrap();
        assert_eq!(
            server.long_tag("wasm.host_calls.users"),
            Some(1),
            "{request_id}: its own call, not its neighbour's"
        );
        let store_calls = spans
            .iter()
            .filter(|span| {
                span.trace_id == server.trace_id
                    && span.parent_span_id == server.span_id
                    && span.operation_name.ends_with(" users")
            })
            .count();
        assert_eq!(
            store_calls, 1,
            "{request_id}: one user-store span under its own"
        );
    }
}

/// What the hostile fixture's `/remember` reports of an instance that has served `earlier`
/// requests before: its counter, the statics and the grown page those requests wrote.
fn remembered(earlier: u64) -> Value {
    if earlier == 0 {
        serde_json::json!({"counter": 0, "dirty_words": 0, "dirty_grown_bytes": 0})
    } else {
        serde_json::json!({"counter": earlier, "dirty_words": 8192, "dirty_grown_bytes": 0})
    }
}

#[tokio::test]
async fn with_reuse_a_wasip2_instance_serves_up_to_the_reuse_count_one_request_at_a_time() {
    let host = hostile_host(&[
        ("MAX_INSTANCE_REUSE_COUNT", "3"),
        ("MAX_INSTANCE_CONCURRENT_REUSE_COUNT", "16"),
    ]);
    let loaded = host.wait_for_log(|line| line["message"] == "guest loaded");
    assert_eq!(
        loaded["instances"], "reused: up to 3 requests each, 1 at once, dropped after 1000 ms idle",
        "a WASIp2 export is synchronous: {loaded}"
    );
    for earlier in [0, 1, 2, 0, 1, 2, 0] {
        assert_eq!(get(&host, "/remember").await, (200, remembered(earlier)));
    }
}

#[tokio::test]
async fn a_trap_in_a_reused_wasip2_instance_gets_500_and_the_next_request_a_fresh_instance() {
    let host = hostile_host(&[("MAX_INSTANCE_REUSE_COUNT", "100")]);
    assert_eq!(get(&host, "/remember").await, (200, remembered(0)));
    assert_eq!(get(&host, "/remember").await, (200, remembered(1)));
    let (status, body) = get(&host, "/past-the-end").await;
    assert_eq!(
        (status, body),
        (500, serde_json::json!({"error": "Internal server error"}))
    );
    assert_eq!(get(&host, "/remember").await, (200, remembered(0)));
    // A trap, not a request left unanswered: the instance's failure is the cause.
    let failed =
        host.wait_for_log(|line| line["url.path"] == "/past-the-end" && line["level"] == "ERROR");
    let error = failed["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("the reused instance serving it failed"),
        "{failed}"
    );
}

#[tokio::test]
async fn a_reused_wasip2_instance_that_returns_without_answering_gets_500_and_takes_no_more_requests()
 {
    let host = hostile_host(&[("MAX_INSTANCE_REUSE_COUNT", "100")]);
    assert_eq!(get(&host, "/remember").await, (200, remembered(0)));
    assert_eq!(get(&host, "/remember").await, (200, remembered(1)));
    // Each instance that meets the route is broken: the next request goes to a fresh one. An
    // instance has answered twice, so however many meet it, the guest stays reused.
    for _ in 0..3 {
        assert_eq!(
            get(&host, "/no-answer").await,
            (500, serde_json::json!({"error": "Internal server error"}))
        );
    }
    assert_eq!(get(&host, "/remember").await, (200, remembered(0)));
    assert_eq!(get(&host, "/remember").await, (200, remembered(1)));
    let warned = warning(&host, "takes no more");
    assert!(
        warned["message"]
            .as_str()
            .unwrap()
            .contains("componentize-js"),
        "{warned}"
    );
    let failed =
        host.wait_for_log(|line| line["url.path"] == "/no-answer" && line["level"] == "ERROR");
    assert_eq!(
        failed["error"], "the guest returned without sending a response",
        "{failed}"
    );
}

#[tokio::test]
async fn a_reused_guest_that_answers_once_per_instance_fails_each_instances_second_request_as_under_wasmtime_serve()
 {
    let host = hostile_host(&[("MAX_INSTANCE_REUSE_COUNT", "100")]);
    // Each instance answers its first request and leaves its second unanswered (a 500), which
    // retires it; reuse stays on, so the next instance does the same.
    let mut failed = 0;
    for _ in 0..10 {
        match get(&host, "/answer-once").await {
            (200, _) => {}
            (500, _) => failed += 1,
            other => panic!("{other:?}"),
        }
    }
    assert!(failed > 3, "{failed} of 10 failed");
    let warned = warning(&host, "must be served fresh");
    assert!(
        warned["message"]
            .as_str()
            .unwrap()
            .contains("componentize-js")
    );
}

/// The first WARN line whose message contains `text`, once the host has written it.
fn warning(host: &Host, text: &str) -> Value {
    host.wait_for_log(|line| {
        line["level"] == "WARN"
            && line["message"]
                .as_str()
                .is_some_and(|message| message.contains(text))
    })
}

/// The host serving the orders fixture (WASIp2, reading request bodies) with reuse on.
fn reused_orders_host() -> Host {
    Host::builder()
        .guest("orders-guest")
        .env(&[("MAX_INSTANCE_REUSE_COUNT", "100")])
        .start()
}

#[tokio::test]
async fn requests_through_a_reused_wasip2_instance_each_name_their_own_route() {
    let host = reused_orders_host();
    for _ in 0..3 {
        let put = client().put(host.url("/api/orders/7")).body("{}").send();
        assert_eq!(put.await.unwrap().status(), 200);
        let get = client().get(host.url("/api/renaming")).send();
        assert_eq!(get.await.unwrap().status(), 200);
    }
    let samples = support::prometheus::scrape(&host).await;
    let requests = |method, route| {
        let labels = [("method", method), ("route", route), ("status", "200")];
        support::prometheus::value(&samples, "http_requests_total", &labels)
    };
    assert_eq!(requests("PUT", "/api/orders/{id}"), 3.0);
    assert_eq!(requests("GET", "/api/b"), 3.0);
}

#[tokio::test]
async fn a_reused_wasip2_instance_that_loops_is_stopped_at_the_deadline_with_503() {
    let host = hostile_host(&[
        ("MAX_INSTANCE_REUSE_COUNT", "100"),
        ("REQUEST_TIMEOUT_MS", "200"),
    ]);
    assert_eq!(get(&host, "/remember").await, (200, remembered(0)));
    let started = Instant::now();
    assert_eq!(get(&host, "/loop").await.0, 503);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(get(&host, "/remember").await, (200, remembered(0)));
}

#[tokio::test]
async fn a_reused_wasip2_instance_keeping_every_request_is_stopped_at_its_limit_with_the_cause() {
    let host = hostile_host(&[
        ("MAX_INSTANCE_REUSE_COUNT", "1000000"),
        ("GUEST_MEMORY_MB", "8"),
    ]);
    let mut kept = 0;
    let stopped = loop {
        let id = format!("keep-{kept}");
        let response = support::get_with_id(&host, "/keep-request", &id).await;
        if response.status() != 200 {
            break (response.status().as_u16(), id);
        }
        let body: Value = response.json().await.unwrap();
        kept += 1;
        assert_eq!(body["kept"], kept, "one instance keeps them all");
        assert!(kept < 500, "8 MiB kept more than 500 requests");
    };
    assert_eq!(
        stopped.0, 500,
        "past the instance's own limit: the guest's fault"
    );
    assert!(kept >= 8, "stopped after {kept} requests");
    let line = host.wait_for_log(|line| line["request_id"] == stopped.1);
    let cause = line["error"].as_str().unwrap_or_default();
    assert!(
        cause.contains("the reused instance serving it failed") && cause.contains("wasi:http"),
        "{cause}"
    );
    let (status, body) = get(&host, "/keep-request").await;
    assert_eq!((status, body), (200, serde_json::json!({"kept": 1})));
}

#[tokio::test]
async fn a_reused_instance_reads_a_request_body_whole_while_the_request_lasts() {
    let host = reused_orders_host();
    for length in [0, 1, 100_000, 1 << 20] {
        let put = client()
            .put(host.url("/api/orders/7"))
            .body(vec![b'x'; length]);
        let response = put.send().await.unwrap();
        assert_eq!(response.status(), 200);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["bytes"], length, "{body}");
    }
}

#[tokio::test]
async fn a_wasip3_instance_fresh_or_reused_reads_a_request_body_whole() {
    let reused = [
        ("MAX_INSTANCE_REUSE_COUNT", "128"),
        ("MAX_INSTANCE_CONCURRENT_REUSE_COUNT", "16"),
    ];
    for host in [p3_host(&[]), p3_host(&reused)] {
        for length in [0, 1, 100_000, 1 << 20] {
            let post = client().post(host.url("/length")).body(vec![b'x'; length]);
            let response = post.send().await.unwrap();
            assert_eq!(response.status(), 200);
            let body: Value = response.json().await.unwrap();
            assert_eq!(body["length"], length, "{body}");
        }
    }
}

#[tokio::test]
async fn a_body_a_reused_instance_keeps_past_its_request_is_gone_with_the_request() {
    // The kept request's body, its bytes and their share of the host's body budget, belong to
    // the request: the guest reading it later finds nothing to read.
    let host = hostile_host(&[
        ("MAX_INSTANCE_REUSE_COUNT", "1000000"),
        ("IDLE_INSTANCE_TIMEOUT_MS", "60000"),
    ]);
    let kept = client()
        .post(host.url("/keep-request"))
        .body(vec![b'k'; 100_000])
        .send()
        .await
        .unwrap();
    assert_eq!(kept.status(), 200);
    // Its answer read to the end: the request has ended.
    assert_eq!(kept.text().await.unwrap(), r#"{"kept":1}"#);
    let (status, body) = get(&host, "/read-kept").await;
    assert_eq!((status, body), (200, serde_json::json!({"failed": 0})));
}

#[tokio::test]
async fn a_body_a_reused_instance_keeps_open_is_cut_short_at_the_stall_bound() {
    let host = hostile_host(&[
        ("MAX_INSTANCE_REUSE_COUNT", "1000000"),
        ("RESPONSE_STALL_MS", "300"),
    ]);
    let started = Instant::now();
    let response = client().get(host.url("/keep-body")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let body = tokio::spawn(response.bytes());
    // The instance keeps serving meanwhile, so it never goes idle.
    while !body.is_finished() {
        assert_eq!(get(&host, "/remember").await.0, 200);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the body is still open"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        body.await.unwrap().is_err(),
        "a cut-short body must not look complete"
    );
}

#[tokio::test]
async fn a_body_a_reused_instance_writes_as_fast_as_a_slow_client_reads_outlives_the_deadline_until_the_response_timeout()
 {
    let host = reusing_host(
        "1000000",
        "16",
        &[
            ("REQUEST_TIMEOUT_MS", "300"),
            ("RESPONSE_TIMEOUT_MS", "1500"),
        ],
    );
    let started = Instant::now();
    let mut response = client().get(host.url("/flood")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    // A slow reader: a frame is always ready when it asks, so the body never waits on the guest.
    let ended = loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        match response.chunk().await {
            Ok(Some(_)) => {}
            ended => break ended,
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the body is still open"
        );
    };
    assert!(ended.is_err(), "a cut-short body must not look complete");
    // Not at the deadline, which bounds only the head: at the response timeout.
    assert!(started.elapsed() >= Duration::from_millis(1500));
}
