//! Feature gate reports (KEP-3920): the agent reads which gates its node's components run with
//! and publishes them as `NodeFeatureReport/<node>`.
//!
//! - [`parse`] (pure): Prometheus text exposition (or OpenMetrics) → the
//!   `kubernetes_feature_enabled{name,stage}` gauges (1 on, 0 off). GA gates carry `stage=""` in
//!   some builds and `stage="GA"` in others; both become `GA`.
//! - [`Scraper`]: GET `/metrics` of the kubelet (HTTPS on 10250, the service-account token as
//!   bearer, authorized as `nodes/metrics`; the kubelet's CA, or verification explicitly off) and,
//!   when configured, of kube-proxy (plain HTTP on loopback, no token).
//! - [`run`]: every `--gates-interval`, scrape, build the report, and server-side apply it when
//!   it changed or `--gates-refresh-interval` has passed since the last write. A component that
//!   cannot be read is reported with its `error` (and counted in
//!   `nodewarden_agent_gate_scrapes_total{result="error"}`); the agent goes on.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{ArgAction, Args};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::config::{
    AuthInfo, Cluster, Context, KubeConfigOptions, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
};
use kube::{Api, Client};
use nodewarden_api::features::{ComponentReport, GateState, NodeFeatureReport, NodeFeatureReportSpec};
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// The metric that carries feature gates.
pub const METRIC: &str = "kubernetes_feature_enabled";
/// Component names in the report.
pub const KUBELET: &str = "kubelet";
pub const KUBE_PROXY: &str = "kube-proxy";
pub const AGENT: &str = "nodewarden-agent";
/// Field manager of the report.
pub const FIELD_MANAGER: &str = "nodewarden-agent";

/// nodewarden's own gates, reported as component `nodewarden-agent`: (name, enabled, stage).
pub const AGENT_GATES: &[(&str, bool, &str)] = &[("NodewardenRightsizing", true, "ALPHA")];

/// Flags of the gate reports.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct GatesArgs {
    /// Base URL of this node's kubelet; default `https://$NODEWARDEN_NODE_IP:10250`, else
    /// `https://127.0.0.1:10250`.
    #[arg(long, env = "NODEWARDEN_KUBELET_URL")]
    pub kubelet_url: Option<String>,

    /// The node's IP (the chart sets it from `status.hostIP`); used for the default kubelet URL.
    #[arg(long, env = "NODEWARDEN_NODE_IP")]
    pub node_ip: Option<String>,

    /// PEM CA bundle that signs the kubelet's serving certificate.
    #[arg(
        long,
        env = "NODEWARDEN_KUBELET_CA_FILE",
        default_value = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
    )]
    pub kubelet_ca_file: PathBuf,

    /// Do not verify the kubelet's serving certificate (for self-signed kubelet certificates).
    #[arg(long, env = "NODEWARDEN_KUBELET_INSECURE_SKIP_VERIFY", action = ArgAction::Set, default_value_t = false)]
    pub kubelet_insecure_skip_verify: bool,

    /// Bearer token file sent to the kubelet (re-read as it rotates).
    #[arg(
        long,
        env = "NODEWARDEN_KUBELET_TOKEN_FILE",
        default_value = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    )]
    pub kubelet_token_file: PathBuf,

    /// Full URL of kube-proxy's metrics (e.g. `http://127.0.0.1:10249/metrics`); unset: kube-proxy
    /// is not reported.
    #[arg(long, env = "NODEWARDEN_KUBE_PROXY_METRICS_URL")]
    pub kube_proxy_metrics_url: Option<String>,

    /// How often the gates are read.
    #[arg(long, env = "NODEWARDEN_GATES_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub gates_interval: Duration,

    /// Write the report at least this often even when nothing changed, so it stays fresh for
    /// Feature transitions (which only count reports observed after they started).
    #[arg(long, env = "NODEWARDEN_GATES_REFRESH_INTERVAL", default_value = "5m", value_parser = parse_duration)]
    pub gates_refresh_interval: Duration,

    /// Report feature gates at all.
    #[arg(long, env = "NODEWARDEN_GATES", action = ArgAction::Set, default_value_t = true)]
    pub gates: bool,
}

