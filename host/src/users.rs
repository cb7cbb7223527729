//! The `users` WIT interface, implemented for each request's state on the shared [`UserStore`].
//!
//! [`UserStore`]: crate::user_store::UserStore

use crate::bindings::users::{CreateError, Host, User};
use crate::request_state::RequestState;

impl Host for RequestState {
    fn list(&mut self) -> wasmtime::Result<Vec<User>> {
        Ok(self.users.list())
    }

    fn get(&mut self, id: String) -> wasmtime::Result<Option<User>> {
        Ok(self.users.get(&id))
    }

    fn create(
        &mut self,
        name: String,
        email: String,
    ) -> wasmtime::Result<Result<User, CreateError>> {
        Ok(self.users.create(&name, &email))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::user_store::UserStore;

    #[test]
    fn the_interface_reaches_the_shared_store() {
        let store = Arc::new(UserStore::new(10));
        let mut first_request = RequestState::new(Arc::clone(&store), tracing::Span::none());
        let created = first_request
            .create("Ada".into(), "ada@x.io".into())
            .unwrap()
            .unwrap();

        // A later request, with a fresh state, sees what the first one stored.
        let mut second_request = RequestState::new(Arc::clone(&store), tracing::Span::none());
        assert_eq!(
            second_request.get(created.id.clone()).unwrap(),
            Some(created.clone())
        );
        assert_eq!(second_request.list().unwrap(), vec![created]);
        assert_eq!(
            second_request
                .create("Other".into(), "ADA@X.IO".into())
                .unwrap(),
            Err(CreateError::DuplicateEmail)
        );
    }
}
