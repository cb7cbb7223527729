//! The one place that builds responses: JSON success bodies and `{"error": ...}` bodies.

use serde::Serialize;

use crate::error::ApiError;

/// An HTTP response as the logic produces it; the wasm edge copies it onto `wasi:http`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Header names (lower case) and values.
    pub headers: Vec<(&'static str, String)>,
    /// The complete body.
    pub body: Vec<u8>,
}

impl Response {
    /// A response whose body is `value` as JSON.
    pub fn json(status: u16, value: &impl Serialize) -> Response {
        // Our bodies are plain structs of strings and numbers: serialising them cannot fail.
        let body = serde_json::to_vec(value).expect("API bodies always serialise");
        Response {
            status,
            headers: vec![("content-type", "application/json".to_string())],
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
