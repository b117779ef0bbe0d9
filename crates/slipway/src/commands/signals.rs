//! Signals: SIGTERM and SIGINT stop a command (a second one exits at once); for the manager,
//! SIGQUIT drains it first.

use anyhow::Context as _;
use slipway_manager::shutdown::Shutdown;
use tokio_util::sync::CancellationToken;

/// The manager's shutdown: SIGQUIT drains it (no more jobs; the running ones finish within
/// `shutdown_timeout`), the first SIGTERM or SIGINT stops it, a second one exits at once.
pub fn manager_signals() -> anyhow::Result<Shutdown> {
    use tokio::signal::unix::{SignalKind, signal};
    let shutdown = Shutdown::new(shutdown_signal()?);
    let mut quit = signal(SignalKind::quit()).context("installing SIGQUIT handler")?;
    let drain = shutdown.drain.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = quit.recv() => {
                tracing::info!("SIGQUIT: finishing the running jobs, taking no new ones (SIGTERM to stop now)");
                drain.cancel();
            }
            _ = drain.cancelled() => {}
        }
    });
    Ok(shutdown)
}

/// A token cancelled on the first SIGTERM or SIGINT; a second one exits at once.
pub fn shutdown_signal() -> anyhow::Result<CancellationToken> {
    use tokio::signal::unix::{SignalKind, signal};
    let token = CancellationToken::new();
    let mut term = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let t = token.clone();
    tokio::spawn(async move {
        for round in 0..2 {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            if round == 0 {
                tracing::info!("shutting down: finishing cleanup (signal again to exit at once)");
                t.cancel();
            } else {
                eprintln!("second signal: exiting without cleanup");
                std::process::exit(130);
            }
        }
    });
    Ok(token)
}
