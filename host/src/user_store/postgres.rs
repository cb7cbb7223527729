//! The durable store: users in PostgreSQL, shared by every host that names the same database.
//!
//! Connections come from a bounded pool; a broken one is replaced on its next use, so the store
//! recovers by itself when the database comes back. Every call is bounded by a timeout and a
//! failure is [`Unavailable`], never a panic or a trap. The schema is created at start by
//! versioned migrations under an advisory lock, so replicas may start at the same moment.

use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use opentelemetry::KeyValue;
use opentelemetry::trace::TraceContextExt;
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::error::SqlState;
use tokio_postgres::{NoTls, Row};
use uuid::Uuid;

use crate::error::{Error, one_line};
use crate::user_store::found::FoundUsers;
use crate::user_store::health::{Health, PROBE_EVERY};
use crate::user_store::user::{CreateError, Unavailable, User, email_key};

/// The migrations, in order; each runs once per database, inside the start-up transaction.
const MIGRATIONS: &[(i32, &str)] = &[(1, include_str!("../../migrations/0001_users.sql"))];

/// The advisory lock that serialises start-ups (migrations and the cap) across replicas.
const START_UP_LOCK: i64 = 0x7475_746f_7269_616c; // "tutorial"

/// Shards of the cap in `user_slots` (see the migration): enough that concurrent creations
/// rarely queue on one row.
const SLOT_SHARDS: u64 = 16;

/// How long start-up waits between two attempts to reach the database.
const RETRY_PAUSE: Duration = Duration::from_millis(250);

/// TCP keepalives on every connection, so one whose peer vanished (a partition, a failover) is
/// found dead within about 25 s even while idle, instead of the system's two hours.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_RETRIES: u32 = 3;

/// How long `/metrics` may serve the last user count before asking the database again: a
/// flood of scrapes costs at most one query per interval.
const COUNT_REFRESH: Duration = Duration::from_secs(1);

/// How to reach PostgreSQL. Its `Debug` never shows the password.
#[derive(Debug, Clone)]
pub struct PostgresSettings {
    /// The parsed connection URL.
    pub config: tokio_postgres::Config,
    /// Connections kept open at most.
    pub pool_size: usize,
    /// The longest one store call may take, waiting for a connection included.
    pub call_timeout: Duration,
    /// How long start-up keeps trying to reach the database before it gives up.
    pub connect_wait: Duration,
    /// Bytes of users found by id kept in memory for later lookups (0: none).
    pub found_users_bytes: usize,
}

impl PostgresSettings {
    /// Parses a `postgres://` URL (with `sslmode`, `options` and the other usual parameters).
    /// The error, what is wrong, never repeats the URL, which may hold a password.
    pub fn parse_url(url: &str) -> Result<tokio_postgres::Config, String> {
        let config: tokio_postgres::Config = url
            .parse()
            .map_err(|error| format!("not a PostgreSQL URL ({error})"))?;
        if config.get_hosts().is_empty() {
            return Err("the PostgreSQL URL names no host".to_string());
        }
        // `user:p@ss@host` splits at the first `@`: part of the password would become the host,
        // and be shown in messages and spans.
        let tcp_host_has_at = config
            .get_hosts()
            .iter()
            .any(|host| matches!(host, Host::Tcp(name) if name.contains('@')));
        if tcp_host_has_at {
            return Err(
                "the URL holds an unescaped '@': percent-encode it in the password (%40)"
                    .to_string(),
            );
        }
        if config.get_ssl_mode() == SslMode::Require {
            return Err(
                "sslmode=require asks for TLS, which this host does not speak to PostgreSQL; \
                 use sslmode=disable or prefer (on a trusted network or through a TLS proxy)"
                    .to_string(),
            );
        }
        Ok(config)
    }
}

/// Users in PostgreSQL.
pub struct PostgresStore {
    connections: Connections,
    /// The last user count and when it was read, for `/metrics`.
    count_cache: std::sync::Mutex<Option<(Instant, u64)>>,
    /// Held by the one `/metrics` scrape that refreshes the count.
    count_refresh: tokio::sync::Mutex<()>,
    /// Users already seen, for lookups by id: they never change.
    found: FoundUsers,
}

