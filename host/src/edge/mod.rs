//! The HTTP edge: where clients meet the host, and every limit a client meets.
//!
//! - [`server`]: the accept loop and the per-request path (request ids, limits, errors);
//! - [`connections`]: the connection table, and which connection gives way when it is full;
//! - [`client_stream`]: a client's socket, which gives up on a client that stops reading and
//!   closes without resetting a client still sending its request;
//! - [`request_body`]: the request body, read within its limits before the guest sees it;
//! - [`responses`]: the one place that builds the host's own responses;
//! - [`settings`]: the flags and variables of all of the above.

pub mod client_stream;
pub mod connections;
pub mod request_body;
pub mod responses;
pub mod server;
pub mod settings;
