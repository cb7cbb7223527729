//! The embedded store: users in this process's memory, lost when it exits, seen by no other
//! replica. Nothing to set up; the default.

use std::collections::{HashMap, HashSet};
use std::sync::{PoisonError, RwLock, RwLockReadGuard};

use uuid::Uuid;

use crate::user_store::user::{CreateError, User, email_key};

/// What one stored user costs beyond its text: the `User` in the list (its id and two string
/// heads) with the list's spare room, the id's and the e-mail key's entries in their hash tables
/// with theirs, and the allocator's share of three strings. Measured: users of the largest size
/// the contract allows (200 four-byte characters of name, 254 of e-mail) grow the process by
/// about 3,110 bytes each, which [`held_bytes`] gives as 3,152.
const USER_OVERHEAD_BYTES: u64 = 320;

/// The memory `user` holds once stored with `email_key`, its e-mail case-folded for duplicates
/// (which can be longer than the e-mail: `İ` is 2 bytes, its lower case 3): the three strings
/// as kept, and [`USER_OVERHEAD_BYTES`].
pub fn held_bytes(user: &User, email_key: &str) -> u64 {
    let text = user.name.len() + user.email.len() + email_key.len();
    USER_OVERHEAD_BYTES + text as u64
}

/// A thread-safe, in-memory, append-only user store bounded in users and in bytes.
#[derive(Debug)]
pub struct MemoryStore {
    capacity: u64,
    /// The most [`held_bytes`] all users together may hold.
    max_bytes: u64,
    inner: RwLock<Users>,
}

#[derive(Debug, Default)]
struct Users {
    /// In creation order, which is the order `list_page` returns.
    in_order: Vec<User>,
    /// Position in `in_order` of each id.
    by_id: HashMap<Uuid, usize>,
    /// Case-folded e-mail addresses, to refuse duplicates in any letter case.
    email_keys: HashSet<String>,
    /// What the users hold, by [`held_bytes`].
    bytes: u64,
}

impl MemoryStore {
    /// An empty store that holds at most `capacity` users, taking at most `max_bytes`.
    pub fn new(capacity: u64, max_bytes: u64) -> MemoryStore {
        MemoryStore {
            capacity,
            max_bytes,
            inner: RwLock::default(),
        }
    }

    /// Up to `limit` users in creation order, after the user `after` (from the first when
    /// `None`; nothing when `after` is unknown).
    pub fn list_page(&self, after: Option<Uuid>, limit: usize) -> Vec<User> {
        let users = self.read();
        let start = match after {
            None => 0,
            Some(id) => users
                .by_id
                .get(&id)
                .map_or(users.in_order.len(), |&position| position + 1),
        };
        users.in_order[start..]
            .iter()
            .take(limit)
            .cloned()
            .collect()
    }

    /// The user whose id is `id`.
    pub fn get(&self, id: Uuid) -> Option<User> {
        let users = self.read();
        users
            .by_id
            .get(&id)
            .map(|&position| users.in_order[position].clone())
    }

    /// Stores `user`. Refuses an e-mail already stored in any letter case, and any user past the
    /// capacity in users or in bytes.
    pub fn create(&self, user: User) -> Result<User, CreateError> {
        let mut users = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        let mut email_key = email_key(&user.email);
        if users.email_keys.contains(&email_key) {
            return Err(CreateError::DuplicateEmail);
        }
        // Lower-casing may have grown it past its first allocation: kept at its length.
        email_key.shrink_to_fit();
        let bytes = users.bytes + held_bytes(&user, &email_key);
        if users.in_order.len() as u64 >= self.capacity || bytes > self.max_bytes {
            return Err(CreateError::StoreFull);
        }
        users.bytes = bytes;
        let position = users.in_order.len();
        users.by_id.insert(user.id, position);
        users.email_keys.insert(email_key);
        users.in_order.push(user.clone());
        Ok(user)
    }

    /// How many users are stored.
    pub fn count(&self) -> u64 {
        self.read().in_order.len() as u64
    }

    fn read(&self) -> RwLockReadGuard<'_, Users> {
        // Nothing panics while holding the lock, but a poisoned lock must not stop the service.
        self.inner.read().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn create(store: &MemoryStore, name: &str, email: &str) -> Result<User, CreateError> {
        store.create(User::new(name, email))
    }

