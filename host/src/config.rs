//! The host's configuration: flags override environment variables, which override defaults.

use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::BoolishValueParser;
use clap::{CommandFactory, Parser};

use crate::error::Error;
use crate::guest::ProbePath;
use crate::otel_env::{self, BatchSettings, SpanExport};
use crate::user_store::StoreChoice;
use crate::user_store::postgres::PostgresSettings;

/// The port the API listens on unless told otherwise.
pub const DEFAULT_PORT: u16 = 8080;
/// The address the API binds unless told otherwise: every interface.
pub const DEFAULT_BIND: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
/// How long one request may run inside the guest.
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 10_000;
/// The largest request body the host passes to the guest; larger ones get 413.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;
/// Linear memory one guest instance may grow to.
pub const DEFAULT_GUEST_MEMORY_MB: u64 = 128;
/// How many guest instances may run at once; more requests wait briefly, then get 503.
pub const DEFAULT_MAX_INSTANCES: u32 = 64;
/// How many instances that have sent their response head may stream its body beyond
/// `--max-instances`: hundreds of clients that read slowly hold these, not the running slots.
pub const DEFAULT_MAX_STREAMING: u32 = 512;
/// How many users the store holds before creation answers 503.
pub const DEFAULT_MAX_USERS: u64 = 1_000_000;
/// How long a request's body may take to arrive, in milliseconds.
pub const DEFAULT_BODY_TIMEOUT_MS: u64 = 10_000;
/// Where users are kept unless told otherwise: this process's memory.
pub const MEMORY_STORE: &str = "memory";
/// PostgreSQL connections each host keeps at most: about four per core of a two-core machine,
/// where the database shares the cores.
pub const DEFAULT_STORE_POOL_SIZE: usize = 8;
/// How long start-up waits for PostgreSQL to answer before it gives up.
pub const DEFAULT_STORE_CONNECT_TIMEOUT_SECS: u64 = 10;
/// Memory for users already found by id on PostgreSQL, in MiB.
pub const DEFAULT_STORE_CACHE_MB: u64 = 16;
/// The longest one store call may take; shorter when the request deadline is short.
pub const MAX_STORE_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// The service name on every span unless `OTEL_SERVICE_NAME` says otherwise.
pub const DEFAULT_SERVICE_NAME: &str = "tutorial-service";
/// The Jaeger agent's host unless `OTEL_EXPORTER_JAEGER_AGENT_HOST` says otherwise.
pub const DEFAULT_JAEGER_AGENT_HOST: &str = "localhost";
/// The Jaeger agent's UDP port unless `OTEL_EXPORTER_JAEGER_AGENT_PORT` says otherwise.
pub const DEFAULT_JAEGER_AGENT_PORT: u16 = 6831;
/// The path a new guest is probed on unless `--probe-path` says otherwise.
pub const DEFAULT_PROBE_PATH: &str = "/api/health";
/// Where the JSON log lines are appended, relative to the working directory.
pub const DEFAULT_LOG_FILE: &str = "logs/app.log";

/// The variables read from the environment only: the OpenTelemetry SDK's (as every SDK reads
/// them) and the log filter.
const ENVIRONMENT_HELP: &str = "\
Every value, of a flag or a variable, is trimmed; an empty one counts as unset.

