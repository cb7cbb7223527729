//! Lists too long to hold in memory: 100,000 users listed whole by 32 clients at once on each
//! store, past the request's deadline, and a list its client stops reading cut short. A test
//! binary of its own, so its load does not slow the timing-sensitive tests of the others (cargo
//! runs test binaries one after another).

#[macro_use]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::lists::{PeakResident, ask_for_the_list, create_many};
use support::{Host, Store, client, client_from, raw_request};

/// 32 clients on one address read the whole list at once while another keeps both cores busy
/// computing: every list arrives whole, though it takes far longer than the request's deadline
/// (which bounds a guest only until its response head), and the host's memory stays within
/// twice its idle figure.
async fn whole_long_lists_outlive_the_deadline_in_bounded_memory(store: Store) {
    const USERS: usize = 100_000;
    const CLIENTS: usize = 32;
    // A deadline far shorter than the lists take; half of it bounds each store call.
    let host = Host::builder()
        .store(&store)
        .env(&[("REQUEST_TIMEOUT_MS", "4000"), ("STORE_POOL_SIZE", "32")])
        .start();
    let creating = Instant::now();
    create_many(&host, USERS, 64, "User").await;
    eprintln!(
        "{store:?}: {USERS} users created in {:?}",
        creating.elapsed()
    );
    let idle = host.resident_bytes();
    let listing = Instant::now();

    let peak = PeakResident::start(&host);
    let computing = Arc::new(AtomicBool::new(true));
    let computations: Vec<_> = (0..2)
        .map(|_| {
            let (url, computing) = (host.url("/api/compute"), Arc::clone(&computing));
            tokio::spawn(async move {
                let client = client_from([127, 0, 0, 2]);
                let mut answered = 0;
                while computing.load(Ordering::Relaxed) {
                    let response = client.post(&url).json(&json!({"n": 30})).send().await;
                    answered += usize::from(response.is_ok_and(|r| r.status() == 200));
                }
                answered
            })
        })
        .collect();
    let lists: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let url = host.url("/api/users");
            tokio::spawn(async move {
                let response = client().get(url).send().await.unwrap();
                assert_eq!(response.status(), 200);
                let users: Vec<Value> = response.json().await.expect("a complete JSON array");
                users.len()
            })
        })
        .collect();
    for list in lists {
        assert_eq!(list.await.unwrap(), USERS);
    }
    let took = listing.elapsed();
    computing.store(false, Ordering::Relaxed);
    let mut computed = 0;
    for computation in computations {
        computed += computation.await.unwrap();
    }
    eprintln!("{store:?}: listed by {CLIENTS} clients in {took:?}, {computed} computations beside");
    let peak = peak.stop();
    eprintln!(
        "{store:?}: resident {} MiB idle, {} MiB at most while listing",
        idle >> 20,
        peak >> 20
    );
    assert!(
        computed > 0,
        "no computation was answered while the lists streamed"
    );
    assert!(
        peak <= 2 * idle,
        "resident memory {} MiB while listing, {} MiB idle",
        peak >> 20,
        idle >> 20
    );
    let cut = host.log_lines_where(|line| line["level"] == "ERROR");
    assert!(cut.is_empty(), "{cut:#?}");
}

