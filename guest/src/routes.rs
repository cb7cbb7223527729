//! The API's paths and the methods each one allows.

/// A known route, with the path parameter of `/api/users/{id}` when there is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route<'a> {
    /// `/api/health`
    Health,
    /// `/api/users`
    Users,
    /// `/api/users/{id}`, with the raw path segment.
    User(&'a str),
    /// `/api/compute`
    Compute,
}

impl Route<'_> {
    /// Finds the route for a request target; the query string, if any, is ignored.
    pub fn from_path(target: &str) -> Option<Route<'_>> {
        // A loop over bytes, not `split_once('?')`: the generic pattern searcher is kilobytes of
        // code for a one-byte search, run twice a request (bench/PROFILE.md, section 21).
        let path = match target.bytes().position(|byte| byte == b'?') {
            Some(query) => &target[..query],
            None => target,
        };
        match path {
            "/api/health" => Some(Route::Health),
            "/api/users" => Some(Route::Users),
            "/api/compute" => Some(Route::Compute),
            _ => {
                let id = path.strip_prefix("/api/users/")?;
                (!id.is_empty() && !id.contains('/')).then_some(Route::User(id))
            }
        }
    }

    /// The route's template, as the host labels requests with it.
    pub fn template(self) -> &'static str {
        match self {
            Route::Health => "/api/health",
            Route::Users => "/api/users",
            Route::User(_) => "/api/users/{id}",
            Route::Compute => "/api/compute",
        }
    }

    /// The methods this route answers, as listed in a 405's `Allow` header.
    ///
    /// `HEAD` is answered wherever `GET` is, like `GET` without a body.
    pub fn allowed_methods(self) -> &'static [&'static str] {
        match self {
            Route::Health | Route::User(_) => &["GET", "HEAD"],
            Route::Users => &["GET", "HEAD", "POST"],
            Route::Compute => &["POST"],
        }
    }

    /// Whether `method` is one this route answers.
    pub fn allows(self, method: &str) -> bool {
        self.allowed_methods().contains(&method)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_paths_map_to_their_routes() {
        assert_eq!(Route::from_path("/api/health"), Some(Route::Health));
        assert_eq!(Route::from_path("/api/users"), Some(Route::Users));
        assert_eq!(Route::from_path("/api/compute"), Some(Route::Compute));
        assert_eq!(Route::from_path("/api/users/abc"), Some(Route::User("abc")));
    }

    #[test]
    fn every_route_has_its_template() {
        assert_eq!(Route::Health.template(), "/api/health");
        assert_eq!(Route::Users.template(), "/api/users");
        assert_eq!(Route::User("abc").template(), "/api/users/{id}");
        assert_eq!(Route::Compute.template(), "/api/compute");
    }

    #[test]
    fn the_query_string_is_ignored() {
        assert_eq!(
            Route::from_path("/api/health?verbose=1"),
            Some(Route::Health)
        );
        assert_eq!(Route::from_path("/api/users/x?y"), Some(Route::User("x")));
        assert_eq!(Route::from_path("/api/users/a?b/c"), Some(Route::User("a")));
        assert_eq!(Route::from_path("/api/users/é?x"), Some(Route::User("é")));
        assert_eq!(Route::from_path("?"), None);
        assert_eq!(Route::from_path("/api/health?"), Some(Route::Health));
    }

    proptest::proptest! {
        #[test]
        fn the_path_ends_at_the_first_question_mark_of_any_target(target in "(/api/(health|users|compute|users/[a-zé?/]{0,4}))?[?a-zé/]{0,6}") {
            let path = target.split_once('?').map_or(target.as_str(), |(path, _query)| path);
            proptest::prop_assert_eq!(Route::from_path(&target), Route::from_path(path));
        }
    }

    #[test]
    fn unknown_paths_have_no_route() {
        for path in [
            "/",
            "",
            "/api",
            "/api/",
            "/api/users/",
            "/api/users/a/b",
            "/API/health",
            "/api/health/",
            "/metrics",
        ] {
            assert_eq!(Route::from_path(path), None, "{path}");
        }
    }

    #[test]
    fn head_is_allowed_wherever_get_is() {
        for route in [Route::Health, Route::Users, Route::User("x")] {
            assert!(route.allows("GET") && route.allows("HEAD"));
        }
        assert!(!Route::Compute.allows("GET") && !Route::Compute.allows("HEAD"));
    }

    #[test]
    fn methods_are_case_sensitive_and_unlisted_ones_refused() {
        assert!(!Route::Health.allows("get"));
        for method in ["OPTIONS", "TRACE", "PUT", "DELETE", "PATCH", "CONNECT"] {
            assert!(!Route::Users.allows(method), "{method}");
        }
    }
}
