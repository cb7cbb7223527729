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
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// What the request bodies of all clients together may hold in the servers here.
const BODY_BUFFER_BYTES: usize = 64 << 20;

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
        InProcess::start_with(64).await
    }

    /// [`InProcess::start`], serving at most `max_connections` at once.
    async fn start_with(max_connections: usize) -> InProcess {
        InProcess::start_limited(max_connections, GuestLimits::default()).await
    }

    /// [`InProcess::start_with`], its guests within `limits`.
    async fn start_limited(max_connections: usize, limits: GuestLimits) -> InProcess {
        let runtime =
            Runtime::new(ComponentCache::new(tempdir()), limits).expect("the wasm runtime starts");
        let guest = load(&runtime, "guest").await;
        let app = Arc::new(App::new(
            Arc::new(Serving::new(guest)),
            Arc::new(UserStore::memory(1_000)),
            Arc::new(Metrics::new()),
            ClientLimits {
                max_body_bytes: 1 << 20,
                body_timeout: Duration::from_secs(10),
                body_buffer_bytes: BODY_BUFFER_BYTES,
                max_connections,
                response_stall: Duration::from_secs(10),
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

#[test]
fn only_a_wasip3_guest_is_compiled_for_the_engine_with_component_model_concurrency() {
    // With concurrency on, wasmtime runs every call inside its event loop, which costs a WASIp2
    // request about a quarter of its throughput.
    let runtime = Runtime::new(ComponentCache::new(tempdir()), GuestLimits::default())
        .expect("the wasm runtime starts");
    let (wasip2, _) = runtime.load(&guest_path("guest")).expect("the guest loads");
    assert!(!wasip2.engine().get_concurrency_support());
    let (wasip3, _) = runtime
        .load(&guest_path("p3-guest"))
        .expect("the WASIp3 fixture loads");
    assert!(wasip3.engine().get_concurrency_support());
}

/// `GET path` of `server`, its body parsed as JSON.
async fn get_json(server: &InProcess, path: &str) -> Value {
    let answer = client().get(server.url(path)).send().await.unwrap();
    answer.json().await.unwrap()
}

async fn health_version(server: &InProcess) -> Value {
    get_json(server, "/api/health").await["version"].clone()
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
    let users = get_json(&server, "/api/users").await;
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

/// A connection from `from` that sends a `POST /api/users` head announcing `length` bytes of
/// body, then `sent` of them, and stalls.
async fn stalled_body(server: &InProcess, from: [u8; 4], length: usize, sent: usize) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(std::net::SocketAddr::from((from, 0))).unwrap();
    let authority = server.base_url.trim_start_matches("http://");
    let mut stream = socket.connect(authority.parse().unwrap()).await.unwrap();
    let head = format!(
        "POST /api/users HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\
         Content-Length: {length}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&vec![b' '; sent]).await.unwrap();
    stream
}

/// Whether the host answered `stream` 503 within a moment.
async fn refused(stream: &mut TcpStream) -> bool {
    let mut answer = [0; 12];
    matches!(
        tokio::time::timeout(Duration::from_millis(100), stream.read_exact(&mut answer)).await,
        Ok(Ok(_)) if answer.ends_with(b" 503")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peer_stalling_bodies_fills_its_share_and_a_fresh_clients_post_gets_201() {
    let server = InProcess::start_with(1_000).await;
    let attacker = [127, 0, 0, 2];
    // Half of a 1 MiB body on each of 64 connections: a budget of 64 MiB, were it one pool.
    let mut stalled = Vec::new();
    for _ in 0..64 {
        stalled.push(stalled_body(&server, attacker, 1 << 20, 512 << 10).await);
    }
    // Then small stalled bodies, to fill whatever is left.
    for _ in 0..64 {
        stalled.push(stalled_body(&server, attacker, 64 << 10, 32 << 10).await);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut refusals = 0;
    for stream in &mut stalled {
        refusals += usize::from(refused(stream).await);
    }
    assert!(refusals > 0, "the attacker's share never ran out");
    let fresh = reqwest::Client::builder()
        .no_proxy()
        .local_address(std::net::IpAddr::from([127, 0, 0, 3]))
        .build()
        .unwrap();
    let (status, user) = create_with(&fresh, &server.base_url, "Fresh", "fresh@x.io").await;
    assert_eq!(status, 201, "{user}");
}

/// What the host answers `request`, sent whole from `from` on a connection of its own.
async fn exchange(server: &InProcess, from: [u8; 4], request: &[u8]) -> String {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(std::net::SocketAddr::from((from, 0))).unwrap();
    let authority = server.base_url.trim_start_matches("http://");
    let mut stream = socket.connect(authority.parse().unwrap()).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    let read = stream.read_to_end(&mut answer);
    let _ = tokio::time::timeout(Duration::from_secs(10), read).await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// A connection from `from` that asks for the list of users and reads none of it.
async fn unread_list(server: &InProcess, from: [u8; 4]) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    // A small window, so the host's side fills at once.
    socket.set_recv_buffer_size(4 << 10).unwrap();
    socket.bind(std::net::SocketAddr::from((from, 0))).unwrap();
    let authority = server.base_url.trim_start_matches("http://");
    let mut stream = socket.connect(authority.parse().unwrap()).await.unwrap();
    stream
        .write_all(b"GET /api/users HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_addresses_holding_the_body_budget_and_the_streaming_slots_leave_a_ninths_small_post_and_get_answered()
 {
    let limits = GuestLimits {
        max_streaming: 8,
        ..GuestLimits::default()
    };
    let server = InProcess::start_limited(1_000, limits).await;
    // A list of about 2 MB (the store holds 1,000 users; the ninth's POST is the last), far
    // more than a client that reads none of it takes: each of the crowd's eight addresses
    // holds one of the eight streaming slots with it.
    let client = client();
    for i in 0..999 {
        let name = "\u{1F600}".repeat(200);
        let email = format!("{i:04}{}@x.io", "e".repeat(240));
        let (status, body) = create_with(&client, &server.base_url, &name, &email).await;
        assert_eq!(status, 201, "{body}");
    }
    let crowd: Vec<[u8; 4]> = (2..10).map(|last| [127, 0, 0, last]).collect();
    let mut held = Vec::new();
    for &address in &crowd {
        held.push(unread_list(&server, address).await);
        // More than its share of the body budget: half of a 1 MiB body on each of 16
        // connections, then smaller ones to fill what is left of it to within 1 KiB.
        let sizes = [(16, 1 << 20), (10, 128 << 10), (6, 32 << 10), (20, 2 << 10)];
        for (bodies, length) in sizes {
            for _ in 0..bodies {
                held.push(stalled_body(&server, address, length, length / 2).await);
            }
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The shared part is full: a large body from an address of its own finds no room (well
    // within the 10 s body deadline, which would free the crowd's bodies).
    let mut large = stalled_body(&server, [127, 0, 0, 11], 1 << 20, 512 << 10).await;
    let mut answer = [0; 12];
    let answered =
        tokio::time::timeout(Duration::from_secs(2), large.read_exact(&mut answer)).await;
    assert!(
        matches!(answered, Ok(Ok(_))) && answer.ends_with(b" 503"),
        "the crowd left room in the budget: {}",
        String::from_utf8_lossy(&answer)
    );
    // 16,000 bytes: more than the crowd left of the shared part, within what the reserve
    // takes. Over a socket of its own, so that no client library sends it twice.
    let json = r#"{"name": "Ninth", "email": "ninth@x.io"}"#;
    let body = format!("{json}{}", " ".repeat(16_000 - json.len()));
    let post = format!(
        "POST /api/users HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let ninth = [127, 0, 0, 10];
    let created = exchange(&server, ninth, post.as_bytes()).await;
    assert!(created.starts_with("HTTP/1.1 201"), "{created}");
    let get = b"GET /api/health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    assert!(
        exchange(&server, ninth, get)
            .await
            .starts_with("HTTP/1.1 200")
    );
    drop(held);
}

#[test]
fn a_component_importing_every_function_the_host_offers_links() {
    // Made from wit/ itself: the `hosted` world imports every interface the host implements
    // (the service's `users` and `telemetry`, wasi:http and what it includes, wasi:otel), so a
    // host function missing, misnamed or mistyped against the WIT fails here, not in a guest.
    let mut resolve = wit_parser::Resolve::default();
    let wit = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../wit");
    let (package, _) = resolve.push_path(&wit).expect("wit/ parses");
    let world = resolve
        .select_world(&[package], Some("hosted"))
        .expect("wit/ has the hosted world");
    let mangling = wit_parser::ManglingAndAbi::Legacy(wit_parser::LiftLowerAbi::Sync);
    let mut module = wit_component::dummy_module(&resolve, world, mangling);
    wit_component::embed_component_metadata(
        &mut module,
        &resolve,
        world,
        wit_component::StringEncoding::UTF8,
    )
    .expect("the metadata embeds");
    let component = wit_component::ComponentEncoder::default()
        .module(&module)
        .expect("the module is a component's core")
        .validate(true)
        .encode()
        .expect("the component encodes");
    let imports = wasmparser::Parser::new(0)
        .parse_all(&component)
        .filter_map(|payload| match payload {
            Ok(wasmparser::Payload::ComponentImportSection(section)) => Some(section.count()),
            _ => None,
        })
        .sum::<u32>();
    assert!(imports >= 20, "only {imports} interfaces imported");
    let path = tempdir().join("every-import.wasm");
    std::fs::write(&path, component).unwrap();
    let runtime = Runtime::new(ComponentCache::new(tempdir()), GuestLimits::default())
        .expect("the wasm runtime starts");
    if let Err(error) = runtime.load(&path) {
        panic!("the host does not link every function of its WIT: {error:?}");
    }
}
