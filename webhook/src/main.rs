use clap::Parser;
use nodewarden_webhook::config::{Command, Config, CrdsCommand};

fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    let mut runtime = match config.worker_threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            if n > 1 {
                builder.worker_threads(usize::from(n));
            }
            builder
        }
    };
    runtime.enable_all().build()?.block_on(serve(config))
}

async fn serve(config: Config) -> anyhow::Result<()> {
    nodewarden_runtime::telemetry::init(config.log_format, &config.log_level, "nodewarden_webhook")?;
    if let Some(Command::Crds(CrdsCommand::Apply { timeout })) = config.command {
        let client = nodewarden_runtime::client::kube_client(config.kubeconfig.as_deref()).await?;
        if let Err(err) = nodewarden_webhook::crds::apply(&client, timeout).await {
            tracing::error!(error = %err, "nodewarden-webhook crds apply failed");
            return Err(err.into());
        }
        return Ok(());
    }
    let shutdown = nodewarden_runtime::signals::shutdown_on_signals()?;
    if let Err(err) = nodewarden_webhook::run(config, shutdown).await {
        tracing::error!(error = format!("{err:#}"), "nodewarden-webhook failed");
        return Err(err);
    }
    Ok(())
}
