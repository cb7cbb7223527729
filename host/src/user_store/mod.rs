//! The user store: every user the service knows, shared by all requests.
//!
//! It lives in host state, outside any wasm store, so it outlives each per-request instance and
//! survives guest swaps. Two stores answer alike: [`memory`] (the default, nothing to set up) and
//! [`postgres`] (durable, shared by any number of hosts). Guests reach either through the `users`
//! WIT interface and never know which one it is.

pub mod found;
pub mod health;
pub mod memory;
pub mod postgres;
pub mod settings;
pub mod user;

use uuid::Uuid;

pub use user::{CreateError, MAX_PAGE_SIZE, Unavailable, User, email_key};

use crate::error::Error;
use memory::MemoryStore;
use postgres::{PostgresSettings, PostgresStore};

/// What `--store` chose.
pub enum StoreChoice {
    /// Users in this process's memory, taking at most `max_bytes` of it.
    Memory {
        /// `--max-store-mb` in bytes.
        max_bytes: u64,
    },
    /// Users in PostgreSQL.
    Postgres(Box<PostgresSettings>),
}

/// The user store the host was started with.
pub enum UserStore {
    /// In this process's memory.
    Memory(MemoryStore),
    /// In PostgreSQL, shared by every host that names the same database.
    Postgres(PostgresStore),
}

impl UserStore {
    /// An empty in-memory store that holds at most `capacity` users, of any size.
    pub fn memory(capacity: u64) -> UserStore {
        UserStore::Memory(MemoryStore::new(capacity, u64::MAX))
    }

    /// The store `choice` names, ready to serve: on PostgreSQL connected and migrated, waiting a
    /// bounded time for the database to come up.
    pub async fn open(choice: StoreChoice, capacity: u64) -> Result<UserStore, Error> {
        Ok(match choice {
            StoreChoice::Memory { max_bytes } => {
                UserStore::Memory(MemoryStore::new(capacity, max_bytes))
            }
            StoreChoice::Postgres(settings) => {
                UserStore::Postgres(PostgresStore::open(*settings, capacity).await?)
            }
        })
    }

    /// `memory` or `postgres`: the `store` label of the store's metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            UserStore::Memory(_) => "memory",
            UserStore::Postgres(_) => "postgres",
        }
    }

    /// Up to `limit` (at most [`MAX_PAGE_SIZE`]) users in creation order: after the user `after`,
    /// from the first when `None`, none when `after` is no stored user.
    pub async fn list_page(
        &self,
        after: Option<Uuid>,
        limit: u32,
    ) -> Result<Vec<User>, Unavailable> {
        let limit = limit.min(MAX_PAGE_SIZE);
        match self {
            UserStore::Memory(store) => Ok(store.list_page(after, limit as usize)),
            UserStore::Postgres(store) => store.list_page(after, limit).await,
        }
    }

    /// The user whose id is `id`, if any.
    pub async fn get(&self, id: Uuid) -> Result<Option<User>, Unavailable> {
        match self {
            UserStore::Memory(store) => Ok(store.get(id)),
            UserStore::Postgres(store) => store.get(id).await,
        }
    }

    /// Stores a new user under a fresh UUID v4; `Ok` means it is stored (on PostgreSQL,
    /// committed). Duplicates are checked before the cap.
    pub async fn create(&self, name: &str, email: &str) -> Result<User, CreateError> {
        let user = User::new(name, email);
        match self {
            UserStore::Memory(store) => store.create(user),
            UserStore::Postgres(store) => store.create(user).await,
        }
    }

    /// How many users are stored, cheaply (no scan of the users); `None` when the store cannot
    /// tell right now.
    pub async fn count(&self) -> Option<u64> {
        match self {
            UserStore::Memory(store) => Some(store.count()),
            UserStore::Postgres(store) => store.count().await,
        }
    }

    /// Whether the store answers (the memory store always does), judged at once; the cause
    /// when it does not.
    pub fn check(&self) -> Result<(), Unavailable> {
        match self {
            UserStore::Memory(_) => Ok(()),
            UserStore::Postgres(store) => store.check(),
        }
    }

    /// The OpenTelemetry database attributes of this store's spans that do not change per call.
    pub fn span_target(&self) -> SpanTarget<'_> {
        match self {
            UserStore::Memory(_) => SpanTarget {
                system: "memory",
                namespace: None,
                server: None,
            },
            UserStore::Postgres(store) => SpanTarget {
                system: "postgresql",
                namespace: Some(store.database()),
                server: store.server(),
            },
        }
    }
}

/// Where a store's calls go, as OpenTelemetry's database conventions name it.
#[derive(Debug, Clone, Copy)]
pub struct SpanTarget<'a> {
    /// `db.system.name`.
    pub system: &'static str,
    /// `db.namespace`: the database.
    pub namespace: Option<&'a str>,
    /// `server.address` and `server.port`, for a TCP connection.
    pub server: Option<(&'a str, u16)>,
}
