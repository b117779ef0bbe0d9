//! How the manager stops, as GitLab Runner does: a graceful drain (SIGQUIT: take no more jobs,
//! let the running ones finish within `shutdown_timeout`) or a stop (SIGTERM, SIGINT: cancel the
//! running jobs, report them, clean up).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// GitLab Runner's `shutdown_timeout` when config.toml sets none (or 0).
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

/// The manager's two ways of ending. A stop drains too: `drain` is a child of `stop`.
#[derive(Debug, Clone)]
pub struct Shutdown {
    /// Cancelled when no more jobs may be taken; running jobs go on.
    pub drain: CancellationToken,
    /// Cancelled when running jobs must be canceled (and reported) and everything stops.
    pub stop: CancellationToken,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new(CancellationToken::new())
    }
}

impl Shutdown {
    /// A shutdown that stops with `stop` and drains with it or on its own.
    pub fn new(stop: CancellationToken) -> Self {
        Shutdown {
            drain: stop.child_token(),
            stop,
        }
    }

    /// Take no more jobs, and stop once `timeout` has passed while jobs still run. The timer
    /// belongs to the returned task: the caller ends it (abort) when the jobs finish first.
    pub fn drain_within(&self, timeout: Duration) -> tokio::task::JoinHandle<()> {
        self.drain.cancel();
        let stop = self.stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(timeout) => {
                    tracing::warn!(?timeout, "shutdown_timeout passed before the drain finished: stopping (jobs still running are canceled)");
                    stop.cancel();
                }
            }
        })
    }
}

/// The `shutdown_timeout` of config.toml (seconds; 0: GitLab Runner's default, 30 s).
pub fn timeout_of(seconds: u64) -> Duration {
    match seconds {
        0 => DEFAULT_SHUTDOWN_TIMEOUT,
        s => Duration::from_secs(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_drains_and_a_drain_does_not_stop() {
        let s = Shutdown::default();
        s.drain.cancel();
        assert!(!s.stop.is_cancelled());
        let s = Shutdown::default();
        s.stop.cancel();
        assert!(s.drain.is_cancelled());
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_stops_after_its_timeout() {
        let s = Shutdown::default();
        let timer = s.drain_within(Duration::from_secs(30));
        assert!(s.drain.is_cancelled());
        tokio::time::sleep(Duration::from_secs(29)).await;
        assert!(!s.stop.is_cancelled());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(s.stop.is_cancelled());
        let _ = timer.await;
    }

    #[test]
    fn zero_means_gitlab_runners_default() {
        assert_eq!(timeout_of(0), Duration::from_secs(30));
        assert_eq!(timeout_of(5), Duration::from_secs(5));
    }
}
