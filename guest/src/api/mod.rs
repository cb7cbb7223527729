//! The API: one function from request to response, in the contract's order of checks. Routing
//! lives here; what every endpoint shares in `exchange`; each endpoint in a module of its own.

mod compute;
mod exchange;
#[cfg(test)]
mod fakes;
mod health;
mod users;

pub use exchange::{LIST_PAGE_SIZE, Ports, Request, reads_content_type};

use compute::compute;
use health::health;
use users::{create_user, get_user, list_users};

use crate::error::ApiError;
use crate::ports::{Clock, Telemetry, UserStore};
use crate::response::{Responder, Response};
use crate::routes::Route;

/// Whether the logic parses a request's body, and so whether the edge reads it: only a `POST`
/// to an endpoint that takes one. No other answer depends on the body (one over the host's limit
/// never reaches the guest: the host answers 413 before it runs).
pub fn reads_body(method: &str, target: &str) -> bool {
    // The method first: a `GET` is not routed twice.
    reads_content_type(method) && Route::from_path(target).is_some_and(|route| route.allows(method))
}

/// Answers one request through `responder`. Checks run in the contract's order: unknown path
/// (404), wrong method (405), content type (415), unparseable body (400), then the endpoint's
/// own rules.
pub fn handle(
    request: &Request<'_>,
    ports: &Ports<'_, impl UserStore, impl Clock, impl Telemetry>,
    responder: impl Responder,
) {
    match endpoint(request, ports.telemetry) {
        Ok(Route::Users) if request.method != "POST" => {
            list_users(request.method, ports, responder);
        }
        Ok(route) => answer(route, request, ports)
            .unwrap_or_else(Response::from)
            .send(responder),
        Err(error) => Response::from(error).send(responder),
    }
}

/// Answers a request whose body the logic parses but could not read (the client broke it, or it
/// is over the host's limit): 400, under the endpoint's route. The host turns it into
/// a 413 when the body was over its limit.
pub fn unreadable_body(target: &str, telemetry: &impl Telemetry, responder: impl Responder) {
    if let Some(route) = Route::from_path(target) {
        telemetry.set_route(route.template());
    }
    Response::from(ApiError::UnreadableBody).send(responder);
}

/// The route of a request whose path exists and whose method that path allows. A known path
/// names its template to the host, whatever the method.
fn endpoint<'a>(request: &Request<'a>, telemetry: &impl Telemetry) -> Result<Route<'a>, ApiError> {
    let route = Route::from_path(request.target).ok_or(ApiError::NotFound)?;
    telemetry.set_route(route.template());
    if !route.allows(request.method) {
        return Err(ApiError::MethodNotAllowed(route.allowed_methods()));
    }
    Ok(route)
}

