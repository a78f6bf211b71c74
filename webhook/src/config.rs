//! Flags of `nodewarden-webhook`. Every flag also reads an environment variable.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use nodewarden_runtime::duration::{parse_duration, parse_interval};
use nodewarden_runtime::telemetry::LogFormat;

use crate::certificates::CertArgs;
use crate::node_reports::NodeReportsArgs;

/// The command line and environment of `nodewarden-webhook`.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "nodewarden-webhook",
    version,
    about = "nodewarden admission webhook: per-node right-sizing of DaemonSet pods, cluster claim guard, feature lifecycle"
)]
pub struct Config {
    /// Without a command, the webhook runs.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Address of the HTTPS admission server. Default: every interface in a pod, loopback when
    /// run by hand outside a cluster.
    #[arg(long, env = "NODEWARDEN_LISTEN_ADDR", default_value_t = nodewarden_runtime::default_bind(8443))]
    pub listen_addr: SocketAddr,

    /// Address of the plain-HTTP admin server (/livez, /readyz, /metrics). Default: every
    /// interface in a pod, loopback when run by hand outside a cluster.
    #[arg(long, env = "NODEWARDEN_ADMIN_ADDR", default_value_t = nodewarden_runtime::default_bind(8080))]
    pub admin_addr: SocketAddr,

