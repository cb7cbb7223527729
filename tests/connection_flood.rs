//! A thousand connections that never finish their request head and a thousand whose body stalls:
//! a new client that sends a whole request is served throughout, and the slow connections are
//! closed within their timeouts (issue 22). A test binary of its own: it opens thousands of
//! sockets and asks health on a clock, so nothing else should load the machine meanwhile.

mod support;

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use support::{Host, client};

const HALF_HEADS: usize = 1_000;
const HALF_BODIES: usize = 1_000;
/// The body deadline the hosts here run with: shorter than the default, for a shorter test.
const BODY_TIMEOUT: Duration = Duration::from_secs(3);
/// A bound that tells "served" from "waited for a timeout or a slot": seconds, not milliseconds.
const SERVED_WITHIN: Duration = Duration::from_secs(2);

/// Lets this process hold its thousands of sockets.
fn raise_own_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain calls on a valid rlimit.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
    }
    assert!(
        limit.rlim_cur >= 4 * (HALF_HEADS + HALF_BODIES) as u64,
        "this test needs an open-file limit of at least {}",
        4 * (HALF_HEADS + HALF_BODIES)
    );
}

/// What became of one slow connection.
struct Outcome {
    /// The first bytes the host sent before closing (an answer, or nothing).
    answer: String,
    /// How long after it was opened the host closed it; `None` if it never did.
    closed_after: Option<Duration>,
}

/// Opens a connection, sends `request`, and waits (in a task) for the host to close it.
async fn slow_connection(authority: &str, request: &'static [u8]) -> JoinHandle<Outcome> {
    let opened = Instant::now();
    let mut stream = TcpStream::connect(authority).await.unwrap();
    // A connection the full table has shed already may refuse the bytes: that is an outcome too.
    let _ = stream.write_all(request).await;
    tokio::spawn(async move {
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(30), async {
            let mut buffer = [0u8; 4096];
            loop {
                match stream.read(&mut buffer).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => answer.extend_from_slice(&buffer[..n]),
                }
            }
        })
        .await;
        Outcome {
            answer: String::from_utf8_lossy(&answer).into_owned(),
            closed_after: read.is_ok().then(|| opened.elapsed()),
        }
    })
}

/// Opens the flood against `host`, asks health from a new connection every 200 ms while it
/// lasts, and returns the slow connections' outcomes (heads first, then bodies).
async fn flood(host: &Host) -> (Vec<Outcome>, Vec<Outcome>) {
    raise_own_open_file_limit();
    let health = {
        let url = host.url("/api/health");
        tokio::spawn(async move {
            let until = Instant::now() + BODY_TIMEOUT + Duration::from_secs(5);
            let mut asked = 0;
            while Instant::now() < until {
                // A new client each time: a new connection, which must find a place.
                let started = Instant::now();
                let response = client()
                    .get(&url)
                    .header("connection", "close")
                    .send()
                    .await;
                let status = response.map(|response| response.status().as_u16());
                assert_eq!(status.ok(), Some(200), "health after {asked} checks");
                assert!(
                    started.elapsed() < SERVED_WITHIN,
                    "health took {:?} after {asked} checks",
                    started.elapsed()
                );
                asked += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            asked
        })
    };
    let mut heads = Vec::new();
    let mut bodies = Vec::new();
    for _ in 0..HALF_HEADS.max(HALF_BODIES) {
        if heads.len() < HALF_HEADS {
            heads.push(
                slow_connection(host.authority(), b"GET /api/health HTTP/1.1\r\nHost: x\r\n").await,
            );
        }
        if bodies.len() < HALF_BODIES {
            bodies.push(
                slow_connection(
                    host.authority(),
                    b"POST /api/users HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n\
                      content-length: 1048576\r\n\r\n{\"name\":\"",
                )
                .await,
            );
        }
    }
    let asked = health.await.unwrap();
    assert!(asked >= 20, "health was asked only {asked} times");
    let mut head_outcomes = Vec::new();
    for task in heads {
        head_outcomes.push(task.await.unwrap());
    }
    let mut body_outcomes = Vec::new();
    for task in bodies {
        body_outcomes.push(task.await.unwrap());
    }
    (head_outcomes, body_outcomes)
}

/// Every outcome closed within `limit` of its opening.
fn assert_closed_within(outcomes: &[Outcome], limit: Duration, what: &str) {
    let slowest = outcomes
        .iter()
        .map(|outcome| outcome.closed_after.unwrap_or(Duration::MAX))
        .max()
        .unwrap();
    assert!(
        slowest <= limit,
        "a {what} connection was closed only after {slowest:?}"
    );
}

/// The half heads closed within hyper's head timeout, the half bodies within the body timeout
/// (5 s of slack each).
fn assert_closed_in_time(heads: &[Outcome], bodies: &[Outcome]) {
    let slack = Duration::from_secs(5);
    let head_timeout = host::edge::server::HEADER_READ_TIMEOUT;
    assert_closed_within(heads, head_timeout + slack, "half-head");
    assert_closed_within(bodies, BODY_TIMEOUT + slack, "half-body");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_client_is_served_while_a_thousand_half_heads_and_a_thousand_half_bodies_wait() {
    let host = Host::builder()
        .env(&[("BODY_TIMEOUT_MS", &BODY_TIMEOUT.as_millis().to_string())])
        .start();
    let (heads, bodies) = flood(&host).await;
    // hyper's head timeout, then closed; a stalled body gets its 408, then closed.
    assert_closed_in_time(&heads, &bodies);
    for outcome in &bodies {
        assert!(
            outcome.answer.starts_with("HTTP/1.1 408"),
            "{:?}",
            outcome.answer
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_full_table_slow_connections_give_way_to_new_clients() {
    // 256 places for 2,000 slow connections: every newcomer takes the place of a slow one.
    let host = Host::builder()
        .env(&[
            ("MAX_CONNECTIONS", "256"),
            ("BODY_TIMEOUT_MS", &BODY_TIMEOUT.as_millis().to_string()),
        ])
        .start();
    let (heads, bodies) = flood(&host).await;
    assert_closed_in_time(&heads, &bodies);
    let shed = heads
        .iter()
        .chain(&bodies)
        .filter(|outcome| outcome.answer.is_empty())
        .count();
    assert!(
        shed >= HALF_HEADS + HALF_BODIES - 256,
        "only {shed} slow connections gave way"
    );
}
