//! The probe: one request a new guest must answer 200 before it serves.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt;

use crate::error::Error;
use crate::runtime::guest::Guest;
use crate::runtime::store::RequestContext;
use crate::user_store::UserStore;

/// Where a new guest is probed before it serves: a path of its own, or nowhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbePath {
    /// `GET` this path (and query) and expect a 200.
    Get(http::uri::PathAndQuery),
    /// Load the guest without probing it.
    Off,
}

/// The most of a probe's response body that is read.
const MAX_PROBE_BODY_BYTES: usize = 64 * 1024;

/// The longest guest version kept: it goes on every request span and log line.
const MAX_VERSION_BYTES: usize = 64;

/// The `version` of a health body: 1 to [`MAX_VERSION_BYTES`] printable ASCII characters, else
/// `unknown`.
fn reported_version(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|health| health["version"].as_str().map(str::to_string))
        .filter(|version| {
            (1..=MAX_VERSION_BYTES).contains(&version.len())
                && version
                    .bytes()
                    .all(|byte| byte.is_ascii_graphic() || byte == b' ')
        })
        .unwrap_or_else(|| "unknown".to_string())
}

/// How long the probe of a new guest may take.
pub const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

impl Guest {
    /// Sends one `GET` of the probe path through a fresh instance, with telemetry off and an
    /// empty store of its own, and returns the reported `version` (`unknown` when the 200's body
    /// is not JSON with one, or when probing is off). Anything but a 200 within
    /// [`PROBE_TIMEOUT`] is an error.
    pub async fn probe_version(&self, path: &ProbePath) -> Result<String, Error> {
        let ProbePath::Get(path) = path else {
            return Ok("unknown".to_string());
        };
        let probe = async {
            let request = http::Request::get(path.as_str())
                .header(http::header::HOST, "localhost")
                .body(http_body_util::Empty::<Bytes>::new())
                .expect("a parsed path makes a valid request");
            let context = RequestContext::quiet(Arc::new(UserStore::memory(0)));
            let response =
                self.handle(context, request)
                    .await
                    .map_err(|source| Error::ProbeFailed {
                        path: path.to_string(),
                        source,
                    })?;
            let status = response.status();
            let body = http_body_util::Limited::new(response.into_body(), MAX_PROBE_BODY_BYTES)
                .collect()
                .await
                .map(|body| body.to_bytes())
                .unwrap_or_default();
            if status != http::StatusCode::OK {
                return Err(Error::ProbeAnswered {
                    path: path.to_string(),
                    status,
                });
            }
            Ok(reported_version(&body))
        };
        tokio::time::timeout(PROBE_TIMEOUT, probe)
            .await
            .map_err(|_| Error::ProbeTimedOut {
                path: path.to_string(),
            })?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reported_version_is_kept_only_when_short_and_printable() {
        assert_eq!(reported_version(br#"{"version":"1.2.3"}"#), "1.2.3");
        let long = format!(r#"{{"version":"{}"}}"#, "9".repeat(65));
        for body in [
            &br#"{"status":"healthy"}"#[..],
            br#"{"version":""}"#,
            br#"{"version":"1.0\n"}"#,
            br#"{"version":7}"#,
            b"not json",
            long.as_bytes(),
        ] {
            assert_eq!(
                reported_version(body),
                "unknown",
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }
}
