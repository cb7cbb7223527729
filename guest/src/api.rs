//! The API: one function from request to response, in the contract's order of checks.

use serde::Serialize;

use crate::error::ApiError;
use crate::fibonacci;
use crate::ports::{Clock, CreateError, Level, Span, Telemetry, Unavailable, UserStore, Value};
use crate::response::{BodyWriter, Responder, Response, json_headers};
use crate::routes::Route;
use crate::validation;

/// Users read from the store per call while a list is streamed: bounds the memory a list takes
/// in the guest and in the host, whatever the number of users.
pub const LIST_PAGE_SIZE: u32 = 256;

/// What the logic needs of an HTTP request.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The method, upper case as sent (methods are case-sensitive).
    pub method: &'a str,
    /// The path, possibly followed by `?query`.
    pub target: &'a str,
    /// The `Content-Type` header, if any.
    pub content_type: Option<&'a str>,
    /// The whole body (the host has already bounded its size); empty unless the request
    /// [`reaches_endpoint`].
    pub body: &'a [u8],
}

/// Whether a request reaches an endpoint (its path is known and allows its method), and so
/// whether its body is read: 404 and 405 are answered without reading it.
pub fn reaches_endpoint(method: &str, target: &str) -> bool {
    Route::from_path(target).is_some_and(|route| route.allows(method))
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

/// Answers a request that reaches an endpoint but whose body could not be read (the client broke
/// it, or it is over the host's limit): 400, under the endpoint's route. The host turns it into
/// a 413 when the body was over its limit.
pub fn unreadable_body(target: &str, telemetry: &impl Telemetry, responder: impl Responder) {
    if let Some(route) = Route::from_path(target) {
        telemetry.set_route(route.template());
    }
    Response::from(ApiError::UnreadableBody).send(responder);
}

/// What the logic reaches outside itself: the user store, a clock and telemetry.
pub struct Ports<'a, S, C, T> {
    /// The host's user store.
    pub store: &'a S,
    /// A monotonic clock.
    pub clock: &'a C,
    /// Spans and log events.
    pub telemetry: &'a T,
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

fn health(telemetry: &impl Telemetry) -> Response {
    #[derive(Serialize)]
    struct Health {
        status: &'static str,
        version: &'static str,
    }
    telemetry.log(
        Level::Info,
        "health check",
        &[("version", crate::VERSION.into())],
    );
    Response::json(
        200,
        &Health {
            status: "healthy",
            version: crate::VERSION,
        },
    )
}

/// Streams every user as one JSON array, a page at a time, so memory stays constant however
/// many users there are. The body is byte for byte `serde_json::to_vec` of the whole list.
///
/// A store failure before the head is a 503; after it (a later page), the response is aborted so
/// the client sees a truncated body, never a short list that looks complete. `HEAD` reads only
/// the first page, for the status.
fn list_users<S: UserStore, C: Clock, T: Telemetry>(
    method: &str,
    ports: &Ports<'_, S, C, T>,
    responder: impl Responder,
) {
    let span = ports.telemetry.span("users.list", &[]);
    let mut page = match ports.store.list_page(None, LIST_PAGE_SIZE) {
        Ok(page) => page,
        Err(Unavailable) => {
            log_store_failure(ports.telemetry, "listing users");
            return Response::from(ApiError::StoreUnavailable).send(responder);
        }
    };
    let mut body = responder.send_head(200, json_headers(), None);
    if method == "HEAD" {
        return body.finish();
    }
    let mut count: usize = 0;
    let mut chunk = vec![b'['];
    loop {
        for user in &page {
            if count > 0 {
                chunk.push(b',');
            }
            serde_json::to_writer(&mut chunk, user).expect("a user always serialises");
            count += 1;
        }
        let last_page = page.len() < LIST_PAGE_SIZE as usize;
        if last_page {
            chunk.push(b']');
        }
        if body.write(&chunk).is_err() {
            return;
        }
        if last_page {
            break;
        }
        chunk.clear();
        let after = page.last().map(|user| user.id.clone());
        page = match ports.store.list_page(after.as_deref(), LIST_PAGE_SIZE) {
            Ok(page) => page,
            Err(Unavailable) => {
                // Dropping `body` unfinished aborts the response.
                return log_store_failure(ports.telemetry, "listing users");
            }
        };
    }
    let count = ("user.count", Value::Integer(count as i64));
    span.set_attribute(count.clone());
    ports.telemetry.log(Level::Info, "listed users", &[count]);
    body.finish();
}

fn get_user<S: UserStore, C: Clock, T: Telemetry>(
    segment: &str,
    ports: &Ports<'_, S, C, T>,
) -> Result<Response, ApiError> {
    // Only a canonical UUID is recorded: the raw segment is client input of any length.
    let id = validation::user_id(segment);
    let id_attribute = ("user.id", Value::from(id.as_deref().unwrap_or("invalid")));
    let _span = ports
        .telemetry
        .span("users.get", std::slice::from_ref(&id_attribute));
    ports.telemetry.log(
        Level::Info,
        "looking up user",
        std::slice::from_ref(&id_attribute),
    );
    // Every lookup asks the store, which counts hits and misses: one that is not a UUID finds
    // nothing there.
    let found = ports
        .store
        .get(id.as_deref().unwrap_or(segment))
        .map_err(|Unavailable| {
            log_store_failure(ports.telemetry, "looking up a user");
            ApiError::StoreUnavailable
        })?;
    match found {
        Some(user) => Ok(Response::json(200, &user)),
        None => {
            ports
                .telemetry
                .log(Level::Warn, "user not found", &[id_attribute]);
            Err(ApiError::UserNotFound)
        }
    }
}

fn create_user<S: UserStore, C: Clock, T: Telemetry>(
    request: &Request<'_>,
    ports: &Ports<'_, S, C, T>,
) -> Result<Response, ApiError> {
    let span = ports.telemetry.span("users.create", &[]);
    let new_user = json_body(request)
        .and_then(|body| validation::new_user(&body))
        .inspect_err(|error| log_rejection(ports.telemetry, "user creation", *error))?;
    let user = ports
        .store
        .create(&new_user.name, &new_user.email)
        .map_err(|error| match error {
            CreateError::DuplicateEmail => ApiError::DuplicateEmail,
            CreateError::StoreFull => ApiError::StoreFull,
            CreateError::Unavailable => {
                log_store_failure(ports.telemetry, "user creation");
                ApiError::StoreUnavailable
            }
        })
        .inspect_err(|error| {
            if *error != ApiError::StoreUnavailable {
                log_rejection(ports.telemetry, "user creation", *error);
            }
        })?;
    let id_attribute = ("user.id", Value::from(user.id.as_str()));
    span.set_attribute(id_attribute.clone());
    ports
        .telemetry
        .log(Level::Info, "user created", &[id_attribute]);
    Ok(Response::json(201, &user))
}

fn compute<S: UserStore, C: Clock, T: Telemetry>(
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
        .span("compute.fibonacci", std::slice::from_ref(&n_attribute));
    ports.telemetry.log(
        Level::Info,
        "compute started",
        std::slice::from_ref(&n_attribute),
    );
    let started = ports.clock.now_nanos();
    let result = fibonacci::naive(std::hint::black_box(n));
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

/// Logs why a request body was refused, at `warn`: the client's mistake, not the service's.
fn log_rejection(telemetry: &impl Telemetry, operation: &str, error: ApiError) {
    let attributes = [
        ("error", Value::from(error.message().as_str())),
        (
            "http.response.status_code",
            Value::Integer(error.status().into()),
        ),
    ];
    telemetry.log(Level::Warn, &format!("{operation} rejected"), &attributes);
}

/// Logs that the store failed, at `error`: the service could not do its job.
fn log_store_failure(telemetry: &impl Telemetry, operation: &str) {
    let message = format!("{operation} failed: user store unavailable");
    telemetry.log(Level::Error, &message, &[]);
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
    use crate::ports::{Attribute, User};

    /// An in-memory store with the host's rules: creation order, case-insensitive e-mails, a cap.
    /// It can be told to fail, from its `n`-th call on.
    struct FakeStore {
        users: RefCell<Vec<User>>,
        capacity: usize,
        calls: Cell<usize>,
        fails_from_call: Cell<usize>,
    }

    impl FakeStore {
        fn new() -> FakeStore {
            FakeStore {
                users: RefCell::default(),
                capacity: usize::MAX,
                calls: Cell::new(0),
                fails_from_call: Cell::new(usize::MAX),
            }
        }

        /// Every user, straight from the store.
        fn all(&self) -> Vec<User> {
            self.users.borrow().clone()
        }

        /// From now on, the `n`-th call (0: the next one) and every later one is `Unavailable`.
        fn fail_from_call(&self, n: usize) {
            self.fails_from_call.set(self.calls.get() + n);
        }

        fn call(&self) -> Result<(), Unavailable> {
            let call = self.calls.get();
            self.calls.set(call + 1);
            if call >= self.fails_from_call.get() {
                Err(Unavailable)
            } else {
                Ok(())
            }
        }
    }

    impl UserStore for FakeStore {
        fn list_page(&self, after: Option<&str>, limit: u32) -> Result<Vec<User>, Unavailable> {
            self.call()?;
            let users = self.users.borrow();
            let start = match after {
                None => 0,
                Some(id) => match users.iter().position(|user| user.id == id) {
                    Some(position) => position + 1,
                    None => users.len(),
                },
            };
            Ok(users[start..]
                .iter()
                .take(limit as usize)
                .cloned()
                .collect())
        }
        fn get(&self, id: &str) -> Result<Option<User>, Unavailable> {
            self.call()?;
            Ok(self
                .users
                .borrow()
                .iter()
                .find(|user| user.id == id)
                .cloned())
        }
        fn create(&self, name: &str, email: &str) -> Result<User, CreateError> {
            self.call()
                .map_err(|Unavailable| CreateError::Unavailable)?;
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

    /// A response collected in memory, and whether its body was finished (not aborted).
    #[derive(Default)]
    struct Collected {
        head: Option<Head>,
        body: Vec<u8>,
        finished: bool,
    }

    /// A response head as sent.
    struct Head {
        status: u16,
        headers: Vec<(&'static str, String)>,
        content_length: Option<usize>,
    }

    struct Collector<'a>(&'a RefCell<Collected>);

    impl<'a> Responder for Collector<'a> {
        type Body = Collector<'a>;
        fn send_head(
            self,
            status: u16,
            headers: Vec<(&'static str, String)>,
            content_length: Option<usize>,
        ) -> Collector<'a> {
            self.0.borrow_mut().head = Some(Head {
                status,
                headers,
                content_length,
            });
            self
        }
    }

    impl BodyWriter for Collector<'_> {
        fn write(&mut self, bytes: &[u8]) -> Result<(), crate::response::ClientGone> {
            self.0.borrow_mut().body.extend_from_slice(bytes);
            Ok(())
        }
        fn finish(self) {
            self.0.borrow_mut().finished = true;
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

    /// Records every span and log event the logic reports, and the routes it names.
    #[derive(Default)]
    struct RecordingTelemetry {
        events: RefCell<Vec<String>>,
        routes: RefCell<Vec<&'static str>>,
    }

    struct RecordedSpan<'a> {
        name: &'static str,
        events: &'a RefCell<Vec<String>>,
    }

    impl<'a> Telemetry for &'a RecordingTelemetry {
        type Span = RecordedSpan<'a>;
        fn span(&self, name: &'static str, attributes: &[Attribute]) -> RecordedSpan<'a> {
            self.events
                .borrow_mut()
                .push(format!("span {name} {attributes:?}"));
            RecordedSpan {
                name,
                events: &self.events,
            }
        }
        fn log(&self, level: Level, message: &str, attributes: &[Attribute]) {
            self.events
                .borrow_mut()
                .push(format!("{level:?} {message} {attributes:?}"));
        }
        fn set_route(&self, template: &'static str) {
            self.routes.borrow_mut().push(template);
        }
    }

    impl Span for RecordedSpan<'_> {
        fn set_attribute(&self, attribute: Attribute) {
            self.events
                .borrow_mut()
                .push(format!("set {} {attribute:?}", self.name));
        }
    }

    impl Drop for RecordedSpan<'_> {
        fn drop(&mut self) {
            self.events.borrow_mut().push(format!("end {}", self.name));
        }
    }

    fn run(request: &Request<'_>, store: &FakeStore) -> Response {
        run_recorded(request, store).0
    }

    /// Runs a request and returns the response with what it reported, one line per event.
    /// Every response here is complete: its body finished, its length declared if it was known.
    fn run_recorded(request: &Request<'_>, store: &FakeStore) -> (Response, Vec<String>) {
        let (collected, events) = run_collected(request, store);
        assert!(collected.finished, "the body was aborted");
        let Head {
            status,
            headers,
            content_length,
        } = collected.head.expect("a head was sent");
        if let Some(length) = content_length {
            assert_eq!(
                length,
                collected.body.len(),
                "declared and sent lengths differ"
            );
        }
        let response = Response {
            status,
            headers,
            body: collected.body,
        };
        (response, events)
    }

    /// Runs a request and returns what reached the responder, finished or not.
    fn run_collected(request: &Request<'_>, store: &FakeStore) -> (Collected, Vec<String>) {
        let telemetry = RecordingTelemetry::default();
        let collected = RefCell::new(Collected::default());
        handle(
            request,
            &Ports {
                store,
                clock: &clock(),
                telemetry: &&telemetry,
            },
            Collector(&collected),
        );
        (collected.into_inner(), telemetry.events.take())
    }

    /// The routes a request names to the host.
    fn routes_named(request: &Request<'_>) -> Vec<&'static str> {
        let telemetry = RecordingTelemetry::default();
        handle(
            request,
            &Ports {
                store: &FakeStore::new(),
                clock: &clock(),
                telemetry: &&telemetry,
            },
            Collector(&RefCell::new(Collected::default())),
        );
        telemetry.routes.take()
    }

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
    fn only_a_request_that_reaches_an_endpoint_has_its_body_read() {
        assert!(reaches_endpoint("POST", "/api/users"));
        assert!(reaches_endpoint("GET", "/api/health?x=1"));
        assert!(!reaches_endpoint("POST", "/api/health"));
        assert!(!reaches_endpoint("POST", "/api/nope"));
    }

    fn post(target: &str, body: &str) -> Request<'static> {
        let (target, body) = (target.to_string().leak(), body.to_string().leak());
        Request {
            method: "POST",
            target,
            content_type: Some("application/json"),
            body: body.as_bytes(),
        }
    }

    fn get(target: &str) -> Request<'static> {
        Request {
            method: "GET",
            target: target.to_string().leak(),
            content_type: None,
            body: b"",
        }
    }

    fn send(store: &FakeStore, method: &str, target: &str, body: Option<&str>) -> Response {
        let request = Request {
            method,
            target,
            content_type: body.map(|_| "application/json"),
            body: body.unwrap_or_default().as_bytes(),
        };
        run(&request, store)
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
        // The list is streamed: its HEAD has the GET's status and headers, and no body.
        let head = send(&store, "HEAD", "/api/users", None);
        let get = send(&store, "GET", "/api/users", None);
        assert_eq!((head.status, &head.headers), (get.status, &get.headers));
        assert!(head.body.is_empty());
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
        assert_eq!(store.all().len(), 1);
    }

    #[test]
    fn a_full_store_gives_503() {
        let store = FakeStore {
            capacity: 0,
            ..FakeStore::new()
        };
        let response = send(
            &store,
            "POST",
            "/api/users",
            Some(r#"{"name":"A","email":"a@x.io"}"#),
        );
        assert_error(&response, 503, "User store is full");
    }

    /// Stores `count` users straight into `store`, skipping the API.
    fn fill(store: &FakeStore, count: usize) {
        for i in 0..count {
            store
                .create(&format!("User {i}"), &format!("u{i}@x.io"))
                .unwrap();
        }
    }

    #[test]
    fn a_list_of_many_pages_is_byte_for_byte_the_whole_array() {
        for count in [
            1,
            LIST_PAGE_SIZE as usize - 1,
            LIST_PAGE_SIZE as usize,
            LIST_PAGE_SIZE as usize + 1,
            3 * LIST_PAGE_SIZE as usize + 7,
        ] {
            let store = FakeStore::new();
            fill(&store, count);
            let response = send(&store, "GET", "/api/users", None);
            assert_eq!(response.status, 200);
            assert_eq!(response.header("content-type"), Some("application/json"));
            assert_eq!(response.body, serde_json::to_vec(&store.all()).unwrap());
        }
    }

    #[test]
    fn a_list_reads_the_store_a_bounded_page_at_a_time() {
        let store = FakeStore::new();
        fill(&store, 2 * LIST_PAGE_SIZE as usize + 1);
        store.calls.set(0);
        send(&store, "GET", "/api/users", None);
        assert_eq!(store.calls.get(), 3);
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
            assert!(
                events.iter().any(|event| event.starts_with("Error ")),
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

    #[test]
    fn a_store_failure_after_the_first_page_aborts_the_list() {
        let store = FakeStore::new();
        fill(&store, LIST_PAGE_SIZE as usize + 1);
        store.fail_from_call(1);
        let (collected, events) = run_collected(&get("/api/users"), &store);
        assert_eq!(collected.head.map(|head| head.status), Some(200));
        assert!(
            !collected.finished,
            "a cut-short list must not look complete"
        );
        assert!(
            serde_json::from_slice::<Value>(&collected.body).is_err(),
            "the partial body is not a valid array"
        );
        assert!(
            events.iter().any(|event| event.starts_with("Error ")),
            "{events:?}"
        );
    }

    #[test]
    fn a_streamed_list_declares_no_length_and_a_complete_answer_does() {
        let store = FakeStore::new();
        let (list, _) = run_collected(&get("/api/users"), &store);
        assert_eq!(list.head.unwrap().content_length, None);
        let (health, _) = run_collected(&get("/api/health"), &store);
        assert_eq!(health.head.unwrap().content_length, Some(health.body.len()));
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
        assert!(store.all().is_empty());
    }

    #[test]
    fn health_logs_one_info_line() {
        let (_, events) = run_recorded(&get("/api/health"), &FakeStore::new());
        assert_eq!(events.len(), 1, "{events:?}");
        assert!(events[0].starts_with("Info health check"), "{events:?}");
    }

    #[test]
    fn listing_reports_a_users_list_span_with_the_count() {
        let store = FakeStore::new();
        run(
            &post("/api/users", r#"{"name":"A","email":"a@x.io"}"#),
            &store,
        );
        let (_, events) = run_recorded(&get("/api/users"), &store);
        assert_eq!(
            events,
            [
                "span users.list []",
                r#"set users.list ("user.count", Integer(1))"#,
                r#"Info listed users [("user.count", Integer(1))]"#,
                "end users.list",
            ]
        );
    }

    #[test]
    fn a_lookup_reports_its_user_id_and_a_miss_at_warn() {
        let store = FakeStore::new();
        let id = "6f1c3c1e-8a1b-4c2d-9e3f-0a1b2c3d4e5f";
        let (_, events) = run_recorded(&get(&format!("/api/users/{}", id.to_uppercase())), &store);
        let attribute = format!(r#"[("user.id", Text("{id}"))]"#);
        assert_eq!(
            events,
            [
                format!("span users.get {attribute}"),
                format!("Info looking up user {attribute}"),
                format!("Warn user not found {attribute}"),
                "end users.get".to_string(),
            ]
        );
    }

    #[test]
    fn a_lookup_with_a_malformed_id_never_reports_the_raw_input() {
        let (_, events) = run_recorded(&get("/api/users/secret-garbage"), &FakeStore::new());
        assert!(
            events.iter().all(|event| !event.contains("secret-garbage")),
            "{events:?}"
        );
        assert!(
            events
                .iter()
                .any(|event| event.starts_with("Warn user not found"))
        );
    }

    #[test]
    fn a_creation_reports_a_users_create_span_with_the_new_id() {
        let (response, events) = run_recorded(
            &post("/api/users", r#"{"name":"A","email":"a@x.io"}"#),
            &FakeStore::new(),
        );
        let id = body(&response)["id"].as_str().unwrap().to_string();
        assert_eq!(
            events,
            [
                "span users.create []".to_string(),
                format!(r#"set users.create ("user.id", Text("{id}"))"#),
                format!(r#"Info user created [("user.id", Text("{id}"))]"#),
                "end users.create".to_string(),
            ]
        );
    }

    #[test]
    fn a_validation_failure_is_logged_at_warn_with_its_message() {
        let (_, events) = run_recorded(
            &post("/api/users", r#"{"name":"A","email":"bad"}"#),
            &FakeStore::new(),
        );
        assert!(
            events
                .iter()
                .any(|event| event.starts_with("Warn user creation rejected")
                    && event.contains("Invalid email format")
                    && event.contains("Integer(400)")),
            "{events:?}"
        );
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
