//! Swapping the guest while the host runs: on `SIGHUP`, and on file change with `--watch`.
//!
//! A reload reads and compiles the new component on a blocking thread (off the request path),
//! links and pre-instantiates it, sends it one `GET` of the probe path (`/api/health` unless
//! `--probe-path` says otherwise, or none), and only then swaps it in.
//! Requests already running finish on the old guest; new ones get the new guest. Under reuse,
//! the old guest's idle instances go at the swap and its busy ones once their requests end, so
//! their places are the new guest's. A guest that
//! cannot be read, compiled, linked or instantiated, or whose probe is not a 200, is
//! rejected: one error line says why, and the running guest keeps serving.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use notify::{RecommendedWatcher, RecursiveMode, Watcher};

use crate::error::{Error, one_line};
use crate::observability::metrics::Metrics;
use crate::runtime::cache::CacheOutcome;
use crate::runtime::engine::Runtime;
use crate::runtime::guest::{Guest, Serving, ServingGuest};
use crate::runtime::probe::ProbePath;

/// How long the file must stay quiet before a change is reloaded: editors and `cargo` write,
/// truncate and rename in bursts.
pub const WATCH_DEBOUNCE: Duration = Duration::from_millis(250);

/// Reloads the guest at one path into one [`Serving`].
pub struct Reloader {
    runtime: Arc<Runtime>,
    serving: Arc<Serving>,
    metrics: Arc<Metrics>,
    path: PathBuf,
    /// Where a new guest must answer 200 before it is swapped in.
    probe_path: ProbePath,
    /// Reloads run one at a time, so two triggers cannot race to swap.
    one_at_a_time: tokio::sync::Mutex<()>,
}

impl Reloader {
    /// A reloader of the component at `path` into `serving`, probing new guests on
    /// `probe_path`, counting reloads in `metrics`.
    pub fn new(
        runtime: Arc<Runtime>,
        serving: Arc<Serving>,
        metrics: Arc<Metrics>,
        path: PathBuf,
        probe_path: ProbePath,
    ) -> Reloader {
        Reloader {
            runtime,
            serving,
            metrics,
            path,
            probe_path,
            one_at_a_time: tokio::sync::Mutex::new(()),
        }
    }

    /// Loads the guest from its path and swaps it in if it passes; returns its version.
    pub async fn reload(&self, trigger: &'static str) -> Result<String, Error> {
        let _one_at_a_time = self.one_at_a_time.lock().await;
        let started = Instant::now();
        let path = self.path.display().to_string();
        match self.load_and_probe().await {
            Ok((guest, version, cache)) => {
                let new = ServingGuest {
                    guest,
                    version: version.clone(),
                };
                let old = self.serving.swap(new);
                old.guest.retire();
                self.metrics.observe_reload(true);
                tracing::info!(
                    trigger,
                    path,
                    old_version = %old.version,
                    new_version = version,
                    cache = cache.as_str(),
                    load_ms = started.elapsed().as_millis() as u64,
                    "guest reloaded"
                );
                Ok(version)
            }
            Err(error) => {
                self.metrics.observe_reload(false);
                let why = one_line(&error);
                tracing::error!(
                    trigger,
                    path,
                    error = why,
                    "guest reload rejected; the running guest keeps serving"
                );
                Err(error)
            }
        }
    }

    async fn load_and_probe(&self) -> Result<(Guest, String, CacheOutcome), Error> {
        let runtime = Arc::clone(&self.runtime);
        let path = self.path.clone();
        let (guest, cache) = tokio::task::spawn_blocking(move || runtime.load(&path))
            .await
            .map_err(Error::LoadTask)??;
        let version = guest.probe_version(&self.probe_path).await?;
        Ok((guest, version, cache))
    }

