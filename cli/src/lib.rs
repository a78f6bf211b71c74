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
    /// Only the autoscalers of this namespace. When unset, as kubectl: the context's namespace,
    /// else `default`.
    #[arg(short, long, env = "NODEWARDEN_NAMESPACE")]
    pub namespace: Option<String>,
    /// The autoscalers of every namespace (wins over --namespace).
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Only the DaemonSetAutoscalers with these labels, as kubectl's selector: `app=logs`,
    /// `tier in (infra),team!=web`.
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    pub selector: Option<String>,
    /// Order of the rows (and of the nodes).
    #[arg(long, value_enum, default_value_t = report::SortBy::Change, value_name = "ORDER")]
    pub sort_by: report::SortBy,
    /// No header lines: the table prints one line per row (the first field is
    /// namespace/DaemonSet), the CSV no header record.
    #[arg(long)]
    pub no_headers: bool,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Format::Table, env = "NODEWARDEN_OUTPUT")]
    pub output: Format,
}

impl ReportArgs {
    /// The namespace to read, as kubectl picks it: none with `-A`, else `--namespace`, else
    /// `default_namespace` (the kubeconfig context's namespace, or `default`).
    pub fn scope(&self, default_namespace: &str) -> Option<String> {
        if self.all_namespaces {
            None
        } else {
            Some(
                self.namespace
                    .clone()
                    .unwrap_or_else(|| default_namespace.to_string()),
            )
        }
    }
}

/// Output format of the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Aligned tables (the default).
    Table,
    /// The tables with more columns (the source in the words of the pod's annotation).
    Wide,
    /// JSON; quantities in millicores and bytes.
    Json,
    /// The JSON document as YAML.
    Yaml,
    /// One line per DaemonSet, node and container; quantities in millicores and bytes.
    Csv,
    /// A self-contained HTML page: a summary, then every row in a table to sort and filter.
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
            let namespace = args.scope(client.default_namespace());
            let snapshot =
                report::fetch::snapshot(&client, namespace.as_deref(), args.selector.as_deref()).await?;
            let mut report = report::compute(&snapshot);
            report.sort(args.sort_by);
            let view = report::render::View {
                sort: args.sort_by,
                headers: !args.no_headers,
                namespace,
            };
            let written = match args.output {
                Format::Table => report::render::table(&report, &view, false, out),
                Format::Wide => report::render::table(&report, &view, true, out),
                Format::Json => report::render::json(&report, out),
                Format::Yaml => report::render::yaml(&report, out),
                Format::Csv => report::render::csv(&report, &view, out),
                Format::Html => report::render::html(&report, &view, out),
            };
            written
                .and_then(|()| out.flush())
                .map_err(|e| Error::Output(e.to_string()))
        }
    }
}