Span export, as every OpenTelemetry SDK is configured (environment only):
  OTEL_TRACES_EXPORTER                 jaeger (UDP agent, the default) | otlp | none
  OTEL_SDK_DISABLED                    true: export no spans
  OTEL_EXPORTER_OTLP_ENDPOINT          collector base URL [http://localhost:4318; grpc: :4317]
  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT   full URL for spans (wins over the base URL)
  OTEL_EXPORTER_OTLP_PROTOCOL          http/protobuf (the default) | grpc
  OTEL_EXPORTER_OTLP_TRACES_PROTOCOL   the same, for spans only (wins over the above)
  OTEL_EXPORTER_OTLP_HEADERS           key=value,... sent with every export
  OTEL_EXPORTER_OTLP_TRACES_HEADERS    the same, for spans only (wins over the above)
  OTEL_EXPORTER_OTLP_TIMEOUT           milliseconds per export [10000]
  OTEL_EXPORTER_OTLP_TRACES_TIMEOUT    the same, for spans only (wins over the above)
  OTEL_EXPORTER_OTLP_COMPRESSION       none (the only value this build accepts)
  OTEL_EXPORTER_OTLP_TRACES_COMPRESSION  the same, for spans only
  OTEL_RESOURCE_ATTRIBUTES             key=value,... on every span's resource
  OTEL_BSP_SCHEDULE_DELAY              milliseconds between span batches [5000]
  OTEL_BSP_MAX_QUEUE_SIZE              spans waiting for export at most [2048]
  OTEL_BSP_MAX_EXPORT_BATCH_SIZE       spans per batch [128 to the agent, 512 over OTLP]
  OTEL_BSP_EXPORT_TIMEOUT              milliseconds per export to the agent [5000]
  OTEL_BSP_MAX_CONCURRENT_EXPORTS      exports at once [1]

Logs:
  RUST_LOG                             log filter for the JSON lines [info]";

/// The log filter's variable, read by `tracing-subscriber`.
pub const LOG_FILTER_VARIABLE: &str = "RUST_LOG";

/// Serves the tutorial service's guest component over HTTP.
#[derive(Debug, Clone, Parser)]
#[command(name = "host", version, about, after_help = ENVIRONMENT_HELP)]
pub struct Config {
    /// Guest component to serve (a wasi-http component; `make build` produces the default one).
    #[arg(long, env = "GUEST_COMPONENT", default_value_os_t = default_guest_path())]
    pub guest: PathBuf,

    /// TCP port to listen on (0 picks a free one).
    #[arg(long, env = "PORT", default_value_t = DEFAULT_PORT)]
    pub port: u16,

    /// Address to bind.
    #[arg(long, env = "BIND", default_value_t = DEFAULT_BIND)]
    pub bind: IpAddr,

    /// Reload the guest when its file changes.
    #[arg(long, env = "GUEST_WATCH", value_parser = BoolishValueParser::new(), default_value_t = false)]
    pub watch: bool,

    /// Deadline for one request inside the guest, in milliseconds.
    #[arg(long, env = "REQUEST_TIMEOUT_MS", default_value_t = DEFAULT_REQUEST_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub request_timeout_ms: u64,

    /// Largest accepted request body, in bytes; larger ones get 413.
    #[arg(long, env = "MAX_BODY_BYTES", default_value_t = DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,

    /// How long a request's body may take to arrive once its head has, in milliseconds; a
    /// slower body gets 408.
    #[arg(long, env = "BODY_TIMEOUT_MS", default_value_t = DEFAULT_BODY_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub body_timeout_ms: u64,

    /// Connections served at once [default: the open-file limit, raised to its hard limit, less
    /// 256]; when full, the connection waiting longest for a request head (or stalled in its
    /// body) is closed for a newcomer; only when all are being answered is a newcomer given 503.
    #[arg(long, env = "MAX_CONNECTIONS",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub max_connections: Option<usize>,

    /// Linear memory cap per guest instance, in MiB.
    #[arg(long, env = "GUEST_MEMORY_MB", default_value_t = DEFAULT_GUEST_MEMORY_MB,
          value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub guest_memory_mb: u64,

    /// Linear memory all guest instances together may grow to, in MiB [default: half the
    /// machine's memory]; past it a guest's `memory.grow` fails and a request whose instance
    /// cannot get memory is answered 503.
    #[arg(long, env = "GUEST_MEMORY_BUDGET_MB",
          value_parser = clap::value_parser!(u64).range(1..=16 << 20))]
    pub guest_memory_budget_mb: Option<u64>,

    /// Most guest instances working towards a response head at once.
    #[arg(long, env = "MAX_INSTANCES", default_value_t = DEFAULT_MAX_INSTANCES,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub max_instances: u32,

    /// Most guest instances, beyond --max-instances, that have sent their response head and
    /// stream the rest of the body (to clients that may read slowly).
    #[arg(long, env = "MAX_STREAMING", default_value_t = DEFAULT_MAX_STREAMING,
          value_parser = clap::value_parser!(u32).range(0..=4096))]
    pub max_streaming: u32,

    /// Most users the store holds; creating one more answers 503.
    #[arg(long, env = "MAX_USERS", default_value_t = DEFAULT_MAX_USERS)]
    pub max_users: u64,

    /// Where users are kept: `memory` (this process only) or a PostgreSQL URL,
    /// `postgres://user:password@host:port/database[?sslmode=disable&options=...]`, shared by
    /// every host that names it. When neither this flag nor USER_STORE is set, DATABASE_URL is
    /// used if set; else `memory`.
    #[arg(long, env = "USER_STORE", hide_env_values = true, value_parser = store_setting)]
    pub store: Option<StoreSetting>,

    /// PostgreSQL connections this host keeps open at most.
    #[arg(long, env = "STORE_POOL_SIZE", default_value_t = DEFAULT_STORE_POOL_SIZE,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1000))]
    pub store_pool_size: usize,

    /// MiB of memory for users already found on PostgreSQL, served again without a query (users
    /// never change); 0 asks the database every time.
    #[arg(long, env = "STORE_CACHE_MB", default_value_t = DEFAULT_STORE_CACHE_MB,
          value_parser = clap::value_parser!(u64).range(0..=65536))]
    pub store_cache_mb: u64,

    /// Seconds start-up keeps trying to reach PostgreSQL before it exits with an error.
    #[arg(long, env = "STORE_CONNECT_TIMEOUT_SECS", default_value_t = DEFAULT_STORE_CONNECT_TIMEOUT_SECS,
          value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub store_connect_timeout_secs: u64,

    /// Path a new guest must answer 200 to (`GET`) before it serves, at start and on every
    /// reload; `off` loads a guest unprobed (say, one that has no such path).
    #[arg(long, env = "GUEST_PROBE_PATH", default_value = DEFAULT_PROBE_PATH, value_parser = probe_path)]
    pub probe_path: ProbePath,

    /// Directory of compiled guest components, so a guest compiled before loads at once.
    #[arg(long, env = "GUEST_CACHE_DIR", default_value_os_t = default_cache_dir())]
    pub cache_dir: PathBuf,

    /// Name reported with every span [default: tutorial-service].
    #[arg(long, env = "OTEL_SERVICE_NAME")]
    pub service_name: Option<String>,

    /// Host of the Jaeger agent the spans go to, over UDP [default: localhost].
    #[arg(long, env = "OTEL_EXPORTER_JAEGER_AGENT_HOST")]
    pub jaeger_agent_host: Option<String>,

    /// UDP port of the Jaeger agent [default: 6831].
    #[arg(long, env = "OTEL_EXPORTER_JAEGER_AGENT_PORT", value_parser = optional_port)]
    pub jaeger_agent_port: Option<MaybePort>,

    /// File the JSON log lines are appended to.
    #[arg(long, env = "LOG_FILE", default_value = DEFAULT_LOG_FILE)]
    pub log_file: PathBuf,
}

