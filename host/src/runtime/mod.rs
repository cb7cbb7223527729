//! The guest runtime: compiles and links a guest component once ([`Runtime`]), instantiates it
//! afresh for every request ([`Guest::handle`]), and swaps in a new one while serving.
//!
//! - [`engine`]: the engine (epoch ticker), the linker, loading a component;
//! - [`built`]: where `make build` leaves guest components;
//! - [`cache`]: compiled components on disk, keyed by their bytes and the engine;
//! - [`admission`]: what a component must be before it is linked (UTF-8 strings to the host);
//! - [`capacity`]: the pools, memory budget, store limits and slots, all sized from the flags;
//! - [`held`]: what a guest's handles make the host hold, charged to the memory budget;
//! - [`outbound`]: the outgoing calls a guest may make, and how they go out;
//! - [`pool`]: the linear memories and stacks instances reuse, without page-protection changes;
//! - [`page_scan`]: which pages of a pooled memory or stack were touched, from the page tables;
//! - [`slots`]: the two budgets of instance slots, running and streaming, and each peer's share;
//! - [`store`]: what one request's store holds: WASI, `wasi:http`, and the service's
//!   interfaces, each on its own state;
//! - [`guest`]: one request through a fresh instance;
//! - [`reuse`]: or, when the operator chose it, through a WASIp3 instance that serves several;
//! - [`guest_body`]: a response body that breaks off when the guest fails mid-stream;
//! - [`probe`]: the request a new guest must answer 200 before it serves;
//! - [`serving`]: the guest serving new requests, swapped whole;
//! - [`reload`]: swapping the guest on `SIGHUP` or file change, after its probe;
//! - [`settings`]: the flags and variables of all of the above.

pub mod admission;
pub mod built;
pub mod cache;
pub mod capacity;
pub mod engine;
pub mod guest;
pub mod guest_body;
pub mod held;
pub mod outbound;
pub mod page_scan;
pub mod pool;
pub mod probe;
pub mod reload;
pub mod reuse;
pub mod serving;
pub mod settings;
pub mod slots;
pub mod store;

pub use capacity::GuestLimits;
pub use engine::Runtime;
pub use guest::Guest;
pub use probe::ProbePath;
pub use serving::{Serving, ServingGuest};
