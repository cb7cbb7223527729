//! The per-request path without sockets, run by `make bench` (or `cargo bench -p host`):
//!
//! - criterion: one instantiate + handle of each guest inside the host, so regressions in the
//!   per-request path show in microseconds;
//! - fib(30) in the guest against the same function compiled natively, and against the same
//!   function on a bare wasmtime engine with and without epoch interruption, timed in
//!   interleaved rounds and printed as one JSON line for `bench/report.py`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use criterion::{Criterion, criterion_group};
use host::edge::request_body::GuestRequestBody;
use host::runtime::cache::ComponentCache;
use host::runtime::store::RequestContext;
use host::runtime::{Guest, GuestLimits, Runtime};
use host::user_store::UserStore;
use http_body_util::BodyExt;

fn load(runtime: &Runtime, crate_name: &str) -> Guest {
    // A component not built yet fails here, naming its path: `make build` builds them all.
    let path = host::runtime::built::built_component(crate_name);
    match runtime.load(&path) {
        Ok((guest, _)) => guest,
        Err(error) => panic!("{error} (run `make build` first)"),
    }
}

async fn call(
    guest: &Guest,
    users: &Arc<UserStore>,
    request: http::Request<GuestRequestBody>,
) -> Bytes {
    let context = RequestContext::quiet(Arc::clone(users));
    let response = guest
        .handle(context, request)
        .await
        .expect("the guest answers");
    response
        .into_body()
        .collect()
        .await
        .expect("the body streams")
        .to_bytes()
}

fn health() -> http::Request<GuestRequestBody> {
    http::Request::get("/api/health")
        .header("host", "bench")
        .body(GuestRequestBody::new(Bytes::new(), Default::default()))
        .unwrap()
}

