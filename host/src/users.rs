//! The `users` WIT interface, implemented for each request's state on the shared [`UserStore`].
//!
//! Every call becomes one client span (OpenTelemetry's database conventions, never a parameter
//! value) and one sample of `user_store_operation_seconds`; a failed call is logged with its
//! cause, counted in `user_store_errors_total`, and reaches the guest as `unavailable` (a 503),
//! never as a trap.
//!
//! [`UserStore`]: crate::user_store::UserStore

use std::sync::Arc;
use std::time::Instant;

use tracing::Instrument;
use tracing::field::Empty;
use uuid::Uuid;
use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, WasmStr};

use crate::bindings::users::{CreateError, Host, StoreError, User};
use crate::metrics::LookupResult;
use crate::request_state::RequestState;
use crate::user_store::{self, Unavailable};

/// The longest `name` and `email` the host stores, in bytes: the guest's own limits (200 and 254
/// characters) at four bytes a character. A guest that sends more has a bug, and traps.
pub const MAX_NAME_BYTES: usize = 200 * 4;
/// See [`MAX_NAME_BYTES`].
pub const MAX_EMAIL_BYTES: usize = 254 * 4;
/// The longest id or cursor read from a guest: a UUID is 36 characters (45 with braces and a
/// `urn:uuid:` prefix); anything longer finds nothing without being copied.
const MAX_ID_BYTES: usize = 64;
/// Store calls of one request that get a span of their own; later ones (a long list's pages)
/// are timed and counted only, so no request floods the trace exporter.
pub const MAX_STORE_SPANS_PER_REQUEST: u32 = 64;

/// Links the `users` interface by hand, rather than through `bindgen!`'s `add_to_linker`, so a
/// guest's strings are measured in guest memory before any is copied: generated bindings would
/// copy a 100 MiB "name" into host memory before [`MAX_NAME_BYTES`] could refuse it.
pub fn add_to_linker(linker: &mut Linker<RequestState>) -> wasmtime::Result<()> {
    let mut instance = linker.instance("tutorial:service/users@0.2.1")?;
    instance.func_wrap_async(
        "list",
        |mut store, (after, limit): (Option<WasmStr>, u32)| {
            Box::new(async move {
                let after = match after {
                    None => None,
                    Some(after) => match read(&store, &after, MAX_ID_BYTES)? {
                        Some(after) => Some(after),
                        // No stored user has an id that long.
                        None => return Ok((Ok(Vec::new()),)),
                    },
                };
                Ok((Host::list(store.data_mut(), after, limit).await?,))
            })
        },
    )?;
    instance.func_wrap_async("get", |mut store, (id,): (WasmStr,)| {
        Box::new(async move {
            // No stored user has an id that long: a lookup that finds nothing.
            let id = read(&store, &id, MAX_ID_BYTES)?.unwrap_or_default();
            Ok((Host::get(store.data_mut(), id).await?,))
        })
    })?;
    instance.func_wrap_async("create", |mut store, (name, email): (WasmStr, WasmStr)| {
        Box::new(async move {
            let name = read(&store, &name, MAX_NAME_BYTES)?;
            let email = read(&store, &email, MAX_EMAIL_BYTES)?;
            let (Some(name), Some(email)) = (name, email) else {
                wasmtime::bail!("users.create with a name or email over the host's limits");
            };
            Ok((Host::create(store.data_mut(), name, email).await?,))
        })
    })?;
    Ok(())
}

/// The guest's string, if it is at most `max` bytes; a longer one is not copied.
fn read(
    store: &StoreContextMut<'_, RequestState>,
    text: &WasmStr,
    max: usize,
) -> wasmtime::Result<Option<String>> {
    let text = text.to_str(store)?;
    Ok((text.len() <= max).then(|| text.into_owned()))
}

