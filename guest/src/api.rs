//! The API: one function from request to response, in the contract's order of checks.

use serde::Serialize;

use crate::error::ApiError;
use crate::fibonacci;
use crate::ports::{Clock, CreateError, UserStore};
use crate::response::Response;
use crate::routes::Route;
use crate::validation;

/// What the logic needs of an HTTP request.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The method, upper case as sent (methods are case-sensitive).
    pub method: &'a str,
    /// The path, possibly followed by `?query`.
    pub target: &'a str,
    /// The `Content-Type` header, if any.
    pub content_type: Option<&'a str>,
    /// The whole body (the host has already bounded its size).
    pub body: &'a [u8],
}

/// Answers one request. Checks run in the contract's order: unknown path (404), wrong method
/// (405), content type (415), unparseable body (400), then the endpoint's own rules.
pub fn handle(request: &Request<'_>, store: &impl UserStore, clock: &impl Clock) -> Response {
    dispatch(request, store, clock).unwrap_or_else(Response::from)
}

fn dispatch(
    request: &Request<'_>,
    store: &impl UserStore,
    clock: &impl Clock,
) -> Result<Response, ApiError> {
    let route = Route::from_path(request.target).ok_or(ApiError::NotFound)?;
    if !route.allows(request.method) {
        return Err(ApiError::MethodNotAllowed(route.allowed_methods()));
    }
    match route {
        Route::Health => Ok(health()),
        Route::Users if request.method == "POST" => create_user(request, store),
        Route::Users => Ok(Response::json(200, &store.list())),
        Route::User(id) => get_user(id, store),
        Route::Compute => compute(request, clock),
    }
}

fn health() -> Response {
    #[derive(Serialize)]
    struct Health {
        status: &'static str,
        version: &'static str,
    }
    Response::json(
        200,
        &Health {
            status: "healthy",
            version: crate::VERSION,
        },
    )
}

fn get_user(segment: &str, store: &impl UserStore) -> Result<Response, ApiError> {
    let id = validation::user_id(segment).ok_or(ApiError::UserNotFound)?;
    let user = store.get(&id).ok_or(ApiError::UserNotFound)?;
    Ok(Response::json(200, &user))
}

fn create_user(request: &Request<'_>, store: &impl UserStore) -> Result<Response, ApiError> {
    let new_user = validation::new_user(&json_body(request)?)?;
    let user = store
        .create(&new_user.name, &new_user.email)
        .map_err(|error| match error {
            CreateError::DuplicateEmail => ApiError::DuplicateEmail,
            CreateError::StoreFull => ApiError::StoreFull,
        })?;
    Ok(Response::json(201, &user))
}

fn compute(request: &Request<'_>, clock: &impl Clock) -> Result<Response, ApiError> {
    #[derive(Serialize)]
    struct ComputeResult {
        input: u32,
        result: u64,
        duration_ms: u64,
    }
    let n = validation::compute_n(&json_body(request)?)?;
    let started = clock.now_nanos();
    let result = fibonacci::naive(std::hint::black_box(n));
    let duration_ms = clock.now_nanos().saturating_sub(started) / 1_000_000;
    Ok(Response::json(
        200,
        &ComputeResult {
            input: n,
            result,
            duration_ms,
        },
    ))
}

