//! A stored user, and what a store call can answer: the types both stores share.

use uuid::Uuid;

/// The most users one page holds, whatever the caller asks for: bounds the memory of a call.
pub const MAX_PAGE_SIZE: u32 = 1000;

/// A stored user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// A UUID v4, assigned at creation.
    pub id: Uuid,
    /// Display name, trimmed by the guest.
    pub name: String,
    /// E-mail address as given.
    pub email: String,
}

impl User {
    /// A new user with a fresh UUID v4.
    pub fn new(name: &str, email: &str) -> User {
        User {
            id: Uuid::new_v4(),
            name: name.to_string(),
            email: email.to_string(),
        }
    }
}

/// The store could not answer: unreachable, failing or too slow. Carries the cause, for the
/// host's log (never for the client: it may name the database).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("user store unavailable: {0}")]
pub struct Unavailable(pub String);

/// Why a creation was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateError {
    /// Another user already has this e-mail address, in any letter case.
    DuplicateEmail,
    /// The store holds as many users as allowed.
    StoreFull,
    /// The store could not answer. Nothing was stored, unless the database committed just as
    /// the connection failed (the outcome of an interrupted commit cannot be known).
    Unavailable(Unavailable),
}

/// The key duplicates are compared by: the address in Unicode lower case, computed here so that
/// both stores (and every database locale) agree.
pub fn email_key(email: &str) -> String {
    email.to_lowercase()
}