impl Host for RequestState {
    async fn list(
        &mut self,
        after: Option<String>,
        limit: u32,
    ) -> wasmtime::Result<Result<Vec<User>, StoreError>> {
        let after = match after.as_deref().map(Uuid::try_parse) {
            None => None,
            Some(Ok(id)) => Some(id),
            // No stored user has an id that is not a UUID.
            Some(Err(_)) => return Ok(Ok(Vec::new())),
        };
        let users = Arc::clone(&self.users);
        let page = self
            .store_call(StoreCall::List, users.list_page(after, limit))
            .await;
        Ok(page
            .map(|page| page.into_iter().map(User::from).collect())
            .map_err(|Unavailable(_)| StoreError::Unavailable))
    }

    /// A lookup, counted in `user_lookups_total` as found or not (a store fault is neither).
    async fn get(&mut self, id: String) -> wasmtime::Result<Result<Option<User>, StoreError>> {
        let found = match Uuid::try_parse(&id) {
            Ok(id) => {
                let users = Arc::clone(&self.users);
                self.store_call(StoreCall::Get, users.get(id)).await
            }
            Err(_) => Ok(None),
        };
        if let (Some(metrics), Ok(found)) = (&self.metrics, &found) {
            metrics.observe_lookup(if found.is_some() {
                LookupResult::Success
            } else {
                LookupResult::Failure
            });
        }
        Ok(found
            .map(|user| user.map(User::from))
            .map_err(|Unavailable(_)| StoreError::Unavailable))
    }

    async fn create(
        &mut self,
        name: String,
        email: String,
    ) -> wasmtime::Result<Result<User, CreateError>> {
        if name.len() > MAX_NAME_BYTES || email.len() > MAX_EMAIL_BYTES {
            wasmtime::bail!(
                "users.create with a {}-byte name and a {}-byte email: over the host's limits",
                name.len(),
                email.len()
            );
        }
        let users = Arc::clone(&self.users);
        let created = self
            .store_call(StoreCall::Create, users.create(&name, &email))
            .await;
        Ok(created.map(User::from).map_err(|error| match error {
            user_store::CreateError::DuplicateEmail => CreateError::DuplicateEmail,
            user_store::CreateError::StoreFull => CreateError::StoreFull,
            user_store::CreateError::Unavailable(_) => CreateError::Unavailable,
        }))
    }
}

/// A call of the `users` interface, as the store's telemetry names it.
#[derive(Debug, Clone, Copy)]
enum StoreCall {
    List,
    Get,
    Create,
}

impl StoreCall {
    /// The `operation` label of the store's metrics.
    fn label(self) -> &'static str {
        match self {
            StoreCall::List => "list",
            StoreCall::Get => "get",
            StoreCall::Create => "create",
        }
    }

    /// `db.operation.name`: the SQL command the PostgreSQL store runs (the memory store does the
    /// same work in memory).
    fn operation_name(self) -> &'static str {
        match self {
            StoreCall::List | StoreCall::Get => "SELECT",
            StoreCall::Create => "INSERT",
        }
    }
}

/// What a store call's outcome says of the store's health.
trait StoreOutcome {
    /// The fault, when the store failed (a refused duplicate is not a fault).
    fn fault(&self) -> Option<&Unavailable>;
}

impl<T> StoreOutcome for Result<T, Unavailable> {
    fn fault(&self) -> Option<&Unavailable> {
        self.as_ref().err()
    }
}

impl StoreOutcome for Result<user_store::User, user_store::CreateError> {
    fn fault(&self) -> Option<&Unavailable> {
        match self {
            Err(user_store::CreateError::Unavailable(fault)) => Some(fault),
            _ => None,
        }
    }
}

impl RequestState {
    /// Runs `call` inside a client span under the guest's innermost open span, times it, and
    /// logs and counts a failure.
    async fn store_call<R: StoreOutcome>(
        // `&mut`: the state is `Send` but not `Sync`, and the future holds it across the wait.
        &mut self,
        call: StoreCall,
        future: impl Future<Output = R>,
    ) -> R {
        let span = self.store_span(call);
        let started = Instant::now();
        let outcome = future.instrument(span.clone()).await;
        let fault = outcome.fault();
        if let Some(metrics) = &self.metrics {
            metrics.observe_store_call(
                call.label(),
                self.users.kind(),
                started.elapsed(),
                fault.is_some(),
            );
        }
        if let Some(Unavailable(reason)) = fault {
            span.record("otel.status_code", "ERROR");
            span.record("error.type", "unavailable");
            // Not a line of its own: the request's one ERROR line carries the reason.
            span.in_scope(|| {
                tracing::debug!(operation = call.label(), reason, "user store call failed")
            });
            if let Some(fault) = &self.host_fault {
                fault.record(|| format!("user store call {} failed: {reason}", call.label()));
            }
        }
        outcome
    }