/// The complete answer of every endpoint but the (streamed) user list.
fn answer<S: UserStore, C: Clock, T: Telemetry>(
    route: Route<'_>,
    request: &Request<'_>,
    ports: &Ports<'_, S, C, T>,
) -> Result<Response, ApiError> {
    match route {
        Route::Health => Ok(health(ports.telemetry)),
        Route::Users => create_user(request, ports),
        Route::User(id) => get_user(id, ports),
        Route::Compute => compute(request, ports),
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use serde_json::Value;

    use crate::api::fakes::*;
    use crate::api::*;

    #[test]
    fn a_known_path_names_its_template_whatever_the_method() {
        assert_eq!(routes_named(&get("/api/health")), ["/api/health"]);
        assert_eq!(routes_named(&get("/api/users/abc?x")), ["/api/users/{id}"]);
        assert_eq!(routes_named(&post("/api/compute", "{}")), ["/api/compute"]);
        assert_eq!(routes_named(&post("/api/health", "")), ["/api/health"]);
    }

    #[test]
    fn an_unknown_path_names_no_route() {
        assert!(routes_named(&get("/api/nope")).is_empty());
    }

    #[test]
    fn an_unreadable_body_is_a_400_under_the_endpoints_route() {
        let telemetry = RecordingTelemetry::default();
        let collected = RefCell::new(Collected::default());
        unreadable_body("/api/users?x", &&telemetry, Collector(&collected));
        assert_eq!(collected.into_inner().head.unwrap().status, 400);
        assert_eq!(telemetry.routes.take(), ["/api/users"]);
    }

    #[test]
    fn only_a_post_to_an_endpoint_that_takes_one_has_its_body_read() {
        assert!(reads_body("POST", "/api/users"));
        assert!(reads_body("POST", "/api/compute?x=1"));
        assert!(!reads_body("GET", "/api/health"));
        assert!(!reads_body("GET", "/api/users"));
        assert!(!reads_body("HEAD", "/api/users/abc"));
        assert!(!reads_body("POST", "/api/health"));
        assert!(!reads_body("POST", "/api/nope"));
        assert!(!reads_body("PUT", "/api/users"));
    }

    #[test]
    fn only_a_post_has_its_content_type_read() {
        assert!(reads_content_type("POST"));
        for method in ["GET", "HEAD", "PUT", "DELETE", "OPTIONS"] {
            assert!(!reads_content_type(method), "{method}");
        }
    }

    #[test]
    fn unknown_paths_are_404() {
        assert_error(
            &send(&FakeStore::new(), "GET", "/nope", None),
            404,
            "Not found",
        );
        assert_error(
            &send(&FakeStore::new(), "POST", "/api/nope", Some("{}")),
            404,
            "Not found",
        );
    }

    #[test]
    fn a_wrong_method_is_405_with_allow() {
        let store = FakeStore::new();
        let cases = [
            ("DELETE", "/api/health", "GET, HEAD"),
            ("POST", "/api/health", "GET, HEAD"),
            ("PUT", "/api/users", "GET, HEAD, POST"),
            ("OPTIONS", "/api/users", "GET, HEAD, POST"),
            ("POST", "/api/users/abc", "GET, HEAD"),
            ("GET", "/api/compute", "POST"),
            ("TRACE", "/api/compute", "POST"),
        ];
        for (method, path, allow) in cases {
            let response = send(&store, method, path, None);
            assert_error(&response, 405, "Method not allowed");
            assert_eq!(response.header("allow"), Some(allow), "{method} {path}");
        }
    }

    #[test]
    fn a_post_without_json_content_type_is_415() {
        let store = FakeStore::new();
        for content_type in [None, Some("text/plain"), Some("application/xml")] {
            let request = Request {
                method: "POST",
                target: "/api/users",
                content_type,
                body: b"{}",
            };
            assert_error(
                &run(&request, &store),
                415,
                "Content-Type must be application/json",
            );
        }
        let with_charset = Request {
            method: "POST",
            target: "/api/compute",
            content_type: Some("application/json; charset=utf-8"),
            body: br#"{"n":1}"#,
        };
        assert_eq!(run(&with_charset, &store).status, 200);
    }

    #[test]
    fn a_body_that_is_not_a_json_object_is_400() {
        let store = FakeStore::new();
        for text in ["{", "", "[]", "42", "\"x\""] {
            let response = send(&store, "POST", "/api/users", Some(text));
            assert_eq!(response.status, 400, "{text:?}");
        }
    }

    #[test]
    fn checks_run_in_the_contract_order() {
        let store = FakeStore::new();
        // Unknown path beats everything; wrong method beats content type; content type beats JSON.
        let request = |method, target, content_type| Request {
            method,
            target,
            content_type,
            body: b"{",
        };
        assert_eq!(run(&request("PUT", "/nope", None), &store).status, 404);
        assert_eq!(
            run(&request("PUT", "/api/compute", None), &store).status,
            405
        );
        assert_eq!(
            run(&request("POST", "/api/compute", Some("text/plain")), &store).status,
            415
        );
        assert_eq!(
            run(
                &request("POST", "/api/compute", Some("application/json")),
                &store
            )
            .status,
            400
        );
    }

    #[test]
    fn an_unavailable_store_gives_503_on_every_store_endpoint() {
        let store = FakeStore::new();
        fill(&store, 1);
        let id = store.all()[0].id.clone();
        store.fail_from_call(0);
        for (method, target, body) in [
            ("GET", "/api/users".to_string(), None),
            ("HEAD", "/api/users".to_string(), None),
            ("GET", format!("/api/users/{id}"), None),
            (
                "POST",
                "/api/users".to_string(),
                Some(r#"{"name":"B","email":"b@x.io"}"#),
            ),
        ] {
            let (response, events) = run_recorded(
                &Request {
                    method,
                    target: &target,
                    content_type: body.map(|_| "application/json"),
                    body: body.unwrap_or_default().as_bytes(),
                },
                &store,
            );
            if method == "HEAD" {
                assert_eq!(response.status, 503);
            } else {
                assert_error(&response, 503, "User store unavailable");
            }
            // At warn: the host writes the request's one ERROR line, with the store's reason.
            assert!(
                events
                    .iter()
                    .any(|event| event.starts_with("Warn ")
                        && event.contains("user store unavailable")),
                "{method} {target}: {events:?}"
            );
        }
        assert_eq!(store.all().len(), 1);
    }

    #[test]
    fn health_and_compute_need_no_store() {
        let store = FakeStore::new();
        store.fail_from_call(0);
        assert_eq!(send(&store, "GET", "/api/health", None).status, 200);
        assert_eq!(
            send(&store, "POST", "/api/compute", Some(r#"{"n":3}"#)).status,
            200
        );
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        /// Every status the contract lets the guest answer with.
        const CONTRACT_STATUSES: &[u16] = &[200, 201, 400, 404, 405, 409, 415, 503];

        fn method() -> impl Strategy<Value = String> {
            prop_oneof![
                prop::sample::select(vec![
                    "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"
                ])
                .prop_map(String::from),
                "[A-Za-z]{1,10}",
            ]
        }

        fn path() -> impl Strategy<Value = String> {
            prop_oneof![
                prop::sample::select(vec![
                    "/api/health",
                    "/api/users",
                    "/api/compute",
                    "/metrics",
                    "/"
                ])
                .prop_map(String::from),
                "/api/users/[ -~]{0,40}",
                "/api/[a-z/]{0,20}(\\?[ -~]{0,20})?",
                "[ -~]{0,60}",
            ]
        }

        fn body() -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![
                prop::collection::vec(any::<u8>(), 0..64),
                "\\{\"n\":(-?[0-9]{3,25}(\\.[0-9])?|[0-9]|1[0-9]|2[0-4]|null|true|\"[0-9]\"|\\[\\])\\}".prop_map(String::into_bytes),
                ("[ -~]{0,30}", "[ -~]{0,40}")
                    .prop_map(|(name, email)| serde_json::json!({"name": name, "email": email}).to_string().into_bytes()),
                any::<String>().prop_map(String::into_bytes),
            ]
        }

        proptest! {
            #[test]
            fn any_request_gets_a_json_answer_with_a_contract_status(
                method in method(),
                target in path(),
                content_type in prop::option::of(prop::sample::select(vec![
                    "application/json", "application/json; charset=utf-8", "text/plain", "",
                ])),
                body in body(),
            ) {
                let store = FakeStore::new();
                let request = Request { method: &method, target: &target, content_type, body: &body };
                let response = run(&request, &store);
                prop_assert!(CONTRACT_STATUSES.contains(&response.status), "status {}", response.status);
                prop_assert_eq!(response.header("content-type"), Some("application/json"));
                if method == "HEAD" && response.body.is_empty() {
                    // A streamed list answers HEAD without reading past its first page.
                    return Ok(());
                }
                let json: Value = serde_json::from_slice(&response.body).expect("the body is JSON");
                if response.status >= 400 {
                    let object = json.as_object().expect("an error body is an object");
                    prop_assert_eq!(object.len(), 1);
                    prop_assert!(object["error"].as_str().is_some_and(|message| !message.is_empty() && message.len() <= 100));
                }
            }
        }
    }
}
