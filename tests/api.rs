//! End-to-end tests of the API: the real host binary, the real guest component, real HTTP over
//! a socket, on each user store (`memory::*` and `postgres::*`, a real PostgreSQL). Each test
//! starts its own host on an ephemeral port (and its own database), so tests share no users.

#[macro_use]
mod support;

use std::collections::HashSet;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use support::{Host, Store, client, get_json, raw_request};

/// Sends `method path` with an optional JSON body and returns status, headers and parsed body.
async fn send(
    host: &Host,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, reqwest::header::HeaderMap, Value) {
    let mut request = client().request(
        Method::from_bytes(method.as_bytes()).unwrap(),
        host.url(path),
    );
    if let Some(body) = body {
        request = request.json(&body);
    }
    answer(request.send().await.unwrap()).await
}

/// Sends a `POST` with a raw body and, if given, a `Content-Type`.
async fn post_raw(
    host: &Host,
    path: &str,
    content_type: Option<&str>,
    body: impl Into<reqwest::Body>,
) -> (StatusCode, reqwest::header::HeaderMap, Value) {
    let mut request = client().post(host.url(path)).body(body);
    if let Some(content_type) = content_type {
        request = request.header("content-type", content_type);
    }
    answer(request.send().await.unwrap()).await
}

/// Status, headers and the body parsed as JSON (a JSON string of the text if it is not JSON,
/// `null` if empty).
async fn answer(response: reqwest::Response) -> (StatusCode, reqwest::header::HeaderMap, Value) {
    let status = response.status();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    let body = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    };
    (status, headers, body)
}