    fn store_span(&mut self, call: StoreCall) -> tracing::Span {
        if !self.telemetry_enabled || self.store_spans >= MAX_STORE_SPANS_PER_REQUEST {
            return tracing::Span::none();
        }
        self.store_spans += 1;
        let target = self.users.span_target();
        let (address, port) = target.server.unzip();
        tracing::info_span!(
            parent: self.innermost_span(),
            "user store call",
            otel.name = format!("{} users", call.operation_name()),
            otel.kind = "client",
            otel.status_code = Empty,
            db.system.name = target.system,
            db.operation.name = call.operation_name(),
            db.collection.name = "users",
            db.namespace = target.namespace,
            server.address = address,
            server.port = port,
            error.type = Empty,
            user_store.cache_hit = Empty,
        )
    }
}

impl From<user_store::User> for User {
    fn from(user: user_store::User) -> User {
        User {
            id: user.id.hyphenated().to_string(),
            name: user.name,
            email: user.email,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::user_store::UserStore;

    fn request(store: &Arc<UserStore>) -> RequestState {
        RequestState::new(
            Arc::clone(store),
            None,
            tracing::Span::none(),
            Arc::default(),
        )
    }

    #[tokio::test]
    async fn the_interface_reaches_the_shared_store() {
        let store = Arc::new(UserStore::memory(10));
        let created = request(&store)
            .create("Ada".into(), "ada@x.io".into())
            .await
            .unwrap()
            .unwrap();

        // A later request, with a fresh state, sees what the first one stored.
        let mut second = request(&store);
        assert_eq!(
            second.get(created.id.to_uppercase()).await.unwrap(),
            Ok(Some(created.clone()))
        );
        assert_eq!(second.list(None, 10).await.unwrap(), Ok(vec![created]));
        assert_eq!(
            second
                .create("Other".into(), "ADA@X.IO".into())
                .await
                .unwrap(),
            Err(CreateError::DuplicateEmail)
        );
    }

    #[tokio::test]
    async fn ids_and_cursors_that_are_not_uuids_find_nothing() {
        let store = Arc::new(UserStore::memory(10));
        let mut state = request(&store);
        state
            .create("A".into(), "a@x.io".into())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(state.get("not-a-uuid".into()).await.unwrap(), Ok(None));
        assert_eq!(
            state.list(Some("garbage".into()), 10).await.unwrap(),
            Ok(vec![])
        );
    }

    #[tokio::test]
    async fn a_name_or_email_over_the_host_limits_traps_and_stores_nothing() {
        let store = Arc::new(UserStore::memory(10));
        let mut state = request(&store);
        let long = "x".repeat(MAX_NAME_BYTES + 1);
        assert!(state.create(long, "a@x.io".into()).await.is_err());
        let long_email = format!("{}@x.io", "x".repeat(MAX_EMAIL_BYTES));
        assert!(state.create("A".into(), long_email).await.is_err());
        assert_eq!(store.count().await, Some(0));
    }

    #[tokio::test]
    async fn a_page_is_never_larger_than_the_host_allows() {
        let store = Arc::new(UserStore::memory(2_000));
        let mut state = request(&store);
        for i in 0..user_store::MAX_PAGE_SIZE + 5 {
            state
                .create("U".into(), format!("u{i}@x.io"))
                .await
                .unwrap()
                .unwrap();
        }
        let page = state.list(None, u32::MAX).await.unwrap().unwrap();
        assert_eq!(page.len(), user_store::MAX_PAGE_SIZE as usize);
    }
}
