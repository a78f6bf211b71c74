use std::process::ExitCode;

use clap::Parser;
use nodewarden_webhook::config::{Command, Config, CrdsCommand};

fn main() -> ExitCode {
    let config = Config::parse();
    if let Err(err) =
        nodewarden_runtime::telemetry::init(config.log_format, &config.log_level, "nodewarden_webhook")
    {
        // no logger yet: said once, on stderr
        eprintln!("nodewarden-webhook: {err:#}");
        return ExitCode::FAILURE;
    }
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
    let crds_apply = matches!(config.command, Some(Command::Crds(CrdsCommand::Apply { .. })));
    let result = match runtime.enable_all().build() {
        Ok(runtime) => runtime.block_on(serve(config)),
        Err(err) => Err(anyhow::Error::from(err).context("starting the Tokio runtime")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // logged once, in the log's format; not printed again on the way out
            let what = if crds_apply {
                "nodewarden-webhook crds apply failed"
            } else {
                "nodewarden-webhook failed"
            };
            tracing::error!(error = format!("{err:#}"), "{what}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(config: Config) -> anyhow::Result<()> {
    if let Some(Command::Crds(CrdsCommand::Apply { timeout })) = config.command {
        let client = nodewarden_runtime::client::kube_client(config.kubeconfig.as_deref()).await?;
        nodewarden_webhook::crds::apply(&client, timeout).await?;
        return Ok(());
    }
    let shutdown = nodewarden_runtime::signals::shutdown_on_signals()?;
    nodewarden_webhook::run(config, shutdown).await
}
