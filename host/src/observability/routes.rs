//! Route templates. The guest owns routing and names the template each request matched
//! (`telemetry.set-route`); the host labels spans and metrics with it, a bounded set per guest.
//! The host knows one route of its own, `/metrics`, and nothing of the guest's API.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// The host's own metrics endpoint unless `--metrics-path` moves it.
pub const METRICS_PATH: &str = "/metrics";
/// The longest path `--metrics-path` takes.
const MAX_METRICS_PATH_BYTES: usize = 1024;

/// Where the host serves its metrics page: a path of its own, or nowhere (`off`), so that a
/// guest may own `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricsPath {
    /// The host serves no metrics page; every path goes to the guest.
    Off,
    /// The host answers this path itself.
    At(Arc<str>),
}

impl Default for MetricsPath {
    fn default() -> MetricsPath {
        MetricsPath::At(Arc::from(METRICS_PATH))
    }
}

impl MetricsPath {
    /// `off`, or a `/`-rooted path of printable ASCII; empty counts as unset (the default).
    pub fn parse(value: &str) -> Result<MetricsPath, String> {
        match value {
            "off" => Ok(MetricsPath::Off),
            "" => Ok(MetricsPath::default()),
            path if path.starts_with('/')
                && path.len() <= MAX_METRICS_PATH_BYTES
                && path
                    .bytes()
                    .all(|byte| byte.is_ascii_graphic() && byte != b'?') =>
            {
                Ok(MetricsPath::At(Arc::from(path)))
            }
            _ => Err(format!(
                "expected `off` or a path starting with `/`, without spaces or a query (at most \
                 {MAX_METRICS_PATH_BYTES} bytes)"
            )),
        }
    }

    /// The path the host answers itself, if any.
    pub fn path(&self) -> Option<&Arc<str>> {
        match self {
            MetricsPath::Off => None,
            MetricsPath::At(path) => Some(path),
        }
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

/// A `/`-rooted path of printable ASCII (no spaces), short enough to be a label, and not the
/// host's own route's default path (a guest's `/metrics` with the host's page moved is labelled
/// [`OTHER`]: one rule, whatever the flags).
fn is_template(template: &str) -> bool {
    template != METRICS_PATH
        && template.starts_with('/')
        && template.len() <= MAX_TEMPLATE_BYTES
        && template.bytes().all(|byte| byte.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn the_hosts_own_route_is_no_guests_template() {
        assert!(matches!(
            RouteTemplates::default().label(METRICS_PATH),
            Label::Folded { .. }
        ));
    }
}
