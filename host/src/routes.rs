//! The API's route templates, as the host needs them.
//!
//! The guest owns routing; the host only needs to know which requests reach a real endpoint, to
//! apply the body limit in the contract's order (404 and 405 come before 413), and to label
//! metrics and spans with a bounded set of templates instead of raw paths.

use http::Method;

/// The host's own metrics endpoint.
pub const METRICS_PATH: &str = "/metrics";
/// The template of a lookup by id, whose answers count as lookup successes and failures.
pub const USER_BY_ID: &str = "/api/users/{id}";

/// A route template and the methods its endpoint answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// The template, e.g. `/api/users/{id}`.
    pub template: &'static str,
    /// Methods answered; `HEAD` wherever `GET` is.
    pub methods: &'static [Method],
}

impl Route {
    /// Whether this route answers `method`.
    pub fn allows(&self, method: &Method) -> bool {
        self.methods.contains(method)
    }
}

const GET_OR_HEAD: &[Method] = &[Method::GET, Method::HEAD];

/// Every route of the API, the host's `/metrics` included.
pub const ROUTES: &[Route] = &[
    Route {
        template: "/api/health",
        methods: GET_OR_HEAD,
    },
    Route {
        template: "/api/users",
        methods: &[Method::GET, Method::HEAD, Method::POST],
    },
    Route {
        template: "/api/users/{id}",
        methods: GET_OR_HEAD,
    },
    Route {
        template: "/api/compute",
        methods: &[Method::POST],
    },
    Route {
        template: METRICS_PATH,
        methods: GET_OR_HEAD,
    },
];

/// The route a request path (without its query) belongs to, if any.
pub fn find(path: &str) -> Option<&'static Route> {
    let template = match path.strip_prefix("/api/users/") {
        Some(id) if !id.is_empty() && !id.contains('/') => USER_BY_ID,
        _ => path,
    };
    ROUTES.iter().find(|route| route.template == template)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_their_templates() {
        assert_eq!(find("/api/health").unwrap().template, "/api/health");
        assert_eq!(find("/api/users").unwrap().template, "/api/users");
        assert_eq!(find("/api/users/8d5e").unwrap().template, "/api/users/{id}");
        assert_eq!(find("/api/compute").unwrap().template, "/api/compute");
        assert_eq!(find("/metrics").unwrap().template, "/metrics");
    }

    #[test]
    fn unknown_paths_match_nothing() {
        for path in [
            "/",
            "/api/users/",
            "/api/users/a/b",
            "/api/health/",
            "/API/health",
        ] {
            assert_eq!(find(path).map(|route| route.template), None, "{path}");
        }
    }

    #[test]
    fn head_goes_wherever_get_goes() {
        for route in ROUTES {
            assert_eq!(
                route.allows(&Method::GET),
                route.allows(&Method::HEAD),
                "{}",
                route.template
            );
        }
    }
}
