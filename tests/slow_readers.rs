//! Hundreds of clients that ask for a long list and never read it. A test binary of its own:
//! it times `GET /api/health`, so nothing else may load the machine meanwhile (cargo runs test
//! binaries one after another, and the tests here take turns).

mod support;

use std::time::{Duration, Instant};

use support::lists::{PeakResident, ask_for_the_list, ask_for_the_list_from, create_many};
use support::{Host, Store, client};

/// Held by each test for its whole run: the tests of a binary run in parallel otherwise.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// 300 clients ask for a list of 40,000 users and never read it (the attack that once took every
/// slot). Each holds a streaming slot, not one of the slots new requests need, so `GET /api/health`
/// stays 200 and is served (not kept waiting for a slot or a timeout) the whole time (the
/// readers' instances are dropped at the stall bound), and the host's memory grows by a bounded
/// amount. How fast health stays is measured by `make bench`, not here: a timed assertion on a
/// busy CI machine is a flaky test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_slow_readers_leave_health_fast_and_memory_bounded() {
    let _turn = ONE_AT_A_TIME.lock().await;
    const SLOW_READERS: usize = 300;
    let host = Host::builder().store(&Store::Memory).start();
    create_many(&host, 40_000, 64, "Some User").await;
    let idle = host.resident_bytes();
    let peak = PeakResident::start(&host);
    // Health is asked every 20 ms from before the first slow reader until past the stall bound
    // (10 s), when their connections are closed and their instances dropped.
    let health = {
        let url = host.url("/api/health");
        tokio::spawn(async move {
            let client = client();
            let until = Instant::now() + Duration::from_secs(13);
            let mut slowest = Duration::ZERO;
            let mut asked = 0;
            while Instant::now() < until {
                let started = Instant::now();
                let status = client.get(&url).send().await.unwrap().status();
                assert_eq!(status, 200, "health answered {status} after {asked} checks");
                slowest = slowest.max(started.elapsed());
                asked += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (slowest, asked)
        })
    };
    let mut slow_readers = Vec::new();
    for _ in 0..SLOW_READERS {
        slow_readers.push(ask_for_the_list(&host).await);
    }
    let (slowest, asked) = health.await.unwrap();
    let peak = peak.stop();
    eprintln!(
        "{SLOW_READERS} slow readers: health asked {asked} times, slowest {slowest:?}; \
         resident {} MiB idle, {} MiB at most",
        idle >> 20,
        peak >> 20
    );
    // Served, not queued behind a slot's 1 s wait or a 10 s stall.
    assert!(slowest < Duration::from_secs(1), "{slowest:?}");
    assert!(
        peak < idle + (512 << 20),
        "resident memory {} MiB, {} MiB idle",
        peak >> 20,
        idle >> 20
    );
    drop(slow_readers);
}

/// What one client that never reads may make the host hold, at most: its instance (the real
/// guest's linear memory with the list it is writing, its stack), the body's buffered chunks,
/// hyper's buffer and the socket's unsent bytes. About 0.7 MiB was measured.
const PER_READER_BYTES: u64 = 1 << 20;

