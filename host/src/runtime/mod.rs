//! The guest runtime: compiles and links a guest component once ([`Runtime`]), instantiates it
//! for every request ([`Guest::handle`]), and swaps in a new one while serving.
//!
//! - [`engine`], [`built`], [`cache`], [`admission`]: loading, caching and checking a component;
//! - [`capacity`], [`slots`], [`held`], [`pool`], [`page_scan`]: what instances may use;
//! - [`store`], [`outbound`]: what one request's store holds, and its outgoing calls;
//! - [`guest`], [`reuse`], [`guest_body`]: one request through a fresh or reused instance,
//!   and its body;
//! - [`probe`], [`reload`]: the guest that serves ([`Serving`]), swapped after its probe;
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
pub mod settings;
pub mod slots;
pub mod store;

pub use capacity::GuestLimits;
pub use engine::Runtime;
pub use guest::{Guest, Serving, ServingGuest};
pub use probe::ProbePath;
