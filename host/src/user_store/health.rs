//! Whether PostgreSQL answers, for the readiness page: judged at once, without a query of its
//! own on the request's path, from the store's calls and from a probe run in the background.
//!
//! A call that succeeded a moment ago says the database answers, however busy the pool is, so a
//! loaded host stays ready. Otherwise a probe (`SELECT 1`) runs every second, whoever asks or
//! not; a probe that failed, or that has not answered within a second, makes the store not ready
//! until a call succeeds again.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::user_store::user::Unavailable;

/// A call that succeeded this recently shows that the database answers.
pub const RECENT_SUCCESS: Duration = Duration::from_secs(2);
/// Probes start at most this often.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);
/// A probe still running after this long counts as no answer.
pub const PROBE_ANSWER_WITHIN: Duration = Duration::from_secs(1);

/// What the store knows of the database's answers.
#[derive(Debug)]
pub struct Health {
    /// When the store was made: the origin of `last_success_ms`.
    opened: Instant,
    /// Milliseconds after `opened` when a call last succeeded.
    last_success_ms: AtomicU64,
    probe: Mutex<Probe>,
    /// `postgres://host:port/database`, for the message of a probe that does not answer.
    target: String,
}

/// The background probe's state.
#[derive(Debug, Default)]
struct Probe {
    started: Option<Instant>,
    running: bool,
    /// When the last probe failed, and why.
    failure: Option<(Instant, Unavailable)>,
}

impl Health {
    /// The health of a store made at `now`, its database at `target`.
    pub fn new(now: Instant, target: String) -> Health {
        Health {
            opened: now,
            last_success_ms: AtomicU64::new(0),
            probe: Mutex::default(),
            target,
        }
    }

    /// A call succeeded at `now`.
    pub fn succeeded_at(&self, now: Instant) {
        // Rounded up: a failure in the same millisecond, just before, no longer counts.
        let ms = now
            .saturating_duration_since(self.opened)
            .as_micros()
            .div_ceil(1000);
        self.last_success_ms
            .fetch_max(u64::try_from(ms).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// When a call last succeeded.
    fn last_success(&self) -> Instant {
        self.opened + Duration::from_millis(self.last_success_ms.load(Ordering::Relaxed))
    }

    /// Whether a probe should start at `now`; when it should, it is counted as running.
    pub fn start_probe(&self, now: Instant) -> bool {
        if now.saturating_duration_since(self.last_success()) < PROBE_EVERY {
            return false;
        }
        let mut probe = self
            .probe
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let due = probe
            .started
            .is_none_or(|started| now.saturating_duration_since(started) >= PROBE_EVERY);
        if probe.running || !due {
            return false;
        }
        probe.running = true;
        probe.started = Some(now);
        true
    }

    /// The probe started by [`Health::start_probe`] ended at `now` with `outcome`.
    pub fn probe_ended(&self, now: Instant, outcome: Result<(), Unavailable>) {
        let mut probe = self
            .probe
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        probe.running = false;
        probe.failure = outcome.err().map(|failure| (now, failure));
    }

    /// Whether the database answers, as far as is known at `now`; why not, when it does not.
    pub fn verdict(&self, now: Instant) -> Result<(), Unavailable> {
        let last_success = self.last_success();
        if now.saturating_duration_since(last_success) < RECENT_SUCCESS {
            return Ok(());
        }
        let probe = self
            .probe
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if let Some((failed_at, failure)) = &probe.failure
            && *failed_at > last_success
        {
            return Err(failure.clone());
        }
        match probe.started {
            Some(started)
                if probe.running
                    && now.saturating_duration_since(started) > PROBE_ANSWER_WITHIN =>
            {
                Err(Unavailable(format!(
                    "{}: no answer within {} ms",
                    self.target,
                    PROBE_ANSWER_WITHIN.as_millis()
                )))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(start: Instant, ms: u64) -> Instant {
        start + Duration::from_millis(ms)
    }

    fn refused() -> Unavailable {
        Unavailable("postgres://db:5432/x: connection refused".into())
    }

    /// A store opened at `start` whose first probe started 3 s later.
    fn probing_since_3_s() -> (Instant, Health) {
        let start = Instant::now();
        let health = Health::new(start, "postgres://db:5432/x".into());
        assert!(health.start_probe(after(start, 3_000)));
        (start, health)
    }

    #[test]
    fn a_store_that_answered_a_moment_ago_is_ready_and_needs_no_probe() {
        let start = Instant::now();
        let health = Health::new(start, "postgres://db:5432/x".into());
        assert_eq!(health.verdict(after(start, 1_500)), Ok(()));
        health.succeeded_at(after(start, 5_000));
        assert!(!health.start_probe(after(start, 5_500)));
        assert_eq!(health.verdict(after(start, 6_900)), Ok(()));
    }

    #[test]
    fn probes_start_at_most_once_a_second_whatever_they_found() {
        let (start, health) = probing_since_3_s();
        // One runs: no second one.
        assert!(!health.start_probe(after(start, 3_100)));
        health.probe_ended(after(start, 3_010), Err(refused()));
        assert!(!health.start_probe(after(start, 3_500)));
        assert!(health.start_probe(after(start, 4_000)));
    }

    #[test]
    fn a_failed_probe_makes_the_store_not_ready_until_a_call_succeeds() {
        let (start, health) = probing_since_3_s();
        health.probe_ended(after(start, 3_010), Err(refused()));
        assert_eq!(health.verdict(after(start, 3_020)), Err(refused()));
        assert_eq!(health.verdict(after(start, 9_000)), Err(refused()));
        health.succeeded_at(after(start, 9_100));
        assert_eq!(health.verdict(after(start, 9_200)), Ok(()));
        // Long after that call, the old failure still does not count.
        assert_eq!(health.verdict(after(start, 20_000)), Ok(()));
    }

    #[test]
    fn a_probe_without_an_answer_within_a_second_makes_the_store_not_ready() {
        let (start, health) = probing_since_3_s();
        assert_eq!(health.verdict(after(start, 3_900)), Ok(()));
        let hung = health.verdict(after(start, 4_100)).unwrap_err();
        assert_eq!(hung.0, "postgres://db:5432/x: no answer within 1000 ms");
        health.probe_ended(after(start, 4_200), Ok(()));
        health.succeeded_at(after(start, 4_200));
        assert_eq!(health.verdict(after(start, 4_300)), Ok(()));
    }
}
