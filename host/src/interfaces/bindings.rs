//! Host bindings for the WIT world a guest is hosted in (`hosted`, wit/service.wit): the one
//! `bindgen!`, kept for the interfaces' types and for calling the guest's export. The host's side of each interface
//! is linked by hand, in the interface's own module, not through generated traits.
//!
//! Every WASI interface maps onto wasmtime-wasi's and wasmtime-wasi-http's own bindings.
#![allow(missing_docs)]

wasmtime::component::bindgen!({
    path: "../wit",
    world: "tutorial:service/hosted",
    exports: { default: async },
    additional_derives: [PartialEq],
    with: {
        "wasi:http": wasmtime_wasi_http::p2::bindings::http,
        "wasi:io/error@0.2.12": wasmtime_wasi::p2::bindings::io::error,
        "wasi:io/poll@0.2.12": wasmtime_wasi::p2::bindings::io::poll,
        "wasi:io/streams@0.2.12": wasmtime_wasi::p2::bindings::io::streams,
        "wasi:cli": wasmtime_wasi::p2::bindings::cli,
        "wasi:clocks/wall-clock@0.2.12": wasmtime_wasi::p2::bindings::clocks::wall_clock,
        "wasi:clocks/monotonic-clock@0.2.12": wasmtime_wasi::p2::bindings::clocks::monotonic_clock,
        "wasi:random": wasmtime_wasi::p2::bindings::random,
        "tutorial:service/telemetry.span": GuestSpan,
    },
});

pub use tutorial::service::{telemetry, users};

/// A guest component, linked and ready to be instantiated for each request.
pub type ServicePre<T> = HostedPre<T>;

/// A span the guest opened: only a handle. The host keeps the span itself, with the request's
/// other telemetry, so the resource table never holds one.
pub struct GuestSpan;