impl Config {
    /// What one guest instance may use.
    pub fn guest_limits(&self) -> crate::guest::GuestLimits {
        crate::guest::GuestLimits {
            request_timeout: std::time::Duration::from_millis(self.request_timeout_ms),
            memory_bytes: usize::try_from(self.guest_memory_mb << 20).unwrap_or(usize::MAX),
            memory_budget_bytes: self
                .guest_memory_budget_mb
                .map_or_else(default_memory_budget, |mb| {
                    usize::try_from(mb << 20).unwrap_or(usize::MAX)
                }),
            max_instances: self.max_instances,
            max_streaming: self.max_streaming,
        }
    }

    /// The store `--store` (or `USER_STORE`, or `DATABASE_URL`) names. An error never repeats
    /// the setting, which may hold a password.
    pub fn store_choice(&self) -> Result<StoreChoice, Error> {
        let from_database_url = || {
            std::env::var("DATABASE_URL")
                .ok()
                .filter(|url| !url.is_empty())
                .map(StoreSetting)
        };
        let setting = self.store.clone().or_else(from_database_url);
        let setting = setting
            .as_ref()
            .map_or(MEMORY_STORE, |setting| setting.0.as_str());
        if setting == MEMORY_STORE {
            return Ok(StoreChoice::Memory);
        }
        if !(setting.starts_with("postgres://") || setting.starts_with("postgresql://")) {
            return Err(Error::StoreSetting(
                "expected `memory` or a postgres:// URL".to_string(),
            ));
        }
        Ok(StoreChoice::Postgres(Box::new(PostgresSettings {
            config: PostgresSettings::parse_url(setting)?,
            pool_size: self.store_pool_size,
            call_timeout: self.store_call_timeout(),
            connect_wait: Duration::from_secs(self.store_connect_timeout_secs),
            found_users_bytes: usize::try_from(self.store_cache_mb << 20).unwrap_or(usize::MAX),
        })))
    }