/// A gates interval: at least one second.
fn parse_duration(s: &str) -> Result<Duration, String> {
    nodewarden_runtime::duration::parse_at_least(s, Duration::from_secs(1))
}

impl GatesArgs {
    /// The kubelet's base URL.
    pub fn kubelet_url(&self) -> String {
        match (&self.kubelet_url, &self.node_ip) {
            (Some(url), _) => url.clone(),
            (None, Some(ip)) if ip.contains(':') => format!("https://[{ip}]:10250"),
            (None, Some(ip)) if !ip.is_empty() => format!("https://{ip}:10250"),
            _ => "https://127.0.0.1:10250".to_string(),
        }
    }
}

/// A line of the exposition that mentions the gate metric but cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {why} (expected {METRIC}{{name=\"Gate\",stage=\"BETA\"}} 1)")]
pub struct ParseError {
    pub line: usize,
    pub why: String,
}

/// The feature gates in a Prometheus text exposition (or OpenMetrics text), sorted by name.
/// Other metrics, comments, `# HELP`/`# TYPE`/`# EOF` lines and timestamps are skipped. A gate
/// listed twice keeps its last value.
pub fn parse(text: &str) -> Result<Vec<GateState>, ParseError> {
    let mut gates: std::collections::BTreeMap<String, GateState> = std::collections::BTreeMap::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        let Some(rest) = line.strip_prefix(METRIC) else {
            continue;
        };
        // not another metric that merely starts with the same name
        if !(rest.starts_with('{') || rest.starts_with(' ') || rest.starts_with('\t')) {
            continue;
        }
        let err = |why: String| ParseError { line: i + 1, why };
        let (labels, after) = if let Some(body) = rest.strip_prefix('{') {
            let (labels, consumed) = parse_labels(body).map_err(err)?;
            (labels, &body[consumed..])
        } else {
            (Vec::new(), rest)
        };
        let mut fields = after.split_whitespace();
        let value = fields.next().ok_or_else(|| err("no value".into()))?;
        let value: f64 = value
            .parse()
            .map_err(|_| err(format!("value {value:?} is not a number")))?;
        if let Some(ts) = fields.next()
            && ts.parse::<f64>().is_err()
        {
            return Err(err(format!("timestamp {ts:?} is not a number")));
        }
        let label = |k: &str| labels.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let name = label("name")
            .filter(|n| !n.is_empty())
            .ok_or_else(|| err("no name label".into()))?;
        let stage = match label("stage").unwrap_or_default().as_str() {
            "" | "GA" => "GA".to_string(),
            other => other.to_string(),
        };
        let enabled = if value == 1.0 {
            true
        } else if value == 0.0 {
            false
        } else {
            return Err(err(format!("value {value} is neither 1 nor 0")));
        };
        gates.insert(name.clone(), GateState { name, enabled, stage });
    }
    Ok(gates.into_values().collect())
}

/// Parses `name="value",...}` (after the opening brace); returns the labels and the bytes read,
/// closing brace included.
fn parse_labels(body: &str) -> Result<(Vec<(String, String)>, usize), String> {
    let bytes = body.as_bytes();
    let mut labels = Vec::new();
    let mut i = 0;
    loop {
        while i < bytes.len() && (bytes[i] == b' ' || bytes[i] == b',') {
            i += 1;
        }
        if i >= bytes.len() {
            return Err("labels are not closed with }".into());
        }
        if bytes[i] == b'}' {
            return Ok((labels, i + 1));
        }
        let start = i;
        while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
            i += 1;
        }
        let key = &body[start..i];
        if key.is_empty() {
            return Err(format!(
                "bad label name at {:?}",
                &body[start..(start + 10).min(body.len())]
            ));
        }
        while i < bytes.len() && bytes[i] == b' ' {
            i += 1;
        }
        if bytes.get(i) != Some(&b'=') {
            return Err(format!("label {key} has no =\"value\""));
        }
        i += 1;
        while i < bytes.len() && bytes[i] == b' ' {
            i += 1;
        }
        if bytes.get(i) != Some(&b'"') {
            return Err(format!("the value of label {key} is not quoted"));
        }
        i += 1;
        let mut value = String::new();
        let mut chars = body[i..].char_indices();
        let mut closed = None;
        while let Some((at, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, other)) => value.push(other),
                    None => break,
                },
                '"' => {
                    closed = Some(at);
                    break;
                }
                c => value.push(c),
            }
        }
        let Some(at) = closed else {
            return Err(format!("the value of label {key} is not closed"));
        };
        i += at + 1;
        labels.push((key.to_string(), value));
    }
}

