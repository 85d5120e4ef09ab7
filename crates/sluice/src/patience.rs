//! How a start waits out a server's passing fault (docs/operations.md, "Starting").
//!
//! Once the preflight has seen every server answer, a step of the start that then fails on
//! one of them — PostgreSQL restarting, the broker cutting its connections — is most likely a
//! fault that passes in seconds, as a running node rides it out. So on servers each step is
//! tried again, with a growing pause, for up to [`Patience::ON_SERVERS`]; its last error ends
//! the start. On the embedded default there is nothing to wait for: a step fails at once.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// How a start's steps are tried again.
#[derive(Clone, Copy, Debug)]
pub struct Patience {
    /// How long a failing step is tried again, from its first failure; zero: not again.
    window: Duration,
    /// The pause after the first failure; each next one is twice the last, up to
    /// [`Patience::MAX_PAUSE`].
    first_pause: Duration,
}

impl Patience {
    /// How long a start on servers tries a failing step again: longer than a PostgreSQL
    /// restart or a broker's leader election takes, short enough that a lasting fault still
    /// ends the start where a supervisor sees it.
    pub const ON_SERVERS: Duration = Duration::from_secs(60);
    const FIRST_PAUSE: Duration = Duration::from_millis(250);
    const MAX_PAUSE: Duration = Duration::from_secs(5);

    /// Tries each step again for `window` after it first fails.
    pub fn new(window: Duration) -> Self {
        Self { window, first_pause: Self::FIRST_PAUSE }
    }

    /// A step fails at once.
    pub fn none() -> Self {
        Self::new(Duration::ZERO)
    }

    /// Runs `step` until it succeeds or the window since its first failure has passed; the
    /// error is the last attempt's (a step names itself in its errors' context). Each failure
    /// but the last is a warning in the log.
    pub async fn run<T, F, Fut>(&self, mut step: F) -> anyhow::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = anyhow::Result<T>>,
    {
        let mut pause = self.first_pause;
        let mut until = None;
        loop {
            let error = match step().await {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            let until = *until.get_or_insert_with(|| Instant::now() + self.window);
            if Instant::now() + pause > until {
                return Err(error);
            }
            tracing::warn!(
                error = format!("{error:#}"),
                retry_in_ms = pause.as_millis(),
                "a step of the start failed; trying again"
            );
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Self::MAX_PAUSE);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use anyhow::Context;

    use super::*;

    fn quick(window: Duration) -> Patience {
        Patience { window, first_pause: Duration::from_millis(1) }
    }

    /// A step that fails its first `failures` attempts, counting them all.
    async fn flaky(attempts: &AtomicU32, failures: u32) -> anyhow::Result<u32> {
        let attempt = attempts.fetch_add(1, Ordering::SeqCst) + 1;
        if attempt <= failures {
            return Err(anyhow::anyhow!("connection reset (attempt {attempt})"))
                .context("resuming jobs");
        }
        Ok(attempt)
    }

    #[tokio::test]
    async fn a_step_that_fails_a_few_times_succeeds_within_the_window() {
        let attempts = AtomicU32::new(0);
        let patience = quick(Duration::from_secs(10));
        let value = patience.run(|| flaky(&attempts, 3)).await.unwrap();
        assert_eq!(value, 4);
        assert_eq!(attempts.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn a_lasting_fault_ends_the_step_with_its_last_error() {
        let attempts = AtomicU32::new(0);
        let patience = quick(Duration::from_millis(40));
        let error = patience.run(|| flaky(&attempts, u32::MAX)).await.unwrap_err();
        let tried = attempts.load(Ordering::SeqCst);
        assert!(tried > 1, "tried {tried} times");
        assert_eq!(
            format!("{error:#}"),
            format!("resuming jobs: connection reset (attempt {tried})")
        );
    }

    #[tokio::test]
    async fn without_patience_the_first_failure_ends_the_step() {
        let attempts = AtomicU32::new(0);
        let error = Patience::none().run(|| flaky(&attempts, 1)).await.unwrap_err();
        assert_eq!(attempts.load(Ordering::SeqCst), 1);
        assert_eq!(format!("{error:#}"), "resuming jobs: connection reset (attempt 1)");
    }
}