    /// The longest one store call may take: half the request deadline, at most
    /// [`MAX_STORE_CALL_TIMEOUT`], so a store that hangs is a 503 well within the deadline.
    pub fn store_call_timeout(&self) -> Duration {
        (Duration::from_millis(self.request_timeout_ms) / 2)
            .clamp(Duration::from_millis(1), MAX_STORE_CALL_TIMEOUT)
    }

    /// What one client may use of the host.
    pub fn client_limits(&self) -> crate::server::ClientLimits {
        crate::server::ClientLimits {
            max_body_bytes: self.max_body_bytes,
            body_timeout: Duration::from_millis(self.body_timeout_ms),
            body_buffer_bytes: (machine_memory() / 8).max(64 << 20),
            max_connections: self
                .max_connections
                .unwrap_or_else(|| crate::connections::default_cap(machine_memory())),
        }
    }

    /// Where spans go, under which name and resource: the flags above, then the OpenTelemetry
    /// SDK's variables ([`crate::otel_env`]). An empty setting counts as unset, as the SDKs
    /// treat their environment variables; the batch processor reads `OTEL_BSP_*` itself.
    pub fn telemetry(&self) -> Result<TelemetrySettings, Error> {
        self.telemetry_from(&|name: &str| std::env::var(name).ok())
    }

    /// [`Config::telemetry`], with the SDK's variables read through `var`.
    pub fn telemetry_from(
        &self,
        var: &impl Fn(&str) -> Option<String>,
    ) -> Result<TelemetrySettings, Error> {
        let text = |setting: &Option<String>, default: &str| {
            setting
                .clone()
                .filter(|value| !value.is_empty())
                .unwrap_or_else(|| default.to_string())
        };
        let jaeger_agent = (
            text(&self.jaeger_agent_host, DEFAULT_JAEGER_AGENT_HOST),
            self.jaeger_agent_port
                .and_then(|MaybePort(port)| port)
                .unwrap_or(DEFAULT_JAEGER_AGENT_PORT),
        );
        let resource_attributes = otel_env::resource_attributes(var)?;
        // `OTEL_SERVICE_NAME` wins over a `service.name` in `OTEL_RESOURCE_ATTRIBUTES`, which
        // wins over the default, as the SDK specification orders them.
        let named_in_attributes = resource_attributes
            .iter()
            .rev()
            .find(|(key, value)| key == "service.name" && !value.is_empty())
            .map(|(_, value)| value.as_str());
        Ok(TelemetrySettings {
            service_name: text(
                &self.service_name,
                named_in_attributes.unwrap_or(DEFAULT_SERVICE_NAME),
            ),
            export: otel_env::span_export(var, jaeger_agent)?,
            batch: otel_env::batch_settings(var)?,
            resource_attributes,
        })
    }

    /// The socket address to listen on.
    pub fn listen_addr(&self) -> SocketAddr {
        SocketAddr::new(self.bind, self.port)
    }
}

