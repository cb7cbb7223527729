//! Test support: starts the real `host` binary on an ephemeral port and talks to it over HTTP.

#![allow(dead_code)] // Each test file uses its own part of this module.

pub mod jaeger;
pub mod lists;
pub mod otlp;
pub mod postgres;
pub mod prometheus;
pub mod swaps;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Runs `command` (its host variables cleared) to its exit, killing it after `limit`: a host
/// that should refuse to start but starts must fail the test, not hang it.
pub fn run_to_exit(mut command: Command, limit: Duration) -> std::process::Output {
    // Every variable the host reads is cleared, unless the test set it: the machine's
    // environment cannot change what a test sees.
    for var in host::config::variables() {
        if command.get_envs().all(|(name, _)| name != var.as_str()) {
            command.env_remove(var);
        }
    }
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// How long a host may take to start before the test fails.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The user store a test's host runs on.
#[derive(Debug, Clone)]
pub enum Store {
    /// The default in-memory store.
    Memory,
    /// A database of this test's own on the shared test PostgreSQL; its URL.
    Postgres(String),
}

impl Store {
    /// A fresh, empty PostgreSQL database (see [`postgres::Server::shared`]).
    pub fn postgres() -> Store {
        Store::Postgres(postgres::Server::shared().create_database())
    }

    /// The environment that points a host at this store.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        match self {
            Store::Memory => vec![],
            Store::Postgres(url) => vec![("USER_STORE", url.clone())],
        }
    }
}

/// Runs each listed test function (an `async fn(Store)`) once per store, as
/// `memory::<name>` and `postgres::<name>`: one suite, both stores.
#[allow(unused_macros)] // Only the files whose tests run on both stores use it.
macro_rules! on_every_store {
    ($($test:ident),+ $(,)?) => {
        mod memory {
            $(
                #[tokio::test]
                async fn $test() {
                    super::$test(super::support::Store::Memory).await;
                }
            )+
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $test() {
                    super::$test(super::support::Store::postgres()).await;
                }
            )+
        }
    };
}

/// The path of a guest component built by `make build` (`guest`, or a fixture's crate name).
pub fn guest_path(crate_name: &str) -> PathBuf {
    let path = host::runtime::built::built_component(crate_name);
    assert!(
        path.exists(),
        "{} is missing: run `make build` first",
        path.display()
    );
    path
}

/// The host serving `fixtures/hostile-guest`, with extra environment variables.
pub fn hostile_host(env: &[(&str, &str)]) -> Host {
    Host::builder().guest("hostile-guest").env(env).start()
}

/// `GET path`: the status and the JSON body (`null` when the body is not JSON).
pub async fn get(host: &Host, path: &str) -> (u16, serde_json::Value) {
    let response = client().get(host.url(path)).send().await.unwrap();
    let status = response.status().as_u16();
    (
        status,
        response.json().await.unwrap_or(serde_json::Value::Null),
    )
}

/// `GET path` with `x-request-id: request_id`, so the request's spans and lines can be found.
pub async fn get_with_id(host: &Host, path: &str, request_id: &str) -> reqwest::Response {
    client()
        .get(host.url(path))
        .header("x-request-id", request_id)
        .send()
        .await
        .unwrap()
}

/// A running host process, killed when dropped.
pub struct Host {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base_url: String,
    /// Every line the host has written to stdout so far.
    pub stdout: Arc<Mutex<Vec<String>>>,
    /// The log file the host appends to (unless the test set `LOG_FILE` itself).
    pub log_file: PathBuf,
}

/// How to start a host process: the real guest with default settings, on a port it picks,
/// unless told otherwise. The one way the tests start a host.
#[must_use = "nothing starts until `start`"]
pub struct HostBuilder {
    guest: PathBuf,
    env: Vec<(String, String)>,
    flags: Vec<String>,
    port: u16,
    cgroup_procs: Option<PathBuf>,
}

impl HostBuilder {
    /// Serves the fixture (or `guest`) of this crate name, as `make build` left it.
    pub fn guest(self, crate_name: &str) -> HostBuilder {
        self.guest_at(&guest_path(crate_name))
    }

    /// Serves the component at `path`.
    pub fn guest_at(mut self, path: &Path) -> HostBuilder {
        self.guest = path.to_path_buf();
        self
    }

