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
use std::time::Duration;

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
    /// `tier in (infra),team!=web`. With --prometheus: the DaemonSets with these labels.
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
    /// Compute each node's figures from this Prometheus server's history of the kubelet's
    /// cAdvisor series (container_cpu_usage_seconds_total, container_memory_working_set_bytes)
    /// with the agent's estimator, instead of reading NodeRecommendations: works before
    /// nodewarden is installed. Reports every DaemonSet of the namespace (or --daemonset);
    /// one without a DaemonSetAutoscaler gets the defaults. Base URL, e.g.
    /// http://localhost:9090 (docs/history.md).
    #[arg(long, env = "NODEWARDEN_PROMETHEUS", value_name = "URL")]
    pub prometheus: Option<String>,
    /// With --prometheus: only this DaemonSet (repeat for more).
    #[arg(long = "daemonset", value_name = "NAME", requires = "prometheus")]
    pub daemonsets: Vec<String>,
    /// With --prometheus: how far back to read (the estimator weighs a day-old sample half as
    /// much as a new one). At most 90d.
    #[arg(long, default_value = "14d", value_parser = parse_window, value_name = "DURATION")]
    pub window: Duration,
    /// With --prometheus: one sample per this interval (the query's step). 1m gives VPA's
    /// one sample per minute, on which the estimator's confidence counts.
    #[arg(long, default_value = "1m", value_parser = parse_step, value_name = "DURATION")]
    pub resolution: Duration,
    /// With --prometheus: the range of CPU's rate(); at least twice the scrape interval.
    #[arg(long, default_value = "2m", value_parser = parse_step, value_name = "DURATION")]
    pub rate_window: Duration,
    /// With --prometheus: read the history up to this time (RFC 3339, e.g.
    /// 2026-11-28T06:00:00Z; the window ends on the last whole step at or before it), to see what
    /// the figures were then, or to read exactly what an agent seeded (its NodeRecommendation's
    /// lastSampleTime). Default: now, less half the rate window, whose newest samples may still
    /// be on their way to Prometheus.
    #[arg(long, value_parser = parse_time, value_name = "TIME", requires = "prometheus")]
    pub end: Option<k8s_openapi::jiff::Timestamp>,
    /// With --prometheus: a file holding a bearer token to send (read again for each query).
    #[arg(long, env = "NODEWARDEN_PROMETHEUS_TOKEN_FILE", value_name = "FILE")]
    pub prometheus_token_file: Option<PathBuf>,
    /// With --prometheus: a PEM file of CA certificates to trust for https (else the system's).
    #[arg(long, env = "NODEWARDEN_PROMETHEUS_CA_FILE", value_name = "FILE")]
    pub prometheus_ca_file: Option<PathBuf>,
    /// With --prometheus: how long one query may take.
    #[arg(long, default_value = "30s", value_parser = parse_step, value_name = "DURATION")]
    pub prometheus_timeout: Duration,
    /// With --prometheus: most series one query may return (one per pod and container); more
    /// is an error that says to narrow the report.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(1..=100_000), value_name = "N")]
    pub max_series: u32,
}

/// The longest `--window`.
pub const MAX_WINDOW: Duration = Duration::from_secs(90 * 24 * 3600);

fn parse_window(s: &str) -> Result<Duration, String> {
    let d = nodewarden_runtime::duration::parse_at_least(s, Duration::from_secs(60))?;
    if d > MAX_WINDOW {
        return Err(format!("{s} is longer than 90d"));
    }
    Ok(d)
}

fn parse_step(s: &str) -> Result<Duration, String> {
    let d = nodewarden_runtime::duration::parse_at_least(s, Duration::from_secs(1))?;
    if d > Duration::from_secs(24 * 3600) {
        return Err(format!("{s} is longer than 24h"));
    }
    Ok(d)
}

fn parse_time(s: &str) -> Result<k8s_openapi::jiff::Timestamp, String> {
    s.parse::<k8s_openapi::jiff::Timestamp>()
        .map_err(|e| format!("{s} is not an RFC 3339 time such as 2026-11-28T06:00:00Z: {e}"))
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

/// What `--prometheus` and its flags ask for.
pub fn history_request(args: &ReportArgs, url: &str) -> report::history::Request {
    report::history::Request {
        endpoint: nodewarden_history::Endpoint {
            url: url.to_string(),
            bearer_token_file: args.prometheus_token_file.clone(),
            ca_file: args.prometheus_ca_file.clone(),
        },
        limits: nodewarden_history::Limits {
            query_timeout: args.prometheus_timeout,
            max_series: usize::try_from(args.max_series).unwrap_or(usize::MAX),
            ..nodewarden_history::Limits::default()
        },
        window: args.window,
        resolution: args.resolution,
        rate_window: args.rate_window,
        end_ms: args.end.map(|t| t.as_millisecond()),
        daemonsets: args.daemonsets.clone(),
        selector: args.selector.clone(),
        labels: nodewarden_history::cadvisor::Labels::default(),
    }
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
            let mut report = match &args.prometheus {
                None => {
                    let snapshot =
                        report::fetch::snapshot(&client, namespace.as_deref(), args.selector.as_deref())
                            .await?;
                    report::compute(&snapshot)
                }
                Some(url) => {
                    let request = history_request(args, url);
                    let now_ms = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
                        .unwrap_or(0);
                    if let Some(end) = args.end.filter(|t| t.as_millisecond() > now_ms) {
                        return Err(Error::Usage(format!(
                            "--end {end} is in the future; the history ends now at the latest"
                        )));
                    }
                    let (snapshot, source) =
                        report::history::snapshot(&client, namespace.as_deref(), &request, now_ms).await?;
                    let mut report = report::compute(&snapshot);
                    for ds in &mut report.daemonsets {
                        let name = format!("{}/{}", ds.namespace, ds.daemonset);
                        if source.without_autoscaler.contains(&name) {
                            ds.mode = "none".to_string();
                        }
                    }
                    report.history = Some(source);
                    report
                }
            };
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