/// The pool and what every call on it needs; cheap to clone into a task of its own.
#[derive(Clone)]
struct Connections {
    pool: Pool,
    call_timeout: Duration,
    /// `postgres://host:port/database`, without user or password: for messages and spans.
    target: Arc<Target>,
    /// What readiness knows of the database's answers.
    health: Arc<Health>,
}

/// Where the database is, without credentials.
#[derive(Debug, Clone)]
struct Target {
    host: String,
    port: Option<u16>,
    database: String,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.port {
            Some(port) => write!(f, "postgres://{}:{port}/{}", self.host, self.database),
            None => write!(f, "postgres://{}/{}", self.host, self.database),
        }
    }
}

impl Target {
    fn of(config: &tokio_postgres::Config) -> Target {
        let (host, port) = match config.get_hosts().first() {
            Some(Host::Tcp(name)) => (
                name.clone(),
                Some(config.get_ports().first().copied().unwrap_or(5432)),
            ),
            #[cfg(unix)]
            Some(Host::Unix(path)) => (path.display().to_string(), None),
            None => (String::new(), None),
        };
        let database = config
            .get_dbname()
            .or(config.get_user())
            .unwrap_or_default()
            .to_string();
        Target {
            host,
            port,
            database,
        }
    }
}

impl PostgresStore {
    /// Connects, creates or updates the schema and sets the cap to `capacity`, retrying for
    /// `settings.connect_wait` while the database cannot be reached.
    pub async fn open(settings: PostgresSettings, capacity: u64) -> Result<PostgresStore, Error> {
        let target = Target::of(&settings.config);
        let mut config = settings.config;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(settings.call_timeout);
        }
        config
            .keepalives(true)
            .keepalives_idle(KEEPALIVE_IDLE)
            .keepalives_interval(KEEPALIVE_INTERVAL)
            .keepalives_retries(KEEPALIVE_RETRIES);
        // The server gives up on a statement (or a lock) the host has stopped waiting for.
        let timeout_ms = settings.call_timeout.as_millis();
        let options = format!(
            "{} -c statement_timeout={timeout_ms} -c lock_timeout={timeout_ms}",
            config.get_options().unwrap_or_default()
        );
        config.options(options.trim_start());
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                // A closed connection is replaced; a query on a broken one fails that one call.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(settings.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(settings.call_timeout))
            .create_timeout(Some(settings.call_timeout))
            .recycle_timeout(Some(settings.call_timeout))
            .build()
            .expect("a pool with a runtime always builds");
        let store = PostgresStore {
            connections: Connections {
                pool,
                call_timeout: settings.call_timeout,
                health: Arc::new(Health::new(Instant::now(), target.to_string())),
                target: Arc::new(target),
            },
            count_cache: std::sync::Mutex::new(None),
            count_refresh: tokio::sync::Mutex::new(()),
            found: FoundUsers::new(settings.found_users_bytes),
        };
        let started = Instant::now();
        loop {
            // An attempt may not outlast the wait (a replica holding the start-up lock forever).
            let remaining = settings
                .connect_wait
                .saturating_sub(started.elapsed())
                .max(RETRY_PAUSE);
            let error = match tokio::time::timeout(remaining, store.start_up(capacity)).await {
                Ok(Ok(())) => {
                    store.connections.health.succeeded_at(Instant::now());
                    tokio::spawn(store.connections.clone().probe_while_idle());
                    return Ok(store);
                }
                Ok(Err(error)) => error,
                Err(_) => StartUpError::TimedOut(remaining),
            };
            // Wrong credentials, a role without rights or a missing database will not fix
            // themselves: say so at once.
            if error.code() == Some(&SqlState::INVALID_CATALOG_NAME) {
                return Err(Error::StoreDatabaseMissing {
                    target: store.connections.target.to_string(),
                });
            }
            let refused = error.code().is_some_and(|code| {
                code.code().starts_with("28") || *code == SqlState::INSUFFICIENT_PRIVILEGE
            });
            if refused {
                return Err(Error::StoreRefused {
                    target: store.connections.target.to_string(),
                    reason: one_line(&error),
                });
            }
            let hopeless = matches!(error, StartUpError::NewerSchema(_));
            let remaining = settings.connect_wait.saturating_sub(started.elapsed());
            if hopeless || remaining.is_zero() {
                return Err(Error::StoreUnreachable {
                    target: store.connections.target.to_string(),
                    waited: started.elapsed(),
                    reason: one_line(&error),
                });
            }
            tokio::time::sleep(RETRY_PAUSE.min(remaining)).await;
        }
    }

    /// Runs the pending migrations and spreads the room left under `capacity` over the slot
    /// shards, all in one transaction that holds the start-up lock.
    async fn start_up(&self, capacity: u64) -> Result<(), StartUpError> {
        let mut client = self.connections.pool.get().await?;
        let transaction = client.transaction().await?;
        transaction
            .execute("SELECT pg_advisory_xact_lock($1)", &[&START_UP_LOCK])
            .await?;
        transaction
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (
                     version    integer     PRIMARY KEY,
                     applied_at timestamptz NOT NULL DEFAULT now()
                 )",
            )
            .await?;
        let applied: Vec<i32> = transaction
            .query("SELECT version FROM schema_migrations", &[])
            .await?
            .iter()
            .map(|row| row.get(0))
            .collect();
        let known = MIGRATIONS.iter().map(|&(version, _)| version).max();
        if let Some(&newest) = applied.iter().max().filter(|&&newest| Some(newest) > known) {
            return Err(StartUpError::NewerSchema(newest));
        }
        for (version, sql) in MIGRATIONS {
            if !applied.contains(version) {
                transaction.batch_execute(sql).await?;
                transaction
                    .execute(
                        "INSERT INTO schema_migrations (version) VALUES ($1)",
                        &[version],
                    )
                    .await?;
            }
        }
        let used: Vec<(i16, i64)> = transaction
            .query(
                "SELECT shard, used FROM user_slots ORDER BY shard FOR UPDATE",
                &[],
            )
            .await?
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect();
        for (shard, quota) in shard_quotas(&used, capacity) {
            transaction
                .execute(
                    "UPDATE user_slots SET quota = $2 WHERE shard = $1",
                    &[&shard, &quota],
                )
                .await?;
        }
        transaction.commit().await?;
        Ok(())
    }

    /// The database's name, for spans.
    pub fn database(&self) -> &str {
        &self.connections.target.database
    }

    /// Host and port, for spans; `None` on a Unix socket.
    pub fn server(&self) -> Option<(&str, u16)> {
        let target = &self.connections.target;
        target.port.map(|port| (target.host.as_str(), port))
    }

    /// See `UserStore::list_page`.
    pub async fn list_page(
        &self,
        after: Option<Uuid>,
        limit: u32,
    ) -> Result<Vec<User>, Unavailable> {
        let limit = i64::from(limit);
        self.call(async |client| {
            let rows = match after {
                None => {
                    let statement = client
                        .prepare_cached("SELECT id, name, email FROM users ORDER BY seq LIMIT $1")
                        .await?;
                    client.query(&statement, &[&limit]).await?
                }
                Some(after) => {
                    // An unknown `after` has no `seq`: the comparison with NULL selects nothing.
                    let statement = client
                        .prepare_cached(
                            "SELECT id, name, email FROM users
                             WHERE seq > (SELECT seq FROM users WHERE id = $1)
                             ORDER BY seq LIMIT $2",
                        )
                        .await?;
                    client.query(&statement, &[&after, &limit]).await?
                }
            };
            rows.iter().map(user_from_row).collect()
        })
        .await
    }

    /// See `UserStore::get`.
    /// A user this host has seen before is served from memory (users never change); any other
    /// id, a miss included, asks the database, which another replica may have written since.
    pub async fn get(&self, id: Uuid) -> Result<Option<User>, Unavailable> {
        let cached = self.found.get(id);
        // On the store call's span, which the `users` interface makes current while it waits.
        opentelemetry::Context::map_current(|context| {
            let hit = KeyValue::new("user_store.cache_hit", cached.is_some());
            context.span().set_attribute(hit);
        });
        if cached.is_some() {
            return Ok(cached);
        }
        let found = self
            .call(async |client| {
                let statement = client
                    .prepare_cached("SELECT id, name, email FROM users WHERE id = $1")
                    .await?;
                let row = client.query_opt(&statement, &[&id]).await?;
                row.as_ref().map(user_from_row).transpose()
            })
            .await?;
        if let Some(user) = &found {
            self.found.insert(user);
        }
        Ok(found)
    }

    /// Inserts `user` and takes one unit of a shard's quota in one statement: it commits both or
    /// neither, and it has committed when this returns `Ok`.
    pub async fn create(&self, user: User) -> Result<User, CreateError> {
        let key = email_key(&user.email);
        let outcome = self
            .call(async |client| {
                let insert = client
                    .prepare_cached(
                        "WITH slot AS (
                             UPDATE user_slots SET used = used + 1
                             WHERE shard = $5 AND used < quota
                             RETURNING shard
                         )
                         INSERT INTO users (id, name, email, email_key)
                         SELECT $1, $2, $3, $4 FROM slot",
                    )
                    .await?;
                // The new id's random bits pick the first shard tried.
                let first_shard = (u64::from(user.id.as_bytes()[15]) % SLOT_SHARDS) as i16;
                let mut shard = first_shard;
                loop {
                    let inserted = client
                        .execute(&insert, &[&user.id, &user.name, &user.email, &key, &shard])
                        .await;
                    match inserted {
                        Ok(1) => return Ok(Created::Stored),
                        Ok(_) => {}
                        Err(error) if is_duplicate_email(&error) => {
                            return Ok(Created::DuplicateEmail);
                        }
                        Err(error) => return Err(error.into()),
                    }
                    // That shard is full: try another with room, if any is left, picked at
                    // random so that creations near the cap do not all queue on one row.
                    let with_room = client
                        .prepare_cached(
                            "SELECT shard FROM user_slots WHERE used < quota \
                             ORDER BY random() LIMIT 1",
                        )
                        .await?;
                    match client.query_opt(&with_room, &[]).await? {
                        Some(row) => shard = row.try_get(0)?,
                        None => break,
                    }
                }
                // Full: a duplicate still answers 409, as on the memory store.
                let taken = client
                    .prepare_cached("SELECT EXISTS (SELECT 1 FROM users WHERE email_key = $1)")
                    .await?;
                let duplicate: bool = client.query_one(&taken, &[&key]).await?.try_get(0)?;
                Ok(if duplicate {
                    Created::DuplicateEmail
                } else {
                    Created::StoreFull
                })
            })
            .await;
        match outcome {
            Ok(Created::Stored) => {
                self.found.insert(&user);
                Ok(user)
            }
            Ok(Created::DuplicateEmail) => Err(CreateError::DuplicateEmail),
            Ok(Created::StoreFull) => Err(CreateError::StoreFull),
            Err(unavailable) => Err(CreateError::Unavailable(unavailable)),
        }
    }

    /// The number of users, from the 16 rows of `user_slots` (no scan of `users`), read at most
    /// once a second whatever the number of scrapes; `None` while it is unknown.
    pub async fn count(&self) -> Option<u64> {
        let cached = *self
            .count_cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let fresh = cached.filter(|(read_at, _)| read_at.elapsed() < COUNT_REFRESH);
        if let Some((_, count)) = fresh {
            return Some(count);
        }
        // Another scrape is reading it: serve the last count rather than queue behind it.
        let Ok(_refreshing) = self.count_refresh.try_lock() else {
            return cached.map(|(_, count)| count);
        };
        let counted = self
            .call(async |client| {
                let statement = client
                    .prepare_cached("SELECT sum(used)::bigint FROM user_slots")
                    .await?;
                let count: Option<i64> = client.query_one(&statement, &[]).await?.try_get(0)?;
                Ok(count.unwrap_or(0).try_into().unwrap_or(0))
            })
            .await;
        match counted {
            Ok(count) => {
                *self
                    .count_cache
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) =
                    Some((Instant::now(), count));
                Some(count)
            }
            Err(_) => cached.map(|(_, count)| count),
        }
    }

    /// Whether the database answers, judged at once from what calls and probes found (see
    /// [`Health`]).
    pub fn check(&self) -> Result<(), Unavailable> {
        self.connections.health.verdict(Instant::now())
    }

    /// Runs `work` on a pooled connection: see [`Connections::call`].
    async fn call<T>(
        &self,
        work: impl AsyncFnOnce(&Object) -> Result<T, CallError>,
    ) -> Result<T, Unavailable> {
        self.connections.call(work).await
    }
}