    /// Adds environment variables; later ones win.
    pub fn env(mut self, env: &[(&str, &str)]) -> HostBuilder {
        let env = env
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()));
        self.env.extend(env);
        self
    }

    /// Adds command-line flags (after the ones every test host gets).
    pub fn flags(mut self, flags: &[&str]) -> HostBuilder {
        self.flags.extend(flags.iter().map(|flag| flag.to_string()));
        self
    }

    /// Keeps users in `store`.
    pub fn store(mut self, store: &Store) -> HostBuilder {
        let store_env = store
            .env()
            .into_iter()
            .map(|(name, value)| (name.to_string(), value));
        self.env.splice(0..0, store_env);
        self
    }

    /// Listens on a port picked here, and is ready once it accepts connections: for runs
    /// whose log level hides the start-up line, which otherwise tells the port.
    pub fn free_port(mut self) -> HostBuilder {
        self.port = free_port();
        self
    }

    /// Runs in the cgroup whose process list is `cgroup_procs` from its first instruction on,
    /// so all its memory is charged there.
    pub fn in_cgroup(mut self, cgroup_procs: &Path) -> HostBuilder {
        self.cgroup_procs = Some(cgroup_procs.to_path_buf());
        self
    }

    /// Starts the host; returns once it listens.
    pub fn start(self) -> Host {
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
            .collect();
        let flags = self.flags;
        let Some(cgroup_procs) = self.cgroup_procs else {
            return Host::spawn_with(&self.guest, self.port, &env, |command| {
                command.args(flags);
            });
        };
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::process::CommandExt;
        let procs = std::ffi::CString::new(cgroup_procs.as_os_str().as_bytes()).unwrap();
        Host::spawn_with(&self.guest, self.port, &env, move |command| {
            command.args(flags);
            // SAFETY: between fork and exec only async-signal-safe calls, no allocation.
            unsafe {
                command.pre_exec(move || {
                    let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    // "0" names the writing process itself.
                    let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                    libc::close(fd);
                    if written != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        })
    }
}

impl Host {
    /// A host to start: the real guest with default settings unless told otherwise.
    pub fn builder() -> HostBuilder {
        HostBuilder {
            guest: guest_path("guest"),
            env: Vec::new(),
            flags: Vec::new(),
            port: 0,
            cgroup_procs: None,
        }
    }

    fn spawn_with(
        guest: &Path,
        port: u16,
        env: &[(&str, &str)],
        prepare: impl FnOnce(&mut Command),
    ) -> Host {
        let mut command = Command::new(env!("CARGO_BIN_EXE_host"));
        for var in host::config::variables() {
            command.env_remove(var);
        }
        let log_dir = tempdir();
        command
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--guest",
            ])
            .arg(guest)
            .env("LOG_FILE", log_dir.join("app.log"))
            // No agent listens here unless a test sets its own port.
            .env("OTEL_EXPORTER_JAEGER_AGENT_HOST", "127.0.0.1")
            .env("OTEL_EXPORTER_JAEGER_AGENT_PORT", "9")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        prepare(&mut command);
        let mut child = command.spawn().expect("the host binary starts");

        // Read stdout on a thread for the whole run: a full pipe would block the host's logging.
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let (address_tx, address_rx) = mpsc::channel();
        let reader = BufReader::new(child.stdout.take().unwrap());
        let lines = Arc::clone(&stdout);
        std::thread::spawn(move || {
            let mut address_tx = Some(address_tx);
            for line in reader.lines().map_while(Result::ok) {
                if let Some(address) = listening_address(&line)
                    && let Some(tx) = address_tx.take()
                {
                    let _ = tx.send(address);
                }
                lines.lock().unwrap().push(line);
            }
        });
        let address = if port != 0 {
            wait_until_accepting(port);
            format!("127.0.0.1:{port}")
        } else {
            match address_rx.recv_timeout(START_TIMEOUT) {
                Ok(address) => address,
                Err(_) => {
                    let _ = child.kill();
                    panic!(
                        "host did not report its address; stdout: {:?}",
                        stdout.lock().unwrap()
                    );
                }
            }
        };
        Host {
            child,
            base_url: format!("http://{address}"),
            stdout,
            log_file: log_dir.join("app.log"),
        }
    }

    /// Every stdout line so far that is a JSON object.
    pub fn log_lines(&self) -> Vec<serde_json::Value> {
        self.stdout
            .lock()
            .unwrap()
            .iter()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    /// The JSON stdout lines so far that satisfy `wanted`.
    pub fn log_lines_where(
        &self,
        wanted: impl Fn(&serde_json::Value) -> bool,
    ) -> Vec<serde_json::Value> {
        self.log_lines()
            .into_iter()
            .filter(|line| wanted(line))
            .collect()
    }

    /// Waits until `count` stdout lines satisfy `wanted`, for 10 s at most, and returns those
    /// there are then (lines reach stdout from the log writer's thread, in batches).
    pub fn wait_for_logs(
        &self,
        count: usize,
        wanted: impl Fn(&serde_json::Value) -> bool,
    ) -> Vec<serde_json::Value> {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let lines = self.log_lines_where(&wanted);
            if lines.len() >= count || std::time::Instant::now() >= deadline {
                return lines;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until some stdout line satisfies `found`, or panics after 10 s.
    pub fn wait_for_log(&self, found: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        self.wait_for_logs(1, found)
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("no such log line in {:#?}", self.log_lines()))
    }

    /// Sends a signal (`HUP`, `TERM`, …) to the host process.
    pub fn signal(&self, name: &str) {
        let sent = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -{name} failed");
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        // A host that never exits fails its test instead of hanging the whole run.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("the host did not exit within 60 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The absolute URL of `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    /// `host:port` of the listener.
    pub fn authority(&self) -> &str {
        self.base_url.trim_start_matches("http://")
    }

    /// Kills the process with SIGKILL (no chance to flush or finish anything) and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The process's resident memory, in bytes.
    pub fn resident_bytes(&self) -> u64 {
        resident_bytes(self.pid()).expect("the host is running")
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The log's temporary directory, made for this host alone: a run leaves no litter.
        if let Some(dir) = self.log_file.parent()
            && dir
                .file_name()
                .is_some_and(|name| name.to_string_lossy().starts_with("host-test-"))
        {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn wait_until_accepting(port: u16) {
    let deadline = std::time::Instant::now() + START_TIMEOUT;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "host never accepted on port {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `ADDR` of a start-up line that says `listening on http://ADDR`.
fn listening_address(line: &str) -> Option<String> {
    let rest = &line[line.find("listening on http://")? + "listening on http://".len()..];
    let end = rest
        .find(|c: char| c == '"' || c.is_whitespace())
        .unwrap_or(rest.len());
    Some(rest[..end].to_string())
}

/// The resident memory (`VmRSS`) of process `pid`, in bytes; `None` once it has exited.
pub fn resident_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// A loopback port that was free a moment ago, for a server a test starts.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A fresh, empty directory under the system temp directory.
pub fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("host-test-{}", uuid_like()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{}-{}-{}",
        std::process::id(),
        nanos,
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// The CPU time, user and system, process `pid` has used, from `/proc` (in the kernel's ticks).
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // After the command's closing parenthesis come field 3 (the state) onwards: utime is field
    // 14, stime field 15.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 1..]
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    ticks as f64 / per_second as f64
}

/// An HTTP client for the tests; no connection reuse surprises, no proxies.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// [`client`] from the loopback address `from`, so the host sees another peer.
pub fn client_from(from: [u8; 4]) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .local_address(std::net::IpAddr::from(from))
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// Creates a user through the API and returns it as the host answered it.
pub async fn create_user(host: &Host, name: &str, email: &str) -> serde_json::Value {
    let body = serde_json::json!({ "name": name, "email": email });
    let response = client()
        .post(host.url("/api/users"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201, "creating {email}");
    response.json().await.unwrap()
}

/// `POST /api/users` on `base_url` through `client` (which may reuse its connections): the status
/// and the body as JSON, whatever the status.
pub async fn create_with(
    client: &reqwest::Client,
    base_url: &str,
    name: &str,
    email: &str,
) -> (u16, serde_json::Value) {
    let response = client
        .post(format!("{base_url}/api/users"))
        .json(&serde_json::json!({ "name": name, "email": email }))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or_default())
}

/// `GET path`, its body parsed as JSON.
pub async fn get_json(host: &Host, path: &str) -> serde_json::Value {
    client()
        .get(host.url(path))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Sends one raw request over a fresh TCP connection and returns everything the host answered
/// until it closed the connection. For requests an HTTP client library would refuse to send.
pub async fn raw_request(authority: &str, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(authority).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}