async fn create(host: &Host, name: &str, email: &str) -> Value {
    let (status, _, user) = send(
        host,
        "POST",
        "/api/users",
        Some(json!({"name": name, "email": email})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{user}");
    user
}

/// Asserts a JSON error response: the status, `application/json`, and exactly `{"error": ...}`.
fn assert_error(
    status: StatusCode,
    headers: &reqwest::header::HeaderMap,
    body: &Value,
    expected: StatusCode,
) {
    assert_eq!(status, expected, "{body}");
    assert_eq!(headers["content-type"], "application/json");
    let object = body
        .as_object()
        .unwrap_or_else(|| panic!("error body is an object: {body}"));
    assert_eq!(object.len(), 1, "{body}");
    assert!(
        object["error"]
            .as_str()
            .is_some_and(|message| !message.is_empty()),
        "{body}"
    );
}

async fn health_answers_200_healthy_with_the_guest_version(store: Store) {
    let host = Host::builder().store(&store).start();
    let (status, headers, body) = send(&host, "GET", "/api/health", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(body, json!({"status": "healthy", "version": "0.1.0"}));
}

async fn the_user_list_starts_empty(store: Store) {
    let host = Host::builder().store(&store).start();
    let (status, _, body) = send(&host, "GET", "/api/users", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!([]));
}

async fn creating_a_user_answers_201_with_exactly_id_name_and_email(store: Store) {
    let host = Host::builder().store(&store).start();
    let user = create(&host, "  Ada Lovelace ", "ada@example.com").await;
    let fields: HashSet<&str> = user
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(fields, HashSet::from(["id", "name", "email"]));
    assert_eq!(user["name"], "Ada Lovelace");
    assert_eq!(user["email"], "ada@example.com");
    let id = uuid::Uuid::parse_str(user["id"].as_str().unwrap()).unwrap();
    assert_eq!(id.get_version_num(), 4);
    assert_eq!(user["id"], id.hyphenated().to_string());
}

async fn users_are_listed_in_creation_order_and_fetched_by_id_in_any_case(store: Store) {
    let host = Host::builder().store(&store).start();
    let users = [
        create(&host, "C", "c@example.com").await,
        create(&host, "A", "a@example.com").await,
        create(&host, "B", "b@example.com").await,
    ];
    let (status, _, listed) = send(&host, "GET", "/api/users", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed, json!(users));

    let id = users[1]["id"].as_str().unwrap();
    for path_id in [id.to_string(), id.to_uppercase()] {
        let (status, _, fetched) = send(&host, "GET", &format!("/api/users/{path_id}"), None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(fetched, users[1]);
    }
}

async fn an_unknown_or_malformed_user_id_is_404_user_not_found(store: Store) {
    let host = Host::builder().store(&store).start();
    create(&host, "A", "a@example.com").await;
    for id in [
        uuid::Uuid::new_v4().to_string(),
        "not-a-uuid".into(),
        "12345".into(),
    ] {
        let (status, headers, body) = send(&host, "GET", &format!("/api/users/{id}"), None).await;
        assert_error(status, &headers, &body, StatusCode::NOT_FOUND);
        assert_eq!(body, json!({"error": "User not found"}));
    }
}

async fn an_invalid_email_is_400_invalid_email_format_and_stores_nothing(store: Store) {
    let host = Host::builder().store(&store).start();
    for email in [
        "invalid-email",
        "a@b",
        "@example.com",
        "a b@example.com",
        "a@@example.com",
    ] {
        let (status, headers, body) = send(
            &host,
            "POST",
            "/api/users",
            Some(json!({"name": "A", "email": email})),
        )
        .await;
        assert_error(status, &headers, &body, StatusCode::BAD_REQUEST);
        assert_eq!(body, json!({"error": "Invalid email format"}), "{email}");
    }
    assert_eq!(send(&host, "GET", "/api/users", None).await.2, json!([]));
}

async fn missing_or_wrongly_typed_user_fields_are_400(store: Store) {
    let host = Host::builder().store(&store).start();
    let bodies = [
        json!({"name": "A"}),
        json!({"email": "a@example.com"}),
        json!({"name": "A", "email": null}),
        json!({"name": 1, "email": "a@example.com"}),
        json!({"name": "A", "email": 5}),
        json!({"name": "   ", "email": "a@example.com"}),
        json!({"name": "x".repeat(201), "email": "a@example.com"}),
        json!({}),
    ];
    for body in bodies {
        let (status, headers, answer) = send(&host, "POST", "/api/users", Some(body.clone())).await;
        assert_error(status, &headers, &answer, StatusCode::BAD_REQUEST);
    }
    assert_eq!(send(&host, "GET", "/api/users", None).await.2, json!([]));
}

async fn unknown_fields_in_a_user_body_are_ignored(store: Store) {
    let host = Host::builder().store(&store).start();
    let (status, _, user) = send(
        &host,
        "POST",
        "/api/users",
        Some(json!({"name": "A", "email": "a@example.com", "id": "mine", "admin": true})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_ne!(user["id"], "mine");
    assert!(user.get("admin").is_none());
}

async fn a_duplicate_email_in_any_case_is_409(store: Store) {
    let host = Host::builder().store(&store).start();
    create(&host, "A", "Ada@Example.com").await;
    let (status, headers, body) = send(
        &host,
        "POST",
        "/api/users",
        Some(json!({"name": "B", "email": "ada@example.COM"})),
    )
    .await;
    assert_error(status, &headers, &body, StatusCode::CONFLICT);
    assert_eq!(
        send(&host, "GET", "/api/users", None)
            .await
            .2
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

async fn a_full_user_store_answers_503(store: Store) {
    let host = Host::builder()
        .store(&store)
        .env(&[("MAX_USERS", "2")])
        .start();
    create(&host, "A", "a@example.com").await;
    create(&host, "B", "b@example.com").await;
    let (status, headers, body) = send(
        &host,
        "POST",
        "/api/users",
        Some(json!({"name": "C", "email": "c@example.com"})),
    )
    .await;
    assert_error(status, &headers, &body, StatusCode::SERVICE_UNAVAILABLE);
}

async fn compute_returns_exact_fibonacci_numbers(store: Store) {
    let host = Host::builder().store(&store).start();
    for (n, expected) in [(0, 0), (1, 1), (10, 55), (20, 6765), (35, 9_227_465)] {
        let (status, _, body) = send(&host, "POST", "/api/compute", Some(json!({"n": n}))).await;
        assert_eq!(status, StatusCode::OK);
        let fields: HashSet<&str> = body
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(fields, HashSet::from(["input", "result", "duration_ms"]));
        assert_eq!(body["input"], n);
        assert_eq!(body["result"], expected);
        assert!(body["duration_ms"].is_u64(), "{body}");
    }
}

async fn compute_refuses_n_out_of_range_or_not_a_json_integer(store: Store) {
    let host = Host::builder().store(&store).start();
    let refused = [
        r#"{"n": 36}"#,
        r#"{"n": 50}"#,
        r#"{"n": 100}"#,
        r#"{"n": -1}"#,
        r#"{"n": 1.5}"#,
        r#"{"n": 10.0}"#,
        r#"{"n": "10"}"#,
        r#"{"n": null}"#,
        r#"{"n": true}"#,
        r#"{}"#,
    ];
    for body in refused {
        let (status, headers, answer) =
            post_raw(&host, "/api/compute", Some("application/json"), body).await;
        assert_error(status, &headers, &answer, StatusCode::BAD_REQUEST);
    }
}

async fn unknown_paths_are_404_with_a_json_error(store: Store) {
    let host = Host::builder().store(&store).start();
    for (method, path) in [
        ("GET", "/"),
        ("GET", "/api/nope"),
        ("POST", "/api/users/"),
        ("GET", "/api/users/a/b"),
    ] {
        let (status, headers, body) = send(&host, method, path, None).await;
        assert_error(status, &headers, &body, StatusCode::NOT_FOUND);
    }
}

async fn a_wrong_method_is_405_with_allow(store: Store) {
    let host = Host::builder().store(&store).start();
    let cases = [
        ("DELETE", "/api/health", "GET, HEAD"),
        ("POST", "/api/health", "GET, HEAD"),
        ("PUT", "/api/users", "GET, HEAD, POST"),
        ("OPTIONS", "/api/users", "GET, HEAD, POST"),
        (
            "DELETE",
            "/api/users/6f1c3c1e-8a1b-4c2d-9e3f-0a1b2c3d4e5f",
            "GET, HEAD",
        ),
        ("GET", "/api/compute", "POST"),
        ("TRACE", "/api/compute", "POST"),
        ("POST", "/metrics", "GET, HEAD"),
        ("POST", "/livez", "GET, HEAD"),
        ("DELETE", "/readyz", "GET, HEAD"),
    ];
    for (method, path, allow) in cases {
        let (status, headers, body) = send(&host, method, path, None).await;
        assert_error(status, &headers, &body, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(headers["allow"], allow, "{method} {path}");
    }
}

async fn head_is_answered_like_get_without_a_body(store: Store) {
    let host = Host::builder().store(&store).start();
    for path in ["/api/health", "/api/users", "/metrics", "/livez", "/readyz"] {
        let response = client().head(host.url(path)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        assert!(response.headers().contains_key("x-request-id"));
        assert!(response.bytes().await.unwrap().is_empty());
    }
}

async fn a_post_without_json_content_type_is_415(store: Store) {
    let host = Host::builder().store(&store).start();
    for content_type in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
    ] {
        let user = r#"{"name":"A","email":"a@example.com"}"#;
        let (status, headers, body) = post_raw(&host, "/api/users", content_type, user).await;
        assert_error(status, &headers, &body, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    }
    let with_charset = post_raw(
        &host,
        "/api/compute",
        Some("application/json; charset=utf-8"),
        r#"{"n": 5}"#,
    )
    .await;
    assert_eq!(with_charset.0, StatusCode::OK);
}

async fn a_body_that_is_not_a_json_object_is_400(store: Store) {
    let host = Host::builder().store(&store).start();
    for body in [
        "{",
        "",
        "[1]",
        "42",
        "\"text\"",
        "null",
        "{\"name\":\"A\",}",
    ] {
        for path in ["/api/users", "/api/compute"] {
            let (status, headers, answer) =
                post_raw(&host, path, Some("application/json"), body).await;
            assert_error(status, &headers, &answer, StatusCode::BAD_REQUEST);
        }
    }
}

async fn a_body_over_the_limit_is_413_before_the_guest_runs(store: Store) {
    let host = Host::builder()
        .store(&store)
        .env(&[("MAX_BODY_BYTES", "1000")])
        .start();
    let oversized = format!(
        r#"{{"name":"{}","email":"a@example.com"}}"#,
        "x".repeat(1000)
    );

    // Declared by Content-Length.
    let (status, headers, body) = post_raw(
        &host,
        "/api/users",
        Some("application/json"),
        oversized.clone(),
    )
    .await;
    assert_error(status, &headers, &body, StatusCode::PAYLOAD_TOO_LARGE);

    // Streamed in chunks, with no declared length.
    let chunked = format!(
        "POST /api/users HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n{:x}\r\n{oversized}\r\n0\r\n\r\n",
        oversized.len()
    );
    let answer = raw_request(host.authority(), chunked.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");

    // A `GET` ignores its body, but one over the limit is refused all the same: the contract
    // puts 413 first, answered by the host before the guest runs.
    let chunked_get = format!(
        "GET /api/health HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n{:x}\r\n{oversized}\r\n0\r\n\r\n",
        oversized.len()
    );
    let answer = raw_request(host.authority(), chunked_get.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");

    // Whatever the path and method: an unknown user, the list, a `HEAD`, an unknown path and a
    // wrong method are all the host's 413.
    for (method, path, status) in [
        ("GET", "/api/users/no-such-user", "413"),
        ("GET", "/api/users", "413"),
        ("HEAD", "/api/health", "413"),
        ("GET", "/api/nope", "413"),
        ("DELETE", "/api/users", "413"),
    ] {
        let declared = format!(
            "{method} {path} HTTP/1.1\r\nhost: t\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{oversized}",
            oversized.len()
        );
        let answer = raw_request(host.authority(), declared.as_bytes()).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{method} {path}: {answer}"
        );
    }

    // Nothing was stored, and a body within the limit still works.
    assert_eq!(send(&host, "GET", "/api/users", None).await.2, json!([]));
    create(&host, "A", "a@example.com").await;
}

async fn the_default_body_limit_is_one_mebibyte(store: Store) {
    let host = Host::builder().store(&store).start();
    let json = Some("application/json");
    let (status, headers, body) =
        post_raw(&host, "/api/compute", json, vec![b' '; 2 * 1024 * 1024]).await;
    assert_error(status, &headers, &body, StatusCode::PAYLOAD_TOO_LARGE);
    let mut within = vec![b' '; 1024 * 1024 - 8];
    within.extend_from_slice(br#"{"n":3}"#);
    assert_eq!(
        post_raw(&host, "/api/compute", json, within).await.0,
        StatusCode::OK
    );
}

async fn checks_run_in_the_contract_order(store: Store) {
    let host = Host::builder()
        .store(&store)
        .env(&[("MAX_BODY_BYTES", "10")])
        .start();
    let big = "x".repeat(100);
    let post = |path: &str, content_type: &'static str, body: String| {
        client()
            .post(host.url(path))
            .header("content-type", content_type)
            .body(body)
            .send()
    };
    // Size (413, the host's, before any routing) before unknown path (404) before wrong method
    // (405) before type (415) before JSON (400).
    for path in ["/nope", "/api/health", "/api/users"] {
        assert_eq!(
            post(path, "text/plain", big.clone())
                .await
                .unwrap()
                .status(),
            StatusCode::PAYLOAD_TOO_LARGE,
            "{path}"
        );
    }
    assert_eq!(
        post("/nope", "text/plain", "{".into())
            .await
            .unwrap()
            .status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        post("/api/health", "text/plain", "{".into())
            .await
            .unwrap()
            .status(),
        StatusCode::METHOD_NOT_ALLOWED
    );
    assert_eq!(
        post("/api/users", "text/plain", "{".into())
            .await
            .unwrap()
            .status(),
        StatusCode::UNSUPPORTED_MEDIA_TYPE
    );
    assert_eq!(
        post("/api/users", "application/json", "{".into())
            .await
            .unwrap()
            .status(),
        StatusCode::BAD_REQUEST
    );
}

async fn every_response_carries_an_x_request_id(store: Store) {
    let host = Host::builder().store(&store).start();
    let requests = [
        ("GET", "/api/health"),
        ("GET", "/api/users"),
        ("GET", "/api/users/nope"),
        ("POST", "/api/users"),
        ("GET", "/metrics"),
        ("GET", "/nope"),
        ("PATCH", "/api/users"),
    ];
    let mut ids = HashSet::new();
    for (method, path) in requests {
        let (_, headers, _) = send(&host, method, path, None).await;
        let id = headers["x-request-id"].to_str().unwrap().to_string();
        assert_eq!(
            uuid::Uuid::parse_str(&id).unwrap().get_version_num(),
            4,
            "{method} {path}"
        );
        ids.insert(id);
    }
    assert_eq!(ids.len(), requests.len(), "each request gets its own id");
}

async fn a_valid_client_request_id_is_kept_and_an_invalid_one_replaced(store: Store) {
    let host = Host::builder().store(&store).start();
    let kept = client()
        .get(host.url("/api/health"))
        .header("x-request-id", "trace-me-42")
        .send()
        .await
        .unwrap();
    assert_eq!(kept.headers()["x-request-id"], "trace-me-42");

    let too_long = "a".repeat(129);
    let replaced = client()
        .get(host.url("/api/health"))
        .header("x-request-id", &too_long)
        .send()
        .await
        .unwrap();
    let id = replaced.headers()["x-request-id"].to_str().unwrap();
    assert!(uuid::Uuid::parse_str(id).is_ok(), "{id}");
}

async fn the_hosts_liveness_and_readiness_pages_answer_200_with_json(store: Store) {
    let host = Host::builder().store(&store).start();
    let (status, headers, body) = send(&host, "GET", "/livez", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(body, json!({"status": "alive"}));
    let (status, headers, body) = send(&host, "GET", "/readyz", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "application/json");
    let kind = match store {
        Store::Memory => "memory",
        Store::Postgres(_) => "postgres",
    };
    let health = get_json(&host, "/api/health").await;
    assert_eq!(
        body,
        json!({"status": "ready", "guest_version": health["version"], "store": kind})
    );
    assert!(headers.contains_key("x-request-id"));
}

async fn metrics_are_prometheus_text_on_the_api_port(store: Store) {
    let host = Host::builder().store(&store).start();
    send(&host, "GET", "/api/health", None).await;
    let response = client().get(host.url("/metrics")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-type"],
        "text/plain; version=0.0.4"
    );
    let text = response.text().await.unwrap();
    assert!(
        text.contains(r#"http_requests_total{method="GET",route="/api/health",status="200"} 1"#),
        "{text}"
    );
    assert!(
        text.contains("http_request_duration_seconds_bucket{"),
        "{text}"
    );
}

async fn two_hundred_concurrent_creations_all_land(store: Store) {
    let host = Host::builder().store(&store).start();
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let url = host.url("/api/users");
            tokio::spawn(async move {
                let response = client()
                    .post(url)
                    .json(&json!({"name": format!("user {i}"), "email": format!("user{i}@example.com")}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status(), StatusCode::CREATED);
                response.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string()
            })
        })
        .collect();
    let mut created = HashSet::new();
    for task in tasks {
        created.insert(task.await.unwrap());
    }
    assert_eq!(created.len(), 200, "ids are unique");
    let listed: Vec<Value> = send(&host, "GET", "/api/users", None)
        .await
        .2
        .as_array()
        .unwrap()
        .clone();
    let listed: HashSet<String> = listed
        .iter()
        .map(|user| user["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(listed, created);
}

async fn a_trapping_guest_gets_500_and_the_host_keeps_serving(store: Store) {
    // It fails its probe as it fails everything: loaded unprobed.
    let mut host = Host::builder()
        .store(&store)
        .guest("panicking-guest")
        .env(&[("GUEST_PROBE_PATH", "off")])
        .start();
    for _ in 0..3 {
        let (status, headers, body) = send(&host, "GET", "/api/health", None).await;
        assert_error(status, &headers, &body, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(body, json!({"error": "Internal server error"}));
        assert!(headers.contains_key("x-request-id"));
    }
    assert!(host.is_running());
    // The host's own endpoint does not need the guest.
    assert_eq!(send(&host, "GET", "/metrics", None).await.0, StatusCode::OK);
}

async fn a_request_without_host_header_is_still_served(store: Store) {
    let host = Host::builder().store(&store).start();
    let answer = raw_request(host.authority(), b"GET /api/health HTTP/1.0\r\n\r\n").await;
    assert!(
        answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200"),
        "{answer}"
    );
    assert!(
        answer.ends_with(r#"{"status":"healthy","version":"0.1.0"}"#),
        "{answer}"
    );
}

#[test]
fn a_missing_guest_is_a_one_line_error_naming_the_path_and_make_build() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_host"))
        .args([
            "--port",
            "0",
            "--bind",
            "127.0.0.1",
            "--guest",
            "/nonexistent/guest.wasm",
        ])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains("/nonexistent/guest.wasm") && lines[0].contains("make build"),
        "{stderr}"
    );
}

#[test]
fn a_file_that_is_not_a_component_is_a_one_line_error() {
    let not_a_component = support::tempdir().join("garbage.wasm");
    std::fs::write(&not_a_component, b"\0asm garbage that is not wasm").unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_host"))
        .args(["--port", "0", "--bind", "127.0.0.1", "--guest"])
        .arg(&not_a_component)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("garbage.wasm") && stderr.contains("make build"),
        "{stderr}"
    );
}

on_every_store! {
    health_answers_200_healthy_with_the_guest_version,
    the_user_list_starts_empty,
    creating_a_user_answers_201_with_exactly_id_name_and_email,
    users_are_listed_in_creation_order_and_fetched_by_id_in_any_case,
    an_unknown_or_malformed_user_id_is_404_user_not_found,
    an_invalid_email_is_400_invalid_email_format_and_stores_nothing,
    missing_or_wrongly_typed_user_fields_are_400,
    unknown_fields_in_a_user_body_are_ignored,
    a_duplicate_email_in_any_case_is_409,
    a_full_user_store_answers_503,
    compute_returns_exact_fibonacci_numbers,
    compute_refuses_n_out_of_range_or_not_a_json_integer,
    unknown_paths_are_404_with_a_json_error,
    a_wrong_method_is_405_with_allow,
    head_is_answered_like_get_without_a_body,
    a_post_without_json_content_type_is_415,
    a_body_that_is_not_a_json_object_is_400,
    a_body_over_the_limit_is_413_before_the_guest_runs,
    the_default_body_limit_is_one_mebibyte,
    checks_run_in_the_contract_order,
    every_response_carries_an_x_request_id,
    a_valid_client_request_id_is_kept_and_an_invalid_one_replaced,
    metrics_are_prometheus_text_on_the_api_port,
    the_hosts_liveness_and_readiness_pages_answer_200_with_json,
    two_hundred_concurrent_creations_all_land,
    a_trapping_guest_gets_500_and_the_host_keeps_serving,
    a_request_without_host_header_is_still_served,
}
