//! End-to-end tests of what a newcomer meets first (issue 23): one rule for empty and padded
//! values, errors that name what the user set, `--help` listing every variable, a start-up line
//! saying where spans go and a WARN when they cannot, one ERROR line per failed request, library
//! lines without build paths, and a missing database said plainly.

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::jaeger::Agent;
use support::{Host, Store, get_with_id, guest_path};

/// Runs the host binary with `args` and `env` until it exits (a host that starts is killed
/// after 20 s: failure enough for these tests).
fn run_host(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_host"));
    command
        .args(["--bind", "127.0.0.1", "--port", "0"])
        .args(args)
        .envs(env.iter().copied());
    support::run_to_exit(command, Duration::from_secs(20))
}

/// The JSON lines of request `request_id` at `level`, once the host has written them.
fn lines_of(host: &Host, request_id: &str, level: &str) -> Vec<Value> {
    host.log_lines_where(|line| line["request_id"] == request_id && line["level"] == level)
}

#[test]
fn a_bad_value_from_a_variable_is_named_by_the_variable_not_a_flag() {
    let output = run_host(&[], &[("OTEL_EXPORTER_JAEGER_AGENT_PORT", "abc")]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("OTEL_EXPORTER_JAEGER_AGENT_PORT")
            && !stderr.contains("--jaeger-agent-port"),
        "{stderr}"
    );
    // Typed as a flag, the flag is named.
    let output = run_host(&["--jaeger-agent-port", "abc"], &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--jaeger-agent-port"), "{stderr}");
}

#[test]
fn help_lists_every_variable_the_host_reads() {
    let output = run_host(&["--help"], &[]);
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for variable in host::config::variables() {
        assert!(help.contains(&variable), "--help does not list {variable}");
    }
    for variable in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_COMPRESSION",
        "OTEL_BSP_SCHEDULE_DELAY",
        "OTEL_BSP_MAX_CONCURRENT_EXPORTS",
        "RUST_LOG",
    ] {
        assert!(help.contains(variable), "--help does not list {variable}");
    }
}

#[test]
fn a_percent_that_starts_no_escape_in_the_headers_is_refused_at_start() {
    let output = run_host(
        &[],
        &[
            ("OTEL_TRACES_EXPORTER", "otlp"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=top%ZZsecret"),
        ],
    );
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("OTEL_EXPORTER_OTLP_HEADERS") && !stderr.contains("secret"),
        "{stderr}"
    );
}

#[tokio::test]
async fn padded_and_empty_variables_follow_one_rule_and_spans_still_flow() {
    // A padded port is trimmed (it was refused), an empty host counts as unset (localhost).
    let mut agent = Agent::start();
    let port = format!(" {} ", agent.port);
    let host = Host::builder()
        .env(&[
            ("OTEL_EXPORTER_JAEGER_AGENT_HOST", " 127.0.0.1 "),
            ("OTEL_EXPORTER_JAEGER_AGENT_PORT", &port),
            ("OTEL_TRACES_EXPORTER", " jaeger "),
            ("OTEL_SERVICE_NAME", ""),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ])
        .start();
    assert_eq!(
        get_with_id(&host, "/api/health", "padded").await.status(),
        200
    );
    let spans = agent.wait_for(|spans| {
        spans
            .iter()
            .any(|span| span.str_tag("request_id") == Some("padded"))
    });
    assert!(!spans.is_empty());
    // An empty port counts as unset: the default port, said at start, and no WARN about it.
    let host = Host::builder()
        .env(&[
            ("OTEL_EXPORTER_JAEGER_AGENT_PORT", ""),
            ("OTEL_EXPORTER_JAEGER_AGENT_HOST", ""),
        ])
        .start();
    let started = host.wait_for_log(|line| line["exporter"] == "jaeger");
    assert_eq!(started["endpoint"], "udp://localhost:6831", "{started}");
    assert!(
        host.log_lines_where(|line| line["level"] == "WARN")
            .is_empty(),
        "{:?}",
        host.log_lines()
    );
}

