//! Feature gate reports (KEP-3920): the agent reads which gates its node's components run with
//! and publishes them as `NodeFeatureReport/<node>`.
//!
//! Files: `parse` (pure), `scrape`, `run`.
//!
//! - [`parse()`] (pure): Prometheus text exposition (or OpenMetrics) → the
//!   `kubernetes_feature_enabled{name,stage}` gauges (1 on, 0 off). GA gates carry `stage=""` in
//!   some builds and `stage="GA"` in others; both become `GA`.
//! - [`Scraper`]: GET `/metrics` of the kubelet (HTTPS on 10250, the service-account token as
//!   bearer, authorized as `nodes/metrics`; the kubelet's CA, or verification explicitly off) and,
//!   when configured, of kube-proxy (plain HTTP on loopback, no token).
//! - [`run`]: every `--gates-interval`, scrape, build the report, and server-side apply it when
//!   it changed or `--gates-refresh-interval` has passed since the last write. A component that
//!   cannot be read is reported with its `error` (and counted in
//!   `nodewarden_agent_gate_scrapes_total{result="error"}`); the agent goes on.

mod parse;
mod run;
mod scrape;
mod trust;

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args};

pub use parse::{ParseError, agent_component, changed, component, parse};
pub use run::{object, run};
/// How a scraped body becomes text (size limit, UTF-8); public for the fuzz targets only.
#[doc(hidden)]
pub use scrape::read_bounded;
pub use scrape::{KubeletTrust, PinnedCertificate, ScrapeError, Scraper, classify};
pub use trust::{KubeletReader, parse_serving_certificate, read_serving_certificate};

/// The metric that carries feature gates.
pub const METRIC: &str = "kubernetes_feature_enabled";
/// Component names in the report.
pub const KUBELET: &str = "kubelet";
/// Component name of kube-proxy in the report.
pub const KUBE_PROXY: &str = "kube-proxy";
/// Component name of this agent in the report.
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

    /// The kubelet's own serving certificate (PEM, as a kubelet that signs its own writes it:
    /// `<cert-dir>/kubelet.crt`). Where the CA does not verify the kubelet, this certificate does,
    /// for this node's kubelet alone. Unset: only the CA.
    #[arg(long, env = "NODEWARDEN_KUBELET_SERVING_CERT_FILE")]
    pub kubelet_serving_cert_file: Option<PathBuf>,

    /// Do not verify the kubelet's serving certificate (an explicit opt-out, where neither the CA
    /// nor the kubelet's own certificate file can be had).
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

#[cfg(test)]
mod tests {
    use super::run::observe;
    use super::*;
    use crate::metrics::Metrics;
    use k8s_openapi::jiff::Timestamp;
    use nodewarden_api::features::{GateState, NodeFeatureReportSpec, ReadFailure};

    const KUBELET_METRICS: &str = include_str!("../../tests/fixtures/gates/kubelet-metrics.txt");
    const OPENMETRICS: &str = include_str!("../../tests/fixtures/gates/openmetrics.txt");

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
    fn odd_utf8_is_read_or_refused_without_a_panic() {
        // a bad label name made of multi-byte characters: the quoted part is cut by characters
        // (3 bytes each, so 10 bytes in falls inside the fourth)
        let text = "kubernetes_feature_enabled{\u{20ac}\u{20ac}\u{20ac}\u{20ac}\u{20ac}=\"A\"} 1";
        let err = parse(text).expect_err(text).to_string();
        assert!(
            err.contains("bad label name at \"\u{20ac}\u{20ac}\u{20ac}\u{20ac}\u{20ac}="),
            "{err}"
        );
        let cases = [
            "kubernetes_feature_enabled{\u{1F600}} 1",
            "kubernetes_feature_enabled{n\u{e9}=\"A\"} 1",
            "kubernetes_feature_enabled{name=\"\u{1F600}\\\u{e9}\"} 1",
            "kubernetes_feature_enabled{name=\"A\"} \u{e9}",
            "kubernetes_feature_enabled\u{e9}{name=\"A\"} 1",
            "kubernetes_feature_enabled{name=\"\u{e9}",
            "kubernetes_feature_enabled{name\u{3000}=\"A\"} 1",
        ];
        for text in cases {
            // an answer, either way: no panic on any of them
            let _ = parse(text);
        }
        let gates = parse("kubernetes_feature_enabled{name=\"Gr\u{fc}n\u{1F600}\",stage=\"ALPHA\"} 1")
            .expect("UTF-8 in a value");
        assert_eq!(gates[0].name, "Gr\u{fc}n\u{1F600}");
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
    fn a_certificate_that_cannot_be_verified_is_told_apart() {
        use rustls::{CertificateError, Error as Tls};
        // as the client reports it: the TLS error inside an io::Error inside another io::Error
        // inside the connector's error
        let tls = |e: Tls| {
            let io = std::io::Error::new(std::io::ErrorKind::InvalidData, e);
            kube::Error::Service(Box::new(std::io::Error::other(io)))
        };
        assert_eq!(
            classify(&tls(Tls::InvalidCertificate(CertificateError::UnknownIssuer))),
            ReadFailure::CertificateNotVerified
        );
        assert_eq!(
            classify(&tls(Tls::InvalidCertificate(CertificateError::Expired))),
            ReadFailure::CertificateNotVerified
        );
        assert_eq!(classify(&tls(Tls::DecryptError)), ReadFailure::Other);
        let status = |code: u16| {
            kube::Error::Api(Box::new(
                kube::core::Status::failure("Forbidden", "Forbidden").with_code(code),
            ))
        };
        assert_eq!(classify(&status(403)), ReadFailure::Forbidden);
        assert_eq!(classify(&status(401)), ReadFailure::Forbidden);
        assert_eq!(classify(&status(500)), ReadFailure::Other);

        // the report carries the kind next to the words; a parse error is of no particular kind
        let now = Timestamp::now();
        let unverified = ScrapeError {
            reason: ReadFailure::CertificateNotVerified,
            message: "GET /metrics: invalid peer certificate: UnknownIssuer".into(),
        };
        let c = component(KUBELET, Err(unverified), now);
        assert_eq!(c.error_reason, Some(ReadFailure::CertificateNotVerified));
        assert!(c.error.as_deref().is_some_and(|e| e.contains("UnknownIssuer")));
        let c = component(
            KUBELET,
            Ok("kubernetes_feature_enabled{name=\"A\"} 7".into()),
            now,
        );
        assert_eq!(c.error_reason, Some(ReadFailure::Other));
        assert_eq!(
            component(KUBELET, Ok(KUBELET_METRICS.into()), now).error_reason,
            None
        );
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
            kubelet_serving_cert_file: None,
            kubelet_insecure_skip_verify: true,
            kubelet_token_file: token,
            kube_proxy_metrics_url: None,
            gates_interval: Duration::from_secs(1),
            gates_refresh_interval: Duration::from_secs(60),
            gates: true,
        };
        let scraper = Scraper::kubelet(&args, &KubeletTrust::Insecure)
            .await
            .expect("a scraper is made without connecting");
        let err = scraper.scrape().await.expect_err("nothing listens");
        assert!(err.message.starts_with("GET /metrics"), "{err}");
        assert_eq!(
            err.reason,
            ReadFailure::Other,
            "nothing listening is no certificate problem"
        );
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
