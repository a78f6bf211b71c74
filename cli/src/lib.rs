//! `kubectl-nodewarden`: what nodewarden does, seen from a user's kubeconfig.
//!
//! Installed on the `PATH` as `kubectl-nodewarden`, it runs as `kubectl nodewarden <command>`.
//! `report` puts every autoscaled DaemonSet's template beside each node's pod and recommendation
//! ([`report`]). The library holds everything; `main.rs` only parses flags and prints errors,
//! so tests drive [`run`] with real flags.

#![warn(missing_docs)]

pub mod error;
pub mod report;

use std::io::Write;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

pub use error::Error;

/// kubectl nodewarden: per-node right-sizing of DaemonSet pods, seen from your kubeconfig.
#[derive(Debug, Parser)]
#[command(name = "kubectl-nodewarden", bin_name = "kubectl nodewarden", version)]
pub struct Cli {
    /// Kubeconfig file to use. When unset, as kubectl: the files listed in KUBECONFIG (separated
    /// by `:`), else ~/.kube/config, else the in-cluster service account.
    #[arg(long, global = true, env = "NODEWARDEN_KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Context of the kubeconfig to use; its current context when unset.
    #[arg(long, global = true, env = "NODEWARDEN_CONTEXT", value_name = "NAME")]
    pub context: Option<String>,
    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands of `kubectl nodewarden`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Per DaemonSet and node: template, current requests, target and bounds, OOM kills, and what
    /// the fleet would free or need on top.
    Report(ReportArgs),
}

/// Flags of `kubectl nodewarden report`.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// Only the autoscalers of this namespace; every namespace when unset.
    #[arg(short, long, env = "NODEWARDEN_NAMESPACE")]
    pub namespace: Option<String>,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Format::Table, env = "NODEWARDEN_OUTPUT")]
    pub output: Format,
}

/// Output format of the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Aligned tables (the default).
    Table,
    /// JSON; quantities in millicores and bytes.
    Json,
    /// One line per DaemonSet, node and container; quantities in millicores and bytes.
    Csv,
    /// A self-contained HTML page with a chart per node.
    Html,
}

/// A client for the kubeconfig and context given, as kubectl would pick them.
pub async fn client(kubeconfig: Option<&std::path::Path>, context: Option<&str>) -> Result<Client, Error> {
    let options = KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    let config = match (kubeconfig, context) {
        (Some(path), _) => {
            let file =
                Kubeconfig::read_from(path).map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?
        }
        (None, Some(_)) => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| Error::Config(e.to_string()))?,
        (None, None) => kube::Config::infer()
            .await
            .map_err(|e| Error::Config(e.to_string()))?,
    };
    Client::try_from(config).map_err(|e| Error::Config(e.to_string()))
}

/// Runs one command, writing its output to `out`.
pub async fn run(cli: &Cli, out: &mut dyn Write) -> Result<(), Error> {
    match &cli.command {
        Command::Report(args) => {
            let client = client(cli.kubeconfig.as_deref(), cli.context.as_deref()).await?;
            let snapshot = report::fetch::snapshot(&client, args.namespace.as_deref()).await?;
            let report = report::compute(&snapshot);
            let written = match args.output {
                Format::Table => report::render::table(&report, out),
                Format::Json => report::render::json(&report, out),
                Format::Csv => report::render::csv(&report, out),
                Format::Html => report::render::html(&report, out),
            };
            written
                .and_then(|()| out.flush())
                .map_err(|e| Error::Output(e.to_string()))
        }
    }
}
