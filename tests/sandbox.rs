//! End-to-end tests of the sandbox's bounds (issue 22): memory that reaches the next instance
//! only as zeroes even through swap, pools that give a burst's memory back, every instance slot
//! held at once, the host-wide memory budget, quotas checked before a guest's string is read,
//! components that would make the host transcode their strings refused at load, and the real
//! guest linked without the command interfaces `std` would bring.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;
use support::{Host, client, get, hostile_host};

/// A swap file switched on and a memory cgroup of the test's own, both undone when dropped
/// (a panicking test included).
struct SwapLab {
    swap_file: PathBuf,
    swap_on: bool,
    cgroup: PathBuf,
    cgroup_made: bool,
    version: CgroupVersion,
}

#[derive(Clone, Copy)]
enum CgroupVersion {
    /// The v1 memory controller: `memory.force_empty` reclaims everything it can.
    V1,
    /// The unified hierarchy: `memory.reclaim` reclaims what it is asked to.
    V2,
}

impl SwapLab {
    /// Swap and a cgroup, or why they cannot be had here.
    fn set_up() -> Result<SwapLab, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root: swapon and cgroups need it".into());
        }
        let v2_controllers = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers");
        let (version, parent) = if v2_controllers.is_ok_and(|list| list.contains("memory")) {
            (CgroupVersion::V2, PathBuf::from("/sys/fs/cgroup"))
        } else if Path::new("/sys/fs/cgroup/memory/memory.force_empty").exists() {
            (CgroupVersion::V1, PathBuf::from("/sys/fs/cgroup/memory"))
        } else {
            return Err("no memory cgroup controller is mounted".into());
        };
        let name = format!("host-swap-test-{}", std::process::id());
        let mut lab = SwapLab {
            swap_file: support::tempdir().join("swap"),
            swap_on: false,
            cgroup: parent.join(name),
            cgroup_made: false,
            version,
        };
        // A swap file must have no holes: written out, not just sized.
        std::fs::write(&lab.swap_file, vec![0u8; 128 << 20])
            .map_err(|error| format!("writing a swap file: {error}"))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&lab.swap_file, std::fs::Permissions::from_mode(0o600))
            .map_err(|error| format!("chmod of the swap file: {error}"))?;
        run("mkswap", &[lab.swap_file.as_os_str()])?;
        run("swapon", &[lab.swap_file.as_os_str()])?;
        lab.swap_on = true;
        std::fs::create_dir(&lab.cgroup)
            .map_err(|error| format!("creating cgroup {}: {error}", lab.cgroup.display()))?;
        lab.cgroup_made = true;
        Ok(lab)
    }

    fn procs(&self) -> PathBuf {
        self.cgroup.join("cgroup.procs")
    }

    /// Pushes the cgroup's memory out: to swap, then out of the swap cache.
    fn evict(&self) {
        for _ in 0..3 {
            let _ = match self.version {
                CgroupVersion::V1 => std::fs::write(self.cgroup.join("memory.force_empty"), "0"),
                CgroupVersion::V2 => std::fs::write(self.cgroup.join("memory.reclaim"), "4G"),
            };
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for SwapLab {
    fn drop(&mut self) {
        if self.cgroup_made {
            // The host is gone by now; its cgroup empties as the kernel reaps it.
            let deadline = Instant::now() + Duration::from_secs(10);
            while std::fs::remove_dir(&self.cgroup).is_err() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        if self.swap_on
            && let Err(error) = run("swapoff", &[self.swap_file.as_os_str()])
        {
            eprintln!(
                "could not undo swapon of {}: {error}",
                self.swap_file.display()
            );
        }
        let _ = std::fs::remove_file(&self.swap_file);
    }
}

fn run(program: &str, args: &[&std::ffi::OsStr]) -> Result<(), String> {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|error| format!("{program}: {error}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// `VmSwap` of process `pid`, in bytes.
fn swapped_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmSwap:"))
        .map(|value| value.trim().trim_end_matches("kB").trim().parse().unwrap())
        .unwrap_or(0);
    kib * 1024
}

#[tokio::test]
async fn memory_swapped_out_and_evicted_from_the_swap_cache_reaches_the_next_instance_as_zeroes() {
    let lab = match SwapLab::set_up() {
        Ok(lab) => lab,
        Err(reason) => {
            eprintln!("SKIPPED: the swap test cannot run here: {reason}");
            return;
        }
    };
    // One instance at a time, so the next request gets the region the last one used.
    let host = Host::builder()
        .guest("hostile-guest")
        .env(&[
            ("MAX_INSTANCES", "1"),
            ("MAX_STREAMING", "0"),
            ("REQUEST_TIMEOUT_MS", "4000"),
        ])
        .in_cgroup(&lab.procs())
        .start();
    // The instance fills 512 KiB with the secret and computes on until its deadline; meanwhile
    // its pages go to swap and out of the swap cache, as a busy machine would do to them.
    let url = host.url("/secret-hold");
    let holding =
        tokio::spawn(async move { client().get(url).send().await.unwrap().status().as_u16() });
    tokio::time::sleep(Duration::from_millis(500)).await;
    lab.evict();
    let swapped = swapped_bytes(host.pid());
    assert_eq!(
        holding.await.unwrap(),
        503,
        "the holder ends at its deadline"
    );
    let secret_bytes = 512 << 10;
    if swapped < secret_bytes {
        eprintln!(
            "SKIPPED: the kernel swapped out {swapped} bytes of the host, less than the \
             {secret_bytes} bytes of secret; nothing to show"
        );
        return;
    }
    let (status, scanned) = get(&host, "/secret-scan").await;
    assert_eq!(status, 200, "{scanned}");
    assert_eq!(
        scanned,
        json!({"secret_words": 0}),
        "the next instance read the last one's secret back from swap ({swapped} bytes swapped)"
    );
    drop(host);
}

#[tokio::test]
async fn every_instance_slot_held_at_once_then_one_more_request_gets_503_never_500() {
    let host = hostile_host(&[
        ("MAX_INSTANCES", "3"),
        ("MAX_STREAMING", "1"),
        ("REQUEST_TIMEOUT_MS", "3000"),
    ]);
    let looping: Vec<_> = (0..3)
        .map(|_| {
            let url = host.url("/loop");
            tokio::spawn(async move { client().get(url).send().await.unwrap().status().as_u16() })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let more: Vec<_> = (0..6)
        .map(|_| {
            let url = host.url("/secret-fill");
            tokio::spawn(async move { client().get(url).send().await.unwrap().status().as_u16() })
        })
        .collect();
    for request in more {
        let status = request.await.unwrap();
        assert!(status == 503 || status == 200, "got {status}");
    }
    for request in looping {
        assert_eq!(
            request.await.unwrap(),
            503,
            "the loops end at their deadline"
        );
    }
    let samples = support::prometheus::scrape(&host).await;
    let failures: f64 = samples
        .iter()
        .filter(|sample| {
            sample.name == "http_requests_total"
                && sample
                    .labels
                    .get("status")
                    .is_some_and(|status| status == "500")
        })
        .map(|sample| sample.value)
        .sum();
    assert_eq!(failures, 0.0, "a request found the pools empty");
}

#[tokio::test]
async fn a_guest_stopped_by_the_host_wide_memory_budget_gets_503_its_own_limit_500() {
    let host = hostile_host(&[("GUEST_MEMORY_MB", "64"), ("GUEST_MEMORY_BUDGET_MB", "24")]);
    let (status, body) = get(&host, "/hoard").await;
    assert_eq!(
        (status, body),
        (503, json!({"error": "Server busy, try again"}))
    );
    assert_eq!(
        get(&host, "/api/health").await.0,
        200,
        "the budget came back"
    );

    let host = hostile_host(&[("GUEST_MEMORY_MB", "24"), ("GUEST_MEMORY_BUDGET_MB", "256")]);
    let (status, _) = get(&host, "/hoard").await;
    assert_eq!(
        status, 500,
        "a guest over its own limit is the guest's fault"
    );
}

#[tokio::test]
async fn a_burst_of_instances_gives_its_memory_back_once_idle() {
    let mut host = hostile_host(&[("MAX_INSTANCES", "48"), ("REQUEST_TIMEOUT_MS", "1500")]);
    // Start-up's compilation leaves memory that the allocator returns over the first moments,
    // later still on a machine busy with other tests.
    let idle = settled_resident_bytes(&host).await;
    // 48 instances at once, each holding the 512 KiB it filled (and its data and stack) until
    // the deadline; their regions stay resident in the pool for reuse.
    let burst: Vec<_> = (0..48)
        .map(|_| {
            let url = host.url("/secret-hold");
            tokio::spawn(async move { client().get(url).send().await.unwrap().status().as_u16() })
        })
        .collect();
    for request in burst {
        assert_eq!(request.await.unwrap(), 503, "stopped at the deadline");
    }
    let after_burst = host.resident_bytes();
    assert!(
        after_burst > idle + (24 << 20),
        "the burst did not grow the host ({} to {} MiB): nothing to show",
        idle >> 20,
        after_burst >> 20
    );
    // Two trim periods with no request: every region mapped for the burst is unmapped.
    let period = host::runtime::pool::POOL_TRIM_PERIOD;
    wait_until_resident_under(&host, idle, 12 << 20, period * 3 + Duration::from_secs(2)).await;
    assert!(host.is_running());
    assert_eq!(get(&host, "/api/health").await.0, 200);
}

#[tokio::test]
async fn past_the_quotas_a_64_mib_string_is_never_read_and_the_request_ends_in_time() {
    // Room for the guest's own 64 MiB string and its two copies in one attribute.
    let mut host = hostile_host(&[("REQUEST_TIMEOUT_MS", "3000"), ("GUEST_MEMORY_MB", "512")]);
    let idle = host.resident_bytes();
    let started = Instant::now();
    // 2,000 calls of each kind with a 64 MiB string: read each time, they would take seconds.
    let (status, body) = get(&host, "/spent-quota").await;
    assert_eq!(status, 200, "{body} after {:?}", started.elapsed());
    assert!(host.is_running());
    // The guest's own 64 MiB are host memory while it runs; its region is given back after.
    assert!(
        host.resident_bytes() < idle + (32 << 20),
        "resident memory grew from {} to {} MiB",
        idle >> 20,
        host.resident_bytes() >> 20
    );
    let samples = support::prometheus::scrape(&host).await;
    for signal in ["span", "log", "attribute"] {
        let dropped = support::prometheus::value(
            &samples,
            "guest_telemetry_dropped_total",
            &[("signal", signal)],
        );
        assert!(dropped >= 2_000.0, "{signal}: {dropped} dropped");
    }
}

/// A component that imports the host's `users.get` and lowers it with UTF-16 strings.
const UTF16_COMPONENT: &str = r#"(component
    (import "tutorial:service/users@0.2.1" (instance $users
        (export "get" (func (param "id" string) (result (option string))))))
    (alias export $users "get" (func $get))
    (core module $libc
        (memory (export "memory") 1)
        (func (export "realloc") (param i32 i32 i32 i32) (result i32) unreachable))
    (core instance $libc (instantiate $libc))
    (core func (canon lower (func $get) string-encoding=utf16
        (memory $libc "memory") (realloc (func $libc "realloc")))))"#;

#[test]
fn a_guest_that_passes_utf16_strings_to_the_host_is_refused_at_start_with_the_reason() {
    let path = support::tempdir().join("utf16.wasm");
    std::fs::write(&path, wat::parse_str(UTF16_COMPONENT).unwrap()).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_host"));
    command
        .args(["--port", "0", "--bind", "127.0.0.1", "--guest"])
        .arg(&path);
    let output = support::run_to_exit(command, Duration::from_secs(60));
    assert!(!output.status.success(), "the host served it");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("UTF-16") && stderr.contains("only UTF-8"),
        "{stderr}"
    );
}

/// The real guest is `no_std` on wasm32 (guest/src/lib.rs): `std` would bring WASI's command
/// interfaces (environment, exit, the standard streams and terminals), which the guest never
/// calls and the host would link into every per-request instance.
#[test]
fn the_service_guest_imports_nothing_but_http_its_streams_a_clock_and_the_service_interfaces() {
    let bytes = std::fs::read(support::guest_path("guest")).unwrap();
    // The component's own imports: those of its nested components and modules are internal.
    let (mut imports, mut depth) = (Vec::new(), 0);
    for payload in wasmparser::Parser::new(0).parse_all(&bytes) {
        match payload.unwrap() {
            wasmparser::Payload::Version { .. } => depth += 1,
            wasmparser::Payload::End(_) => depth -= 1,
            wasmparser::Payload::ComponentImportSection(section) if depth == 1 => {
                for import in section {
                    imports.push(import.unwrap().name.name.to_string());
                }
            }
            _ => {}
        }
    }
    assert!(
        imports
            .iter()
            .any(|name| name.starts_with("tutorial:service/users@"))
    );
    let allowed = [
        "wasi:http/types@",
        "wasi:io/error@",
        "wasi:io/poll@",
        "wasi:io/streams@",
        "wasi:clocks/monotonic-clock@",
        "tutorial:service/users@",
        "tutorial:service/telemetry@",
    ];
    let others: Vec<_> = imports
        .iter()
        .filter(|name| !allowed.iter().any(|prefix| name.starts_with(prefix)))
        .collect();
    assert!(others.is_empty(), "unexpected imports: {others:?}");
}

/// The real guest's allocator traps when the host refuses it memory, as `std`'s did: the
/// request is the guest's own 500, and no panic is made of it (no "guest panicked" line).
#[tokio::test]
async fn the_real_guest_out_of_its_memory_is_a_500_and_no_panic_line() {
    let host = Host::builder().env(&[("GUEST_MEMORY_MB", "1")]).start();
    let name = "x".repeat(900 * 1024);
    let response = client()
        .post(host.url("/api/users"))
        .header("content-type", "application/json")
        .header("x-request-id", "out-of-memory")
        .body(format!(r#"{{"name":"{name}","email":"a@example.com"}}"#))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 500);
    // The host's line comes after any line of the guest's, from the same writer.
    let ours = |line: &serde_json::Value| line["request_id"] == "out-of-memory";
    host.wait_for_log(|line| ours(line) && line["message"] == "request failed");
    let panics = host.log_lines_where(|line| {
        ours(line)
            && line["message"]
                .as_str()
                .unwrap_or_default()
                .contains("panicked")
    });
    assert!(panics.is_empty(), "{panics:#?}");
}

/// The host's resident bytes once they stopped falling: two reads half a second apart within a
/// MiB of each other, or the last read after ten seconds.
async fn settled_resident_bytes(host: &Host) -> u64 {
    let mut before = host.resident_bytes();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = host.resident_bytes();
        if before.abs_diff(now) < 1 << 20 {
            return now;
        }
        before = now;
    }
    before
}

/// Waits until `host` holds less than `idle` + `above` bytes, failing after `within`.
async fn wait_until_resident_under(host: &Host, idle: u64, above: u64, within: Duration) {
    let deadline = Instant::now() + within;
    while host.resident_bytes() > idle + above {
        assert!(
            Instant::now() < deadline,
            "the host held {} MiB {within:?} after (idle {} MiB)",
            host.resident_bytes() >> 20,
            idle >> 20
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// What a `GET path` with a head of `head_bytes` of extra headers, sent as `request_id`,
/// answered: its status.
async fn hoard(host: &Host, path: &str, request_id: &str, head_bytes: usize) -> u16 {
    let mut request = client()
        .get(host.url(path))
        .header("x-request-id", request_id);
    for i in 0..head_bytes / 1000 {
        request = request.header(format!("x-filler-{i}"), "f".repeat(990));
    }
    request.send().await.unwrap().status().as_u16()
}

#[tokio::test]
async fn guests_hoarding_wasi_http_objects_fail_alone_within_the_budget_and_give_it_back() {
    const BUDGET_MB: u64 = 256;
    let host = hostile_host(&[("GUEST_MEMORY_BUDGET_MB", "256")]);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = host.resident_bytes();
    let host = std::sync::Arc::new(host);
    let kinds = [
        ("/hoard-requests", 0),
        ("/hoard-responses", 0),
        ("/hoard-fields", 0),
        ("/hoard-header-copies", 48_000),
    ];
    let hoarders: Vec<_> = kinds
        .into_iter()
        .map(|(path, head_bytes)| {
            let host = std::sync::Arc::clone(&host);
            tokio::spawn(async move { hoard(&host, path, path, head_bytes).await })
        })
        .collect();
    // Probed from another client while they run, and the host's memory watched.
    let mut peak = 0;
    let mut probes = 0;
    while !hoarders.iter().all(|hoarder| hoarder.is_finished()) {
        let (status, _) = get(&host, "/api/health").await;
        assert_eq!(status, 200, "a health check while the guests hoard");
        probes += 1;
        peak = peak.max(host.resident_bytes());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for ((path, _), hoarder) in kinds.iter().zip(hoarders) {
        let status = hoarder.await.unwrap();
        assert!(matches!(status, 500 | 503), "{path} answered {status}");
        let line = host.wait_for_log(|line| line["request_id"] == *path);
        assert_eq!(line["message"], "request failed");
        let cause = line["error"].as_str().unwrap_or_default();
        assert!(cause.contains("wasi:http"), "{path}: {cause}");
    }
    eprintln!(
        "four hoarders: {probes} health checks, resident {} MiB idle, {} MiB at most",
        idle >> 20,
        peak >> 20
    );
    assert!(probes > 0);
    assert!(
        peak < idle + ((BUDGET_MB + 64) << 20),
        "the host grew from {} MiB to {} MiB",
        idle >> 20,
        peak >> 20
    );
    wait_until_resident_under(&host, idle, 64 << 20, Duration::from_secs(10)).await;

    // More hoarders than the budget has shares for: the budget, not only each one's share,
    // stops them, and the host holds no more than the budget.
    let hoarders: Vec<_> = (0..12)
        .map(|i| {
            let host = std::sync::Arc::clone(&host);
            let id = format!("crowd-{i}");
            tokio::spawn(async move { hoard(&host, "/hoard-requests", &id, 0).await })
        })
        .collect();
    let mut peak = 0;
    while !hoarders.iter().all(|hoarder| hoarder.is_finished()) {
        peak = peak.max(host.resident_bytes());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut statuses = Vec::new();
    for hoarder in hoarders {
        let status = hoarder.await.unwrap();
        assert!(matches!(status, 500 | 503), "{status}");
        statuses.push(status);
    }
    eprintln!(
        "twelve hoarders: {statuses:?}, resident {} MiB at most",
        peak >> 20
    );
    assert!(
        peak < idle + ((BUDGET_MB + 64) << 20),
        "the host grew from {} MiB to {} MiB",
        idle >> 20,
        peak >> 20
    );
    assert_eq!(get(&host, "/api/health").await.0, 200);
}