    /// Reloads on every `SIGHUP` until the process ends. The handler is in place when this
    /// returns (a `SIGHUP` before that would end the process); the reloads run in a task.
    pub fn reload_on_sighup(self: Arc<Self>) {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut hangups) = signal(SignalKind::hangup()) else {
            tracing::warn!("cannot listen for SIGHUP; reload by signal is off");
            return;
        };
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                let _ = self.reload("SIGHUP").await;
            }
        });
    }

    /// Reloads whenever the guest file changes. It watches the file's directory, so a file
    /// replaced by a rename (as `cargo` and most editors do) is seen too. The watch lasts as
    /// long as the returned watcher.
    pub fn watch(self: Arc<Self>) -> notify::Result<RecommendedWatcher> {
        let (changed, mut changes) = tokio::sync::mpsc::unbounded_channel();
        let file_name = self.path.file_name().map(|name| name.to_owned());
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                let Ok(event) = event else { return };
                let ours = event
                    .paths
                    .iter()
                    .any(|path| path.file_name() == file_name.as_deref());
                if ours && !event.kind.is_access() {
                    let _ = changed.send(());
                }
            })?;
        let directory = match self.path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
            _ => PathBuf::from("."),
        };
        watcher.watch(&directory, RecursiveMode::NonRecursive)?;
        tracing::info!(
            path = %self.path.display(),
            directory = %directory.display(),
            "watching the guest file: a change reloads it"
        );
        tokio::spawn(async move {
            while changes.recv().await.is_some() {
                loop {
                    match tokio::time::timeout(WATCH_DEBOUNCE, changes.recv()).await {
                        Ok(Some(())) => continue,
                        Ok(None) => return,
                        Err(_quiet) => break,
                    }
                }
                let _ = self.reload("file change").await;
            }
        });
        Ok(watcher)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::GuestLimits;
    use crate::runtime::built::built_component;
    use crate::runtime::cache::ComponentCache;

    /// A directory of this test's own, empty.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("reload-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A service serving the real guest, and a reloader of the file at `path` into it.
    fn reloader_of(path: PathBuf, scratch: &std::path::Path) -> Reloader {
        let cache = ComponentCache::new(scratch.join("cache"));
        let runtime = Arc::new(Runtime::new(cache, GuestLimits::default()).unwrap());
        let (guest, _) = runtime.load(&built_component("guest")).unwrap();
        let serving = Arc::new(Serving::new(ServingGuest {
            guest,
            version: "serving".to_string(),
        }));
        let metrics = Arc::new(Metrics::new());
        Reloader::new(runtime, serving, metrics, path, ProbePath::Off)
    }

    #[tokio::test]
    async fn a_file_that_is_not_a_component_is_rejected_and_the_serving_guest_stays() {
        let dir = scratch("garbage");
        let path = dir.join("guest.wasm");
        std::fs::write(&path, b"\0asm but nothing more").unwrap();
        let reloader = reloader_of(path, &dir);
        assert!(matches!(
            reloader.reload("test").await,
            Err(Error::GuestInvalid { .. })
        ));
        assert_eq!(reloader.serving.current().version, "serving");
        let page = reloader.metrics.render(None);
        assert!(
            page.contains(r#"guest_reloads_total{result="failure"} 1"#),
            "{page}"
        );
    }

    #[tokio::test]
    async fn a_missing_file_is_rejected_and_the_serving_guest_stays() {
        let dir = scratch("missing");
        let reloader = reloader_of(dir.join("nowhere.wasm"), &dir);
        assert!(matches!(
            reloader.reload("test").await,
            Err(Error::GuestUnreadable { .. })
        ));
        assert_eq!(reloader.serving.current().version, "serving");
    }

    #[tokio::test]
    async fn a_valid_component_is_swapped_in() {
        let dir = scratch("valid");
        let reloader = reloader_of(built_component("minimal-guest"), &dir);
        // Probing is off: the version is not asked for.
        assert_eq!(reloader.reload("test").await.unwrap(), "unknown");
        assert_eq!(reloader.serving.current().version, "unknown");
        let page = reloader.metrics.render(None);
        assert!(
            page.contains(r#"guest_reloads_total{result="success"} 1"#),
            "{page}"
        );
    }
}