/// A list whose client stops reading for the stall bound is cut off (no final chunk), never a
/// shorter array that looks complete, and a WARN line with the request's id says why.
async fn a_list_its_client_stops_reading_is_cut_and_never_looks_complete(store: Store) {
    use tokio::io::AsyncReadExt;
    let host = Host::builder()
        .store(&store)
        .env(&[("RESPONSE_STALL_MS", "1000"), ("STORE_POOL_SIZE", "16")])
        .start();
    // About 6 MB of JSON: more than the socket buffers hold. As many creations at once as the
    // pool has connections, so none waits for one past its call timeout.
    create_many(&host, 20_000, 16, &"n".repeat(200)).await;
    let mut stream = ask_for_the_list(&host).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the host never closed the connection");
    let text = String::from_utf8_lossy(&answer);
    assert!(
        text.starts_with("HTTP/1.1 200"),
        "{}",
        &text[..text.len().min(200)]
    );
    assert!(text.contains("transfer-encoding: chunked"));
    assert!(
        !text.ends_with("0\r\n\r\n"),
        "a cut-short list ended like a complete one ({} bytes)",
        answer.len()
    );
    let line = host.wait_for_log(|line| {
        line["level"] == "WARN"
            && line["message"]
                .as_str()
                .is_some_and(|message| message.contains("--response-stall-ms"))
    });
    assert!(line["request_id"].is_string(), "{line}");
}

/// With no streaming slots, slow readers stream on running slots, which new requests take back.
#[tokio::test]
async fn slow_readers_with_no_streaming_slot_leave_new_requests_the_running_slots() {
    let host = Host::builder()
        .store(&Store::Memory)
        .env(&[
            ("MAX_INSTANCES", "2"),
            ("MAX_STREAMING", "0"),
            ("RESPONSE_STALL_MS", "1000"),
        ])
        .start();
    create_many(&host, 20_000, 64, &"n".repeat(200)).await;
    // Both instance slots go to clients that ask for the list and never read it.
    let mut slow_readers = Vec::new();
    for _ in 0..2 {
        slow_readers.push(ask_for_the_list(&host).await);
    }
    // Taken back from the readers within the slot wait, or freed at the stall bound.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let health = client().get(host.url("/api/health")).send().await.unwrap();
        if health.status() == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slow readers kept their slots"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(slow_readers);
}

/// A list refused for its body is the host's 413, before any guest runs: the one instance slot is
/// never taken, and the next request is served at once.
#[tokio::test]
async fn a_list_answered_413_for_its_body_gives_its_instance_back_at_once() {
    let host = Host::builder()
        .store(&Store::Memory)
        .env(&[
            ("MAX_INSTANCES", "1"),
            ("MAX_BODY_BYTES", "1000"),
            ("REQUEST_TIMEOUT_MS", "60000"),
        ])
        .start();
    // Several pages of the list, so that the guest is still writing when the 413 goes out.
    create_many(&host, 2_000, 64, "User").await;
    let oversized = "x".repeat(2_000);
    let request = format!(
        "GET /api/users HTTP/1.1\r\nhost: t\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{oversized}",
        oversized.len()
    );
    let started = Instant::now();
    // Each request waits at most 1 s for the one slot, or is answered 503.
    for _ in 0..5 {
        let answer = raw_request(host.authority(), request.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    }
    let health = client().get(host.url("/api/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    assert!(started.elapsed() < Duration::from_secs(10));
    let errors = host.log_lines_where(|line| line["level"] == "ERROR");
    assert!(errors.is_empty(), "{errors:?}");
}

#[tokio::test]
async fn sigterm_with_a_slow_reader_exits_within_the_grace_and_flushes_its_logs() {
    let mut host = Host::builder().store(&Store::Memory).start();
    create_many(&host, 20_000, 64, &"n".repeat(200)).await;
    // A client that asks for the whole list and reads none of it.
    let slow_reader = ask_for_the_list(&host).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopping = Instant::now();
    assert!(host.terminate().success());
    // The 8 s grace, then the flush: well within the compose file's 15 s stop period.
    assert!(
        stopping.elapsed() < Duration::from_secs(11),
        "{:?}",
        stopping.elapsed()
    );
    let log = std::fs::read_to_string(&host.log_file).unwrap();
    assert!(
        log.contains(r#""message":"stopped""#),
        "the last log line was not flushed"
    );
    drop(slow_reader);
}

on_every_store! {
    whole_long_lists_outlive_the_deadline_in_bounded_memory,
    a_list_its_client_stops_reading_is_cut_and_never_looks_complete,
}
