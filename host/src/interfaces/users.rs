//! The `users` WIT interface, on [`UserCalls`]: each request's calls on the shared
//! [`UserStore`].
//!
//! Every call becomes one client span (OpenTelemetry's database conventions, never a parameter
//! value) and one sample of `user_store_operation_seconds`; a failed call is logged with its
//! cause, counted in `user_store_errors_total`, and reaches the guest as `unavailable` (a 503),
//! never as a trap.

use std::sync::Arc;
use std::time::Instant;

use opentelemetry::context::FutureExt as _;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt};
use opentelemetry::{Context, KeyValue};
use uuid::Uuid;
use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, WasmStr};

use crate::interfaces::bindings::users::{CreateError, StoreError, User};
use crate::interfaces::lift::{self, InGuest};
use crate::observability::metrics::{LookupResult, Metrics};
use crate::observability::request_report::{self, HostCalls, HostInterface, RequestRecord};
use crate::user_store::{self, Unavailable, UserStore};

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

/// The store data of a request whose guest may use the `users` interface.
pub trait UsersView: HostCalls + Send + 'static {
    /// The request's user calls, and the span they nest under (the guest's innermost open one).
    fn users(&mut self) -> (&mut UserCalls, &Context);
}

/// One request's calls on the user store.
pub struct UserCalls {
    store: Arc<UserStore>,
    /// The host's metrics; `None` for requests the host sends itself.
    metrics: Option<Arc<Metrics>>,
    /// The request's record, where a failed call goes for its ERROR line.
    record: Arc<RequestRecord>,
    /// Spans still to give, against [`MAX_STORE_SPANS_PER_REQUEST`]; none for the host's own
    /// requests.
    spans_left: u32,
}

impl UserCalls {
    /// Calls of a request on `store`, counted in `metrics`, their first failure noted in
    /// `record`.
    pub fn new(store: Arc<UserStore>, metrics: Arc<Metrics>, record: Arc<RequestRecord>) -> Self {
        UserCalls {
            store,
            metrics: Some(metrics),
            record,
            spans_left: MAX_STORE_SPANS_PER_REQUEST,
        }
    }

    /// Calls of a request the host sends itself (a probe): no spans or metrics.
    pub fn quiet(store: Arc<UserStore>, record: Arc<RequestRecord>) -> Self {
        UserCalls {
            store,
            metrics: None,
            record,
            spans_left: 0,
        }
    }

    /// `list`: a page of users after the cursor `after`; one that is no UUID finds none.
    pub async fn list(
        &mut self,
        after: Option<&str>,
        limit: u32,
        parent: &Context,
    ) -> Result<Vec<User>, StoreError> {
        let after = match after.map(Uuid::try_parse) {
            None => None,
            Some(Ok(id)) => Some(id),
            // No stored user has an id that is not a UUID.
            Some(Err(_)) => return Ok(Vec::new()),
        };
        let users = Arc::clone(&self.store);
        let page = self
            .call(StoreCall::List, parent, users.list_page(after, limit))
            .await;
        page.map(|page| page.into_iter().map(User::from).collect())
            .map_err(|Unavailable(_)| StoreError::Unavailable)
    }