    #[test]
    fn pages_follow_creation_order_from_any_cursor() {
        let store = MemoryStore::new(10, u64::MAX);
        let names = ["c", "a", "b", "d"];
        for name in names {
            create(&store, name, &format!("{name}@x.io")).unwrap();
        }
        let names_of = |page: Vec<User>| page.into_iter().map(|user| user.name).collect::<Vec<_>>();
        assert_eq!(names_of(store.list_page(None, 10)), names);
        let first = store.list_page(None, 2);
        assert_eq!(names_of(first.clone()), ["c", "a"]);
        let second = store.list_page(Some(first[1].id), 2);
        assert_eq!(names_of(second.clone()), ["b", "d"]);
        assert!(store.list_page(Some(second[1].id), 2).is_empty());
    }

    #[test]
    fn an_unknown_cursor_gives_an_empty_page() {
        let store = MemoryStore::new(10, u64::MAX);
        create(&store, "A", "a@x.io").unwrap();
        assert!(store.list_page(Some(Uuid::new_v4()), 10).is_empty());
    }

    #[test]
    fn get_finds_a_stored_user_and_nothing_else() {
        let store = MemoryStore::new(10, u64::MAX);
        let user = create(&store, "A", "a@x.io").unwrap();
        assert_eq!(store.get(user.id), Some(user));
        assert_eq!(store.get(Uuid::new_v4()), None);
    }

    #[test]
    fn duplicate_emails_are_refused_in_any_case_and_stored_as_given() {
        let store = MemoryStore::new(10, u64::MAX);
        let user = create(&store, "A", "Ada@Example.com").unwrap();
        assert_eq!(user.email, "Ada@Example.com");
        assert_eq!(
            create(&store, "B", "ada@example.COM"),
            Err(CreateError::DuplicateEmail)
        );
        assert_eq!(store.count(), 1);
    }

    #[test]
    fn a_full_store_refuses_new_users() {
        let store = MemoryStore::new(1, u64::MAX);
        create(&store, "A", "a@x.io").unwrap();
        assert_eq!(create(&store, "B", "b@x.io"), Err(CreateError::StoreFull));
        assert_eq!(store.count(), 1);
    }

    #[test]
    fn a_store_full_in_bytes_refuses_new_users_and_keeps_the_ones_it_has() {
        let first = User::new("A", "a@x.io");
        let store = MemoryStore::new(10, held_bytes(&first, "a@x.io") + 400);
        store.create(first).unwrap();
        let long_name = "n".repeat(200);
        assert_eq!(
            create(&store, &long_name, "b@x.io"),
            Err(CreateError::StoreFull)
        );
        create(&store, "C", "c@x.io").unwrap();
        assert_eq!(store.count(), 2);
    }

    #[test]
    fn the_largest_user_the_contract_allows_costs_what_was_measured() {
        let name = "\u{1F600}".repeat(200);
        let email = format!("{}@{}.io", "\u{1F600}".repeat(120), "\u{1F600}".repeat(130));
        assert_eq!(email.chars().count(), 254);
        let bytes = held_bytes(&User::new(&name, &email), &email_key(&email));
        assert!((3_110..3_300).contains(&bytes), "{bytes}");
    }

    #[test]
    fn an_e_mail_whose_lower_case_is_longer_is_counted_at_the_length_kept() {
        let email = format!("{}@x.io", "\u{130}".repeat(100));
        let key = email_key(&email);
        assert_eq!(key.len(), 300 + 5, "each İ folds to i and a combining dot");
        let user = User::new("A", &email);
        let held = held_bytes(&user, &key);
        assert_eq!(held, USER_OVERHEAD_BYTES + 1 + 205 + 305);
        let just_short = MemoryStore::new(10, held - 1);
        assert_eq!(just_short.create(user.clone()), Err(CreateError::StoreFull));
        let exact = MemoryStore::new(10, held);
        exact.create(user).unwrap();
        assert_eq!(exact.count(), 1);
    }

    #[test]
    fn concurrent_creations_all_land() {
        let store = Arc::new(MemoryStore::new(10_000, u64::MAX));
        let threads: Vec<_> = (0..8)
            .map(|thread| {
                let store = Arc::clone(&store);
                std::thread::spawn(move || {
                    for i in 0..100 {
                        create(&store, "U", &format!("{thread}-{i}@x.io")).unwrap();
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let ids: HashSet<Uuid> = store
            .list_page(None, 10_000)
            .into_iter()
            .map(|user| user.id)
            .collect();
        assert_eq!(ids.len(), 800);
    }
}
