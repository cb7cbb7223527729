//! The HTTP edge's settings: where the host listens and what one client may use of it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use clap::Args;

use crate::edge::connections::default_cap;
use crate::edge::server::ClientLimits;
use crate::machine::machine_memory;
use crate::observability::routes::{HostPages, HostPath, LIVE_PATH, METRICS_PATH, READY_PATH};

/// The port the API listens on unless told otherwise.
pub const DEFAULT_PORT: u16 = 8080;
/// The address the API binds unless told otherwise: every interface.
pub const DEFAULT_BIND: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
/// The largest request body the host passes to the guest; larger ones get 413.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;
/// How long a request's body may take to arrive, in milliseconds.
pub const DEFAULT_BODY_TIMEOUT_MS: u64 = 10_000;
/// The least memory request bodies may hold host-wide, however small the machine.
const MIN_BODY_BUFFER_BYTES: usize = 64 << 20;

/// Where the host listens, and what one client may use of it.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "HTTP")]
pub struct EdgeSettings {
    /// TCP port to listen on (0 picks a free one).
    #[arg(long, env = "PORT", default_value_t = DEFAULT_PORT)]
    pub port: u16,

    /// Address to bind.
    #[arg(long, env = "BIND", default_value_t = DEFAULT_BIND)]
    pub bind: IpAddr,

    /// Largest accepted request body, in bytes; larger ones get 413.
    #[arg(long, env = "MAX_BODY_BYTES", default_value_t = DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,

    /// How long a request's body may take to arrive once its head has, in milliseconds; a
    /// slower body gets 408.
    #[arg(long, env = "BODY_TIMEOUT_MS", default_value_t = DEFAULT_BODY_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub body_timeout_ms: u64,

    /// Connections served at once [default: the open-file limit, raised to its hard limit, less
    /// 384, and at most what a quarter of this process's memory holds at 64 KiB each]; when
    /// full, the connection waiting longest for a request head (or stalled in its body) is
    /// closed for a newcomer; only when all are being answered is a newcomer given 503.
    #[arg(long, env = "MAX_CONNECTIONS",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub max_connections: Option<usize>,

    /// Path the host serves its Prometheus metrics on, or `off` for none: every other path,
    /// and this one when moved, is the guest's (a guest may own `/metrics`).
    #[arg(long, env = "METRICS_PATH", default_value = METRICS_PATH,
          value_parser = HostPath::parser(METRICS_PATH))]
    pub metrics_path: HostPath,

    /// Path of the host's liveness page (200 while the host answers), or `off`.
    #[arg(long, env = "LIVE_PATH", default_value = LIVE_PATH,
          value_parser = HostPath::parser(LIVE_PATH))]
    pub live_path: HostPath,

    /// Path of the host's readiness page (200 while its user store answers, else 503), or
    /// `off`.
    #[arg(long, env = "READY_PATH", default_value = READY_PATH,
          value_parser = HostPath::parser(READY_PATH))]
    pub ready_path: HostPath,
}

impl EdgeSettings {
    /// The socket address to listen on.
    pub fn listen_addr(&self) -> SocketAddr {
        SocketAddr::new(self.bind, self.port)
    }

    /// Where the host serves its own pages.
    pub fn host_pages(&self) -> HostPages {
        HostPages {
            metrics: self.metrics_path.clone(),
            live: self.live_path.clone(),
            ready: self.ready_path.clone(),
        }
    }

    /// What one client may use of the host, a response to it making no progress for at most
    /// `response_stall`.
    pub fn client_limits(&self, response_stall: Duration) -> ClientLimits {
        ClientLimits {
            max_body_bytes: self.max_body_bytes,
            body_timeout: Duration::from_millis(self.body_timeout_ms),
            body_buffer_bytes: (machine_memory() / 8).max(MIN_BODY_BUFFER_BYTES),
            max_connections: self
                .max_connections
                .unwrap_or_else(|| default_cap(machine_memory())),
            response_stall,
        }
    }
}
