//! Host bindings for the service's WIT world (`wit/service.wit`): the one `bindgen!`.
//!
//! Every WASI interface maps onto wasmtime-wasi's and wasmtime-wasi-http's own bindings, so only
//! the service's own interfaces, `users` and `telemetry`, are generated here.
#![allow(missing_docs)]

wasmtime::component::bindgen!({
    path: "../wit",
    world: "tutorial:service/service",
    // The store's calls wait on PostgreSQL: async, so a waiting guest holds no thread.
    imports: { "tutorial:service/users": async | trappable, default: trappable },
    exports: { default: async },
    additional_derives: [PartialEq],
    with: {
        "wasi:http": wasmtime_wasi_http::p2::bindings::http,
        "wasi:io": wasmtime_wasi::p2::bindings::io,
        "wasi:cli": wasmtime_wasi::p2::bindings::cli,
        "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
        "wasi:random": wasmtime_wasi::p2::bindings::random,
        "tutorial:service/telemetry.span": crate::telemetry::GuestSpan,
    },
});

pub use tutorial::service::{telemetry, users};
