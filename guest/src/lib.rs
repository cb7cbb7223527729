//! The tutorial service's business logic, built as a `wasi:http` guest component.
//!
//! Everything here but [`wasm`] is plain Rust that compiles on any target, so
//! `cargo test -p guest` runs the whole API natively against in-memory fakes:
//!
//! - [`api`]: the one entry point, [`api::handle`]: request in, response out;
//! - [`routes`]: which paths exist and which methods each allows;
//! - [`validation`]: the contract's rules for request bodies;
//! - [`fibonacci`]: the deliberately naive computation;
//! - [`limits`]: the contract's limits on client input, stated once;
//! - [`error`]: the one error type, each variant with its status and message;
//! - [`response`]: the one place that builds responses, error bodies included;
//! - [`ports`]: what the logic needs from its host (the user store, a clock).
//!
//! `wasm` is the thin edge compiled only for `wasm32`: it converts `wasi:http` requests and
//! responses and implements the ports on the host's `users` interface.
//!
//! On wasm32 the crate is `no_std` (it allocates, through `alloc`): `std` on `wasm32-wasip2`
//! brings WASI's command imports with it (environment, exit, the standard streams and their
//! terminals, 19 functions) that the guest never calls, and the host links every import of a
//! component into every per-request instance. Natively it keeps `std`, for the tests.
#![cfg_attr(target_arch = "wasm32", no_std)]
#![warn(missing_docs)]

extern crate alloc;

pub mod api;
pub mod error;
pub mod fibonacci;
pub mod limits;
pub mod ports;
pub mod response;
pub mod routes;
pub mod validation;

#[cfg(target_arch = "wasm32")]
mod wasm;

/// This crate's package version, so a swapped guest shows: the health check logs it, and its
/// report (`api/health.rs`) spells it out again, since `concat!` takes only literals.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