    /// PEM certificate chain served by the admission server.
    #[arg(
        long,
        env = "NODEWARDEN_TLS_CERT_FILE",
        default_value = "/etc/nodewarden/tls/tls.crt"
    )]
    pub tls_cert_file: PathBuf,

    /// PEM private key of the serving certificate.
    #[arg(
        long,
        env = "NODEWARDEN_TLS_KEY_FILE",
        default_value = "/etc/nodewarden/tls/tls.key"
    )]
    pub tls_key_file: PathBuf,

    /// PEM CA certificates: when set, every admission connection must present a client
    /// certificate signed by one of them (the API server's, from its admission configuration),
    /// or the TLS handshake is refused. Re-read with the serving pair. The admin port is not
    /// affected.
    #[arg(long, env = "NODEWARDEN_CLIENT_CA_FILE")]
    pub client_ca_file: Option<PathBuf>,

    /// With --client-ca-file, the client certificate's subject common name or one of its DNS
    /// names must be one of these, comma-separated (compared ignoring ASCII case); empty means
    /// any certificate the CA signed.
    #[arg(
        long,
        env = "NODEWARDEN_CLIENT_NAMES",
        value_delimiter = ',',
        requires = "client_ca_file"
    )]
    pub client_names: Vec<String>,

    /// How often the certificate files are checked for a new pair (e.g. 10s, 1m).
    #[arg(long, env = "NODEWARDEN_CERT_RELOAD_INTERVAL", default_value = "10s", value_parser = parse_interval)]
    pub cert_reload_interval: Duration,

    /// Largest AdmissionReview body accepted, in bytes; larger ones get HTTP 413.
    #[arg(long, env = "NODEWARDEN_MAX_BODY_BYTES", default_value_t = 6 * 1024 * 1024,
          value_parser = clap::value_parser!(u64).range(1024..=64 * 1024 * 1024))]
    pub max_body_bytes: u64,

    /// Most admission connections open at once; at the limit, a stale connection of the address
    /// holding the most makes room, else new connections wait in the listen backlog.
    #[arg(long, env = "NODEWARDEN_MAX_CONNECTIONS", default_value_t = 512,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections: u32,

    /// Most admission connections one client address holds while other addresses hold some
    /// too (IPv4-mapped IPv6 counts as IPv4); beyond it, one of its own stale connections makes
    /// room, else its new connection is closed at once.
    #[arg(long, env = "NODEWARDEN_MAX_CONNECTIONS_PER_SOURCE", default_value_t = 128,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections_per_source: u32,

    /// New admission connections one client address may open a second (a token bucket holding
    /// as many), counted before the TLS handshake; beyond it, a new connection is closed at once.
    #[arg(long, env = "NODEWARDEN_MAX_CONNECTION_RATE_PER_SOURCE", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connection_rate_per_source: u32,

    /// How long a client may take to finish the TLS handshake before its connection is closed.
    #[arg(long, env = "NODEWARDEN_TLS_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = parse_interval)]
    pub tls_handshake_timeout: Duration,

    /// How long an HTTP/1.1 client may take to send a request's headers before its connection
    /// is closed.
    #[arg(long, env = "NODEWARDEN_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_interval)]
    pub header_read_timeout: Duration,

    /// How long a request may take from its headers to its answer, reading the body included;
    /// then HTTP 408.
    #[arg(long, env = "NODEWARDEN_REQUEST_TIMEOUT", default_value = "10s", value_parser = parse_interval)]
    pub request_timeout: Duration,

    /// A connection (HTTP/1.1 or HTTP/2) with no request in flight for this long is closed.
    #[arg(long, env = "NODEWARDEN_IDLE_TIMEOUT", default_value = "120s", value_parser = parse_interval)]
    pub idle_timeout: Duration,

    /// Most requests in flight on the whole admission server besides each connection's first
    /// (which never waits); at the limit, further requests wait, reading nothing, until one
    /// ends or --request-timeout answers them 408.
    #[arg(long, env = "NODEWARDEN_MAX_REQUESTS_IN_FLIGHT", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_requests_in_flight: u32,

    /// Most concurrent HTTP/2 streams a client may open on one admission connection.
    #[arg(long, env = "NODEWARDEN_MAX_STREAMS_PER_CONNECTION", default_value_t = 32,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub max_streams_per_connection: u32,

    /// How long an answer may wait to be sent (the client reads nothing or opens no HTTP/2
    /// window) before its connection is closed; a stalled connection is closed between once
    /// and twice this after its answer was ready.
    #[arg(long, env = "NODEWARDEN_WRITE_TIMEOUT", default_value = "10s", value_parser = parse_interval)]
    pub write_timeout: Duration,

    /// How often an HTTP/2 connection is pinged to find dead peers.
    #[arg(long, env = "NODEWARDEN_HTTP2_KEEP_ALIVE_INTERVAL", default_value = "30s", value_parser = parse_interval)]
    pub http2_keep_alive_interval: Duration,

    /// How long an HTTP/2 ping may go unanswered before the connection is closed.
    #[arg(long, env = "NODEWARDEN_HTTP2_KEEP_ALIVE_TIMEOUT", default_value = "10s", value_parser = parse_interval)]
    pub http2_keep_alive_timeout: Duration,

    /// After SIGTERM, how long to keep accepting while readiness is already false (lets
    /// endpoints drop this pod first).
    #[arg(long, env = "NODEWARDEN_SHUTDOWN_DELAY", default_value = "0s", value_parser = parse_duration)]
    pub shutdown_delay: Duration,

    /// After SIGTERM and the delay, how long in-flight requests may take to finish.
    #[arg(long, env = "NODEWARDEN_SHUTDOWN_GRACE", default_value = "20s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,

    /// Threads that run the webhook: 1 (the default) runs the admission server, the watches and
    /// the controllers on one thread; N > 1 on a pool of N; 0 one per core the process may use.
    /// Work that takes long (a large review, the status pass) runs on a separate blocking pool
    /// either way. One thread answers about 20,000 reviews a second and spends 30 % less CPU
    /// per review than a pool (docs/benchmarks.md); more help only past that rate.
    #[arg(long, env = "NODEWARDEN_WORKER_THREADS", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(0..=1024))]
    pub worker_threads: u16,

    /// Log format.
    #[arg(long, env = "NODEWARDEN_LOG_FORMAT", value_enum, default_value = "json")]
    pub log_format: LogFormat,

    /// Log filter, e.g. `info` or `nodewarden_webhook=debug,info`.
    #[arg(long, env = "NODEWARDEN_LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// Kubeconfig file to reach the API server; without it, the in-cluster service account
    /// (or `$KUBECONFIG`, or `~/.kube/config`) is used.
    #[arg(long, env = "NODEWARDEN_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Namespace of the webhook's own objects (the controllers' Lease); defaults to the
    /// namespace of the service account or kubeconfig context.
    #[arg(long, env = "NODEWARDEN_POD_NAMESPACE")]
    pub namespace: Option<String>,

    /// This replica's name in leader election; defaults to the host name.
    #[arg(long, env = "NODEWARDEN_POD_NAME")]
    pub pod_name: Option<String>,

    /// The claims guard and the ID initializer.
    #[command(flatten)]
    pub claims: crate::claims::ClaimsArgs,

    /// Who may write NodeRecommendation and NodeFeatureReport objects.
    #[command(flatten)]
    pub node_reports: NodeReportsArgs,

    /// Where the serving certificate comes from (files, or managed in-process).
    #[command(flatten)]
    pub certs: CertArgs,

    /// Right-sizing's status controller.
    #[command(flatten)]
    pub rightsizing: crate::rightsizing::RightsizingArgs,

    /// The Feature lifecycle controller.
    #[command(flatten)]
    pub features: crate::features::FeaturesArgs,
}

