use std::process::ExitCode;

use clap::Parser;
use nodewarden_agent::config::Config;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let config = Config::parse();
    if let Err(err) =
        nodewarden_runtime::telemetry::init(config.log_format, &config.log_level, "nodewarden_agent")
    {
        // no logger yet: said once, on stderr
        eprintln!("nodewarden-agent: {err:#}");
        return ExitCode::FAILURE;
    }
    let result = match nodewarden_runtime::signals::shutdown_on_signals() {
        Ok(shutdown) => nodewarden_agent::run(config, shutdown).await,
        Err(err) => Err(err),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // logged once, in the log's format; not printed again on the way out
            tracing::error!(error = format!("{err:#}"), "nodewarden-agent failed");
            ExitCode::FAILURE
        }
    }
}
