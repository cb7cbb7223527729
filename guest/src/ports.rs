//! What the business logic needs from outside: the user store and a clock.
//!
//! In the component these are the host's `users` interface and WASI's monotonic clock; in native
//! tests they are in-memory fakes. Keeping them as traits is what lets the logic run anywhere.

use alloc::string::{String, ToString};
use alloc::vec::Vec;

use serde::Serialize;

/// A stored user, serialised exactly as the API returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct User {
    /// UUID v4, lower-case hyphenated; assigned by the store.
    pub id: String,
    /// Display name, trimmed.
    pub name: String,
    /// E-mail address as given.
    pub email: String,
}

/// The store could not answer (unreachable, failing, too slow): answered 503, nothing changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unavailable;

/// Why the store refused to create a user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateError {
    /// Another user already has this e-mail address, compared case-insensitively.
    DuplicateEmail,
    /// The store is at its capacity.
    StoreFull,
    /// The store could not answer; nothing was stored.
    Unavailable,
}

/// The user store: owned by the host, shared by all requests.
pub trait UserStore {
    /// Up to `limit` users in creation order: those after the user with id `after`, or from the
    /// first when `after` is `None`. An unknown `after` gives an empty page.
    fn list_page(&self, after: Option<&str>, limit: u32) -> Result<Vec<User>, Unavailable>;
    /// The user with this canonical (lower-case hyphenated) id.
    fn get(&self, id: &str) -> Result<Option<User>, Unavailable>;
    /// Stores a new user with already validated fields and returns it with its new id.
    fn create(&self, name: &str, email: &str) -> Result<User, CreateError>;
}

/// A monotonic clock, to time the Fibonacci computation.
pub trait Clock {
    /// Nanoseconds since an arbitrary, fixed origin.
    fn now_nanos(&self) -> u64;
}

/// Severity of a log event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Fine detail.
    Debug,
    /// A normal event: a request served, a user created.
    Info,
    /// Something the client got wrong, or a miss.
    Warn,
    /// Something the service could not do: its store failed.
    Error,
}

/// The value of a span or log attribute.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A string.
    Text(String),
    /// A signed integer.
    Integer(i64),
}

/// A named attribute of a span or a log event.
pub type Attribute = (&'static str, Value);

impl From<&str> for Value {
    fn from(text: &str) -> Value {
        Value::Text(text.to_string())
    }
}

impl From<i64> for Value {
    fn from(number: i64) -> Value {
        Value::Integer(number)
    }
}

/// Spans and logs, recorded by the host under the request's span.
pub trait Telemetry {
    /// An open span; it ends when dropped.
    type Span: Span;
    /// Opens a child span of the innermost open span.
    fn span(&self, name: &'static str, attributes: &[Attribute]) -> Self::Span;
    /// Writes a log event inside the innermost open span.
    fn log(&self, level: Level, message: &str, attributes: &[Attribute]);
    /// Names the route template the request matched, e.g. `/api/users/{id}`, so the host labels
    /// its span and metrics with it.
    fn set_route(&self, template: &'static str);
}

/// An open span.
pub trait Span {
    /// Adds an attribute to the span.
    fn set_attribute(&self, attribute: Attribute);
}