    /// `get`: a lookup, counted in `user_lookups_total` as found or not (a store fault is
    /// neither); an id that is no UUID finds nothing.
    pub async fn get(&mut self, id: &str, parent: &Context) -> Result<Option<User>, StoreError> {
        let found = match Uuid::try_parse(id) {
            Ok(id) => {
                let users = Arc::clone(&self.store);
                self.call(StoreCall::Get, parent, users.get(id)).await
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
        found
            .map(|user| user.map(User::from))
            .map_err(|Unavailable(_)| StoreError::Unavailable)
    }

    /// `create`: stores a new user.
    pub async fn create(
        &mut self,
        name: &str,
        email: &str,
        parent: &Context,
    ) -> Result<User, CreateError> {
        let users = Arc::clone(&self.store);
        let created = self
            .call(StoreCall::Create, parent, users.create(name, email))
            .await;
        created.map(User::from).map_err(|error| match error {
            user_store::CreateError::DuplicateEmail => CreateError::DuplicateEmail,
            user_store::CreateError::StoreFull => CreateError::StoreFull,
            user_store::CreateError::Unavailable(_) => CreateError::Unavailable,
        })
    }

    /// Runs `future` inside a client span under `parent`, times it, and logs and counts a
    /// failure.
    async fn call<R: StoreOutcome>(
        // `&mut`: the state is `Send` but not `Sync`, and the future holds it across the wait.
        &mut self,
        call: StoreCall,
        parent: &Context,
        future: impl Future<Output = R>,
    ) -> R {
        let span = self.span(call, parent);
        let started = Instant::now();
        // Current while the store works, so it can say on the span whether it asked the
        // database (`user_store.cache_hit`).
        let outcome = future.with_context(span.clone()).await;
        let fault = outcome.fault();
        if let Some(metrics) = &self.metrics {
            metrics.observe_store_call(
                call.label(),
                self.store.kind(),
                started.elapsed(),
                fault.is_some(),
            );
        }
        if let Some(Unavailable(reason)) = fault {
            span.span().set_status(Status::error(""));
            span.span()
                .set_attribute(KeyValue::new("error.type", "unavailable"));
            // Not a line of its own: the request's one ERROR line carries the reason. As a log
            // record it carries the store call's ids, or the guest span's beyond the span quota.
            let in_span = if span.has_active_span() {
                &span
            } else {
                parent
            };
            let _current = in_span.clone().attach();
            tracing::debug!(operation = call.label(), reason, "user store call failed");
            self.record
                .fault(|| format!("user store call {} failed: {reason}", call.label()));
        }
        span.span().end();
        outcome
    }

    /// The call's client span, while the request has spans left: no span otherwise.
    fn span(&mut self, call: StoreCall, parent: &Context) -> Context {
        if self.spans_left == 0 {
            return request_report::no_span_under(parent);
        }
        self.spans_left -= 1;
        // Nothing to build when no span is exported (the request's is then empty).
        if !parent.has_active_span() {
            return request_report::no_span_under(parent);
        }
        let target = self.store.span_target();
        let mut attributes = vec![
            KeyValue::new("db.system.name", target.system),
            KeyValue::new("db.operation.name", call.operation_name()),
            KeyValue::new("db.collection.name", "users"),
        ];
        if let Some(namespace) = target.namespace {
            attributes.push(KeyValue::new("db.namespace", namespace.to_string()));
        }
        if let Some((address, port)) = target.server {
            attributes.push(KeyValue::new("server.address", address.to_string()));
            attributes.push(KeyValue::new("server.port", i64::from(port)));
        }
        request_report::start_child(
            parent,
            format!("{} users", call.operation_name()),
            SpanKind::Client,
            attributes,
        )
    }
}

/// Links the `users` interface: each function lifts its strings within the host's limits, so
/// a guest's strings are measured in guest memory before any is copied (generated bindings would
/// copy a 100 MiB "name" into host memory before [`MAX_NAME_BYTES`] could refuse it), then calls
/// [`UserCalls`].
pub fn add_to_linker<T: UsersView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    let mut instance = linker.instance("tutorial:service/users@0.2.1")?;
    instance.func_wrap_async(
        "list",
        |mut store: StoreContextMut<'_, T>, (after, limit): (Option<WasmStr>, u32)| {
            Box::new(async move {
                store.data_mut().count_call(HostInterface::Users);
                // A cursor too long to be an id is no stored user's: it finds an empty page.
                let after = match after {
                    Some(after) => Some(id(&store, &after)?),
                    None => None,
                };
                let (calls, parent) = store.data_mut().users();
                Ok((calls.list(after.as_deref(), limit, parent).await,))
            })
        },
    )?;
    instance.func_wrap_async(
        "get",
        |mut store: StoreContextMut<'_, T>, (raw,): (WasmStr,)| {
            Box::new(async move {
                store.data_mut().count_call(HostInterface::Users);
                let id = id(&store, &raw)?;
                let (calls, parent) = store.data_mut().users();
                Ok((calls.get(&id, parent).await,))
            })
        },
    )?;
    instance.func_wrap_async(
        "create",
        |mut store: StoreContextMut<'_, T>, (name, email): (WasmStr, WasmStr)| {
            Box::new(async move {
                store.data_mut().count_call(HostInterface::Users);
                let name = lift::bounded_text(&InGuest::new(&name, &store), MAX_NAME_BYTES)?;
                let email = lift::bounded_text(&InGuest::new(&email, &store), MAX_EMAIL_BYTES)?;
                let (Some(name), Some(email)) = (name, email) else {
                    wasmtime::bail!("users.create with a name or email over the host's limits");
                };
                let (calls, parent) = store.data_mut().users();
                Ok((calls.create(&name, &email, parent).await,))
            })
        },
    )?;
    Ok(())
}