/// nodewarden's own gates as a component report.
pub fn agent_component(now: Timestamp) -> ComponentReport {
    ComponentReport {
        name: AGENT.to_string(),
        observed_time: Some(Time(now)),
        error: None,
        gates: AGENT_GATES
            .iter()
            .map(|(name, enabled, stage)| GateState {
                name: name.to_string(),
                enabled: *enabled,
                stage: stage.to_string(),
            })
            .collect(),
    }
}

/// A component's report from a scrape: its gates, or the error.
pub fn component(name: &str, scraped: Result<String, String>, now: Timestamp) -> ComponentReport {
    let (gates, error) = match scraped.and_then(|text| parse(&text).map_err(|e| e.to_string())) {
        Ok(gates) => (gates, None),
        Err(why) => (Vec::new(), Some(why)),
    };
    ComponentReport {
        name: name.to_string(),
        observed_time: Some(Time(now)),
        error,
        gates,
    }
}

/// Whether two reports differ in anything but their observed times.
pub fn changed(old: Option<&NodeFeatureReportSpec>, new: &NodeFeatureReportSpec) -> bool {
    let strip = |s: &NodeFeatureReportSpec| {
        s.components
            .iter()
            .map(|c| (c.name.clone(), c.error.clone(), c.gates.clone()))
            .collect::<Vec<_>>()
    };
    old.is_none_or(|old| strip(old) != strip(new))
}

/// Reads one component's `/metrics`.
pub struct Scraper {
    client: Client,
    path: String,
}

impl Scraper {
    /// The kubelet at `args.kubelet_url()` with the token and CA (or no verification).
    pub async fn kubelet(args: &GatesArgs) -> Result<Self, String> {
        let url = args.kubelet_url();
        let cluster = Cluster {
            server: Some(url.clone()),
            insecure_skip_tls_verify: Some(args.kubelet_insecure_skip_verify),
            certificate_authority: (!args.kubelet_insecure_skip_verify)
                .then(|| args.kubelet_ca_file.display().to_string()),
            ..Default::default()
        };
        let user = AuthInfo {
            token_file: Some(args.kubelet_token_file.display().to_string()),
            ..Default::default()
        };
        Self::build(&url, cluster, Some(user), "/metrics").await
    }

    /// kube-proxy at its full metrics URL, without credentials.
    pub async fn kube_proxy(url: &str) -> Result<Self, String> {
        let uri: http::Uri = url.parse().map_err(|e| {
            format!("--kube-proxy-metrics-url {url:?}: {e} (expected e.g. http://127.0.0.1:10249/metrics)")
        })?;
        let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
            return Err(format!(
                "--kube-proxy-metrics-url {url:?} needs a scheme and a host (e.g. http://127.0.0.1:10249/metrics)"
            ));
        };
        let base = format!("{scheme}://{authority}");
        let path = if uri.path().is_empty() {
            "/metrics"
        } else {
            uri.path()
        };
        let cluster = Cluster {
            server: Some(base.clone()),
            ..Default::default()
        };
        Self::build(&base, cluster, None, path).await
    }

    async fn build(url: &str, cluster: Cluster, user: Option<AuthInfo>, path: &str) -> Result<Self, String> {
        let kubeconfig = Kubeconfig {
            clusters: vec![NamedCluster {
                name: "target".into(),
                cluster: Some(cluster),
                other: Default::default(),
            }],
            auth_infos: vec![NamedAuthInfo {
                name: "agent".into(),
                auth_info: Some(user.unwrap_or_default()),
                other: Default::default(),
            }],
            contexts: vec![NamedContext {
                name: "target".into(),
                context: Some(Context {
                    cluster: "target".into(),
                    user: Some("agent".into()),
                    ..Default::default()
                }),
                other: Default::default(),
            }],
            current_context: Some("target".into()),
            ..Default::default()
        };
        let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        config.connect_timeout = Some(Duration::from_secs(5));
        config.read_timeout = Some(Duration::from_secs(10));
        let client = Client::try_from(config).map_err(|e| format!("{url}: {e}"))?;
        Ok(Scraper {
            client,
            path: path.to_string(),
        })
    }

    /// The exposition text, or why it could not be read.
    pub async fn scrape(&self) -> Result<String, String> {
        let request = http::Request::get(self.path.as_str())
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        self.client
            .request_text(request)
            .await
            .map_err(|e| format!("GET {}: {e}", self.path))
    }
}