/// Every environment variable the host reads: its flags' variables, the OpenTelemetry SDK's and
/// the log filter.
pub fn variables() -> Vec<String> {
    let flags = Config::command();
    let mut names: Vec<String> = flags
        .get_arguments()
        .filter_map(|arg| arg.get_env())
        .filter_map(|name| name.to_str().map(str::to_string))
        .collect();
    names.extend(otel_env::VARIABLES.iter().map(|name| name.to_string()));
    names.push(LOG_FILTER_VARIABLE.to_string());
    names.sort();
    names.dedup();
    names
}

/// Applies the one rule for values to the environment: each variable the host reads is
/// trimmed, and an empty one removed, so it counts as unset for the host and for the exporters,
/// which read some of these variables again themselves.
///
/// # Safety
///
/// Changes the process environment: call it before any other thread runs.
pub unsafe fn normalize_environment() {
    for name in variables() {
        let Some(value) = std::env::var_os(&name) else {
            continue;
        };
        let Some(text) = value.to_str() else {
            continue; // Refused by the checks, which read it as text.
        };
        let trimmed = text.trim();
        // SAFETY: the caller runs this before any other thread exists.
        unsafe {
            if trimmed.is_empty() {
                std::env::remove_var(&name);
            } else if trimmed.len() != text.len() {
                std::env::set_var(&name, trimmed);
            }
        }
    }
}

/// Applies the one rule for values to the command line: a flag's value is trimmed, and a flag
/// whose value is empty is dropped, so it counts as unset (the variable, then the default).
pub fn normalized_args(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let flags = Config::command();
    let takes_value = |name: &str| {
        flags
            .get_arguments()
            .any(|arg| arg.get_long() == Some(name) && arg.get_action().takes_values())
    };
    let mut args = args.into_iter();
    let mut normalized: Vec<OsString> = args.next().into_iter().collect();
    while let Some(arg) = args.next() {
        let Some(flag) = arg.to_str().and_then(|text| text.strip_prefix("--")) else {
            normalized.push(arg);
            continue;
        };
        if let Some((name, value)) = flag.split_once('=') {
            let value = value.trim();
            if !value.is_empty() {
                normalized.push(format!("--{name}={value}").into());
            }
        } else if takes_value(flag) {
            match args.next() {
                Some(value) => match value.to_str().map(str::trim) {
                    Some("") => {}
                    Some(text) => normalized.extend([arg.clone(), text.into()]),
                    None => normalized.extend([arg.clone(), value]),
                },
                None => normalized.push(arg),
            }
        } else {
            normalized.push(arg);
        }
    }
    normalized
}

/// The message for `error` from parsing `args`: clap's own, except that a bad value which came
/// from an environment variable is said to come from that variable (clap names the flag).
pub fn explain(error: clap::Error, args: &[OsString]) -> String {
    use clap::error::{ContextKind, ContextValue};
    let rendered = error.render().to_string();
    let Some(ContextValue::String(flag)) = error.get(ContextKind::InvalidArg) else {
        return rendered;
    };
    let flags = Config::command();
    let Some(arg) = flags.get_arguments().find(|arg| {
        arg.get_long().is_some_and(|long| {
            flag.starts_with(&format!("--{long} ")) || *flag == format!("--{long}")
        })
    }) else {
        return rendered;
    };
    let long = format!("--{}", arg.get_long().unwrap_or_default());
    let typed = args.iter().any(|typed| {
        typed
            .to_str()
            .is_some_and(|typed| typed == long || typed.starts_with(&format!("{long}=")))
    });
    match arg.get_env().and_then(|name| name.to_str()) {
        Some(variable) if !typed && std::env::var_os(variable).is_some() => {
            rendered.replace(&format!("'{flag}'"), variable)
        }
        _ => rendered,
    }
}

/// Where spans go and what describes this process on them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TelemetrySettings {
    /// `service.name` of every span; wins over one in `OTEL_RESOURCE_ATTRIBUTES`.
    pub service_name: String,
    /// The exporter and its destination.
    pub export: SpanExport,
    /// How spans are queued and batched on their way out.
    pub batch: BatchSettings,
    /// `OTEL_RESOURCE_ATTRIBUTES`, on the resource of every span.
    pub resource_attributes: Vec<(String, String)>,
}

