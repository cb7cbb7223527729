//! The WIT interfaces the host implements for each guest instance (`wit/service.wit`): what a
//! guest can ask of the host beyond WASI.
//!
//! - [`bindings`]: the one `bindgen!` of the service's world, for its types and its export;
//! - [`lift`]: reading what a guest passes, bounded before anything is copied;
//! - [`users`]: the `users` interface, on [`users::UserCalls`];
//! - [`telemetry`]: the `telemetry` interface, on [`telemetry::GuestTelemetry`];
//! - [`otel`]: the standard `wasi:otel` interfaces, on [`otel::GuestOtel`] (sharing the
//!   `telemetry` interface's quotas);
//! - [`stdio`]: `wasi:cli`'s stdout and stderr, each line a log line of the request.
//!
//! Each interface is linked by hand, each function written once on its own state; the store's
//! data reaches that state through a view trait ([`users::UsersView`],
//! [`telemetry::TelemetryView`]), as wasmtime-wasi's `WasiView` does.

pub mod bindings;
pub mod lift;
pub mod otel;
pub mod stdio;
pub mod telemetry;
pub mod users;