/// The report object, owned by the Node so that it goes when the node goes.
pub fn object(node: &str, node_uid: Option<&str>, spec: NodeFeatureReportSpec) -> NodeFeatureReport {
    let mut obj = NodeFeatureReport::new(node, spec);
    obj.metadata.owner_references = node_uid.map(|uid| {
        vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: node.into(),
            uid: uid.into(),
            ..Default::default()
        }]
    });
    obj
}

/// Scrapes and publishes until `stop`. Nothing here ends the agent: failures are reported in the
/// report, logged, counted, and retried on the next interval.
pub async fn run(
    args: GatesArgs,
    client: Client,
    node: String,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    // made on first use, and again while it cannot be (e.g. the token file is not there yet)
    let mut kubelet: Option<Scraper> = None;
    let mut proxy: Option<Scraper> = None;
    let reports: Api<NodeFeatureReport> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client);
    let mut node_uid: Option<String> = None;
    let mut last: Option<(NodeFeatureReportSpec, Instant)> = None;
    let mut ticker = tokio::time::interval(args.gates_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let now = Timestamp::now();
        let mut components = Vec::new();
        if kubelet.is_none() {
            kubelet = Scraper::kubelet(&args)
                .await
                .map_err(|why| components.push(observe(&metrics, KUBELET, Err(why), now)))
                .ok();
        }
        if let Some(scraper) = &kubelet {
            components.push(observe(&metrics, KUBELET, scraper.scrape().await, now));
        }
        if let Some(url) = &args.kube_proxy_metrics_url {
            if proxy.is_none() {
                proxy = Scraper::kube_proxy(url)
                    .await
                    .map_err(|why| components.push(observe(&metrics, KUBE_PROXY, Err(why), now)))
                    .ok();
            }
            if let Some(scraper) = &proxy {
                components.push(observe(&metrics, KUBE_PROXY, scraper.scrape().await, now));
            }
        }
        components.push(agent_component(now));
        let spec = NodeFeatureReportSpec { components };
        let due = match &last {
            None => true,
            Some((old, at)) => changed(Some(old), &spec) || at.elapsed() >= args.gates_refresh_interval,
        };
        if !due {
            continue;
        }
        if node_uid.is_none() {
            match nodes.get(&node).await {
                Ok(n) => node_uid = n.metadata.uid,
                Err(err) => {
                    tracing::debug!(error = %err, "cannot read the Node; report written without an owner")
                }
            }
        }
        let obj = object(&node, node_uid.as_deref(), spec.clone());
        match reports
            .patch(
                &node,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&obj),
            )
            .await
        {
            Ok(_) => {
                metrics.feature_report_write(true);
                tracing::debug!(node = %node, "NodeFeatureReport written");
                last = Some((spec, Instant::now()));
            }
            Err(err) => {
                metrics.feature_report_write(false);
                tracing::warn!(error = %err, "writing NodeFeatureReport failed; retrying next interval");
            }
        }
    }
}

