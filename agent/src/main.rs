use clap::Parser;
use nodewarden_agent::config::Config;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    nodewarden_runtime::telemetry::init(config.log_format, &config.log_level, "nodewarden_agent")?;
    let shutdown = nodewarden_runtime::signals::shutdown_on_signals()?;
    if let Err(err) = nodewarden_agent::run(config, shutdown).await {
        tracing::error!(error = format!("{err:#}"), "nodewarden-agent failed");
        return Err(err);
    }
    Ok(())
}
