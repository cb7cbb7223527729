//! The Kubernetes files of `deploy/kubernetes` against the host they deploy: every variable they
//! set is one the host's `--help` lists, and every port and path is the host's default as
//! `--help` prints it. `make deploy-check` builds them with `kubectl kustomize`.

use std::path::Path;
use std::process::Command;

/// The text of a file under `deploy/kubernetes`.
fn manifest(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/kubernetes")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// The host's long `--help`.
fn help() -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_host"))
        .arg("--help")
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

/// The value of the first `key:` after the line `after:` or `after` (both trimmed), in `yaml`.
fn value_after<'a>(yaml: &'a str, after: &str, key: &str) -> &'a str {
    let start = yaml
        .lines()
        .position(|line| line.trim() == after || line.trim() == format!("{after}:"))
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
    // The Service and the probes reach the container by its port's name.
    let name = value_after(&deployment, "ports", "- name");
    assert_eq!(
        value_after(&manifest("service.yaml"), "ports", "targetPort"),
        name
    );
    assert_eq!(value_after(&deployment, "httpGet", "port"), name);
}

#[test]
fn every_variable_the_manifests_set_is_one_the_host_reads() {
    let help = help();
    let deployment = manifest("deployment.yaml");
    let configmap = manifest("configmap.yaml");
    let data = configmap
        .lines()
        .skip_while(|line| *line != "data:")
        .filter_map(|line| line.strip_prefix("  ")?.split_once(": "))
        .map(|(key, _)| key);
    let mut set: Vec<&str> = variables_set(&deployment).into_iter().chain(data).collect();
    assert!(set.contains(&"OTEL_EXPORTER_OTLP_ENDPOINT"), "{set:?}");
    // A variable only other values refer to (`$(POD_NAME)`) is Kubernetes', not the host's.
    set.retain(|name| !deployment.contains(&format!("$({name})")));
    let listed = help.split(|c: char| !(c.is_ascii_uppercase() || c == '_'));
    for name in set {
        assert!(
            listed.clone().any(|word| word == name),
            "--help does not list {name}, which the manifests set"
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
fn the_pod_outlasts_the_hosts_drain_and_its_memory_limit_holds_a_full_guest() {
    let deployment = manifest("deployment.yaml");
    let grace: u64 = value_after(&deployment, "spec", "terminationGracePeriodSeconds")
        .parse()
        .unwrap();
    // The drain, then the telemetry's flush (5 s at most), before Kubernetes kills the pod.
    assert!(
        grace > host::edge::server::SHUTDOWN_GRACE.as_secs() + 5,
        "{grace}"
    );
    let mebibytes = |quantity: &str| -> u64 {
        match quantity.split_at(quantity.len() - 2) {
            (number, "Mi") => number.parse().unwrap(),
            (number, "Gi") => number.parse::<u64>().unwrap() << 10,
            _ => panic!("{quantity}: Mi or Gi"),
        }
    };
    let limit = mebibytes(value_after(&deployment, "limits", "memory"));
    let request = mebibytes(value_after(&deployment, "requests", "memory"));
    assert!(request <= limit);
    // The host gives its guests half of the limit it reads from the cgroup.
    let guest_memory: u64 = help_default(&help(), "GUEST_MEMORY_MB").parse().unwrap();
    assert!(limit / 2 >= 2 * guest_memory, "{limit} MiB");
}
