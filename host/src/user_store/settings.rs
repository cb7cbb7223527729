//! The user store's settings: which store, and how this host uses PostgreSQL.

use std::time::Duration;

use clap::Args;

use crate::machine::machine_memory;
use crate::user_store::StoreChoice;
use crate::user_store::postgres::PostgresSettings;

/// How many users the store holds before creation answers 503.
pub const DEFAULT_MAX_USERS: u64 = 1_000_000;
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

/// Where users are kept, and how this host uses PostgreSQL.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "User store")]
pub struct StoreSettings {
    /// Where users are kept: `memory` (this process only) or a PostgreSQL URL,
    /// `postgres://user:password@host:port/database[?sslmode=disable&options=...]`, shared by
    /// every host that names it. When neither this flag nor USER_STORE is set, --database-url
    /// (DATABASE_URL) is used if set; else `memory`.
    #[arg(long = "store", env = "USER_STORE", hide_env_values = true, value_parser = store_setting)]
    pub store: Option<StoreSetting>,

    /// The PostgreSQL URL to use when --store (USER_STORE) is not set, as platforms that
    /// provision a database name it.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, value_parser = store_setting)]
    pub database_url: Option<StoreSetting>,

    /// Most users the store holds; creating one more answers 503.
    #[arg(long, env = "MAX_USERS", default_value_t = DEFAULT_MAX_USERS)]
    pub max_users: u64,

    /// Memory the users of the `memory` store may take, in MiB [default: an eighth of the memory
    /// this process may use, the machine's or its cgroup's limit]; creating a user past it
    /// answers 503 `User store is full`.
    #[arg(long, env = "MAX_STORE_MB", value_parser = clap::value_parser!(u64).range(1..=16 << 20))]
    pub max_store_mb: Option<u64>,

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
}

impl StoreSettings {
    /// What the `memory` store's users may take: `--max-store-mb`, else an eighth of the
    /// machine's memory (half of it is the guests' budget, an eighth the request bodies').
    pub fn max_store_bytes(&self) -> u64 {
        self.max_store_mb
            .map_or(machine_memory() as u64 / 8, |mb| mb << 20)
    }

    /// The flag whose value [`StoreSettings::choice`] reads: `--store`, else `--database-url`.
    pub fn chosen_flag(&self) -> &'static str {
        if self.store.is_some() {
            "--store"
        } else {
            "--database-url"
        }
    }

    /// The store `--store` (or `USER_STORE`, or `DATABASE_URL`) names, its calls given up after
    /// [`store_call_timeout`] of `request_timeout`. The error, what is wrong, never repeats the
    /// setting, which may hold a password.
    pub fn choice(&self, request_timeout: Duration) -> Result<StoreChoice, String> {
        let setting = self.store.as_ref().or(self.database_url.as_ref());
        let setting = setting.map_or(MEMORY_STORE, |setting| setting.0.as_str());
        if setting == MEMORY_STORE {
            return Ok(StoreChoice::Memory {
                max_bytes: self.max_store_bytes(),
            });
        }
        if !(setting.starts_with("postgres://") || setting.starts_with("postgresql://")) {
            return Err("expected `memory` or a postgres:// URL".to_string());
        }
        Ok(StoreChoice::Postgres(Box::new(PostgresSettings {
            config: PostgresSettings::parse_url(setting)?,
            pool_size: self.store_pool_size,
            call_timeout: store_call_timeout(request_timeout),
            connect_wait: Duration::from_secs(self.store_connect_timeout_secs),
            found_users_bytes: usize::try_from(self.store_cache_mb << 20).unwrap_or(usize::MAX),
        })))
    }
}

/// The longest one store call may take: half the request deadline, at most
/// [`MAX_STORE_CALL_TIMEOUT`], so a store that hangs is a 503 well within the deadline.
pub fn store_call_timeout(request_timeout: Duration) -> Duration {
    (request_timeout / 2).clamp(Duration::from_millis(1), MAX_STORE_CALL_TIMEOUT)
}

/// The raw `--store` setting. Its `Debug` hides it: a URL may hold a password.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreSetting(String);

impl std::fmt::Debug for StoreSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoreSetting(..)")
    }
}

/// Accepts any text: it is checked by [`StoreSettings::choice`], whose errors never echo it
/// (clap's would).
fn store_setting(text: &str) -> Result<StoreSetting, std::convert::Infallible> {
    Ok(StoreSetting(text.to_string()))
}
