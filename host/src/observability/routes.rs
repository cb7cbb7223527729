//! Route templates. The guest owns routing and names the template each request matched
//! (`telemetry.set-route`); the host labels spans and metrics with it, a bounded set per guest.
//! The host knows three routes of its own, its pages (`/metrics`, `/livez`, `/readyz`), and
//! nothing of the guest's API.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use http::Method;

/// The host's own metrics page unless `--metrics-path` moves it.
pub const METRICS_PATH: &str = "/metrics";
/// The host's liveness page unless `--live-path` moves it.
pub const LIVE_PATH: &str = "/livez";
/// The host's readiness page unless `--ready-path` moves it.
pub const READY_PATH: &str = "/readyz";
/// The methods OpenTelemetry's HTTP conventions know; any other is named [`OTHER_METHOD`].
const STANDARD_METHODS: &[Method] = &[
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::CONNECT,
    Method::OPTIONS,
    Method::TRACE,
    Method::PATCH,
];
/// `http.request.method` of a request whose method is not a standard one.
pub const OTHER_METHOD: &str = "_OTHER";

/// The method's name when it is one of the nine standard ones; clients choose methods, so only
/// these may become span names or label values.
pub fn standard_method(method: &Method) -> Option<&'static str> {
    STANDARD_METHODS
        .iter()
        .find(|standard| *standard == method)
        .map(Method::as_str)
}
/// The longest path a page's flag takes.
const MAX_PAGE_PATH_BYTES: usize = 1024;

/// Where the host serves one of its own pages: a path of its own, or nowhere (`off`), so that
/// a guest may own the path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPath {
    /// The host serves no such page; the path goes to the guest.
    Off,
    /// The host answers this path itself.
    At(Arc<str>),
}

impl HostPath {
    /// The parser of a page's flag whose default is `default`: `off`, or a `/`-rooted path of
    /// printable ASCII; empty counts as unset (the default).
    pub fn parser(
        default: &'static str,
    ) -> impl Fn(&str) -> Result<HostPath, String> + Clone + Send + Sync + 'static {
        move |value| match value {
            "off" => Ok(HostPath::Off),
            "" => Ok(HostPath::At(Arc::from(default))),
            path if path.starts_with('/')
                && path.len() <= MAX_PAGE_PATH_BYTES
                && path
                    .bytes()
                    .all(|byte| byte.is_ascii_graphic() && byte != b'?') =>
            {
                Ok(HostPath::At(Arc::from(path)))
            }
            _ => Err(format!(
                "expected `off` or a path starting with `/`, without spaces or a query (at most \
                 {MAX_PAGE_PATH_BYTES} bytes)"
            )),
        }
    }

    /// The path the host answers itself, if any.
    pub fn path(&self) -> Option<&Arc<str>> {
        match self {
            HostPath::Off => None,
            HostPath::At(path) => Some(path),
        }
    }
}

/// One of the host's own pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostPage {
    /// The Prometheus page.
    Metrics,
    /// 200 while the host answers at all: for a liveness probe.
    Live,
    /// 200 while the host can serve the API (its guest loaded and probed, its store reachable),
    /// else 503: for a readiness probe.
    Ready,
}

/// Where the host serves each of its pages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPages {
    /// The metrics page.
    pub metrics: HostPath,
    /// The liveness page.
    pub live: HostPath,
    /// The readiness page.
    pub ready: HostPath,
}

impl Default for HostPages {
    fn default() -> HostPages {
        HostPages {
            metrics: HostPath::At(Arc::from(METRICS_PATH)),
            live: HostPath::At(Arc::from(LIVE_PATH)),
            ready: HostPath::At(Arc::from(READY_PATH)),
        }
    }
}

impl HostPages {
    /// The page served at `path`, and that path, if the host serves one there.
    pub fn at(&self, path: &str) -> Option<(HostPage, &Arc<str>)> {
        [
            (HostPage::Metrics, &self.metrics),
            (HostPage::Live, &self.live),
            (HostPage::Ready, &self.ready),
        ]
        .into_iter()
        .find_map(|(page, at)| {
            at.path()
                .filter(|at| at.as_ref() == path)
                .map(|at| (page, at))
        })
    }

    /// Two pages on one path, which start-up refuses, and that path.
    pub fn shared_path(&self) -> Option<(HostPage, HostPage, &str)> {
        let pages = [
            (HostPage::Metrics, self.metrics.path()),
            (HostPage::Live, self.live.path()),
            (HostPage::Ready, self.ready.path()),
        ];
        pages
            .iter()
            .enumerate()
            .find_map(|(index, &(first, path))| {
                let path = path?;
                let (second, _) = pages[index + 1..]
                    .iter()
                    .find(|(_, other)| *other == Some(path))?;
                Some((first, *second, path.as_ref()))
            })
    }
}

/// The route of a request whose guest named no template: an unknown path.
pub const UNMATCHED: &str = "unmatched";
/// The route of a request whose guest named a template past the per-guest cap, or not a
/// template at all.
pub const OTHER: &str = "_OTHER";
/// Distinct templates labelled per loaded guest: far more than an API has, few enough that a
/// guest naming a template per request cannot grow the metrics without bound.
pub const MAX_TEMPLATES_PER_GUEST: usize = 64;
/// The longest template labelled.
pub const MAX_TEMPLATE_BYTES: usize = 128;

