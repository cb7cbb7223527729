//! The users: listed (streamed a page at a time), looked up by id, created.

use alloc::vec;

use crate::api::exchange::{
    LIST_PAGE_SIZE, Ports, Request, json_body, log_rejection, log_store_failure,
};
use crate::error::ApiError;
use crate::ports::{Clock, CreateError, Level, Span, Telemetry, Unavailable, UserStore, Value};
use crate::response::{BodyWriter, Responder, Response, json_headers};
use crate::validation;

/// Streams every user as one JSON array, a page at a time, so memory stays constant however
/// many users there are. The body is byte for byte `serde_json::to_vec` of the whole list.
///
/// A store failure before the head is a 503; after it (a later page), the response is aborted so
/// the client sees a truncated body, never a short list that looks complete. `HEAD` reads only
/// the first page, for the status.
pub(super) fn list_users<S: UserStore, C: Clock, T: Telemetry>(
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
            chunk.extend_from_slice(&serde_json::to_vec(user).expect("a user always serialises"));
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

pub(super) fn get_user<S: UserStore, C: Clock, T: Telemetry>(
    segment: &str,
    ports: &Ports<'_, S, C, T>,
) -> Result<Response, ApiError> {
    // Only a canonical UUID is recorded: the raw segment is client input of any length.
    let id = validation::user_id(segment);
    let id_attribute = ("user.id", Value::from(id.as_deref().unwrap_or("invalid")));
    let _span = ports
        .telemetry
        .span("users.get", core::slice::from_ref(&id_attribute));
    ports.telemetry.log(
        Level::Info,
        "looking up user",
        core::slice::from_ref(&id_attribute),
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

pub(super) fn create_user<S: UserStore, C: Clock, T: Telemetry>(
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

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use crate::api::fakes::*;
    use crate::api::*;

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
            events
                .iter()
                .any(|event| event.starts_with("Warn ") && event.contains("user store unavailable")),
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
}
