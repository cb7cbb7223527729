//! Clients of long lists: users created in bulk, a client that asks for the list and reads
//! none of it, and the host's peak resident memory meanwhile.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use super::{Host, client, create_with};

/// A connection that has asked for the whole list and read none of it yet. Its receive window
/// is small, so the list cannot hide in the socket buffers.
pub async fn ask_for_the_list(host: &Host) -> tokio::net::TcpStream {
    ask_for_the_list_from(host, [127, 0, 0, 1]).await
}

/// [`ask_for_the_list`] from the loopback address `from`, so the host sees another peer.
pub async fn ask_for_the_list_from(host: &Host, from: [u8; 4]) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.bind(std::net::SocketAddr::from((from, 0))).unwrap();
    let mut stream = socket
        .connect(host.authority().parse().unwrap())
        .await
        .unwrap();
    stream
        .write_all(b"GET /api/users HTTP/1.1\r\nHost: test\r\n\r\n")
        .await
        .unwrap();
    stream
}

/// Users created through the API, `in_flight` at a time.
pub async fn create_many(host: &Host, count: usize, in_flight: usize, name: &str) {
    let permits = Arc::new(tokio::sync::Semaphore::new(in_flight));
    let mut tasks = Vec::with_capacity(count);
    let client = client();
    for i in 0..count {
        let permit = Arc::clone(&permits).acquire_owned().await.unwrap();
        let (client, base_url, name) = (client.clone(), host.base_url.clone(), name.to_string());
        tasks.push(tokio::spawn(async move {
            let (status, body) =
                create_with(&client, &base_url, &name, &format!("u{i}@x.io")).await;
            assert_eq!(status, 201, "{body}");
            drop(permit);
        }));
    }
    for task in tasks {
        if let Err(failed) = task.await {
            // The host's own account of what went wrong, for a failure that shows only on CI.
            let errors = host.log_lines_where(|line| line["level"] == "ERROR");
            panic!("{failed}; the host's error lines: {errors:#?}");
        }
    }
}

/// The host's resident memory, sampled every 10 ms on a thread of its own.
pub struct PeakResident {
    peak: Arc<AtomicU64>,
    sampling: Arc<AtomicBool>,
    sampler: std::thread::JoinHandle<()>,
}

impl PeakResident {
    pub fn start(host: &Host) -> PeakResident {
        let pid = host.pid();
        let peak = Arc::new(AtomicU64::new(host.resident_bytes()));
        let sampling = Arc::new(AtomicBool::new(true));
        let sampler = {
            let (peak, sampling) = (Arc::clone(&peak), Arc::clone(&sampling));
            std::thread::spawn(move || {
                while sampling.load(Ordering::Relaxed) {
                    if let Some(rss) = super::resident_bytes(pid) {
                        peak.fetch_max(rss, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            })
        };
        PeakResident {
            peak,
            sampling,
            sampler,
        }
    }

    /// The most resident memory seen since the start.
    pub fn stop(self) -> u64 {
        self.sampling.store(false, Ordering::Relaxed);
        self.sampler.join().unwrap();
        self.peak.load(Ordering::Relaxed)
    }
}
