//! Logging set-up: JSON (the default, for clusters) or text, filtered by `--log-level`.

use tracing_subscriber::EnvFilter;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Json,
    Text,
}

/// Installs the global subscriber. `filter` uses `tracing_subscriber`'s directive syntax.
pub fn init(format: LogFormat, filter: &str) -> anyhow::Result<()> {
    let filter = EnvFilter::try_new(filter).map_err(|e| {
        anyhow::anyhow!("invalid --log-level {filter:?}: {e} (e.g. info, debug, nodewarden_agent=debug)")
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
    result.map_err(|e| anyhow::anyhow!("installing the logger: {e}"))
}
