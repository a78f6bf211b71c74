use clap::Parser;
use nodewarden_webhook::config::Config;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    nodewarden_runtime::telemetry::init(config.log_format, &config.log_level, "nodewarden_webhook")?;
    let shutdown = nodewarden_runtime::signals::shutdown_on_signals()?;
    if let Err(err) = nodewarden_webhook::run(config, shutdown).await {
        tracing::error!(error = format!("{err:#}"), "nodewarden-webhook failed");
        return Err(err);
    }
    Ok(())
}
