//! The Kubernetes files of `deploy/kubernetes` against the host they deploy: every variable they
//! set is one the host's `--help` lists, and every port and path is the host's default as
//! `--help` prints it. `make deploy-check` builds them with `kubectl kustomize`.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// The text of a file under `deploy/kubernetes`.
fn manifest(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/kubernetes")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// The host's long `--help`, its defaults unchanged by this process's environment.
fn help() -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_host"))
        .arg("--help")
        .env_clear()
        .output()
        .unwrap();
    assert!(output.status.success());
    String::from_utf8(output.stdout).unwrap()
}

/// The default `--help` prints for the flag whose variable is `variable`.
fn help_default<'a>(help: &'a str, variable: &str) -> &'a str {
    let mut lines = help.lines().map(str::trim);
    lines
        .find(|line| *line == format!("[env: {variable}=]"))
        .unwrap_or_else(|| panic!("--help lists no {variable}"));
    let line = lines.next().unwrap_or_default();
    line.strip_prefix("[default: ")
        .and_then(|rest| rest.strip_suffix(']'))
        .unwrap_or_else(|| panic!("--help gives {variable} no default: {line:?}"))
}

/// The value of the first `key:` after the line `after:` or `after` (both trimmed; from the
/// start when `after` is empty), in `yaml`.
fn value_after<'a>(yaml: &'a str, after: &str, key: &str) -> &'a str {
    let start = yaml
        .lines()
        .position(|line| {
            after.is_empty() || line.trim() == after || line.trim() == format!("{after}:")
        })
        .unwrap_or_else(|| panic!("no {after}:"));
    yaml.lines()
        .skip(start)
        .find_map(|line| line.trim().strip_prefix(&format!("{key}: ")))
        .unwrap_or_else(|| panic!("no {key}: after {after}:"))
        .trim_matches('"')
}

/// The names of the environment variables a manifest sets (`- name: UPPER_CASE`).
fn variables_set(yaml: &str) -> Vec<&str> {
    yaml.lines()
        .filter_map(|line| line.trim().strip_prefix("- name: "))
        .filter(|name| {
            name.bytes()
                .all(|byte| byte.is_ascii_uppercase() || byte == b'_')
        })
        .collect()
}

#[test]
fn the_probes_and_the_scrape_use_the_hosts_own_pages_at_their_default_paths() {
    let (help, deployment) = (help(), manifest("deployment.yaml"));
    assert_eq!(
        value_after(&deployment, "readinessProbe", "path"),
        help_default(&help, "READY_PATH")
    );
    for probe in ["livenessProbe", "startupProbe"] {
        assert_eq!(
            value_after(&deployment, probe, "path"),
            help_default(&help, "LIVE_PATH"),
            "{probe}"
        );
    }
    assert_eq!(
        value_after(&deployment, "annotations", "prometheus.io/path"),
        help_default(&help, "METRICS_PATH")
    );
}

#[test]
fn the_container_port_the_scrape_and_the_service_agree_with_the_hosts_port() {
    let (help, deployment) = (help(), manifest("deployment.yaml"));
    let port = help_default(&help, "PORT");
    assert_eq!(value_after(&deployment, "ports", "containerPort"), port);
    assert_eq!(value_after(&deployment, "- name: PORT", "value"), port);
    assert_eq!(
        value_after(&deployment, "annotations", "prometheus.io/port"),
        port
    );
    // The Service and every probe reach the container by its port's name.
    let name = value_after(&deployment, "ports", "- name");
    assert_eq!(
        value_after(&manifest("service.yaml"), "ports", "targetPort"),
        name
    );
    let probes: Vec<&str> = deployment
        .split("httpGet:")
        .skip(1)
        .map(|probe| value_after(probe, "", "port"))
        .collect();
    assert_eq!(probes, [name; 3]);
}

