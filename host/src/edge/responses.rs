//! The one place that builds the host's own responses: errors the host answers itself
//! (limits, faults) and its own pages. Every error body is `{"error": "<message>"}`.

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
/// Message of the 503 the readiness page answers while the store does not (the guest's word
/// for the same fault).
pub const STORE_UNAVAILABLE: &str = "User store unavailable";

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

/// A JSON response.
pub fn json(status: StatusCode, body: &serde_json::Value) -> Response<ResponseBody> {
    full(status, "application/json", body.to_string())
}

/// A JSON error response: `{"error": message}`.
pub fn error(status: StatusCode, message: &str) -> Response<ResponseBody> {
    json(status, &serde_json::json!({ "error": message }))
}

/// Message of the 400 hyper answers for a request it cannot parse.
pub const MALFORMED_REQUEST: &str = "Malformed request";
/// Message of the 414 hyper answers for a request target over its limit.
pub const URI_TOO_LONG: &str = "Request target too long";
/// Message of the 431 hyper answers for a request head over its limit.
pub const HEAD_TOO_LARGE: &str = "Request header fields too large";

/// A fresh request id for an answer given before any request was read.
fn new_request_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// The whole HTTP/1.1 answer to a connection over the cap, written before any request is read:
/// 503 with the busy message, and the connection closed.
pub fn over_connection_cap() -> Vec<u8> {
    let body = serde_json::json!({ "error": BUSY }).to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         x-request-id: {}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        new_request_id(),
        body.len()
    )
    .into_bytes()
}

/// An answer of hyper's in the contract's form.
pub struct ContractForm {
    /// The whole answer.
    pub bytes: Vec<u8>,
    /// Its status code.
    pub status: u16,
    /// The request id it carries.
    pub request_id: String,
    /// Its error message.
    pub message: &'static str,
}

/// The contract's form of an answer hyper writes on its own, or `None` when `bytes` are not one.
///
/// For a request it cannot parse (400), a target too long (414) or a head too large (431),
/// hyper writes a bare head, `content-length: 0`, before any request reaches the host, and
/// offers no hook to change it. Such a head is the whole of one write, and it alone lacks the
/// `x-request-id` every answer of the host carries: the same head, its `content-length`
/// replaced, plus a request id and the JSON error body.
pub fn contract_form_of_hypers_own_answer(bytes: &[u8]) -> Option<ContractForm> {
    let head = std::str::from_utf8(bytes).ok()?;
    let lines = head.strip_suffix("\r\n\r\n")?;
    let mut lines = lines.split("\r\n");
    let status_line = lines.next()?;
    let (status, message) = match status_line.strip_prefix("HTTP/1.")?.get(2..5)? {
        "400" => (400, MALFORMED_REQUEST),
        "414" => (414, URI_TOO_LONG),
        "431" => (431, HEAD_TOO_LARGE),
        _ => return None,
    };
    let headers: Vec<&str> = lines.collect();
    let is_header = |line: &str, name: &str| {
        line.split_once(':')
            .is_some_and(|(key, _)| key.trim().eq_ignore_ascii_case(name))
    };
    let bare = headers
        .iter()
        .any(|line| is_header(line, "content-length") && line.ends_with(": 0"));
    if !bare
        || headers
            .iter()
            .any(|line| line.is_empty() || is_header(line, "x-request-id"))
    {
        return None;
    }
    let body = serde_json::json!({ "error": message }).to_string();
    let mut answer = format!("{status_line}\r\n");
    for line in headers
        .iter()
        .filter(|line| !is_header(line, "content-length"))
    {
        answer.push_str(line);
        answer.push_str("\r\n");
    }
    let request_id = new_request_id();
    answer.push_str(&format!(
        "content-type: application/json\r\nx-request-id: {request_id}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    ));
    Some(ContractForm {
        bytes: answer.into_bytes(),
        status,
        request_id,
        message,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    const HYPERS_400: &[u8] =
        b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\ndate: Fri, 27 Nov 2026 06:00:00 GMT\r\n\r\n";

    #[test]
    fn hypers_bare_error_heads_get_the_contracts_json_body_and_a_request_id() {
        for (head, status, message) in [
            (HYPERS_400.to_vec(), "400", MALFORMED_REQUEST),
            (
                b"HTTP/1.1 414 URI Too Long\r\ncontent-length: 0\r\n\r\n".to_vec(),
                "414",
                URI_TOO_LONG,
            ),
            (
                b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
                    .to_vec(),
                "431",
                HEAD_TOO_LARGE,
            ),
        ] {
            let form = contract_form_of_hypers_own_answer(&head).expect("rewritten");
            assert_eq!(form.status.to_string(), status);
            assert_eq!(form.message, message);
            let answer = String::from_utf8(form.bytes).unwrap();
            let (head, body) = answer.split_once("\r\n\r\n").unwrap();
            assert!(head.starts_with(&format!("HTTP/1.1 {status} ")), "{answer}");
            assert_eq!(body, serde_json::json!({ "error": message }).to_string());
            assert!(head.contains(&format!("\r\ncontent-length: {}", body.len())), "{head}");
            assert!(!head.contains("content-length: 0"), "{head}");
            assert!(head.contains("\r\ncontent-type: application/json"), "{head}");
            let id = head.split("x-request-id: ").nth(1).unwrap().split("\r\n").next().unwrap();
            assert_eq!(id, form.request_id);
            assert_eq!(uuid::Uuid::parse_str(id).unwrap().get_version_num(), 4);
        }
        let kept = String::from_utf8(
            contract_form_of_hypers_own_answer(HYPERS_400)
                .unwrap()
                .bytes,
        )
        .unwrap();
        assert!(kept.contains("\r\nconnection: close\r\n"), "{kept}");
        assert!(
            kept.contains("\r\ndate: Fri, 27 Nov 2026 06:00:00 GMT\r\n"),
            "{kept}"
        );
    }

    #[test]
    fn anything_but_a_bare_error_head_of_hypers_is_left_alone() {
        for bytes in [
            // The host's own answers carry a request id.
            &b"HTTP/1.1 400 Bad Request\r\nx-request-id: a\r\ncontent-length: 0\r\n\r\n"[..],
            // A head with a body, or a body's bytes.
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\n{}",
            b"{\"status\":\"healthy\"}",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n",
            // Statuses hyper does not answer on its own.
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 10\r\n\r\n",
        ] {
            assert!(
                contract_form_of_hypers_own_answer(bytes).is_none(),
                "{}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    #[test]
    fn the_answer_over_the_connection_cap_carries_a_request_id() {
        let answer = String::from_utf8(over_connection_cap()).unwrap();
        assert!(answer.contains("\r\nx-request-id: "), "{answer}");
        let (_, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(
            answer.contains(&format!("content-length: {}\r\n", body.len())),
            "{answer}"
        );
    }
}