#[tokio::test]
async fn a_flag_wins_over_its_variable_as_far_as_the_exporter() {
    // The variable names a port where no agent listens; the flag names the agent's.
    let mut agent = Agent::start();
    let port = agent.port.to_string();
    let host = Host::builder()
        .env(&[
            ("OTEL_EXPORTER_JAEGER_AGENT_PORT", "9"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ])
        .flags(&["--jaeger-agent-port", &port])
        .start();
    assert_eq!(
        get_with_id(&host, "/api/health", "flag-wins")
            .await
            .status(),
        200
    );
    let spans = agent.wait_for(|spans| {
        spans
            .iter()
            .any(|span| span.str_tag("request_id") == Some("flag-wins"))
    });
    assert!(!spans.is_empty());
}

#[tokio::test]
async fn the_start_up_line_names_the_exporter_and_a_failing_export_is_one_warn_line() {
    let closed = support::free_port();
    let endpoint = format!("http://127.0.0.1:{closed}");
    let host = Host::builder()
        .env(&[
            ("OTEL_TRACES_EXPORTER", "otlp"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "500"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ])
        .start();
    let started = host.wait_for_log(|line| line["exporter"] == "otlp/http");
    assert_eq!(started["endpoint"], format!("{endpoint}/v1/traces"));
    for i in 0..20 {
        assert_eq!(
            get_with_id(&host, "/api/health", &format!("r{i}"))
                .await
                .status(),
            200
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let warning = host.wait_for_log(|line| {
        line["level"] == "WARN"
            && line["message"]
                .as_str()
                .is_some_and(|message| message.starts_with("span export failed"))
    });
    assert!(warning["error"].is_string(), "{warning}");
    let warnings = host.log_lines_where(|line| {
        line["message"]
            .as_str()
            .is_some_and(|message| message.starts_with("span export failed"))
    });
    assert_eq!(warnings.len(), 1, "at most one a minute: {warnings:?}");
}

#[tokio::test]
async fn a_failed_request_writes_one_error_line_with_its_cause() {
    let host = Host::builder()
        .guest("panicking-guest")
        .env(&[("GUEST_PROBE_PATH", "off")])
        .start();
    assert_eq!(
        get_with_id(&host, "/api/health", "trapped").await.status(),
        500
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while lines_of(&host, "trapped", "ERROR").is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let errors = lines_of(&host, "trapped", "ERROR");
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(errors[0]["message"], "request failed");
    assert!(
        errors[0]["error"]
            .as_str()
            .is_some_and(|cause| cause.contains("trap")),
        "{}",
        errors[0]
    );
}

#[tokio::test]
async fn a_request_whose_store_is_down_writes_one_error_line_naming_the_store() {
    let store = Store::postgres();
    let Store::Postgres(url) = &store else {
        unreachable!()
    };
    let host = Host::builder()
        .store(&store)
        .env(&[("STORE_CACHE_MB", "0"), ("REQUEST_TIMEOUT_MS", "4000")])
        .start();
    // The database goes away under the running host: every lookup now fails.
    let name = url.rsplit('/').next().unwrap();
    support::postgres::Server::shared()
        .psql("postgres", &format!("DROP DATABASE {name} WITH (FORCE)"));
    let status = get_with_id(
        &host,
        "/api/users/00000000-0000-4000-8000-000000000000",
        "down",
    )
    .await
    .status();
    assert_eq!(status, 503);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let errors = lines_of(&host, "down", "ERROR");
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0]["error"]
            .as_str()
            .is_some_and(|cause| cause.contains("user store call")),
        "{}",
        errors[0]
    );
}

#[tokio::test]
async fn a_restart_on_an_existing_database_logs_no_library_notice_and_no_build_path() {
    let store = Store::postgres();
    let mut first = Host::builder().store(&store).start();
    first.terminate();
    let second = Host::builder().store(&store).start();
    assert_eq!(
        get_with_id(&second, "/api/health", "again").await.status(),
        200
    );
    for host in [&first, &second] {
        for line in host.log_lines() {
            let object = line.as_object().unwrap();
            assert!(object.keys().all(|key| !key.starts_with("log.")), "{line}");
            assert!(!line.to_string().contains("NOTICE"), "{line}");
        }
    }
}

/// What a host started on the store `url` said before it failed to start, and how long it took.
fn start_failure_on(url: &str) -> (String, Duration) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_host"));
    command
        .args(["--bind", "127.0.0.1", "--port", "0", "--guest"])
        .arg(guest_path("guest"))
        .env("USER_STORE", url);
    let started = Instant::now();
    let output = support::run_to_exit(command, Duration::from_secs(30));
    assert!(!output.status.success(), "the host started on {url}");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (stderr, started.elapsed())
}

#[test]
fn a_database_that_does_not_exist_is_said_plainly_at_start() {
    let url = support::postgres::Server::shared().create_database();
    let (stderr, _) = start_failure_on(&format!("{url}_missing"));
    assert!(
        stderr.contains("does not exist") && stderr.contains("create it first"),
        "{stderr}"
    );
    assert!(!stderr.contains("cannot reach"), "{stderr}");
}

#[test]
fn a_role_the_database_refuses_is_said_at_once_and_not_as_unreachable() {
    let server = support::postgres::Server::shared();
    let url = server.create_database();
    let (scheme, rest) = url.split_once("://").unwrap();
    let with_user = |user: &str| format!("{scheme}://{user}@{}", rest.rsplit('@').next().unwrap());
    // A role that logs in but may not create the tables (PUBLIC may not create in `public`).
    let reader = format!("reader_{}", uuid::Uuid::new_v4().simple());
    server.psql("postgres", &format!("CREATE ROLE {reader} LOGIN"));
    for store in [with_user("nobody_at_all"), with_user(&reader)] {
        let (stderr, took) = start_failure_on(&store);
        assert!(
            stderr.contains("refused this host") && stderr.contains("check the URL's user"),
            "{store}: {stderr}"
        );
        assert!(!stderr.contains("cannot reach"), "{stderr}");
        // At once: not after the 10 s start-up spends waiting for a database that is down.
        assert!(took < Duration::from_secs(8), "{store}");
    }
}

#[tokio::test]
async fn the_hosts_pages_move_or_go_and_two_on_one_path_are_refused_at_start() {
    let host = Host::builder()
        .flags(&["--ready-path", "/ops/ready", "--live-path", "off"])
        .start();
    let status = |path: &'static str| {
        let url = host.url(path);
        async move { support::client().get(url).send().await.unwrap().status() }
    };
    assert_eq!(status("/ops/ready").await, 200);
    // The default paths are the guest's now: it knows neither.
    assert_eq!(status("/readyz").await, 404);
    assert_eq!(status("/livez").await, 404);
    assert_eq!(status("/metrics").await, 200);

    let output = run_host(&["--live-path", "/metrics"], &[("READY_PATH", "/metrics")]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        stderr,
        "error: --metrics-path and --live-path both name /metrics: each of the host's pages needs \
         a path of its own\n"
    );
    let output = run_host(&[], &[("READY_PATH", "/livez")]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with("error: --live-path and READY_PATH both name /livez"),
        "{stderr}"
    );
}
