//! The user store: every user the service knows, shared by all requests.
//!
//! It lives in host state, outside any wasm store, so it outlives each per-request instance and
//! survives guest swaps. Guests reach it through the `users` WIT interface ([`crate::users`]).

use std::collections::{HashMap, HashSet};
use std::sync::{PoisonError, RwLock};

use uuid::Uuid;

use crate::bindings::users::{CreateError, User};

/// A thread-safe, in-memory, append-only user store with a capacity.
#[derive(Debug)]
pub struct UserStore {
    capacity: usize,
    inner: RwLock<Users>,
}

#[derive(Debug, Default)]
struct Users {
    /// In creation order, which is the order `list` returns.
    in_order: Vec<User>,
    /// Position in `in_order` of each id.
    by_id: HashMap<Uuid, usize>,
    /// Lower-cased e-mail addresses, to refuse duplicates in any letter case.
    emails: HashSet<String>,
}

impl UserStore {
    /// An empty store that holds at most `capacity` users.
    pub fn new(capacity: usize) -> UserStore {
        UserStore {
            capacity,
            inner: RwLock::default(),
        }
    }

    /// Every user, in creation order.
    pub fn list(&self) -> Vec<User> {
        self.read().in_order.clone()
    }

    /// The user whose id is `id` in any letter case; `None` when `id` is not a UUID.
    pub fn get(&self, id: &str) -> Option<User> {
        let id = Uuid::try_parse(id).ok()?;
        let users = self.read();
        users
            .by_id
            .get(&id)
            .map(|&position| users.in_order[position].clone())
    }

    /// Stores a user under a fresh UUID v4. Refuses an e-mail already stored in any letter case,
    /// and any user past the capacity.
    pub fn create(&self, name: &str, email: &str) -> Result<User, CreateError> {
        let mut users = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        let email_key = email.to_lowercase();
        if users.emails.contains(&email_key) {
            return Err(CreateError::DuplicateEmail);
        }
        if users.in_order.len() >= self.capacity {
            return Err(CreateError::StoreFull);
        }
        let id = Uuid::new_v4();
        let user = User {
            id: id.hyphenated().to_string(),
            name: name.to_string(),
            email: email.to_string(),
        };
        let position = users.in_order.len();
        users.in_order.push(user.clone());
        users.by_id.insert(id, position);
        users.emails.insert(email_key);
        Ok(user)
    }

    /// How many users are stored.
    pub fn len(&self) -> usize {
        self.read().in_order.len()
    }

    /// Whether no user is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Users> {
        // Nothing panics while holding the lock, but a poisoned lock must not stop the service.
        self.inner.read().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn created_users_get_distinct_lower_case_v4_ids() {
        let store = UserStore::new(10);
        let first = store.create("A", "a@x.io").unwrap();
        let second = store.create("B", "b@x.io").unwrap();
        assert_ne!(first.id, second.id);
        for user in [&first, &second] {
            let id = Uuid::parse_str(&user.id).unwrap();
            assert_eq!(id.get_version_num(), 4);
            assert_eq!(user.id, id.hyphenated().to_string());
        }
    }

    #[test]
    fn list_keeps_creation_order() {
        let store = UserStore::new(10);
        let names = ["c", "a", "b"];
        for name in names {
            store.create(name, &format!("{name}@x.io")).unwrap();
        }
        let listed: Vec<String> = store.list().into_iter().map(|user| user.name).collect();
        assert_eq!(listed, names);
    }

    #[test]
    fn get_finds_an_id_in_any_case_and_not_garbage() {
        let store = UserStore::new(10);
        let user = store.create("A", "a@x.io").unwrap();
        assert_eq!(store.get(&user.id), Some(user.clone()));
        assert_eq!(store.get(&user.id.to_uppercase()), Some(user));
        assert_eq!(store.get("not-a-uuid"), None);
        assert_eq!(store.get(&Uuid::new_v4().to_string()), None);
    }

    #[test]
    fn duplicate_emails_are_refused_in_any_case_and_stored_as_given() {
        let store = UserStore::new(10);
        let user = store.create("A", "Ada@Example.com").unwrap();
        assert_eq!(user.email, "Ada@Example.com");
        assert_eq!(
            store.create("B", "ada@example.COM"),
            Err(CreateError::DuplicateEmail)
        );
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn a_full_store_refuses_new_users() {
        let store = UserStore::new(1);
        store.create("A", "a@x.io").unwrap();
        assert_eq!(store.create("B", "b@x.io"), Err(CreateError::StoreFull));
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn concurrent_creations_all_land() {
        let store = Arc::new(UserStore::new(10_000));
        let threads: Vec<_> = (0..8)
            .map(|thread| {
                let store = Arc::clone(&store);
                std::thread::spawn(move || {
                    for i in 0..100 {
                        store.create("U", &format!("{thread}-{i}@x.io")).unwrap();
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let ids: HashSet<String> = store.list().into_iter().map(|user| user.id).collect();
        assert_eq!(ids.len(), 800);
    }
}