/// An id or cursor the guest passed; one too long to be a UUID is read as the empty string,
/// which finds nothing, without being copied.
fn id<T: 'static>(store: &StoreContextMut<'_, T>, raw: &WasmStr) -> wasmtime::Result<String> {
    Ok(lift::bounded_text(&InGuest::new(raw, store), MAX_ID_BYTES)?.unwrap_or_default())
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

    fn request(store: &Arc<UserStore>) -> UserCalls {
        UserCalls::new(Arc::clone(store), Arc::new(Metrics::new()), Arc::default())
    }

    fn outside() -> Context {
        Context::new()
    }

    #[tokio::test]
    async fn the_interface_reaches_the_shared_store() {
        let store = Arc::new(UserStore::memory(10));
        let created = request(&store)
            .create("Ada", "ada@x.io", &outside())
            .await
            .unwrap();

        // A later request, with fresh calls, sees what the first one stored.
        let mut second = request(&store);
        assert_eq!(
            second.get(&created.id.to_uppercase(), &outside()).await,
            Ok(Some(created.clone()))
        );
        assert_eq!(second.list(None, 10, &outside()).await, Ok(vec![created]));
        assert_eq!(
            second.create("Other", "ADA@X.IO", &outside()).await,
            Err(CreateError::DuplicateEmail)
        );
    }

    #[tokio::test]
    async fn ids_and_cursors_that_are_not_uuids_find_nothing() {
        let store = Arc::new(UserStore::memory(10));
        let mut calls = request(&store);
        calls.create("A", "a@x.io", &outside()).await.unwrap();
        assert_eq!(calls.get("not-a-uuid", &outside()).await, Ok(None));
        assert_eq!(calls.get("", &outside()).await, Ok(None));
        assert_eq!(
            calls.list(Some("garbage"), 10, &outside()).await,
            Ok(vec![])
        );
    }

    #[test]
    fn a_name_or_email_over_the_host_limits_is_not_lifted() {
        let name = "é".repeat(MAX_NAME_BYTES / 2);
        assert_eq!(
            lift::bounded_text(&name.as_str(), MAX_NAME_BYTES).unwrap(),
            Some(name.clone())
        );
        let long = "x".repeat(MAX_NAME_BYTES + 1);
        assert_eq!(
            lift::bounded_text(&long.as_str(), MAX_NAME_BYTES).unwrap(),
            None
        );
        let long_email = format!("{}@x.io", "x".repeat(MAX_EMAIL_BYTES));
        assert_eq!(
            lift::bounded_text(&long_email.as_str(), MAX_EMAIL_BYTES).unwrap(),
            None
        );
    }

    #[tokio::test]
    async fn a_page_is_never_larger_than_the_host_allows() {
        let store = Arc::new(UserStore::memory(2_000));
        let mut calls = request(&store);
        for i in 0..user_store::MAX_PAGE_SIZE + 5 {
            calls
                .create("U", &format!("u{i}@x.io"), &outside())
                .await
                .unwrap();
        }
        let page = calls.list(None, u32::MAX, &outside()).await.unwrap();
        assert_eq!(page.len(), user_store::MAX_PAGE_SIZE as usize);
    }

    #[tokio::test]
    async fn a_request_gives_at_most_its_store_spans() {
        let store = Arc::new(UserStore::memory(10));
        let mut calls = request(&store);
        for _ in 0..MAX_STORE_SPANS_PER_REQUEST {
            calls.span(StoreCall::Get, &outside());
        }
        assert_eq!(calls.spans_left, 0);
        calls.span(StoreCall::Get, &outside());
        assert_eq!(calls.spans_left, 0);
        assert_eq!(UserCalls::quiet(store, Arc::default()).spans_left, 0);
    }
}
