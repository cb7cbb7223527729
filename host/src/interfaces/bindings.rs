//! Host bindings for the service's WIT world (`wit/service.wit`): the one `bindgen!`, kept for
//! the interfaces' types and for calling the guest's export. The host's side of each interface
//! is linked by hand, in the interface's own module, not through generated traits.
//!
//! Every WASI interface maps onto wasmtime-wasi's and wasmtime-wasi-http's own bindings.
#![allow(missing_docs)]

wasmtime::component::bindgen!({
    path: "../wit",
    world: "tutorial:service/service",
    exports: { default: async },
    additional_derives: [PartialEq],
    with: {
        "wasi:http": wasmtime_wasi_http::p2::bindings::http,
        "wasi:io": wasmtime_wasi::p2::bindings::io,
        "wasi:cli": wasmtime_wasi::p2::bindings::cli,
        "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
        "wasi:random": wasmtime_wasi::p2::bindings::random,
        "tutorial:service/telemetry.span": GuestSpan,
    },
});

pub use tutorial::service::{telemetry, users};

/// A span the guest opened: only a handle. The host keeps the span itself, with the request's
/// other telemetry, so the resource table never holds one.
pub struct GuestSpan;