/// What `nodewarden-webhook <command>` does instead of serving.
#[derive(Subcommand, Debug, Clone)]
pub enum Command {
    /// nodewarden's CustomResourceDefinitions.
    #[command(subcommand)]
    Crds(CrdsCommand),
}

/// `nodewarden-webhook crds …`.
#[derive(Subcommand, Debug, Clone)]
pub enum CrdsCommand {
    /// Create or replace every nodewarden CRD with the ones this binary was built with (the chart's
    /// pre-upgrade hook), then wait for them to be Established. Uses --kubeconfig (given before
    /// `crds`) or the in-cluster service account.
    Apply {
        /// How long the CRDs may take to be Established.
        #[arg(long, env = "NODEWARDEN_CRDS_TIMEOUT", default_value = "60s", value_parser = parse_interval)]
        timeout: Duration,
    },
}

impl Config {
    /// The admission server's connection limits.
    pub fn server_limits(&self) -> crate::server::ServerLimits {
        crate::server::ServerLimits {
            max_connections: usize::try_from(self.max_connections).unwrap_or(usize::MAX),
            max_connections_per_source: usize::try_from(self.max_connections_per_source)
                .unwrap_or(usize::MAX),
            max_connection_rate_per_source: self.max_connection_rate_per_source,
            tls_handshake_timeout: self.tls_handshake_timeout,
            header_read_timeout: self.header_read_timeout,
            request_timeout: self.request_timeout,
            idle_timeout: self.idle_timeout,
            http2_keep_alive_interval: self.http2_keep_alive_interval,
            http2_keep_alive_timeout: self.http2_keep_alive_timeout,
            max_requests_in_flight: usize::try_from(self.max_requests_in_flight).unwrap_or(usize::MAX),
            max_streams_per_connection: self.max_streams_per_connection,
            write_timeout: self.write_timeout,
        }
    }

