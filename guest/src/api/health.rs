//! `GET /api/health`: the service is up, and which version of the guest answers.

use crate::ports::{Level, Telemetry};
use crate::response::Response;

/// The health report, the same for every request: its JSON text is written at build time, so
/// answering runs no serializer. `concat!` takes only literals, hence `env!` and not
/// [`crate::VERSION`] (the same value; a test holds them together).
const REPORT: &str = concat!(
    r#"{"status":"healthy","version":""#,
    env!("CARGO_PKG_VERSION"),
    r#""}"#
);

pub(super) fn health(telemetry: &impl Telemetry) -> Response {
    telemetry.log(
        Level::Info,
        "health check",
        &[("version", crate::VERSION.into())],
    );
    Response::json_text(200, REPORT)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::api::fakes::*;

    #[test]
    fn health_reports_healthy_and_the_package_version() {
        let response = send(&FakeStore::new(), "GET", "/api/health", None);
        assert_eq!(response.status, 200);
        assert_eq!(
            body(&response),
            json!({"status": "healthy", "version": crate::VERSION})
        );
    }

    #[test]
    fn the_health_report_is_the_bytes_serde_json_would_write() {
        let response = send(&FakeStore::new(), "GET", "/api/health", None);
        // `json!` keeps its keys sorted, and `status` sorts before `version`: the report's order.
        let written = serde_json::to_vec(&json!({"status": "healthy", "version": crate::VERSION}));
        assert_eq!(response.body, written.unwrap());
    }

    #[test]
    fn head_is_answered_like_get() {
        let store = FakeStore::new();
        assert_eq!(
            send(&store, "HEAD", "/api/health", None),
            send(&store, "GET", "/api/health", None)
        );
        // The list is streamed: its HEAD has the GET's status and headers, and no body.
        let head = send(&store, "HEAD", "/api/users", None);
        let get = send(&store, "GET", "/api/users", None);
        assert_eq!((head.status, &head.headers), (get.status, &get.headers));
        assert!(head.body.is_empty());
    }

    #[test]
    fn health_logs_one_info_line() {
        let (_, events) = run_recorded(&get("/api/health"), &FakeStore::new());
        assert_eq!(events.len(), 1, "{events:?}");
        assert!(events[0].starts_with("Info health check"), "{events:?}");
    }
}
