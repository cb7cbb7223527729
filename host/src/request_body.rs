//! A request's body as the guest gets it.
//!
//! The host reads the body before the guest runs (so a client that trickles it holds no
//! instance slot), within the body deadline and up to the size limit. A body over the limit is
//! not read further: the guest gets a body whose first read fails, and only a guest that reads
//! it (one that reached an endpoint) turns the request into the host's 413. A guest that answers
//! without reading (404, 405) keeps its answer, so the host needs no knowledge of routes.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, header};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;

/// Why a body could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyError {
    /// The client broke the body's framing, or the connection.
    Unreadable,
    /// The body did not arrive within the body deadline.
    TooSlow,
}

/// A body the host has read: whole, or known to be over the limit (and left unread).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadBody {
    /// Every byte of it.
    Complete(Bytes),
    /// More than the limit: from `Content-Length` before reading anything, or while reading.
    OverLimit,
}

/// The whole body, or [`ReadBody::OverLimit`] as soon as it is known to exceed `limit`.
pub async fn read_body(
    body: Incoming,
    headers: &HeaderMap,
    limit: usize,
) -> Result<ReadBody, BodyError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return Ok(ReadBody::OverLimit);
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(ReadBody::Complete(collected.to_bytes())),
        Err(error) if error.is::<LengthLimitError>() => Ok(ReadBody::OverLimit),
        Err(_) => Err(BodyError::Unreadable),
    }
}

/// The body handed to the guest: the bytes read, or, for a body over the limit, a read error
/// that marks the request as one to answer 413.
#[derive(Debug)]
pub struct GuestRequestBody {
    bytes: Option<Bytes>,
    /// Set when the guest reads a body over the limit.
    over_limit_read: Option<Arc<AtomicBool>>,
}

impl GuestRequestBody {
    /// A complete body.
    pub fn complete(bytes: Bytes) -> GuestRequestBody {
        GuestRequestBody {
            bytes: Some(bytes),
            over_limit_read: None,
        }
    }

    /// The guest's view of `read`, and the flag its read of an over-limit body raises.
    pub fn new(read: ReadBody) -> (GuestRequestBody, Arc<AtomicBool>) {
        let over_limit_read = Arc::new(AtomicBool::new(false));
        let body = match read {
            ReadBody::Complete(bytes) => GuestRequestBody::complete(bytes),
            ReadBody::OverLimit => GuestRequestBody {
                bytes: None,
                over_limit_read: Some(Arc::clone(&over_limit_read)),
            },
        };
        (body, over_limit_read)
    }
}

impl Body for GuestRequestBody {
    type Data = Bytes;
    type Error = wasmtime_wasi_http::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some(bytes) = self.bytes.take().filter(|bytes| !bytes.is_empty()) {
            return Poll::Ready(Some(Ok(Frame::data(bytes))));
        }
        if let Some(flag) = self.over_limit_read.take() {
            flag.store(true, Ordering::Release);
            return Poll::Ready(Some(Err(wasmtime_wasi_http::Error::HttpRequestBodySize(
                None,
            ))));
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.over_limit_read.is_none() && self.bytes.as_ref().is_none_or(Bytes::is_empty)
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.bytes, &self.over_limit_read) {
            (_, Some(_)) => SizeHint::default(),
            (Some(bytes), None) => SizeHint::with_exact(bytes.len() as u64),
            (None, None) => SizeHint::with_exact(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_complete_body_is_its_bytes_and_never_raises_the_flag() {
        let (body, over_limit_read) = GuestRequestBody::new(ReadBody::Complete(Bytes::from("hi")));
        assert_eq!(body.collect().await.unwrap().to_bytes(), "hi");
        assert!(!over_limit_read.load(Ordering::Acquire));
    }

    #[tokio::test]
    async fn an_over_limit_body_fails_its_first_read_and_raises_the_flag() {
        let (body, over_limit_read) = GuestRequestBody::new(ReadBody::OverLimit);
        assert!(
            !over_limit_read.load(Ordering::Acquire),
            "raised before a read"
        );
        assert!(body.collect().await.is_err());
        assert!(over_limit_read.load(Ordering::Acquire));
    }
}
