//! Hundreds of clients that ask for a long list and never read it. A test binary of its own:
//! it times `GET /api/health`, so nothing else may load the machine meanwhile (cargo runs test
//! binaries one after another).

mod support;

use std::time::{Duration, Instant};

use support::lists::{PeakResident, ask_for_the_list, create_many};
use support::{Host, Store, client};

/// 300 clients ask for a list of 40,000 users and never read it (the attack that once took every
/// slot). Each holds a streaming slot, not one of the slots new requests need, so `GET /api/health`
/// stays 200 and is served (not kept waiting for a slot or a timeout) the whole time (the
/// readers' instances are dropped at the deadline), and the host's memory grows by a bounded
/// amount. How fast health stays is measured by `make bench`, not here: a timed assertion on a
/// busy CI machine is a flaky test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_slow_readers_leave_health_fast_and_memory_bounded() {
    const SLOW_READERS: usize = 300;
    let host = Host::builder().store(&Store::Memory).start();
    create_many(&host, 40_000, 64, "Some User").await;
    let idle = host.resident_bytes();
    let peak = PeakResident::start(&host);
    // Health is asked every 20 ms from before the first slow reader until past the deadline
    // (10 s) and its 1 s backstop, when their instances are dropped.
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
    // Served, not queued behind a slot's 1 s wait or a 10 s deadline.
    assert!(slowest < Duration::from_secs(1), "{slowest:?}");
    assert!(
        peak < idle + (512 << 20),
        "resident memory {} MiB, {} MiB idle",
        peak >> 20,
        idle >> 20
    );
    drop(slow_readers);
}