/// A port setting: a port, or nothing when the setting is empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaybePort(pub Option<u16>);

fn optional_port(value: &str) -> Result<MaybePort, String> {
    if value.is_empty() {
        return Ok(MaybePort(None));
    }
    match value.parse::<u16>() {
        Ok(port) if port > 0 => Ok(MaybePort(Some(port))),
        _ => Err("expected a port, 1 to 65535".to_string()),
    }
}

fn probe_path(value: &str) -> Result<ProbePath, String> {
    if value == "off" {
        return Ok(ProbePath::Off);
    }
    // Empty counts as unset, as for the telemetry settings.
    let value = if value.is_empty() {
        DEFAULT_PROBE_PATH
    } else {
        value
    };
    if !value.starts_with('/') || value.len() > 1024 {
        return Err("expected `off` or a path starting with `/` (at most 1,024 bytes)".to_string());
    }
    value
        .parse()
        .map(ProbePath::Get)
        .map_err(|error| format!("not a valid path: {error}"))
}

impl Default for crate::guest::GuestLimits {
    /// The limits of a host started without flags.
    fn default() -> Self {
        crate::guest::GuestLimits {
            request_timeout: Duration::from_millis(DEFAULT_REQUEST_TIMEOUT_MS),
            memory_bytes: usize::try_from(DEFAULT_GUEST_MEMORY_MB << 20).unwrap_or(usize::MAX),
            memory_budget_bytes: default_memory_budget(),
            max_instances: DEFAULT_MAX_INSTANCES,
            max_streaming: DEFAULT_MAX_STREAMING,
        }
    }
}

/// The raw `--store` setting. Its `Debug` hides it: a URL may hold a password.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreSetting(String);

impl std::fmt::Debug for StoreSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoreSetting(..)")
    }
}

/// Accepts any text: it is checked by [`Config::store_choice`], whose errors never echo it
/// (clap's would).
fn store_setting(text: &str) -> Result<StoreSetting, std::convert::Infallible> {
    Ok(StoreSetting(text.to_string()))
}

/// Half the memory this process may use: guests may use much of it, and never all of it.
fn default_memory_budget() -> usize {
    machine_memory() / 2
}

/// The memory this process may use: the machine's physical memory, or less where a memory
/// cgroup (a container's limit) says so.
pub fn machine_memory() -> usize {
    // SAFETY: sysconf has no preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let physical = match (usize::try_from(pages), usize::try_from(page)) {
        (Ok(pages), Ok(page)) if pages > 0 => pages.saturating_mul(page),
        _ => usize::MAX,
    };
    physical.min(cgroup_memory_limit().unwrap_or(usize::MAX))
}

/// The memory limit of this process's cgroup, v2 (`memory.max`) or v1
/// (`memory.limit_in_bytes`), if it has one.
fn cgroup_memory_limit() -> Option<usize> {
    let membership = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    membership.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let file = if controllers.is_empty() {
            format!("/sys/fs/cgroup{path}/memory.max")
        } else if controllers.split(',').any(|name| name == "memory") {
            format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")
        } else {
            return None;
        };
        std::fs::read_to_string(file).ok()?.trim().parse().ok()
    })
}

/// `target/guest-cache` under the workspace root this host was built in.
fn default_cache_dir() -> PathBuf {
    workspace_root().join("target/guest-cache")
}

/// The workspace this host was built in.
fn workspace_root() -> &'static std::path::Path {
    let host_crate = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    host_crate.parent().unwrap_or(host_crate)
}

