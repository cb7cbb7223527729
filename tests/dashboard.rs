//! The Grafana dashboard against a real Prometheus: the shipped scrape configuration, pointed at
//! a real host under traffic, and every PromQL expression of `deploy/grafana/dashboards` asked
//! through Prometheus's HTTP API. Needs the `prometheus` binary (Debian's package; `.ci/run`
//! installs it, or set `PROMETHEUS` to its path).

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{Host, client, create_user, free_port, tempdir};

/// The targets of the shipped scrape configuration, replaced by the test host's address.
const SHIPPED_TARGETS: &str = r#"["host.docker.internal:8080"]"#;
/// How long Prometheus gets to scrape enough samples for every `rate(...[1m])`.
const EVALUATION_DEADLINE: Duration = Duration::from_secs(90);

fn workspace_file(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join(relative)
}

/// Every `expr` of every panel of the shipped dashboard, with the panel's title.
fn dashboard_expressions() -> Vec<(String, String)> {
    let path = workspace_file("deploy/grafana/dashboards/tutorial-service.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
        .expect("the dashboard is JSON");
    let mut expressions = Vec::new();
    for panel in dashboard["panels"]
        .as_array()
        .expect("the dashboard has panels")
    {
        let title = panel["title"].as_str().unwrap_or("untitled").to_string();
        for target in panel["targets"]
            .as_array()
            .expect("every panel has targets")
        {
            let expr = target["expr"].as_str().expect("every target has an expr");
            expressions.push((title.clone(), expr.to_string()));
        }
    }
    expressions
}

/// A Prometheus server on loopback, killed when dropped.
struct Prometheus {
    child: Child,
    base_url: String,
}

impl Prometheus {
    /// Starts Prometheus with the shipped `deploy/prometheus.yml`, its targets replaced by
    /// `target` (`127.0.0.1:PORT`).
    fn start_scraping(target: &str) -> Prometheus {
        let shipped = std::fs::read_to_string(workspace_file("deploy/prometheus.yml")).unwrap();
        assert!(
            shipped.contains(SHIPPED_TARGETS),
            "deploy/prometheus.yml no longer lists {SHIPPED_TARGETS}: update this test"
        );
        let dir = tempdir();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            shipped.replace(SHIPPED_TARGETS, &format!(r#"["{target}"]"#)),
        )
        .unwrap();
        let binary = std::env::var("PROMETHEUS").unwrap_or_else(|_| "prometheus".to_string());
        let address = format!("127.0.0.1:{}", free_port());
        let child = Command::new(&binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={address}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| {
                panic!(
                    "cannot start `{binary}` ({error}): install Prometheus \
                     (apt-get install prometheus; .ci/run does) or set PROMETHEUS"
                )
            });
        Prometheus {
            child,
            base_url: format!("http://{address}"),
        }
    }

    /// The result vector of an instant query, or the error Prometheus gave.
    async fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let response = client()
            .get(format!("{}/api/v1/query", self.base_url))
            .query(&[("query", expr)])
            .send()
            .await
            .map_err(|error| error.to_string())?;
        let body: Value = response.json().await.map_err(|error| error.to_string())?;
        if body["status"] != "success" {
            return Err(body.to_string());
        }
        Ok(body["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends the load scenario's mix (every route, successes and errors) until `stop` is set.
async fn keep_traffic_flowing(host: Arc<Host>, stop: Arc<AtomicBool>) {
    let client = client();
    let mut round = 0;
    while !stop.load(Ordering::Relaxed) {
        round += 1;
        let created = create_user(&host, "Dash", &format!("dash-{round}@example.com")).await;
        let id = created["id"].as_str().unwrap();
        for path in [
            "/api/health".to_string(),
            "/api/users".to_string(),
            format!("/api/users/{id}"),
            "/api/users/not-a-uuid".to_string(),
            "/metrics".to_string(),
        ] {
            client.get(host.url(&path)).send().await.unwrap();
        }
        for n in [15, 100] {
            client
                .post(host.url("/api/compute"))
                .json(&json!({ "n": n }))
                .send()
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether an instant-vector sample's value is a finite number (not NaN, as a quantile over no
/// observations would be).
fn is_a_number(sample: &Value) -> bool {
    sample["value"][1]
        .as_str()
        .and_then(|value| value.parse::<f64>().ok())
        .is_some_and(f64::is_finite)
}

#[tokio::test(flavor = "multi_thread")]
async fn every_dashboard_expression_parses_and_returns_data_from_a_real_prometheus() {
    let expressions = dashboard_expressions();
    assert!(
        expressions.len() >= 7,
        "the dashboard lost panels: {expressions:?}"
    );
    let host = Arc::new(Host::builder().start());
    let prometheus = Prometheus::start_scraping(host.authority());
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = tokio::spawn(keep_traffic_flowing(Arc::clone(&host), Arc::clone(&stop)));

    // Rates over [1m] need two samples: poll until every expression has a result, or give up
    // and name the ones that never had one.
    let started = Instant::now();
    let mut missing: Vec<String>;
    loop {
        missing = Vec::new();
        for (title, expr) in &expressions {
            match prometheus.query(expr).await {
                Ok(result) if !result.is_empty() && result.iter().all(is_a_number) => {}
                Ok(result) => missing.push(format!("{title}: `{expr}` returned {result:?}")),
                Err(error) => missing.push(format!("{title}: `{expr}` failed: {error}")),
            }
        }
        if missing.is_empty() || started.elapsed() > EVALUATION_DEADLINE {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    stop.store(true, Ordering::Relaxed);
    traffic.await.unwrap();
    assert!(missing.is_empty(), "{}", missing.join("\n"));

    // The scrape really reached this host and its request counter.
    let up = prometheus
        .query(r#"up{job="tutorial-service"}"#)
        .await
        .unwrap();
    assert_eq!(up.len(), 1, "one target: {up:?}");
    assert_eq!(up[0]["value"][1], "1", "the host is up: {up:?}");
    let requests = prometheus
        .query(r#"sum(http_requests_total{route="/api/compute", status="400"})"#)
        .await
        .unwrap();
    let count: f64 = requests[0]["value"][1].as_str().unwrap().parse().unwrap();
    assert!(
        count >= 1.0,
        "the n=100 computes were counted: {requests:?}"
    );
}