/// The templates one loaded guest has named so far.
#[derive(Debug, Default)]
pub struct RouteTemplates {
    known: Mutex<HashSet<Arc<str>>>,
    /// Whether a template was folded into [`OTHER`] yet: said once per guest.
    folded_any: AtomicBool,
}

/// What a template the guest named becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Label {
    /// The template itself, interned.
    Template(Arc<str>),
    /// [`OTHER`].
    Folded {
        /// Whether this is the first template this guest had folded.
        first: bool,
    },
}

impl RouteTemplates {
    /// The label of `template`: itself when it is a valid template and one of the first
    /// [`MAX_TEMPLATES_PER_GUEST`] this guest named, else folded into [`OTHER`].
    pub fn label(&self, template: &str) -> Label {
        if is_template(template) {
            let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(interned) = known.get(template) {
                return Label::Template(Arc::clone(interned));
            }
            if known.len() < MAX_TEMPLATES_PER_GUEST {
                let interned: Arc<str> = Arc::from(template);
                known.insert(Arc::clone(&interned));
                return Label::Template(interned);
            }
        }
        Label::Folded {
            first: !self.folded_any.swap(true, Ordering::Relaxed),
        }
    }
}

/// A `/`-rooted path of printable ASCII (no spaces), short enough to be a label, and not one of
/// the host's pages' default paths (a guest's `/metrics` with the host's page moved is labelled
/// [`OTHER`]: one rule, whatever the flags).
fn is_template(template: &str) -> bool {
    ![METRICS_PATH, LIVE_PATH, READY_PATH].contains(&template)
        && template.starts_with('/')
        && template.len() <= MAX_TEMPLATE_BYTES
        && template.bytes().all(|byte| byte.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_nine_standard_methods_are_named() {
        assert_eq!(standard_method(&Method::GET), Some("GET"));
        assert_eq!(standard_method(&Method::from_bytes(b"BREW").unwrap()), None);
    }

    #[test]
    fn a_template_is_its_own_label_and_interned_once() {
        let templates = RouteTemplates::default();
        let first = templates.label("/api/users/{id}");
        assert_eq!(first, Label::Template(Arc::from("/api/users/{id}")));
        let (Label::Template(a), Label::Template(b)) = (first, templates.label("/api/users/{id}"))
        else {
            panic!("not a template");
        };
        assert!(Arc::ptr_eq(&a, &b));
    }

    #[test]
    fn templates_past_the_cap_are_folded_and_the_first_fold_is_flagged_once() {
        let templates = RouteTemplates::default();
        for i in 0..MAX_TEMPLATES_PER_GUEST {
            assert!(matches!(
                templates.label(&format!("/t/{i}")),
                Label::Template(_)
            ));
        }
        assert_eq!(templates.label("/one/more"), Label::Folded { first: true });
        assert_eq!(templates.label("/and/more"), Label::Folded { first: false });
        // Those already known keep their label.
        assert!(matches!(templates.label("/t/0"), Label::Template(_)));
    }

    #[test]
    fn what_is_not_a_template_is_folded() {
        let templates = RouteTemplates::default();
        let long = format!("/{}", "a".repeat(MAX_TEMPLATE_BYTES));
        for bad in ["", "api/users", "/a b", "/tab\t", "/é", long.as_str()] {
            assert!(
                matches!(templates.label(bad), Label::Folded { .. }),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_hosts_own_routes_are_no_guests_templates() {
        for page in [METRICS_PATH, LIVE_PATH, READY_PATH] {
            assert!(matches!(
                RouteTemplates::default().label(page),
                Label::Folded { .. }
            ));
        }
    }

    #[test]
    fn a_page_is_found_at_its_path_and_nowhere_once_off() {
        let ready = HostPath::parser(READY_PATH);
        let pages = HostPages {
            ready: ready("/ready/now").unwrap(),
            live: ready("off").unwrap(),
            ..HostPages::default()
        };
        assert_eq!(
            pages.at("/ready/now").map(|(page, _)| page),
            Some(HostPage::Ready)
        );
        assert_eq!(
            pages.at("/metrics").map(|(page, _)| page),
            Some(HostPage::Metrics)
        );
        assert_eq!(pages.at(READY_PATH), None);
        assert_eq!(pages.at(LIVE_PATH), None);
        assert_eq!(ready("").unwrap(), HostPath::At(Arc::from(READY_PATH)));
        for bad in ["ready", "/a b", "/a?b", "/é"] {
            assert!(ready(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn two_pages_on_one_path_are_found_out() {
        assert_eq!(HostPages::default().shared_path(), None);
        let pages = HostPages {
            live: HostPath::At(Arc::from(METRICS_PATH)),
            ..HostPages::default()
        };
        assert_eq!(
            pages.shared_path(),
            Some((HostPage::Metrics, HostPage::Live, METRICS_PATH))
        );
        let off = HostPages {
            live: HostPath::Off,
            ready: HostPath::Off,
            ..HostPages::default()
        };
        assert_eq!(off.shared_path(), None);
    }
}
