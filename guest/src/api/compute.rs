//! `POST /api/compute`: the n-th Fibonacci number, computed the slow way, and how long it took.

use serde::Serialize;

use crate::api::exchange::{Ports, Request, json_body, log_rejection};
use crate::error::ApiError;
use crate::fibonacci;
use crate::ports::{Clock, Level, Span, Telemetry, UserStore, Value};
use crate::response::Response;
use crate::validation;

pub(super) fn compute<S: UserStore, C: Clock, T: Telemetry>(
    request: &Request<'_>,
    ports: &Ports<'_, S, C, T>,
) -> Result<Response, ApiError> {
    #[derive(Serialize)]
    struct ComputeResult {
        input: u32,
        result: u64,
        duration_ms: u64,
    }
    let n = json_body(request)
        .and_then(|body| validation::compute_n(&body))
        .inspect_err(|error| log_rejection(ports.telemetry, "compute", *error))?;
    let n_attribute = ("compute.n", Value::Integer(n.into()));
    let span = ports
        .telemetry
        .span("compute.fibonacci", core::slice::from_ref(&n_attribute));
    ports.telemetry.log(
        Level::Info,
        "compute started",
        core::slice::from_ref(&n_attribute),
    );
    let started = ports.clock.now_nanos();
    let result = fibonacci::naive(core::hint::black_box(n));
    let duration_ms = ports.clock.now_nanos().saturating_sub(started) / 1_000_000;
    let duration_attribute = ("compute.duration_ms", Value::Integer(duration_ms as i64));
    span.set_attribute(duration_attribute.clone());
    ports.telemetry.log(
        Level::Info,
        "compute finished",
        &[n_attribute, duration_attribute],
    );
    Ok(Response::json(
        200,
        &ComputeResult {
            input: n,
            result,
            duration_ms,
        },
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::api::fakes::*;

    #[test]
    fn compute_returns_input_result_and_whole_milliseconds() {
        let response = send(
            &FakeStore::new(),
            "POST",
            "/api/compute",
            Some(r#"{"n":20}"#),
        );
        assert_eq!(response.status, 200);
        // The stepping clock advances 7.4 ms between the two reads: 7 whole milliseconds.
        assert_eq!(
            body(&response),
            json!({"input": 20, "result": 6765, "duration_ms": 7})
        );
    }

    #[test]
    fn compute_refuses_n_out_of_range_or_not_an_integer() {
        let store = FakeStore::new();
        for n in ["36", "50", "100", "-1"] {
            let response = send(
                &store,
                "POST",
                "/api/compute",
                Some(&format!(r#"{{"n":{n}}}"#)),
            );
            assert_error(&response, 400, "Field 'n' must be between 0 and 35");
        }
        for n in ["1.5", "10.0", "\"10\"", "true"] {
            let response = send(
                &store,
                "POST",
                "/api/compute",
                Some(&format!(r#"{{"n":{n}}}"#)),
            );
            assert_error(&response, 400, "Field 'n' must be an integer");
        }
        for text in [r#"{"n":null}"#, "{}"] {
            assert_error(
                &send(&store, "POST", "/api/compute", Some(text)),
                400,
                "Missing required field: n",
            );
        }
    }

    #[test]
    fn compute_reports_its_span_timing_and_start_and_finish() {
        let (_, events) = run_recorded(&post("/api/compute", r#"{"n":10}"#), &FakeStore::new());
        assert_eq!(
            events,
            [
                r#"span compute.fibonacci [("compute.n", Integer(10))]"#,
                r#"Info compute started [("compute.n", Integer(10))]"#,
                r#"set compute.fibonacci ("compute.duration_ms", Integer(7))"#,
                r#"Info compute finished [("compute.n", Integer(10)), ("compute.duration_ms", Integer(7))]"#,
                "end compute.fibonacci",
            ]
        );
    }
}