fn observe(
    metrics: &Metrics,
    name: &'static str,
    scraped: Result<String, String>,
    now: Timestamp,
) -> ComponentReport {
    let report = component(name, scraped, now);
    metrics.gate_scrape(name, report.error.is_none());
    if let Some(why) = &report.error {
        tracing::warn!(component = name, %why, "feature gates not readable; reported as an error");
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBELET_METRICS: &str = include_str!("../tests/fixtures/gates/kubelet-metrics.txt");
    const OPENMETRICS: &str = include_str!("../tests/fixtures/gates/openmetrics.txt");

    fn gate(gates: &[GateState], name: &str) -> (bool, String) {
        let g = gates
            .iter()
            .find(|g| g.name == name)
            .unwrap_or_else(|| panic!("{name} missing"));
        (g.enabled, g.stage.clone())
    }

    #[test]
    fn reads_the_gates_of_a_kubelet() {
        let gates = parse(KUBELET_METRICS).expect("parses");
        assert_eq!(gates.len(), 15, "{gates:?}");
        assert_eq!(
            gate(&gates, "SidecarContainers"),
            (true, "GA".into()),
            "stage=\"\" is GA"
        );
        assert_eq!(gate(&gates, "InPlacePodVerticalScaling"), (true, "GA".into()));
        assert_eq!(gate(&gates, "MemoryQoS"), (false, "ALPHA".into()));
        assert_eq!(gate(&gates, "WindowsHostNetwork"), (false, "DEPRECATED".into()));
        assert_eq!(
            gate(&gates, "WidgetGlow"),
            (true, "ALPHA".into()),
            "label order does not matter"
        );
        assert!(gates.windows(2).all(|w| w[0].name < w[1].name), "sorted by name");
        assert!(
            !gates.iter().any(|g| g.name.contains("total")),
            "look-alike metric skipped"
        );
    }

    #[test]
    fn reads_openmetrics_with_timestamps_escapes_and_eof() {
        let gates = parse(OPENMETRICS).expect("parses");
        assert_eq!(gate(&gates, "NFTablesProxyMode"), (true, "GA".into()));
        assert_eq!(gate(&gates, "Odd\"Name\\x"), (false, "BETA".into()));
        assert_eq!(
            gate(&gates, "MultiCIDRServiceAllocator"),
            (false, "GA".into()),
            "the last value wins"
        );
        assert_eq!(gates.len(), 3);
    }

    #[test]
    fn bad_gate_lines_name_the_line_and_what_is_expected() {
        let cases = [
            (
                "kubernetes_feature_enabled{name=\"A\",stage=\"BETA\"} yes",
                "line 1: value \"yes\" is not a number",
            ),
            (
                "# HELP x\nkubernetes_feature_enabled{stage=\"BETA\"} 1",
                "line 2: no name label",
            ),
            ("kubernetes_feature_enabled{name=\"A\"} 0.5", "neither 1 nor 0"),
            ("kubernetes_feature_enabled{name=\"A} 1", "not closed"),
            ("kubernetes_feature_enabled{name=A} 1", "not quoted"),
            ("kubernetes_feature_enabled{name=\"A\"}", "no value"),
            ("kubernetes_feature_enabled{name=\"A\"} 1 soon", "timestamp"),
        ];
        for (text, want) in cases {
            let err = parse(text).expect_err(text).to_string();
            assert!(err.contains(want), "{text}: {err}");
            assert!(err.contains("expected kubernetes_feature_enabled{name="), "{err}");
        }
        assert_eq!(parse("").expect("empty"), vec![]);
        assert_eq!(parse("# EOF\n").expect("eof only"), vec![]);
    }

    #[test]
    fn a_component_that_cannot_be_read_is_reported_with_the_error() {
        let now = Timestamp::now();
        let c = component(KUBELET, Err("GET /metrics: connection refused".into()), now);
        assert_eq!(c.error.as_deref(), Some("GET /metrics: connection refused"));
        assert!(c.gates.is_empty());
        let c = component(
            KUBELET,
            Ok("kubernetes_feature_enabled{name=\"A\"} 7".into()),
            now,
        );
        assert!(
            c.error.as_deref().is_some_and(|e| e.contains("neither 1 nor 0")),
            "{c:?}"
        );
        let c = component(KUBELET, Ok(KUBELET_METRICS.into()), now);
        assert!(c.error.is_none() && c.gates.len() == 15);
    }

    #[test]
    fn only_gates_and_errors_make_a_change() {
        let at = |s: &str| s.parse::<Timestamp>().expect("time");
        let spec = |now: Timestamp, text: &str| NodeFeatureReportSpec {
            components: vec![component(KUBELET, Ok(text.into()), now), agent_component(now)],
        };
        let a = spec(at("2026-11-21T08:00:00Z"), KUBELET_METRICS);
        let later = spec(at("2026-11-21T08:05:00Z"), KUBELET_METRICS);
        assert!(changed(None, &a));
        assert!(
            !changed(Some(&a), &later),
            "a newer observation alone is not a change"
        );
        let flipped = spec(
            at("2026-11-21T08:05:00Z"),
            &KUBELET_METRICS.replace(
                "name=\"MemoryQoS\",stage=\"ALPHA\"} 0",
                "name=\"MemoryQoS\",stage=\"ALPHA\"} 1",
            ),
        );
        assert!(changed(Some(&a), &flipped));
        assert_eq!(a.components[1].name, AGENT);
        assert_eq!(a.components[1].gates[0].name, "NodewardenRightsizing");
    }

    #[test]
    fn the_kubelet_url_defaults_to_the_node_ip() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            gates: GatesArgs,
        }
        let parse = |args: &[&str]| Cli::try_parse_from(std::iter::once("agent").chain(args.iter().copied()));
        let g = parse(&["--node-ip", "10.0.0.7"]).expect("parses").gates;
        assert_eq!(g.kubelet_url(), "https://10.0.0.7:10250");
        assert!(
            !g.kubelet_insecure_skip_verify,
            "verification is on unless turned off"
        );
        assert_eq!(
            parse(&["--node-ip", "fd00::7"])
                .expect("parses")
                .gates
                .kubelet_url(),
            "https://[fd00::7]:10250"
        );
        assert_eq!(
            parse(&[]).expect("parses").gates.kubelet_url(),
            "https://127.0.0.1:10250"
        );
        let g = parse(&["--kubelet-url", "https://node:10250", "--node-ip", "10.0.0.7"])
            .expect("parses")
            .gates;
        assert_eq!(g.kubelet_url(), "https://node:10250");
        let err = parse(&["--gates-interval", "10ms"])
            .err()
            .expect("too short")
            .to_string();
        assert!(err.contains("at least 1s"), "{err}");
    }

    #[tokio::test]
    async fn an_unreachable_kubelet_is_an_error_not_a_crash() {
        let dir = tempfile::tempdir().expect("temp dir");
        let token = dir.path().join("token");
        std::fs::write(&token, "a-token").expect("token file");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("bind")
            .local_addr()
            .expect("addr")
            .port();
        // the port is closed again: nothing listens there
        let args = GatesArgs {
            kubelet_url: Some(format!("https://127.0.0.1:{port}")),
            node_ip: None,
            kubelet_ca_file: "/nonexistent/ca.crt".into(),
            kubelet_insecure_skip_verify: true,
            kubelet_token_file: token,
            kube_proxy_metrics_url: None,
            gates_interval: Duration::from_secs(1),
            gates_refresh_interval: Duration::from_secs(60),
            gates: true,
        };
        let scraper = Scraper::kubelet(&args)
            .await
            .expect("a scraper is made without connecting");
        let err = scraper.scrape().await.expect_err("nothing listens");
        assert!(err.starts_with("GET /metrics"), "{err}");
        let metrics = Metrics::new();
        let c = observe(&metrics, KUBELET, Err(err), Timestamp::now());
        assert!(c.error.is_some());
        assert!(
            metrics
                .encode()
                .contains("nodewarden_agent_gate_scrapes_total{component=\"kubelet\",result=\"error\"} 1"),
            "{}",
            metrics.encode()
        );
        let bad = Scraper::kube_proxy("127.0.0.1:10249")
            .await
            .err()
            .expect("no scheme");
        assert!(bad.contains("http://127.0.0.1:10249/metrics"), "{bad}");
    }
}
