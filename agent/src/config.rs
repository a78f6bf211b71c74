//! Flags of `nodewarden-agent`. Every flag also reads an environment variable. The common ones
//! are here; each capability's are a struct of its own beside it: right-sizing's
//! [`RightsizingArgs`] (in `rightsizing::args`), feature gate reports'
//! [`GatesArgs`](crate::features::GatesArgs).

use std::net::SocketAddr;

use clap::Parser;
use nodewarden_runtime::telemetry::LogFormat;

pub use crate::rightsizing::args::{EstimatorFlags, HistoryArgs, QuantityArg, RightsizingArgs, UpdateArgs};

/// The command line and environment of `nodewarden-agent`.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "nodewarden-agent",
    version,
    about = "nodewarden node agent: measures autoscaled DaemonSet containers on this node and publishes NodeRecommendation/<node>"
)]
pub struct Config {
    /// Name of this node (from the downward API, spec.nodeName).
    #[arg(long, env = "NODEWARDEN_NODE_NAME")]
    pub node_name: String,

    /// Address of the plain-HTTP admin server (/livez, /readyz, /metrics). Default: every
    /// interface in a pod, loopback when run by hand outside a cluster.
    #[arg(long, env = "NODEWARDEN_ADMIN_ADDR", default_value_t = nodewarden_runtime::default_bind(8080))]
    pub admin_addr: SocketAddr,

    /// Log format.
    #[arg(long, env = "NODEWARDEN_LOG_FORMAT", value_enum, default_value = "json")]
    pub log_format: LogFormat,

    /// Log filter, e.g. `info` or `nodewarden_agent=debug,info`.
    #[arg(long, env = "NODEWARDEN_LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// Per-node right-sizing: measuring this node's containers, publishing its
    /// NodeRecommendation, the estimator, updates of running pods, seeding from Prometheus.
    #[command(flatten)]
    pub rightsizing: RightsizingArgs,

    /// Feature gate reports (`NodeFeatureReport/<node>`).
    #[command(flatten)]
    pub gates: crate::features::GatesArgs,
}