#[test]
fn every_variable_the_manifests_set_is_one_the_host_reads() {
    let help = help();
    let deployment = manifest("deployment.yaml");
    let configmap = manifest("configmap.yaml");
    let data = configmap
        .lines()
        .skip_while(|line| *line != "data:")
        .filter(|line| !line.trim_start().starts_with('#'))
        .filter_map(|line| line.strip_prefix("  ")?.split_once(": "))
        .map(|(key, _)| key);
    let mut set: Vec<&str> = variables_set(&deployment).into_iter().chain(data).collect();
    assert!(set.contains(&"OTEL_EXPORTER_OTLP_ENDPOINT"), "{set:?}");
    // A variable only other values refer to (`$(POD_NAME)`) is Kubernetes', not the host's.
    set.retain(|name| !deployment.contains(&format!("$({name})")));
    // The variables the host and its SDK read, every one of them listed by --help (as
    // tests/settings.rs checks).
    let read = host::config::variables();
    for name in set {
        assert!(
            read.iter().any(|variable| variable == name),
            "the host reads no {name}, which the manifests set"
        );
    }
    // The store's URL comes from the Secret, under the variable the host reads it from.
    assert_eq!(
        value_after(&deployment, "secretKeyRef", "key"),
        "DATABASE_URL"
    );
    assert_eq!(
        value_after(&deployment, "secretKeyRef", "name"),
        "tutorial-service-database"
    );
    assert!(help.contains("[env: DATABASE_URL"));
}

#[test]
fn the_pod_outlasts_the_pause_the_drain_and_the_flush_and_its_memory_holds_a_full_guest() {
    let deployment = manifest("deployment.yaml");
    let grace: u64 = value_after(&deployment, "spec", "terminationGracePeriodSeconds")
        .parse()
        .unwrap();
    let pause: u64 = value_after(&deployment, "exec", "command")
        .strip_prefix(r#"["/bin/sleep", ""#)
        .and_then(|rest| rest.strip_suffix(r#""]"#))
        .expect("a pre-stop sleep")
        .parse()
        .unwrap();
    // The pause, the settling reads, the drain, the telemetry's flush and the runtime's last
    // second (main.rs), before Kubernetes kills the pod.
    let needed = Duration::from_secs(pause)
        + host::edge::server::SHUTDOWN_SETTLE
        + host::edge::server::SHUTDOWN_GRACE
        + host::observability::pipeline::FLUSH_DEADLINE
        + Duration::from_secs(1);
    assert!(
        Duration::from_secs(grace) > needed,
        "{grace} s against {needed:?}"
    );
    let mebibytes = |quantity: &str| -> u64 {
        match quantity.split_at(quantity.len() - 2) {
            (number, "Mi") => number.parse().unwrap(),
            (number, "Gi") => number.parse::<u64>().unwrap() << 10,
            _ => panic!("{quantity}: Mi or Gi"),
        }
    };
    let limit = mebibytes(value_after(&deployment, "limits", "memory"));
    // The host sizes itself to the limit: the scheduler must reserve all of it.
    assert_eq!(
        mebibytes(value_after(&deployment, "requests", "memory")),
        limit
    );
    // The host gives its guests half of the limit it reads from the cgroup.
    let guest_memory: u64 = help_default(&help(), "GUEST_MEMORY_MB").parse().unwrap();
    assert!(limit / 2 >= 2 * guest_memory, "{limit} MiB");
}

#[test]
fn the_host_writes_only_to_its_volume_under_a_read_only_root() {
    let deployment = manifest("deployment.yaml");
    assert_eq!(
        value_after(&deployment, "securityContext", "readOnlyRootFilesystem"),
        "true"
    );
    let cache = value_after(&deployment, "volumeMounts", "mountPath");
    assert!(
        value_after(&deployment, "- name: GUEST_CACHE_DIR", "value")
            .starts_with(&format!("{cache}/")),
        "the cache is a directory the host creates inside the volume"
    );
    // Log lines go to stdout; the log file, which only grows, goes nowhere.
    assert_eq!(
        value_after(&deployment, "- name: LOG_FILE", "value"),
        "/dev/null"
    );
}