    /// Parses flags from `args` (the first is the program name), for tools and tests that run
    /// the webhook in-process.
    pub fn from_args<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        <Self as Parser>::try_parse_from(args)
    }

    /// The client certificate check of `--client-ca-file`, or `None` when it is off. Fails when
    /// the CA file cannot be read or holds no usable CA certificate.
    pub fn client_auth(
        &self,
    ) -> Result<Option<std::sync::Arc<crate::certificates::ClientVerifier>>, crate::certificates::tls::TlsError>
    {
        self.client_ca_file
            .as_ref()
            .map(|path| {
                crate::certificates::ClientVerifier::load(path.clone(), self.client_names.clone())
                    .map(std::sync::Arc::new)
            })
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_work_without_any_flag() {
        let c = Config::try_parse_from(["nodewarden-webhook"]).expect("defaults parse");
        assert_eq!(c.listen_addr.port(), 8443);
        assert_eq!(c.admin_addr.port(), 8080);
        assert_eq!(c.cert_reload_interval, Duration::from_secs(10));
        assert!(c.client_ca_file.is_none() && c.client_auth().expect("off").is_none());
        assert_eq!(c.worker_threads, 1, "one thread unless asked");
    }

    #[test]
    fn worker_threads_are_bounded() {
        let c = Config::try_parse_from(["nodewarden-webhook", "--worker-threads=0"]).expect("0: per core");
        assert_eq!(c.worker_threads, 0);
        let err = Config::try_parse_from(["nodewarden-webhook", "--worker-threads=5000"])
            .expect_err("too many")
            .to_string();
        assert!(
            err.contains("--worker-threads") && err.contains("0..=1024"),
            "{err}"
        );
    }

    #[test]
    fn crds_apply_is_a_command() {
        let c = Config::try_parse_from([
            "nodewarden-webhook",
            "--kubeconfig=/k",
            "crds",
            "apply",
            "--timeout=2m",
        ])
        .expect("parses");
        assert!(
            matches!(c.command, Some(Command::Crds(CrdsCommand::Apply { timeout })) if timeout == Duration::from_secs(120))
        );
        assert_eq!(c.kubeconfig.as_deref(), Some(std::path::Path::new("/k")));
        let err = Config::try_parse_from(["nodewarden-webhook", "crds", "delete"])
            .expect_err("no such command")
            .to_string();
        assert!(err.contains("unrecognized subcommand 'delete'"), "{err}");
        assert!(
            Config::try_parse_from(["nodewarden-webhook"])
                .expect("parses")
                .command
                .is_none()
        );
    }

    #[test]
    fn a_missing_client_ca_file_stops_the_start() {
        let c = Config::try_parse_from([
            "nodewarden-webhook",
            "--client-ca-file=/nonexistent/ca.crt",
            "--client-names=kube-apiserver,,",
        ])
        .expect("parses");
        assert_eq!(c.client_names, ["kube-apiserver", "", ""]);
        let err = c.client_auth().expect_err("no such file").to_string();
        assert!(err.contains("/nonexistent/ca.crt"), "{err}");
    }

    #[test]
    fn claims_flags_build_the_policy() {
        use crate::admission::UserInfo;
        let c = Config::try_parse_from([
            "nodewarden-webhook",
            "--claims-allowed-users",
            "alice,,bob",
            "--claims-allowed-service-accounts",
            "nodewarden:nodewarden-webhook,system:serviceaccount:mcs:agent",
            "--claims-id-subdomain",
            "true",
        ])
        .expect("parses");
        let policy = c.claims.policy();
        assert!(policy.id_subdomain);
        let user = |name: &str, groups: &[&str]| UserInfo {
            username: name.to_string(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..Default::default()
        };
        assert!(policy.principals.allows(&user("bob", &[])));
        assert!(policy.principals.allows(&user("carol", &["system:masters"])));
        assert!(
            policy
                .principals
                .allows(&user("system:serviceaccount:nodewarden:nodewarden-webhook", &[]))
        );
        assert!(
            policy
                .principals
                .allows(&user("system:serviceaccount:mcs:agent", &[]))
        );
        assert!(
            !policy
                .principals
                .allows(&user("system:serviceaccount:mcs:other", &[]))
        );
        assert!(!policy.principals.allows(&user("", &[])));

        let defaults = Config::try_parse_from(["nodewarden-webhook"]).expect("defaults parse");
        assert!(!defaults.claims.claims_id_subdomain && !defaults.claims.claims_initialize_id);
        assert!(
            !defaults
                .claims
                .policy()
                .principals
                .allows(&user("alice", &["developers"]))
        );
    }

    #[test]
    fn bad_values_are_rejected_with_what_is_accepted() {
        let cases: &[(&[&str], &str)] = &[
            (&["--listen-addr", "8443"], "invalid socket address"),
            (&["--cert-reload-interval", "soon"], "use e.g."),
            (&["--cert-reload-interval", "1ms"], "at least 100ms"),
            (&["--max-body-bytes", "10"], "1024"),
            (&["--max-connections", "0"], "1..=1000000"),
            (&["--max-connections-per-source", "0"], "1..=1000000"),
            (&["--max-connections-per-source", "many"], "invalid digit"),
            (&["--max-connection-rate-per-source", "0"], "1..=1000000"),
            (&["--max-connection-rate-per-source", "2000000"], "1..=1000000"),
            (&["--idle-timeout", "forever"], "use e.g."),
            (&["--tls-handshake-timeout", "1ms"], "at least 100ms"),
            (&["--request-timeout", "1 fortnight"], "use e.g."),
            (&["--log-format", "xml"], "json"),
            (
                &["--claims-allowed-service-accounts", "nodewarden"],
                "<namespace>:<name>",
            ),
            (
                &["--claims-allowed-service-accounts", "Bad_NS:sa"],
                "namespace contains 'B'",
            ),
            (&["--claims-id-subdomain", "maybe"], "true"),
            (&["--claims-discovery-interval", "5ms"], "at least 100ms"),
            (&["--client-names", "kube-apiserver"], "--client-ca-file"),
        ];
        for (args, want) in cases {
            let mut argv = vec!["nodewarden-webhook"];
            argv.extend_from_slice(args);
            let err = Config::try_parse_from(argv).expect_err("must fail").to_string();
            assert!(err.contains(want), "{args:?}: {err}");
        }
    }
}
