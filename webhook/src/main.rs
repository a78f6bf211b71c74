use clap::Parser;
use nodewarden_webhook::config::Config;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    nodewarden_webhook::telemetry::init(config.log_format, &config.log_level)?;
    let shutdown = nodewarden_webhook::shutdown_on_signals()?;
    if let Err(err) = nodewarden_webhook::run(config, shutdown).await {
        tracing::error!(error = format!("{err:#}"), "nodewarden-webhook failed");
        return Err(err);
    }
    Ok(())
}
