//! Graceful shutdown: one token, cancelled on SIGTERM (the kubelet stopping the pod) or SIGINT.

#[cfg(unix)]
use anyhow::Context;
#[cfg(unix)]
use tokio_util::sync::CancellationToken;

/// Cancels the returned token on SIGTERM or SIGINT. Needs a running tokio runtime. Unix only:
/// the webhook and the agent run on Linux; the kubectl plugin, built for Windows too, links this
/// crate for its other parts and never calls this.
#[cfg(unix)]
pub fn shutdown_on_signals() -> anyhow::Result<CancellationToken> {
    use tokio::signal::unix::{SignalKind, signal};
    let token = CancellationToken::new();
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let t = token.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
        t.cancel();
    });
    Ok(token)
}
