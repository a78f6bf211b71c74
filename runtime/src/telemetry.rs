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
    let result = match format {
        LogFormat::Json => {
            tracing::subscriber::set_global_default(json(filter, std::io::stderr)).map_err(|e| e.to_string())
        }
        LogFormat::Text => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            // colours only for a person at a terminal, not in a file or a pipe
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init()
            .map_err(|e| e.to_string()),
    };
    result.map_err(|e| anyhow::anyhow!("installing the logger: {e}"))
}

/// The JSON subscriber of [`init`], writing to `writer` (tests capture the lines with it).
///
/// Each line is one flat object: `timestamp`, `level`, the event's fields, `message` (the
/// event's text) and the current span's name and fields under `span`. An event field must not be named
/// `message` (it would be written a second time under the same key, and JSON readers keep only
/// one of the two): nodewarden's events name a denial's text `reason`.
pub fn json<W>(filter: EnvFilter, writer: W) -> impl tracing::Subscriber + Send + Sync + 'static
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .json()
        .flatten_event(true)
        .with_current_span(true)
        // the current span carries the request's fields; the list of all spans would repeat them
        .with_span_list(false)
        .finish()
}
