//! The guest runtime's settings: which component serves, how it is reloaded and probed, and
//! what its instances may use.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use clap::builder::BoolishValueParser;

use crate::machine::machine_memory;
use crate::runtime::built::{built_component, default_cache_dir};
use crate::runtime::capacity::{BodyBounds, GuestLimits, InstanceReuse};
use crate::runtime::outbound::OutboundRules;
use crate::runtime::probe::ProbePath;

/// How long one request may run inside the guest before its response head.
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 10_000;
/// How long a response's body may stream once its head is out: the largest list the contract
/// allows (1,000,000 users of the longest name and e-mail, about 1.9 GB) to a client reading
/// 4.2 Mbit/s.
pub const DEFAULT_RESPONSE_TIMEOUT_MS: u64 = 3_600_000;
/// How long a response's body may make no progress, on either side.
pub const DEFAULT_RESPONSE_STALL_MS: u64 = 10_000;
/// Linear memory one guest instance may grow to.
pub const DEFAULT_GUEST_MEMORY_MB: u64 = 128;
/// How many guest instances may run at once; more requests wait briefly, then get 503.
pub const DEFAULT_MAX_INSTANCES: u32 = 64;
/// How many instances that have sent their response head may stream its body beyond
/// `--max-instances`: hundreds of clients that read slowly hold these, not the running slots.
pub const DEFAULT_MAX_STREAMING: u32 = 512;
/// Requests one instance serves: one, a fresh instance for every request.
pub const DEFAULT_MAX_INSTANCE_REUSE_COUNT: u32 = 1;
/// Requests one reused instance serves at once: `wasmtime serve`'s default.
pub const DEFAULT_MAX_INSTANCE_CONCURRENT_REUSE_COUNT: u32 = 16;
/// How long a reused instance waits for its next request: `wasmtime serve`'s default.
pub const DEFAULT_IDLE_INSTANCE_TIMEOUT_MS: u64 = 1_000;
/// The path a new guest is probed on unless `--probe-path` says otherwise.
pub const DEFAULT_PROBE_PATH: &str = "/api/health";

/// Which guest serves, and what each of its instances may use.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Guest")]
pub struct GuestSettings {
    /// Guest component to serve (exporting wasi:http/incoming-handler@0.2 or handler@0.3.0;
    /// `make build` produces the default one).
    #[arg(long, env = "GUEST_COMPONENT", default_value_os_t = built_component("guest"))]
    pub guest: PathBuf,

    /// Reload the guest when its file changes.
    #[arg(long, env = "GUEST_WATCH", value_parser = BoolishValueParser::new(), default_value_t = false)]
    pub watch: bool,

    /// Path a new guest must answer 200 to (`GET`) before it serves, at start and on every
    /// reload; `off` loads a guest unprobed (say, one that has no such path).
    #[arg(long, env = "GUEST_PROBE_PATH", default_value = DEFAULT_PROBE_PATH, value_parser = probe_path)]
    pub probe_path: ProbePath,