/// Where `make build` leaves the component of the workspace crate `crate_name` (`guest`, or a
/// fixture's): `target/wasm32-wasip2/release/`, under the workspace root this host was built in.
/// A library component is named with underscores, a binary one (a command) as its crate is.
/// The one place the start-up default, the tests and the benchmarks find built guests.
pub fn built_component(crate_name: &str) -> PathBuf {
    let dir = workspace_root().join("target/wasm32-wasip2/release");
    let library = dir.join(format!("{}.wasm", crate_name.replace('-', "_")));
    if library.exists() {
        return library;
    }
    let binary = dir.join(format!("{crate_name}.wasm"));
    if binary.exists() { binary } else { library }
}

/// The real guest, as `make build` leaves it.
fn default_guest_path() -> PathBuf {
    built_component("guest")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_contract() {
        let config = Config::try_parse_from(["host"]).unwrap();
        assert_eq!(config.listen_addr().to_string(), "0.0.0.0:8080");
        assert!(
            config
                .guest
                .ends_with("target/wasm32-wasip2/release/guest.wasm")
        );
        assert_eq!(config.max_body_bytes, 1_048_576);
        assert_eq!(config.request_timeout_ms, 10_000);
        assert_eq!(config.guest_memory_mb, 128);
        assert_eq!(config.log_file, PathBuf::from("logs/app.log"));
        assert!(!config.watch);
    }

    #[test]
    fn the_default_guest_limits_are_those_of_a_host_started_without_flags() {
        let config = Config::try_parse_from(["host"]).unwrap();
        let (flags, default) = (config.guest_limits(), crate::guest::GuestLimits::default());
        assert_eq!(flags.request_timeout, default.request_timeout);
        assert_eq!(flags.memory_bytes, default.memory_bytes);
        assert_eq!(flags.memory_budget_bytes, default.memory_budget_bytes);
        assert_eq!(flags.max_instances, default.max_instances);
        assert_eq!(flags.max_streaming, default.max_streaming);
    }

    #[test]
    fn flags_set_every_value() {
        let config = Config::try_parse_from([
            "host",
            "--guest",
            "g.wasm",
            "--port",
            "9000",
            "--bind",
            "127.0.0.1",
            "--watch",
            "--max-body-bytes",
            "10",
            "--max-users",
            "3",
        ])
        .unwrap();
        assert_eq!(config.guest, PathBuf::from("g.wasm"));
        assert_eq!(config.listen_addr().to_string(), "127.0.0.1:9000");
        assert!(config.watch);
        assert_eq!(config.max_body_bytes, 10);
        assert_eq!(config.max_users, 3);
    }

    #[test]
    fn the_store_is_memory_unless_a_postgres_url_is_given() {
        let memory = Config::try_parse_from(["host", "--store", "memory"]).unwrap();
        assert!(matches!(memory.store_choice(), Ok(StoreChoice::Memory)));
        let url = "postgres://app:hunter2@db:5432/users";
        let postgres =
            Config::try_parse_from(["host", "--store", url, "--store-pool-size", "3"]).unwrap();
        let Ok(StoreChoice::Postgres(settings)) = postgres.store_choice() else {
            panic!("a postgres URL chooses PostgreSQL");
        };
        assert_eq!(settings.pool_size, 3);
        assert!(!format!("{postgres:?} {settings:?}").contains("hunter2"));
    }

    #[test]
    fn a_bad_store_setting_is_an_error_that_does_not_repeat_it() {
        for setting in [
            "memroy",
            "mysql://u:hunter2@db/x",
            "postgres://u:hunter2@db:x/y",
        ] {
            let config = Config::try_parse_from(["host", "--store", setting]).unwrap();
            let error = config.store_choice().err().expect(setting).to_string();
            assert!(!error.contains("hunter2"), "{error}");
        }
    }

    #[test]
    fn telemetry_settings_treat_empty_as_unset_and_refuse_a_bad_port() {
        let empty = ["--service-name", "", "--jaeger-agent-host", ""];
        let config = Config::try_parse_from(
            ["host"]
                .into_iter()
                .chain(empty)
                .chain(["--jaeger-agent-port", ""]),
        )
        .unwrap();
        let no_variables = |_: &str| None;
        assert_eq!(
            config.telemetry_from(&no_variables).unwrap(),
            TelemetrySettings {
                service_name: DEFAULT_SERVICE_NAME.to_string(),
                export: SpanExport::JaegerAgent {
                    host: DEFAULT_JAEGER_AGENT_HOST.to_string(),
                    port: DEFAULT_JAEGER_AGENT_PORT,
                },
                batch: otel_env::batch_settings(&no_variables).unwrap(),
                resource_attributes: Vec::new(),
            }
        );
        let set = Config::try_parse_from([
            "host",
            "--service-name",
            "svc",
            "--jaeger-agent-host",
            "agent",
            "--jaeger-agent-port",
            "7000",
        ])
        .unwrap();
        let settings = set.telemetry_from(&no_variables).unwrap();
        assert_eq!(settings.service_name, "svc");
        assert_eq!(
            settings.export,
            SpanExport::JaegerAgent {
                host: "agent".to_string(),
                port: 7000
            }
        );
        for bad in ["0", "65536", "x"] {
            assert!(Config::try_parse_from(["host", "--jaeger-agent-port", bad]).is_err());
        }
    }

    #[test]
    fn the_probe_path_is_a_path_off_or_when_empty_the_default() {
        let probe = |value: &str| {
            Config::try_parse_from(["host", "--probe-path", value]).map(|config| config.probe_path)
        };
        assert_eq!(probe("off").unwrap(), ProbePath::Off);
        assert_eq!(
            probe("").unwrap(),
            ProbePath::Get(DEFAULT_PROBE_PATH.parse().unwrap())
        );
        assert_eq!(
            probe("/ready?deep=1").unwrap(),
            ProbePath::Get("/ready?deep=1".parse().unwrap())
        );
        assert!(probe("ready").is_err());
    }

    #[test]
    fn store_calls_end_well_within_the_request_deadline() {
        let config = Config::try_parse_from(["host"]).unwrap();
        assert_eq!(config.store_call_timeout(), MAX_STORE_CALL_TIMEOUT);
        let short = Config::try_parse_from(["host", "--request-timeout-ms", "1000"]).unwrap();
        assert_eq!(short.store_call_timeout(), Duration::from_millis(500));
    }

    #[test]
    fn invalid_values_are_refused_before_binding() {
        assert!(Config::try_parse_from(["host", "--port", "70000"]).is_err());
        assert!(Config::try_parse_from(["host", "--bind", "nowhere"]).is_err());
        assert!(Config::try_parse_from(["host", "--request-timeout-ms", "0"]).is_err());
        assert!(Config::try_parse_from(["host", "--store-pool-size", "0"]).is_err());
    }

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    #[test]
    fn a_flags_value_is_trimmed_and_an_empty_one_counts_as_unset() {
        let normalized = normalized_args(args(&[
            "host",
            "--port",
            " 9090 ",
            "--service-name",
            "  ",
            "--bind= 127.0.0.1",
            "--jaeger-agent-port=",
            "--watch",
        ]));
        assert_eq!(
            normalized,
            args(&["host", "--port", "9090", "--bind=127.0.0.1", "--watch"])
        );
        let config = Config::try_parse_from(&normalized).unwrap();
        assert_eq!(config.listen_addr().to_string(), "127.0.0.1:9090");
        assert_eq!(config.service_name, None);
        assert!(config.watch);
    }

    #[test]
    fn a_bad_value_is_named_by_the_flag_typed() {
        let typed = args(&["host", "--jaeger-agent-port", "abc"]);
        let error = Config::try_parse_from(&typed).unwrap_err();
        let message = explain(error, &typed);
        assert!(message.contains("--jaeger-agent-port"), "{message}");
    }

    #[test]
    fn every_variable_the_host_reads_is_listed_by_help() {
        let help = Config::command().render_long_help().to_string();
        for variable in variables() {
            assert!(help.contains(&variable), "--help does not list {variable}");
        }
        for variable in ["OTEL_SERVICE_NAME", "OTEL_BSP_MAX_QUEUE_SIZE", "RUST_LOG"] {
            assert!(
                variables().iter().any(|listed| listed == variable),
                "{variable}"
            );
        }
    }
}