impl Connections {
    /// Probes the database every second while no call has succeeded in the last one, for as
    /// long as the store lives: readiness never waits for a query, and no client starts one.
    async fn probe_while_idle(self) {
        let mut ticks = tokio::time::interval(PROBE_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // This task's clone is the last one once the store is gone.
        while Arc::strong_count(&self.health) > 1 {
            ticks.tick().await;
            if self.health.start_probe(Instant::now()) {
                let outcome = self
                    .call(async |client| {
                        client.simple_query("SELECT 1").await?;
                        Ok(())
                    })
                    .await;
                self.health.probe_ended(Instant::now(), outcome);
            }
        }
    }

    /// Runs `work` on a pooled connection within the call timeout (the wait for a connection
    /// included); any failure is [`Unavailable`], a success is noted for readiness. A
    /// connection whose call timed out may still have a query in flight: it is closed, never
    /// handed to the next caller.
    async fn call<T>(
        &self,
        work: impl AsyncFnOnce(&Object) -> Result<T, CallError>,
    ) -> Result<T, Unavailable> {
        let deadline = tokio::time::Instant::now() + self.call_timeout;
        let timed_out = || {
            Unavailable(format!(
                "{}: no answer within {} ms",
                self.target,
                self.call_timeout.as_millis()
            ))
        };
        let client = match tokio::time::timeout_at(deadline, self.pool.get()).await {
            Ok(Ok(client)) => client,
            Ok(Err(error)) => return Err(self.unavailable(error.into())),
            Err(_) => return Err(timed_out()),
        };
        match tokio::time::timeout_at(deadline, work(&client)).await {
            Ok(Ok(answer)) => {
                self.health.succeeded_at(Instant::now());
                Ok(answer)
            }
            Ok(Err(error)) => Err(self.unavailable(error)),
            Err(_) => {
                drop(Object::take(client));
                Err(timed_out())
            }
        }
    }

    fn unavailable(&self, error: CallError) -> Unavailable {
        Unavailable(format!("{}: {}", self.target, error.0))
    }
}

/// What an insert attempt found.
enum Created {
    Stored,
    DuplicateEmail,
    StoreFull,
}

/// A failed store call, as one line.
struct CallError(String);

impl From<tokio_postgres::Error> for CallError {
    fn from(error: tokio_postgres::Error) -> CallError {
        // A server error's DETAIL may quote row values (user data): only its message and code.
        match error.as_db_error() {
            Some(db_error) => CallError(format!(
                "{}: {} (SQLSTATE {})",
                db_error.severity(),
                db_error.message(),
                db_error.code().code()
            )),
            None => CallError(one_line(&error)),
        }
    }
}

impl From<deadpool_postgres::PoolError> for CallError {
    fn from(error: deadpool_postgres::PoolError) -> CallError {
        CallError(one_line(&error))
    }
}

/// A failed start-up: a database error, no connection, no answer, or a schema this host is too
/// old for.
#[derive(Debug, thiserror::Error)]
enum StartUpError {
    #[error(transparent)]
    Database(#[from] tokio_postgres::Error),
    #[error(transparent)]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("no answer within {} ms", .0.as_millis())]
    TimedOut(Duration),
    #[error(
        "the database's schema is at version {0}, newer than this host knows: run a host at \
         least as new as the one that migrated it"
    )]
    NewerSchema(i32),
}

