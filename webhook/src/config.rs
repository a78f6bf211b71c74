//! Flags of `nodewarden-webhook`. Every flag also reads an environment variable.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::telemetry::LogFormat;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "nodewarden-webhook",
    version,
    about = "nodewarden admission webhook: per-node right-sizing of DaemonSet pods, cluster claim guard, feature lifecycle"
)]
pub struct Config {
    /// Address of the HTTPS admission server.
    #[arg(long, env = "NODEWARDEN_LISTEN_ADDR", default_value = "0.0.0.0:8443")]
    pub listen_addr: SocketAddr,

    /// Address of the plain-HTTP admin server (/livez, /readyz, /metrics).
    #[arg(long, env = "NODEWARDEN_ADMIN_ADDR", default_value = "0.0.0.0:8080")]
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

    /// How often the certificate files are checked for a new pair (e.g. 10s, 1m).
    #[arg(long, env = "NODEWARDEN_CERT_RELOAD_INTERVAL", default_value = "10s", value_parser = parse_interval)]
    pub cert_reload_interval: Duration,

    /// Largest AdmissionReview body accepted, in bytes; larger ones get HTTP 413.
    #[arg(long, env = "NODEWARDEN_MAX_BODY_BYTES", default_value_t = 6 * 1024 * 1024,
          value_parser = clap::value_parser!(u64).range(1024..=64 * 1024 * 1024))]
    pub max_body_bytes: u64,

    /// After SIGTERM, how long to keep accepting while readiness is already false (lets
    /// endpoints drop this pod first).
    #[arg(long, env = "NODEWARDEN_SHUTDOWN_DELAY", default_value = "0s", value_parser = humantime::parse_duration)]
    pub shutdown_delay: Duration,

    /// After SIGTERM and the delay, how long in-flight requests may take to finish.
    #[arg(long, env = "NODEWARDEN_SHUTDOWN_GRACE", default_value = "20s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,

    /// Log format.
    #[arg(long, env = "NODEWARDEN_LOG_FORMAT", value_enum, default_value = "json")]
    pub log_format: LogFormat,

    /// Log filter, e.g. `info` or `nodewarden_webhook=debug,info`.
    #[arg(long, env = "NODEWARDEN_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
}

/// A duration of at least 100 ms, in humantime syntax (`500ms`, `10s`, `1m`).
pub fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (use e.g. 500ms, 10s, 1m)"))?;
    if d < Duration::from_millis(100) {
        return Err(format!("{s} is too short: at least 100ms"));
    }
    Ok(d)
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
    }

    #[test]
    fn bad_values_are_rejected_with_what_is_accepted() {
        let cases: &[(&[&str], &str)] = &[
            (&["--listen-addr", "8443"], "invalid socket address"),
            (&["--cert-reload-interval", "soon"], "use e.g."),
            (&["--cert-reload-interval", "1ms"], "at least 100ms"),
            (&["--max-body-bytes", "10"], "1024"),
            (&["--log-format", "xml"], "json"),
        ];
        for (args, want) in cases {
            let mut argv = vec!["nodewarden-webhook"];
            argv.extend_from_slice(args);
            let err = Config::try_parse_from(argv).expect_err("must fail").to_string();
            assert!(err.contains(want), "{args:?}: {err}");
        }
    }
}