impl Config {
    /// Parses flags from `args` (the first being the program name), as from the command line.
    pub fn try_from_args<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        Self::try_parse_from(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::time::Duration;

    use nodewarden_estimator::recommender::EstimatorConfig;

    #[test]
    fn defaults_are_the_vpa_constants() {
        let c = Config::try_parse_from(["nodewarden-agent", "--node-name", "x"]).expect("defaults parse");
        assert_eq!(c.rightsizing.sample_interval, Duration::from_secs(10));
        assert_eq!(c.rightsizing.refresh_interval, Duration::from_secs(3600));
        assert_eq!(c.rightsizing.publish_budget, Duration::from_secs(600));
        assert_eq!(c.admin_addr.port(), 8080);
        let e = c.rightsizing.estimator.estimator().unwrap();
        assert_eq!(e, EstimatorConfig::default());
        // no seeding unless asked for
        assert!(c.rightsizing.history.seed().is_none());
    }

    #[test]
    fn history_flags_make_the_seeding() {
        let c = Config::try_parse_from([
            "nodewarden-agent",
            "--node-name",
            "x",
            "--history-prometheus-url",
            "https://prom.example/prometheus",
            "--history-prometheus-token-file",
            "token",
            "--history-window",
            "2d",
        ])
        .unwrap();
        let s = c.rightsizing.history.seed().expect("seeding");
        assert_eq!(s.endpoint.url, "https://prom.example/prometheus");
        assert_eq!(s.endpoint.bearer_token_file, Some(PathBuf::from("token")));
        assert_eq!(s.window, Duration::from_secs(2 * 24 * 3600));
        assert_eq!(s.limits.query_timeout, Duration::from_secs(30));
        assert_eq!(s.budget, Duration::from_secs(120));
        // the chart's empty default: off
        let d = Config::try_parse_from([
            "nodewarden-agent",
            "--node-name",
            "x",
            "--history-prometheus-url",
            "",
        ]);
        assert!(d.unwrap().rightsizing.history.seed().is_none());
        let d = Config::try_parse_from([
            "nodewarden-agent",
            "--node-name",
            "x",
            "--history-prometheus-url",
            "prom:9090",
        ]);
        assert!(d.unwrap_err().to_string().contains("not an http"));
        let err =
            Config::try_parse_from(["nodewarden-agent", "--node-name", "x", "--history-window", "100d"])
                .unwrap_err()
                .to_string();
        assert!(err.contains("longer than 90d"), "{err}");
        let c = Config::try_parse_from(["nodewarden-agent", "--node-name", "x"]).unwrap();
        assert_eq!(
            c.rightsizing.history.history_window,
            Duration::from_secs(8 * 24 * 3600)
        );
        assert_eq!(
            c.rightsizing.history.history_rate_window,
            crate::rightsizing::seed::RATE_WINDOW
        );
    }

    #[test]
    fn the_seeding_limits_fit_the_agents_memory_and_bad_ones_are_clear_errors() {
        let parse = |extra: &[&str]| {
            let mut args = vec![
                "nodewarden-agent",
                "--node-name",
                "x",
                "--history-prometheus-url",
                "http://prom:9090",
            ];
            args.extend_from_slice(extra);
            Config::try_parse_from(args)
        };
        // the defaults: a few MiB per answer, not the report's 256 MiB, and pages short enough
        // that an answer of every series allowed fits
        let l = parse(&[])
            .unwrap()
            .rightsizing
            .history
            .seed()
            .expect("seeding")
            .limits;
        assert_eq!(l.max_response_bytes, 4 << 20);
        assert_eq!(l.max_series, crate::rightsizing::seed::MAX_SERIES);
        // a query gathers at most that many series of 8 days at 1 minute, whatever the window
        assert_eq!(l.max_points_per_read, l.max_series * (8 * 24 * 60 + 1));
        let page = l.steps_per_page();
        assert!(
            l.max_series * page * crate::rightsizing::seed::ANSWER_BYTES_PER_POINT <= l.max_response_bytes,
            "{l:?}: pages of {page} steps"
        );
        let l = parse(&["--history-max-series", "200", "--history-max-answer-size", "16Mi"])
            .unwrap()
            .rightsizing
            .history
            .seed()
            .expect("seeding")
            .limits;
        assert_eq!((l.max_series, l.max_response_bytes), (200, 16 << 20));
        assert!(
            l.max_series * l.steps_per_page() * 48 <= l.max_response_bytes,
            "{l:?}"
        );
        for (args, want) in [
            (&["--history-max-series", "0"][..], "from 1 to 2000"),
            (&["--history-max-series", "many"], "from 1 to 2000"),
            (&["--history-max-answer-size", "1Ki"], "between 64Ki and 256Mi"),
            (&["--history-max-answer-size", "1Gi"], "between 64Ki and 256Mi"),
            (&["--history-max-answer-size", "big"], "is not a size"),
        ] {
            let err = parse(args).unwrap_err().to_string();
            assert!(err.contains(args[0]) && err.contains(want), "{args:?}: {err}");
        }
    }

    #[test]
    fn the_rate_window_is_a_flag_with_clear_errors() {
        let parse = |v: &str| {
            Config::try_parse_from([
                "nodewarden-agent",
                "--node-name",
                "x",
                "--history-prometheus-url",
                "http://prom:9090",
                "--history-rate-window",
                v,
            ])
        };
        let s = parse("30s").unwrap().rightsizing.history.seed().expect("seeding");
        assert_eq!(s.rate_window, Duration::from_secs(30));
        let err = parse("25h").unwrap_err().to_string();
        assert!(err.contains("longer than 24h"), "{err}");
        let err = parse("500ms").unwrap_err().to_string();
        assert!(err.contains("--history-rate-window"), "{err}");
        let err = parse("soon").unwrap_err().to_string();
        assert!(
            err.contains("--history-rate-window") && err.contains("soon"),
            "{err}"
        );
    }

    #[test]
    fn node_name_is_required() {
        let err = Config::try_parse_from(["nodewarden-agent"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--node-name"), "{err}");
    }

    #[test]
    fn bad_values_are_rejected_with_what_is_accepted() {
        let cases: &[(&[&str], &str)] = &[
            (&["--sample-interval", "often"], "use e.g."),
            (&["--sample-interval", "1ms"], "at least 100ms"),
            (&["--target-percentile", "90"], "between 0 and 1"),
            (&["--pod-min-memory", "lots"], "not a Kubernetes quantity"),
            (&["--bucket-growth", "0"], "greater than 0"),
            (&["--memory-aggregation-interval-count", "0"], "1..=1000"),
            (&["--log-format", "xml"], "json"),
        ];
        for (args, want) in cases {
            let mut argv = vec!["nodewarden-agent", "--node-name", "x"];
            argv.extend_from_slice(args);
            let err = Config::try_parse_from(argv).expect_err("must fail").to_string();
            assert!(err.contains(want), "{args:?}: {err}");
        }
    }

    #[test]
    fn estimator_flags_override_the_constants() {
        let c = Config::try_parse_from([
            "nodewarden-agent",
            "--node-name",
            "x",
            "--pod-min-cpu",
            "50m",
            "--pod-min-memory",
            "1Gi",
            "--lower-bound-confidence-exponent",
            "-3",
            "--memory-aggregation-interval",
            "1h",
        ])
        .unwrap();
        let e = c.rightsizing.estimator.estimator().unwrap();
        assert!((e.pod_min_cpu_cores - 0.05).abs() < 1e-12);
        assert_eq!(e.pod_min_memory_bytes, 1024.0 * 1024.0 * 1024.0);
        assert_eq!(e.lower_confidence_exponent, -3.0);
        assert_eq!(e.memory_interval_ms, 3_600_000);
    }

    #[test]
    fn bad_update_flags_are_clear_errors() {
        let parse = |extra: &[&str]| {
            let mut args = vec!["nodewarden-agent", "--node-name", "n1"];
            args.extend_from_slice(extra);
            Config::try_parse_from(args)
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        assert!(parse(&[]).is_ok());
        let err = parse(&["--disruption-namespace", "Not_A_Namespace"]).unwrap_err();
        assert!(err.contains("is not a namespace name"), "{err}");
        let err = parse(&["--update-min-change=-1"]).unwrap_err();
        assert!(err.contains("must not be negative"), "{err}");
        let err = parse(&["--update-interval", "soon"]).unwrap_err();
        assert!(err.contains("use e.g. 500ms"), "{err}");
        let err = parse(&["--update-running-pods", "maybe"]).unwrap_err();
        assert!(err.contains("maybe"), "{err}");
    }
}