/// The body of a `POST`, after the content-type (415) and JSON (400) checks.
fn json_body(
    request: &Request<'_>,
) -> Result<serde_json::Map<String, serde_json::Value>, ApiError> {
    if !validation::is_json_content_type(request.content_type) {
        return Err(ApiError::UnsupportedMediaType);
    }
    validation::json_object(request.body)
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};

    use serde_json::{Value, json};

    use super::*;
    use crate::ports::User;

    /// An in-memory store with the host's rules: creation order, case-insensitive e-mails, a cap.
    struct FakeStore {
        users: RefCell<Vec<User>>,
        capacity: usize,
    }

    impl FakeStore {
        fn new() -> FakeStore {
            FakeStore {
                users: RefCell::default(),
                capacity: usize::MAX,
            }
        }
    }

    impl UserStore for FakeStore {
        fn list(&self) -> Vec<User> {
            self.users.borrow().clone()
        }
        fn get(&self, id: &str) -> Option<User> {
            self.users
                .borrow()
                .iter()
                .find(|user| user.id == id)
                .cloned()
        }
        fn create(&self, name: &str, email: &str) -> Result<User, CreateError> {
            let mut users = self.users.borrow_mut();
            if users
                .iter()
                .any(|user| user.email.eq_ignore_ascii_case(email))
            {
                return Err(CreateError::DuplicateEmail);
            }
            if users.len() >= self.capacity {
                return Err(CreateError::StoreFull);
            }
            let user = User {
                id: format!("00000000-0000-4000-8000-{:012x}", users.len()),
                name: name.into(),
                email: email.into(),
            };
            users.push(user.clone());
            Ok(user)
        }
    }

    /// A clock that advances by a fixed step each time it is read.
    struct SteppingClock {
        now: Cell<u64>,
        step: u64,
    }

    impl Clock for SteppingClock {
        fn now_nanos(&self) -> u64 {
            let now = self.now.get();
            self.now.set(now + self.step);
            now
        }
    }

    fn clock() -> SteppingClock {
        SteppingClock {
            now: Cell::new(0),
            step: 7_400_000,
        }
    }

    fn send(store: &FakeStore, method: &str, target: &str, body: Option<&str>) -> Response {
        let request = Request {
            method,
            target,
            content_type: body.map(|_| "application/json"),
            body: body.unwrap_or_default().as_bytes(),
        };
        handle(&request, store, &clock())
    }

    fn body(response: &Response) -> Value {
        serde_json::from_slice(&response.body).expect("every response body is JSON")
    }

    fn assert_error(response: &Response, status: u16, message: &str) {
        assert_eq!(response.status, status);
        assert_eq!(response.header("content-type"), Some("application/json"));
        assert_eq!(body(response), json!({ "error": message }));
    }

    #[test]
    fn health_reports_healthy_and_the_package_version() {
        let response = send(&FakeStore::new(), "GET", "/api/health", None);
        assert_eq!(response.status, 200);
        assert_eq!(
            body(&response),
            json!({"status": "healthy", "version": env!("CARGO_PKG_VERSION")})
        );
    }

    #[test]
    fn head_is_answered_like_get() {
        let store = FakeStore::new();
        assert_eq!(
            send(&store, "HEAD", "/api/health", None),
            send(&store, "GET", "/api/health", None)
        );
        assert_eq!(send(&store, "HEAD", "/api/users", None).status, 200);
    }

    #[test]
    fn the_user_list_starts_empty() {
        let response = send(&FakeStore::new(), "GET", "/api/users", None);
        assert_eq!(response.status, 200);
        assert_eq!(body(&response), json!([]));
    }

    #[test]
    fn creating_a_user_answers_201_with_exactly_id_name_and_email() {
        let response = send(
            &FakeStore::new(),
            "POST",
            "/api/users",
            Some(r#"{"name":" Ada ","email":"ada@example.com"}"#),
        );
        assert_eq!(response.status, 201);
        let user = body(&response);
        let fields: Vec<&String> = user.as_object().unwrap().keys().collect();
        assert_eq!(fields, ["email", "id", "name"]);
        assert_eq!(user["name"], "Ada");
        assert_eq!(user["email"], "ada@example.com");
    }

    #[test]
    fn users_are_listed_in_creation_order_and_found_by_id() {
        let store = FakeStore::new();
        let first = body(&send(
            &store,
            "POST",
            "/api/users",
            Some(r#"{"name":"A","email":"a@x.io"}"#),
        ));
        let second = body(&send(
            &store,
            "POST",
            "/api/users",
            Some(r#"{"name":"B","email":"b@x.io"}"#),
        ));
        assert_eq!(
            body(&send(&store, "GET", "/api/users", None)),
            json!([first, second])
        );

        let id = second["id"].as_str().unwrap();
        let found = send(&store, "GET", &format!("/api/users/{id}"), None);
        assert_eq!(found.status, 200);
        assert_eq!(body(&found), second);
    }

    #[test]
    fn a_user_id_is_found_in_any_letter_case() {
        let store = FakeStore::new();
        let user = body(&send(
            &store,
            "POST",
            "/api/users",
            Some(r#"{"name":"A","email":"a@x.io"}"#),
        ));
        let upper = user["id"].as_str().unwrap().to_uppercase();
        assert_eq!(
            send(&store, "GET", &format!("/api/users/{upper}"), None).status,
            200
        );
    }

    #[test]
    fn unknown_and_malformed_ids_are_user_not_found() {
        let store = FakeStore::new();
        assert_error(
            &send(
                &store,
                "GET",
                "/api/users/6f1c3c1e-8a1b-4c2d-9e3f-0a1b2c3d4e5f",
                None,
            ),
            404,
            "User not found",
        );
        assert_error(
            &send(&store, "GET", "/api/users/not-a-uuid", None),
            404,
            "User not found",
        );
    }

    #[test]
    fn an_invalid_email_gives_400_invalid_email_format() {
        let response = send(
            &FakeStore::new(),
            "POST",
            "/api/users",
            Some(r#"{"name":"A","email":"invalid"}"#),
        );
        assert_error(&response, 400, "Invalid email format");
    }

    #[test]
    fn a_missing_field_gives_400() {
        let response = send(
            &FakeStore::new(),
            "POST",
            "/api/users",
            Some(r#"{"name":"A"}"#),
        );
        assert_error(&response, 400, "Missing required field: email");
    }

    #[test]
    fn a_duplicate_email_in_any_case_gives_409_and_stores_nothing() {
        let store = FakeStore::new();
        send(
            &store,
            "POST",
            "/api/users",
            Some(r#"{"name":"A","email":"a@x.io"}"#),
        );
        let response = send(
            &store,
            "POST",
            "/api/users",
            Some(r#"{"name":"B","email":"A@X.IO"}"#),
        );
        assert_error(&response, 409, "A user with this email already exists");
        assert_eq!(store.list().len(), 1);
    }

    #[test]
    fn a_full_store_gives_503() {
        let store = FakeStore {
            users: RefCell::default(),
            capacity: 0,
        };
        let response = send(
            &store,
            "POST",
            "/api/users",
            Some(r#"{"name":"A","email":"a@x.io"}"#),
        );
        assert_error(&response, 503, "User store is full");
    }

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
                &handle(&request, &store, &clock()),
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
        assert_eq!(handle(&with_charset, &store, &clock()).status, 200);
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
        assert_eq!(
            handle(&request("PUT", "/nope", None), &store, &clock()).status,
            404
        );
        assert_eq!(
            handle(&request("PUT", "/api/compute", None), &store, &clock()).status,
            405
        );
        assert_eq!(
            handle(
                &request("POST", "/api/compute", Some("text/plain")),
                &store,
                &clock()
            )
            .status,
            415
        );
        assert_eq!(
            handle(
                &request("POST", "/api/compute", Some("application/json")),
                &store,
                &clock()
            )
            .status,
            400
        );
    }

    #[test]
    fn an_invalid_body_stores_nothing() {
        let store = FakeStore::new();
        send(
            &store,
            "POST",
            "/api/users",
            Some(r#"{"name":"A","email":"bad"}"#),
        );
        send(
            &store,
            "POST",
            "/api/users",
            Some(r#"{"name":"","email":"a@x.io"}"#),
        );
        assert!(store.list().is_empty());
    }
}
