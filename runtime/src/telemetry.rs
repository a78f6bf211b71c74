//! Logging set-up: JSON (the default, for clusters) or text, filtered by `--log-level`.

use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object a line, with the current span's fields.
    Json,
    /// Human-readable text.
    Text,
}

/// Installs the global subscriber, writing to stderr. `filter` uses `tracing_subscriber`'s
/// directive syntax (`info`, `nodewarden_webhook=debug,info`); `binary` names the crate the
/// error message suggests a directive for.
pub fn init(format: LogFormat, filter: &str, binary: &str) -> anyhow::Result<()> {
    let filter = EnvFilter::try_new(filter).map_err(|e| {
        anyhow::anyhow!("invalid --log-level {filter:?}: {e} (e.g. info, debug, {binary}=debug)")
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
        LogFormat::Text => builder.try_init(),
    };
    result.map_err(|e| anyhow::anyhow!("installing the logger: {e}"))
}
