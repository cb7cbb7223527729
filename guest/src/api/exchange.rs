//! What every endpoint shares: the request as the logic sees it, the ports it reaches, and the
//! checks and log lines common to endpoints.

use alloc::format;
use alloc::string::String;

use crate::error::ApiError;
use crate::ports::{Level, Telemetry, Value};
use crate::validation;

/// Users read from the store per call while a list is streamed: bounds the memory a list takes
/// in the guest and in the host, whatever the number of users.
pub const LIST_PAGE_SIZE: u32 = 256;

/// What the logic needs of an HTTP request.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The method, upper case as sent (methods are case-sensitive).
    pub method: &'a str,
    /// The path, possibly followed by `?query`.
    pub target: &'a str,
    /// The `Content-Type` header, if any; only read when [`reads_content_type`].
    pub content_type: Option<&'a str>,
    /// The whole body (the host has already bounded its size); empty unless the logic reads it
    /// (`api::reads_body`).
    pub body: &'a [u8],
}

/// Whether the logic reads a request's `Content-Type`: only a `POST` carries a body it parses.
pub fn reads_content_type(method: &str) -> bool {
    method == "POST"
}

/// What the logic reaches outside itself: the user store, a clock and telemetry.
pub struct Ports<'a, S, C, T> {
    /// The host's user store.
    pub store: &'a S,
    /// A monotonic clock.
    pub clock: &'a C,
    /// Spans and log events.
    pub telemetry: &'a T,
}

/// Logs why a request body was refused, at `warn`: the client's mistake, not the service's.
pub(super) fn log_rejection(telemetry: &impl Telemetry, operation: &str, error: ApiError) {
    let attributes = [
        ("error", Value::from(error.message().as_str())),
        (
            "http.response.status_code",
            Value::Integer(error.status().into()),
        ),
    ];
    telemetry.log(Level::Warn, &format!("{operation} rejected"), &attributes);
}

/// Logs that the store failed, at `warn`: the host writes the request's one ERROR line, with
/// the store's own reason.
pub(super) fn log_store_failure(telemetry: &impl Telemetry, operation: &str) {
    let message = format!("{operation} failed: user store unavailable");
    telemetry.log(Level::Warn, &message, &[]);
}

/// The body of a `POST`, after the content-type (415) and JSON (400) checks.
pub(super) fn json_body(
    request: &Request<'_>,
) -> Result<serde_json::Map<String, serde_json::Value>, ApiError> {
    // The wasm edge asks the host for the header only when `reads_content_type` says so.
    debug_assert!(
        reads_content_type(request.method),
        "a {} body is parsed, but its content type is not read",
        request.method
    );
    if !validation::is_json_content_type(request.content_type) {
        return Err(ApiError::UnsupportedMediaType);
    }
    validation::json_object(request.body)
}