    /// Destinations a guest may call over plain HTTP, separated by commas: `http://host:port`,
    /// `http://host:*` for any port [default: none; every outgoing request is denied].
    #[arg(long, env = "ALLOW_OUTBOUND", default_value = "", value_parser = OutboundRules::parse,
          hide_default_value = true)]
    pub allow_outbound: OutboundRules,

    /// Directory of compiled guest components, so a guest compiled before loads at once.
    #[arg(long, env = "GUEST_CACHE_DIR", default_value_os_t = default_cache_dir())]
    pub cache_dir: PathBuf,

    /// Deadline for one request inside the guest until its response head, in milliseconds; a
    /// guest past it is stopped and the client gets 503. The body is bounded by the two below.
    #[arg(long, env = "REQUEST_TIMEOUT_MS", default_value_t = DEFAULT_REQUEST_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub request_timeout_ms: u64,

    /// Longest a response's body may stream once its head is out, in milliseconds (the default
    /// is an hour: the largest list the contract allows, about 1.9 GB, to a client reading
    /// 4.2 Mbit/s); past it the guest is stopped and the response cut short.
    #[arg(long, env = "RESPONSE_TIMEOUT_MS", default_value_t = DEFAULT_RESPONSE_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub response_timeout_ms: u64,

    /// Longest a response may make no progress, in milliseconds (100 at least): its guest
    /// writing none of its body, or its client, once the socket is full, taking less than 240
    /// bytes a second; past it the response is cut short (for every response on a connection,
    /// the host's pages too).
    #[arg(long, env = "RESPONSE_STALL_MS", default_value_t = DEFAULT_RESPONSE_STALL_MS,
          value_parser = clap::value_parser!(u64).range(100..))]
    pub response_stall_ms: u64,

    /// Linear memory cap per guest instance, in MiB.
    #[arg(long, env = "GUEST_MEMORY_MB", default_value_t = DEFAULT_GUEST_MEMORY_MB,
          value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub guest_memory_mb: u64,

    /// Memory all guest instances together may take, their linear memory and the objects they
    /// hold on the host's side, in MiB [default: half of the memory this process may use, the
    /// machine's or its cgroup's limit]; past it a guest's `memory.grow` fails and a request
    /// whose instance cannot get memory is answered 503.
    #[arg(long, env = "GUEST_MEMORY_BUDGET_MB",
          value_parser = clap::value_parser!(u64).range(1..=16 << 20))]
    pub guest_memory_budget_mb: Option<u64>,

    /// Most guest instances working towards a response head at once (a reused WASIp3 instance
    /// holds one for its whole life).
    #[arg(long, env = "MAX_INSTANCES", default_value_t = DEFAULT_MAX_INSTANCES,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub max_instances: u32,

    /// Most guest instances, beyond --max-instances, that have sent their response head and
    /// stream the rest of the body (to clients that may read slowly).
    #[arg(long, env = "MAX_STREAMING", default_value_t = DEFAULT_MAX_STREAMING,
          value_parser = clap::value_parser!(u32).range(0..=4096))]
    pub max_streaming: u32,

    /// Requests one guest instance serves before it is dropped; 1 (the default) gives every
    /// request a fresh instance. Above 1, requests sharing an instance share its memory: see
    /// docs/guests.md.
    #[arg(long, env = "MAX_INSTANCE_REUSE_COUNT", default_value_t = DEFAULT_MAX_INSTANCE_REUSE_COUNT,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_instance_reuse_count: u32,

    /// Requests one reused WASIp3 instance serves at once (a WASIp2 instance serves one).
    #[arg(long, env = "MAX_INSTANCE_CONCURRENT_REUSE_COUNT",
          default_value_t = DEFAULT_MAX_INSTANCE_CONCURRENT_REUSE_COUNT,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub max_instance_concurrent_reuse_count: u32,

    /// How long a reused instance waits for another request before it is dropped, in
    /// milliseconds.
    #[arg(long, env = "IDLE_INSTANCE_TIMEOUT_MS", default_value_t = DEFAULT_IDLE_INSTANCE_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub idle_instance_timeout_ms: u64,
}

impl GuestSettings {
    /// The deadline of one request inside the guest.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }

    /// How long a response's body may make no progress, on either side.
    pub fn response_stall(&self) -> Duration {
        Duration::from_millis(self.response_stall_ms)
    }

    /// What one guest instance may use.
    pub fn limits(&self) -> GuestLimits {
        GuestLimits {
            request_timeout: self.request_timeout(),
            body: BodyBounds {
                timeout: Duration::from_millis(self.response_timeout_ms),
                stall: self.response_stall(),
            },
            memory_bytes: mebibytes(self.guest_memory_mb),
            memory_budget_bytes: self
                .guest_memory_budget_mb
                .map_or_else(default_memory_budget, mebibytes),
            max_instances: self.max_instances,
            max_streaming: self.max_streaming,
            reuse: InstanceReuse {
                requests: self.max_instance_reuse_count,
                concurrent: self.max_instance_concurrent_reuse_count,
                idle_timeout: Duration::from_millis(self.idle_instance_timeout_ms),
            },
        }
    }
}

impl Default for GuestLimits {
    /// The limits of a host started without flags or variables.
    fn default() -> Self {
        GuestLimits {
            request_timeout: Duration::from_millis(DEFAULT_REQUEST_TIMEOUT_MS),
            body: BodyBounds {
                timeout: Duration::from_millis(DEFAULT_RESPONSE_TIMEOUT_MS),
                stall: Duration::from_millis(DEFAULT_RESPONSE_STALL_MS),
            },
            memory_bytes: mebibytes(DEFAULT_GUEST_MEMORY_MB),
            memory_budget_bytes: default_memory_budget(),
            max_instances: DEFAULT_MAX_INSTANCES,
            max_streaming: DEFAULT_MAX_STREAMING,
            reuse: InstanceReuse {
                requests: DEFAULT_MAX_INSTANCE_REUSE_COUNT,
                concurrent: DEFAULT_MAX_INSTANCE_CONCURRENT_REUSE_COUNT,
                idle_timeout: Duration::from_millis(DEFAULT_IDLE_INSTANCE_TIMEOUT_MS),
            },
        }
    }
}

/// Half the memory this process may use: guests may use much of it, and never all of it.
fn default_memory_budget() -> usize {
    machine_memory() / 2
}

/// `mb` MiB in bytes, at most what the machine can address.
fn mebibytes(mb: u64) -> usize {
    usize::try_from(mb << 20).unwrap_or(usize::MAX)
}

/// `--probe-path`: `off`, or a path; empty counts as unset (the default).
fn probe_path(value: &str) -> Result<ProbePath, String> {
    if value == "off" {
        return Ok(ProbePath::Off);
    }
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