/// Crowds of 600 and then 2,000 clients, all from 127.0.0.2, ask for a list of 200 users of
/// the largest size (375 KB) and never read it, while a fresh client on 127.0.0.3 asks for
/// health every 200 ms: every probe is answered 200 within a second, because the instances
/// writing to non-readers beyond the streaming slots are stopped for fresh requests instead of
/// holding the running slots until their stall bound. The crowds' memory is bounded by the slots,
/// not by their number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crowds_of_clients_that_never_read_leave_fresh_requests_their_slots() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let host = Host::builder().store(&Store::Memory).start();
    let long_name = "\u{1F600}".repeat(200);
    create_many(&host, 200, 16, &long_name).await;
    let idle = host.resident_bytes();
    for crowd in [600, 2_000] {
        let peak = PeakResident::start(&host);
        let probes = {
            let url = host.url("/api/health");
            tokio::spawn(async move {
                let client = reqwest::Client::builder()
                    .no_proxy()
                    .local_address(std::net::IpAddr::from([127, 0, 0, 3]))
                    .timeout(Duration::from_secs(5))
                    .build()
                    .unwrap();
                // Past the write stall time, when the first readers' connections are closed.
                let until = Instant::now() + Duration::from_secs(12);
                let mut slowest = Duration::ZERO;
                let mut asked = 0;
                while Instant::now() < until {
                    let started = Instant::now();
                    let status = client.get(&url).send().await.unwrap().status();
                    assert_eq!(status, 200, "probe {asked} answered {status}");
                    slowest = slowest.max(started.elapsed());
                    asked += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                (slowest, asked)
            })
        };
        let mut readers = Vec::with_capacity(crowd);
        for _ in 0..crowd {
            readers.push(ask_for_the_list_from(&host, [127, 0, 0, 2]).await);
        }
        let (slowest, asked) = probes.await.unwrap();
        let peak = peak.stop();
        eprintln!(
            "{crowd} readers that never read: {asked} probes, slowest {slowest:?}; resident \
             {} MiB idle, {} MiB at most",
            idle >> 20,
            peak >> 20
        );
        assert!(slowest < Duration::from_secs(1), "{slowest:?}");
        let slots = u64::from(host::runtime::settings::DEFAULT_MAX_INSTANCES)
            + u64::from(host::runtime::settings::DEFAULT_MAX_STREAMING);
        assert!(
            peak < idle + slots * PER_READER_BYTES,
            "resident {} MiB at most for {crowd} readers, {} MiB idle",
            peak >> 20,
            idle >> 20
        );
        drop(readers);
    }
}

/// Under reuse (16 requests per instance, one at a time) with 2 instance slots, 200 clients
/// from 127.0.0.2 ask for the long list and never read it, while a client on 127.0.0.3 asks
/// for its health 20 times: every answer is 200, because a reused instance's request holds a slot as
/// a fresh one does (the readers' move to their share of the streaming slots) and the
/// instances are not bounded by the running slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_reuse_a_crowd_that_never_reads_leaves_another_client_served() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let host = Host::builder()
        .store(&Store::Memory)
        .env(&[
            ("MAX_INSTANCE_REUSE_COUNT", "16"),
            ("MAX_INSTANCE_CONCURRENT_REUSE_COUNT", "1"),
            ("MAX_INSTANCES", "2"),
        ])
        .start();
    let long_name = "\u{1F600}".repeat(200);
    create_many(&host, 200, 2, &long_name).await;
    let mut readers = Vec::with_capacity(200);
    for _ in 0..200 {
        readers.push(ask_for_the_list_from(&host, [127, 0, 0, 2]).await);
    }
    let other = support::client_from([127, 0, 0, 3]);
    let mut statuses = Vec::new();
    for _ in 0..20 {
        let answer = other.get(host.url("/api/health")).send().await.unwrap();
        statuses.push(answer.status().as_u16());
    }
    assert_eq!(statuses, [200; 20]);
    drop(readers);
}

/// Under reuse with 2 instance slots and no streaming slot, 2 clients that never read hold both
/// running slots once their heads are out; a request from another client takes one back, as
/// from fresh instances, and is answered 200 (the WARN line says a response was cut short).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_reuse_a_slot_held_for_a_client_that_does_not_read_is_taken_back() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let host = Host::builder()
        .store(&Store::Memory)
        .env(&[
            ("MAX_INSTANCE_REUSE_COUNT", "16"),
            ("MAX_INSTANCE_CONCURRENT_REUSE_COUNT", "1"),
            ("MAX_INSTANCES", "2"),
            ("MAX_STREAMING", "0"),
        ])
        .start();
    let long_name = "\u{1F600}".repeat(200);
    create_many(&host, 200, 2, &long_name).await;
    let readers = [
        ask_for_the_list_from(&host, [127, 0, 0, 2]).await,
        ask_for_the_list_from(&host, [127, 0, 0, 2]).await,
    ];
    // Both heads out, both slots held.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let other = support::client_from([127, 0, 0, 3]);
    let answer = other.get(host.url("/api/health")).send().await.unwrap();
    assert_eq!(answer.status(), 200);
    host.wait_for_log(|line| {
        line["message"]
            .as_str()
            .is_some_and(|message| message.contains("was stopped for a new request"))
    });
    drop(readers);
}
