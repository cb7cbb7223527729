//! The per-request path without sockets: one instantiate + handle of the guest inside the host,
//! and the guest's naive Fibonacci against the same function compiled natively. Regressions in
//! the per-request path show here in microseconds. Run by `make bench` (or `cargo bench -p host`).

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use host::cache::ComponentCache;
use host::guest::{Guest, GuestLimits, Runtime};
use host::request_state::RequestState;
use host::user_store::UserStore;
use http_body_util::{BodyExt, Full};

fn component(file_name: &str) -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let path = workspace
        .join("target/wasm32-wasip2/release")
        .join(file_name);
    assert!(
        path.exists(),
        "{} is missing: run `make build` first",
        path.display()
    );
    path
}

fn load(runtime: &Runtime, file_name: &str) -> Guest {
    runtime
        .load(&component(file_name))
        .expect("the component loads")
        .0
}

async fn call(guest: &Guest, users: &Arc<UserStore>, request: http::Request<Full<Bytes>>) -> Bytes {
    let state = RequestState::quiet(Arc::clone(users));
    let response = guest
        .handle(state, request, None)
        .await
        .expect("the guest answers");
    response
        .into_body()
        .collect()
        .await
        .expect("the body streams")
        .to_bytes()
}

fn health() -> http::Request<Full<Bytes>> {
    http::Request::get("/api/health")
        .header("host", "bench")
        .body(Full::default())
        .unwrap()
}

fn compute(n: u32) -> http::Request<Full<Bytes>> {
    http::Request::post("/api/compute")
        .header("host", "bench")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(format!(r#"{{"n":{n}}}"#))))
        .unwrap()
}

fn benches(c: &mut Criterion) {
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let limits = GuestLimits {
        request_timeout: Duration::from_secs(10),
        memory_bytes: 128 << 20,
        max_instances: 64,
    };
    let cache = ComponentCache::new(std::env::temp_dir().join("host-bench-cache"));
    let runtime = tokio.block_on(async { Runtime::new(cache, limits).unwrap() });
    let real = load(&runtime, "guest.wasm");
    let minimal = load(&runtime, "minimal_guest.wasm");
    let users = Arc::new(UserStore::new(0));

    let mut group = c.benchmark_group("instantiate_and_handle");
    for (name, guest) in [("real-guest", &real), ("minimal-guest", &minimal)] {
        group.bench_function(name, |b| {
            b.to_async(&tokio).iter(|| call(guest, &users, health()))
        });
    }
    group.finish();

    let mut group = c.benchmark_group("fib30");
    group.sample_size(20);
    group.bench_function("native", |b| {
        b.iter(|| guest::fibonacci::naive(black_box(30)))
    });
    group.bench_function("in-guest", |b| {
        b.to_async(&tokio).iter(|| call(&real, &users, compute(30)))
    });
    group.finish();
}

criterion_group!(per_request, benches);
criterion_main!(per_request);
