//! The server in the test's own process, through `server::serve` on a real socket: for rules
//! that need no process of their own. Signals, exit codes and the start-up line stay with the
//! tests that run the `host` binary.

mod support;

use std::sync::Arc;
use std::time::Duration;

use host::edge::server::{self, App, ClientLimits};
use host::observability::metrics::Metrics;
use host::runtime::cache::ComponentCache;
use host::runtime::{GuestLimits, ProbePath, Runtime, Serving, ServingGuest};
use host::user_store::UserStore;
use serde_json::{Value, json};
use support::{client, create_with, guest_path, tempdir};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// A server running in this process, and what stops it.
struct InProcess {
    base_url: String,
    app: Arc<App>,
    /// Compiles and loads guests; its epoch ticker runs the deadlines.
    runtime: Runtime,
    stop: Option<oneshot::Sender<()>>,
    serving: tokio::task::JoinHandle<()>,
}

impl InProcess {
    /// The real guest on an empty memory store, with the default limits.
    async fn start() -> InProcess {
        let runtime = Runtime::new(ComponentCache::new(tempdir()), GuestLimits::default())
            .expect("the wasm runtime starts");
        let guest = load(&runtime, "guest").await;
        let app = Arc::new(App::new(
            Arc::new(Serving::new(guest)),
            Arc::new(UserStore::memory(1_000)),
            Arc::new(Metrics::new()),
            ClientLimits {
                max_body_bytes: 1 << 20,
                body_timeout: Duration::from_secs(10),
                body_buffer_bytes: 64 << 20,
                max_connections: 64,
            },
        ));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base_url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let serving = tokio::spawn(server::serve(listener, Arc::clone(&app), async {
            let _ = stopped.await;
        }));
        InProcess {
            base_url,
            app,
            runtime,
            stop: Some(stop),
            serving,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }
}

/// The fixture `crate_name`, loaded and probed as the host does at start.
async fn load(runtime: &Runtime, crate_name: &str) -> ServingGuest {
    let (guest, _cache) = runtime
        .load(&guest_path(crate_name))
        .expect("the guest loads");
    let probe = ProbePath::Get("/api/health".parse().unwrap());
    let version = guest
        .probe_version(&probe)
        .await
        .expect("the guest answers its probe");
    ServingGuest { guest, version }
}

async fn health_version(server: &InProcess) -> Value {
    let health: Value = client()
        .get(server.url("/api/health"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    health["version"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_created_in_process_is_found_by_its_id() {
    let server = InProcess::start().await;
    let (status, user) = create_with(&client(), &server.base_url, "Ada", "ada@example.com").await;
    assert_eq!(status, 201, "{user}");
    let id = user["id"].as_str().unwrap();
    let found = client()
        .get(server.url(&format!("/api/users/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(found.status(), 200);
    assert_eq!(found.json::<Value>().await.unwrap(), user);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swapped_guest_answers_the_next_request_and_the_store_is_kept() {
    let server = InProcess::start().await;
    let (status, user) =
        create_with(&client(), &server.base_url, "Grace", "grace@example.com").await;
    assert_eq!(status, 201, "{user}");
    assert_eq!(health_version(&server).await, json!("0.1.0"));

    let minimal = load(&server.runtime, "minimal-guest").await;
    let replaced = server.app.serving().swap(minimal);
    assert_eq!(replaced.version, "0.1.0");
    assert_eq!(health_version(&server).await, json!("2.0.0"));

    let real = load(&server.runtime, "guest").await;
    server.app.serving().swap(real);
    let users: Value = client()
        .get(server.url("/api/users"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(users.as_array().map(Vec::len), Some(1), "{users}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_told_to_stop_serve_returns_and_accepts_no_more_connections() {
    let mut server = InProcess::start().await;
    assert_eq!(health_version(&server).await, json!("0.1.0"));
    server.stop.take().unwrap().send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), &mut server.serving)
        .await
        .expect("serve returns within the grace")
        .unwrap();
    let refused = client().get(server.url("/api/health")).send().await;
    assert!(refused.is_err(), "a connection was accepted after the stop");
}