fn compute(n: u32) -> http::Request<GuestRequestBody> {
    http::Request::post("/api/compute")
        .header("host", "bench")
        .header("content-type", "application/json")
        .body(GuestRequestBody::new(
            Bytes::from(format!(r#"{{"n":{n}}}"#)),
            Default::default(),
        ))
        .unwrap()
}

/// `benches/fib.wat` (the guest's naive Fibonacci as LLVM emits it) on a bare engine with
/// epoch interruption on or off: what wasmtime itself costs for this function, host aside.
fn reference_naive(epochs: bool) -> impl FnMut(u32) -> u64 {
    let engine = wasmtime::Engine::new(wasmtime::Config::new().epoch_interruption(epochs))
        .expect("a default engine");
    let wasm = wat::parse_str(include_str!("fib.wat")).expect("fib.wat parses");
    let module = wasmtime::Module::new(&engine, wasm).expect("fib.wat compiles");
    let mut store = wasmtime::Store::new(&engine, ());
    // Nothing advances this engine's epoch, so a deadline one tick away is never reached: the
    // checks run, the interruption never comes.
    store.set_epoch_deadline(1);
    let instance = wasmtime::Instance::new(&mut store, &module, &[]).expect("fib.wat instantiates");
    let naive = instance
        .get_typed_func::<u32, u64>(&mut store, "naive")
        .expect("fib.wat exports naive");
    move |n| naive.call(&mut store, n).expect("naive returns")
}

/// What the benches share: a tokio runtime, the host's runtime with both guests loaded, and an
/// empty user store.
struct Fixture {
    tokio: tokio::runtime::Runtime,
    real: Guest,
    minimal: Guest,
    users: Arc<UserStore>,
}

impl Fixture {
    fn new() -> Fixture {
        let tokio = tokio::runtime::Runtime::new().unwrap();
        let limits = GuestLimits::default();
        let cache = ComponentCache::new(std::env::temp_dir().join("host-bench-cache"));
        let runtime = tokio.block_on(async { Runtime::new(cache, limits).unwrap() });
        Fixture {
            real: load(&runtime, "guest"),
            minimal: load(&runtime, "minimal-guest"),
            users: Arc::new(UserStore::memory(0)),
            tokio,
        }
    }
}

fn instantiate_and_handle(c: &mut Criterion) {
    let fixture = Fixture::new();
    let mut group = c.benchmark_group("instantiate_and_handle");
    for (name, guest) in [
        ("real-guest", &fixture.real),
        ("minimal-guest", &fixture.minimal),
    ] {
        group.bench_function(name, |b| {
            b.to_async(&fixture.tokio)
                .iter(|| call(guest, &fixture.users, health()))
        });
    }
    group.finish();
}

criterion_group!(per_request, instantiate_and_handle);

/// Rounds of the fib(30) comparison; round 0 only warms up.
const FIB_ROUNDS: usize = 201;

/// Times fib(30) natively, in the guest (a request for n=30 minus one for n=0, so the request
/// around the function is not counted), and on a bare engine with and without epochs, one of
/// each per round. A neighbour on a shared machine slows a whole round, so each round's ratios
/// are taken before the medians: criterion, measuring one contender after the other, reported
/// anything from 1.4 to 1.8 for the same build.
fn fib_in_rounds(fixture: &Fixture) {
    let mut bare_with_epochs = reference_naive(true);
    let mut bare_without_epochs = reference_naive(false);
    let request = |n: u32| {
        fixture
            .tokio
            .block_on(call(&fixture.real, &fixture.users, compute(n)))
    };
    let nanos = |run: &mut dyn FnMut()| {
        let start = Instant::now();
        run();
        start.elapsed().as_secs_f64() * 1e9
    };
    let mut rounds = Vec::with_capacity(FIB_ROUNDS);
    for round in 0..=FIB_ROUNDS {
        let native = nanos(&mut || {
            black_box(guest::fibonacci::naive(black_box(30)));
        });
        let fib_request = nanos(&mut || {
            black_box(request(30));
        });
        let empty_request = nanos(&mut || {
            black_box(request(0));
        });
        let with_epochs = nanos(&mut || {
            black_box(bare_with_epochs(black_box(30)));
        });
        let without_epochs = nanos(&mut || {
            black_box(bare_without_epochs(black_box(30)));
        });
        if round > 0 {
            rounds.push([
                native,
                fib_request,
                empty_request,
                with_epochs,
                without_epochs,
            ]);
        }
    }
    let median_of = |value: &dyn Fn(&[f64; 5]) -> f64| median(rounds.iter().map(value).collect());
    let in_guest = |r: &[f64; 5]| r[1] - r[2];
    println!(
        "fib(30), median of {FIB_ROUNDS} interleaved rounds: native {:.0} µs, in the guest {:.0} µs \
         ({:.2}x), bare engine with epochs {:.2}x, without {:.2}x",
        median_of(&|r| r[0]) / 1e3,
        median_of(&in_guest) / 1e3,
        median_of(&|r| in_guest(r) / r[0]),
        median_of(&|r| r[3] / r[0]),
        median_of(&|r| r[4] / r[0]),
    );
    println!(
        r#"{{"native_ns":{:.0},"request_ns":{:.0},"empty_request_ns":{:.0},"in_guest_ns":{:.0},"bare_epochs_ns":{:.0},"bare_no_epochs_ns":{:.0},"in_guest_ratio":{:.4},"bare_epochs_ratio":{:.4},"bare_no_epochs_ratio":{:.4}}}"#,
        median_of(&|r| r[0]),
        median_of(&|r| r[1]),
        median_of(&|r| r[2]),
        median_of(&in_guest),
        median_of(&|r| r[3]),
        median_of(&|r| r[4]),
        median_of(&|r| in_guest(r) / r[0]),
        median_of(&|r| r[3] / r[0]),
        median_of(&|r| r[4] / r[0]),
    );
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    per_request();
    Criterion::default().configure_from_args().final_summary();
    fib_in_rounds(&Fixture::new());
}
