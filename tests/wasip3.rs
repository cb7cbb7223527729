//! End-to-end tests of WASIp3 guests (`wasi:http/handler@0.3.0`), over real sockets: served
//! with a fresh instance per request like WASIp2 ones, within the same deadline and memory
//! limit, and swapped with a WASIp2 guest while serving.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{Host, client, get, guest_path};

/// The p3 fixture's version (tests/fixtures/p3-guest).
const P3_VERSION: &str = "3.0.0";
/// The minimal WASIp2 fixture's version.
const P2_VERSION: &str = "2.0.0";

#[tokio::test]
async fn a_wasip3_guest_gets_a_fresh_instance_for_every_request() {
    let host = Host::builder().guest("p3-guest").start();
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
async fn a_wasip3_guest_that_traps_gets_500_and_the_next_request_is_served() {
    let host = Host::builder().guest("p3-guest").start();
    let (status, body) = get(&host, "/trap").await;
    assert_eq!(status, 500);
    assert_eq!(body["error"], "Internal server error");
    let failed = host.wait_for_log(|line| line["message"] == "request failed");
    assert_eq!(failed["status"], 500);
    let (status, body) = get(&host, "/api/health").await;
    assert_eq!((status, &body["served"]), (200, &Value::from(1)));
}

#[tokio::test]
async fn a_wasip3_guest_that_loops_is_stopped_at_the_deadline_with_503() {
    let host = Host::builder()
        .guest("p3-guest")
        .env(&[("REQUEST_TIMEOUT_MS", "500")])
        .start();
    let started = Instant::now();
    let (status, _) = get(&host, "/loop").await;
    assert_eq!(status, 503);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let (status, _) = get(&host, "/api/health").await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_wasip3_guest_past_its_memory_limit_gets_500() {
    // 64 MiB more than the guest may have.
    let host = Host::builder()
        .guest("p3-guest")
        .env(&[("GUEST_MEMORY_MB", "32")])
        .start();
    let (status, _) = get(&host, "/grow").await;
    assert_eq!(status, 500);
    let (status, _) = get(&host, "/api/health").await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_wasip3_guest_making_streams_without_end_is_stopped_at_the_handle_bound_with_500() {
    let host = Host::builder().guest("p3-guest").start();
    let (status, _) = get(&host, "/streams").await;
    assert_eq!(status, 500);
    let failed = host.wait_for_log(|line| line["message"] == "request failed");
    let cause = failed["error"].as_str().unwrap_or_default();
    assert!(cause.contains("handle limit exceeded"), "{cause}");
    let (status, _) = get(&host, "/api/health").await;
    assert_eq!(status, 200);
}

/// Replaces `live` with `source` the way `cargo` and editors do: write aside, then rename.
fn replace_by_rename(live: &Path, source: &Path) {
    let aside = live.with_extension("next");
    std::fs::copy(source, &aside).unwrap();
    std::fs::rename(&aside, live).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swapping_between_a_wasip2_and_a_wasip3_guest_fails_not_one_request() {
    let live = support::tempdir().join("live.wasm");
    std::fs::copy(guest_path("minimal-guest"), &live).unwrap();
    let host = Arc::new(Host::builder().guest_at(&live).start());
    let stop = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = (0..4)
        .map(|_| {
            let (host, stop) = (Arc::clone(&host), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut answers = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    answers.push(get(&host, "/api/health").await);
                }
                answers
            })
        })
        .collect();
    for swap in 0..6 {
        let (source, version) = if swap % 2 == 0 {
            (guest_path("p3-guest"), P3_VERSION)
        } else {
            (guest_path("minimal-guest"), P2_VERSION)
        };
        replace_by_rename(&live, &source);
        host.signal("HUP");
        let deadline = Instant::now() + Duration::from_secs(20);
        while get(&host, "/api/health").await.1["version"] != version {
            assert!(Instant::now() < deadline, "{version} never served");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut answers = Vec::new();
    for task in load {
        answers.extend(task.await.unwrap());
    }
    let failed: Vec<_> = answers
        .iter()
        .filter(|(status, _)| *status != 200)
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} requests failed: {failed:?}",
        failed.len(),
        answers.len()
    );
    for version in [P2_VERSION, P3_VERSION] {
        assert!(
            answers.iter().any(|(_, body)| body["version"] == version),
            "{version} never served"
        );
    }
}
