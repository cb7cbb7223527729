//! Users this host has already seen in PostgreSQL, kept for lookups by id.
//!
//! The API never changes or deletes a user, so a user found once is that user forever, on every
//! replica: serving it again from memory can never be stale. Only users that exist are kept; a
//! miss always asks the database, since another replica may have created the user since.

use std::collections::HashMap;
use std::sync::{PoisonError, RwLock};

use uuid::Uuid;

use crate::user_store::user::User;

/// Bytes counted per entry beyond its name and e-mail: the id, the map's slot, the strings'
/// headers.
const ENTRY_OVERHEAD: usize = 96;

/// A bounded map of users by id. Past its byte budget, arbitrary entries make room.
#[derive(Debug)]
pub struct FoundUsers {
    budget: usize,
    inner: RwLock<Entries>,
}

#[derive(Debug, Default)]
struct Entries {
    by_id: HashMap<Uuid, User>,
    bytes: usize,
}

fn size_of(user: &User) -> usize {
    user.name.len() + user.email.len() + ENTRY_OVERHEAD
}

impl FoundUsers {
    /// An empty cache that holds at most about `budget` bytes; 0 keeps nothing.
    pub fn new(budget: usize) -> FoundUsers {
        FoundUsers {
            budget,
            inner: RwLock::default(),
        }
    }

    /// The user with this id, if this host has seen it.
    pub fn get(&self, id: Uuid) -> Option<User> {
        let entries = self.inner.read().unwrap_or_else(PoisonError::into_inner);
        entries.by_id.get(&id).cloned()
    }

    /// Remembers `user`, making room within the budget.
    pub fn insert(&self, user: &User) {
        let size = size_of(user);
        if size > self.budget {
            return;
        }
        let mut entries = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        while entries.bytes + size > self.budget {
            // The map's own order is as good as any: every entry stays valid forever, so which
            // one goes only changes what the next lookup costs.
            let Some(&victim) = entries.by_id.keys().next() else {
                break;
            };
            if let Some(removed) = entries.by_id.remove(&victim) {
                entries.bytes -= size_of(&removed);
            }
        }
        if let Some(previous) = entries.by_id.insert(user.id, user.clone()) {
            entries.bytes -= size_of(&previous);
        }
        entries.bytes += size;
    }

    /// Bytes held, as counted against the budget.
    pub fn bytes(&self) -> usize {
        self.inner
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remembered_user_is_found_and_others_are_not() {
        let found = FoundUsers::new(1 << 20);
        let user = User::new("Ada", "ada@x.io");
        found.insert(&user);
        assert_eq!(found.get(user.id), Some(user));
        assert_eq!(found.get(Uuid::new_v4()), None);
    }

    #[test]
    fn the_budget_is_never_exceeded() {
        let user_size = size_of(&User::new("U", "u0@x.io"));
        let found = FoundUsers::new(10 * user_size);
        let users: Vec<User> = (0..100)
            .map(|i| User::new("U", &format!("u{i}@x.io")))
            .collect();
        for user in &users {
            found.insert(user);
            assert!(found.bytes() <= 10 * user_size + 10);
        }
        let kept = users
            .iter()
            .filter(|user| found.get(user.id).is_some())
            .count();
        assert!((1..=10).contains(&kept), "{kept}");
    }

    #[test]
    fn a_zero_budget_keeps_nothing() {
        let found = FoundUsers::new(0);
        let user = User::new("Ada", "ada@x.io");
        found.insert(&user);
        assert_eq!(found.get(user.id), None);
    }
}
