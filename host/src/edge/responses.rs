//! The one place that builds the host's own responses: errors the host answers itself
//! (limits, faults) and the metrics page. Every error body is `{"error": "<message>"}`.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};

/// The body type of every response the host sends, whether the guest or the host wrote it.
pub type ResponseBody = wasmtime_wasi_http::p2::body::HyperOutgoingBody;

/// Message of the 500 answered when the guest traps or produces no response.
pub const INTERNAL_ERROR: &str = "Internal server error";
/// Message of the 503 answered when the guest runs past the request deadline.
pub const TIMED_OUT: &str = "Request timed out";
/// Message of the 503 answered when every guest instance slot stays busy.
pub const BUSY: &str = "Server busy, try again";
/// Message of the 400 answered when the client's body cannot be read off the connection.
pub const UNREADABLE_BODY: &str = "Could not read the request body";
/// Message of the 400 answered for a `Host` header that is not a valid authority.
pub const BAD_HOST: &str = "Invalid Host header";
/// Message of the 408 answered when a request's body does not arrive in time.
pub const BODY_TOO_SLOW: &str = "Request body not received in time";
/// Message of the 413 answered for a body over the limit.
pub const BODY_TOO_LARGE: &str = "Request body too large";

/// A complete response with a fixed body.
pub fn full(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<ResponseBody> {
    let mut response = Response::new(Full::new(body.into()).map_err(Into::into).boxed_unsync());
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// A JSON error response: `{"error": message}`.
pub fn error(status: StatusCode, message: &str) -> Response<ResponseBody> {
    let body = serde_json::json!({ "error": message }).to_string();
    full(status, "application/json", body)
}

/// The whole HTTP/1.1 answer to a connection over the cap, written before any request is read:
/// 503 with the busy message, and the connection closed.
pub fn over_connection_cap() -> Vec<u8> {
    let body = serde_json::json!({ "error": BUSY }).to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A 405 with the `Allow` header listing `allowed`.
pub fn method_not_allowed(allowed: &[http::Method]) -> Response<ResponseBody> {
    let mut response = error(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed");
    let allow = allowed
        .iter()
        .map(http::Method::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    let allow = HeaderValue::from_str(&allow).expect("method names are valid header values");
    response.headers_mut().insert(header::ALLOW, allow);
    response
}