impl StartUpError {
    fn code(&self) -> Option<&SqlState> {
        match self {
            StartUpError::Database(error) => error.code(),
            StartUpError::Pool(deadpool_postgres::PoolError::Backend(error)) => error.code(),
            StartUpError::Pool(_) | StartUpError::TimedOut(_) | StartUpError::NewerSchema(_) => {
                None
            }
        }
    }
}

fn is_duplicate_email(error: &tokio_postgres::Error) -> bool {
    error.as_db_error().is_some_and(|error| {
        *error.code() == SqlState::UNIQUE_VIOLATION
            && error.constraint() == Some("users_email_key_unique")
    })
}

/// A user from a row of `id, name, email`; a row that does not decode is a store failure, not a
/// panic.
fn user_from_row(row: &Row) -> Result<User, CallError> {
    Ok(User {
        id: row.try_get(0)?,
        name: row.try_get(1)?,
        email: row.try_get(2)?,
    })
}

/// Each shard's new quota: what it holds plus an even share of the room left under `capacity`.
/// A shard never gets less than it holds, so lowering the cap below the count only stops
/// creations.
fn shard_quotas(used: &[(i16, i64)], capacity: u64) -> Vec<(i16, i64)> {
    let held: u64 = used.iter().map(|&(_, used)| used.max(0) as u64).sum();
    let room = capacity.saturating_sub(held);
    let shards = used.len().max(1) as u64;
    used.iter()
        .enumerate()
        .map(|(index, &(shard, used))| {
            let share = room / shards + u64::from((index as u64) < room % shards);
            let quota = (used.max(0) as u64).saturating_add(share);
            (shard, i64::try_from(quota).unwrap_or(i64::MAX))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas_sum_to_the_capacity_spread_evenly() {
        let used: Vec<(i16, i64)> = (0..16).map(|shard| (shard, 0)).collect();
        let quotas = shard_quotas(&used, 1_000_003);
        assert_eq!(
            quotas.iter().map(|&(_, quota)| quota).sum::<i64>(),
            1_000_003
        );
        assert!(
            quotas
                .iter()
                .all(|&(_, quota)| quota == 62_500 || quota == 62_501)
        );
    }

    #[test]
    fn quotas_give_the_room_left_on_top_of_what_shards_hold() {
        let used = [(0, 5), (1, 0)];
        assert_eq!(shard_quotas(&used, 8), [(0, 7), (1, 1)]);
    }

    #[test]
    fn a_cap_below_the_count_freezes_every_shard() {
        let used = [(0, 5), (1, 3)];
        assert_eq!(shard_quotas(&used, 4), [(0, 5), (1, 3)]);
    }

    #[test]
    fn a_url_error_never_repeats_the_password() {
        let error = PostgresSettings::parse_url("postgres://u:hunter2@db:notaport/x").unwrap_err();
        assert!(!error.to_string().contains("hunter2"), "{error}");
    }

    #[test]
    fn the_target_names_host_port_and_database_but_no_credentials() {
        let config = PostgresSettings::parse_url(
            "postgres://app:hunter2@db.internal:6543/users?sslmode=disable",
        )
        .unwrap();
        assert_eq!(
            Target::of(&config).to_string(),
            "postgres://db.internal:6543/users"
        );
        assert!(!format!("{config:?}").contains("hunter2"));
    }

    #[test]
    fn an_unescaped_at_in_the_password_is_refused_without_showing_it() {
        let error = PostgresSettings::parse_url("postgres://app:p@ss@db/x")
            .unwrap_err()
            .to_string();
        assert!(error.contains("%40"), "{error}");
        assert!(!error.contains("ss@db"), "{error}");
        assert!(PostgresSettings::parse_url("postgres://app:p%40ss@db/x").is_ok());
    }

    #[test]
    fn a_unix_socket_target_has_no_port() {
        let config =
            PostgresSettings::parse_url("postgres://app@%2Fvar%2Frun%2Fpostgresql/x").unwrap();
        let target = Target::of(&config);
        assert_eq!(target.port, None);
        assert_eq!(target.to_string(), "postgres:///var/run/postgresql/x");
    }

    #[test]
    fn sslmode_require_is_refused_at_start_with_a_reason() {
        let error = PostgresSettings::parse_url("postgres://u@db/x?sslmode=require").unwrap_err();
        assert!(error.to_string().contains("sslmode=require"), "{error}");
    }
}
