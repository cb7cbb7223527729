//! The one place that builds responses: JSON success bodies and `{"error": ...}` bodies, and
//! the [`Responder`] they are sent through (the wasm edge's `wasi:http` response, or memory in
//! tests).

use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;

use serde::Serialize;

use crate::error::ApiError;

/// A complete HTTP response as the logic produces it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Header names (lower case) and values.
    pub headers: Vec<(&'static str, String)>,
    /// The complete body.
    pub body: Vec<u8>,
}

/// The headers of every JSON response.
pub fn json_headers() -> Vec<(&'static str, String)> {
    vec![("content-type", "application/json".to_string())]
}

impl Response {
    /// A response whose body is `value` as JSON.
    pub fn json(status: u16, value: &impl Serialize) -> Response {
        // Our bodies are plain structs of strings and numbers: serialising them cannot fail.
        let body = serde_json::to_vec(value).expect("API bodies always serialise");
        Response::with_json_body(status, body)
    }

    /// A response whose body is `json`, JSON text fixed at build time.
    pub fn json_text(status: u16, json: &'static str) -> Response {
        Response::with_json_body(status, json.as_bytes().to_vec())
    }

    fn with_json_body(status: u16, body: Vec<u8>) -> Response {
        Response {
            status,
            headers: json_headers(),
            body,
        }
    }

    /// The value of header `name`, if set.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// Sends the whole response, with its `Content-Length`, through `responder`.
    pub fn send(self, responder: impl Responder) {
        let mut body = responder.send_head(self.status, self.headers, Some(self.body.len()));
        if body.write(&self.body).is_ok() {
            body.finish();
        }
    }
}

impl From<ApiError> for Response {
    fn from(error: ApiError) -> Response {
        #[derive(Serialize)]
        struct ErrorBody {
            error: String,
        }
        let mut response = Response::json(
            error.status(),
            &ErrorBody {
                error: error.message(),
            },
        );
        if let ApiError::MethodNotAllowed(allowed) = error {
            response.headers.push(("allow", allowed.join(", ")));
        }
        response
    }
}

/// Where a response goes: its head first, then its body in one piece or many.
pub trait Responder {
    /// The body, writable once the head is sent.
    type Body: BodyWriter;

    /// Sends the status and headers. `content_length` is the body's length when it is known
    /// before the first byte is written; a streamed body has none.
    fn send_head(
        self,
        status: u16,
        headers: Vec<(&'static str, String)>,
        content_length: Option<usize>,
    ) -> Self::Body;
}

/// The body of a response whose head is sent. Dropping it without [`finish`](Self::finish)
/// aborts the response: the client sees a body cut short, never a complete-looking one.
pub trait BodyWriter {
    /// Writes the next piece of the body; `Err` means the client is gone and writing may stop.
    fn write(&mut self, bytes: &[u8]) -> Result<(), ClientGone>;
    /// Ends the body: what was written is all of it.
    fn finish(self);
}

/// The client stopped reading (closed its connection): the rest of the body goes nowhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientGone;
