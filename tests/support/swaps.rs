//! Swapping a running host's guest: the file replaced as `cargo` and editors do, `SIGHUP`, and
//! clients that keep asking meanwhile.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Host, get};

/// Replaces `live` with `source` the way `cargo` and editors do: write aside, then rename.
pub fn replace_by_rename(live: &Path, source: &Path) {
    let aside = live.with_extension("next");
    std::fs::copy(source, &aside).unwrap();
    std::fs::rename(&aside, live).unwrap();
}

/// `GET /api/health`: the status and the JSON body (`null` when the body is not JSON).
pub async fn health(host: &Host) -> (u16, Value) {
    get(host, "/api/health").await
}

/// Polls `/api/health` until it reports `version`, or panics after 20 s.
pub async fn wait_for_version(host: &Host, version: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while health(host).await.1["version"] != version {
        assert!(
            Instant::now() < deadline,
            "the guest never became version {version}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `swaps` swaps that alternate between `first` and `second` (a component and its version).
pub fn alternating<'a>(
    first: (PathBuf, &'a str),
    second: (PathBuf, &'a str),
    swaps: usize,
) -> Vec<(PathBuf, &'a str)> {
    (0..swaps)
        .map(|swap| {
            if swap % 2 == 0 {
                first.clone()
            } else {
                second.clone()
            }
        })
        .collect()
}

/// Four clients asking `/api/health` without pause while `live` becomes each of `swaps` in turn
/// (its component and the version it reports), with a `SIGHUP` and a wait for that version each
/// time: every answer they got.
pub async fn answers_while_swapping(
    host: &Arc<Host>,
    live: &Path,
    swaps: &[(PathBuf, &str)],
) -> Vec<(u16, Value)> {
    let stop = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = (0..4)
        .map(|_| {
            let (host, stop) = (Arc::clone(host), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut answers = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    answers.push(health(&host).await);
                }
                answers
            })
        })
        .collect();
    for (source, version) in swaps {
        replace_by_rename(live, source);
        host.signal("HUP");
        wait_for_version(host, version).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut answers = Vec::new();
    for task in load {
        answers.extend(task.await.unwrap());
    }
    answers
}

/// Panics unless every answer is a 200 and each of `versions` answered at least once.
pub fn assert_every_answer_ok(answers: &[(u16, Value)], versions: &[&str]) {
    let failed: Vec<_> = answers
        .iter()
        .filter(|(status, _)| *status != 200)
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} requests failed: {failed:?}",
        failed.len(),
        answers.len()
    );
    for version in versions {
        assert!(
            answers.iter().any(|(_, body)| body["version"] == *version),
            "{version} never served"
        );
    }
}
