//! A real Prometheus server for the history tests, with history backfilled by promtool.
//!
//! Both binaries come from `tests/promtool/build.sh` (the Prometheus Go module pinned there,
//! cached). [`Synthetic`] writes cAdvisor-shaped series (`container_cpu_usage_seconds_total`,
//! a counter, and `container_memory_working_set_bytes`, a gauge, labelled `namespace`, `pod`,
//! `container`, `node`) as OpenMetrics text, `promtool tsdb create-blocks-from openmetrics`
//! turns them into blocks, and [`Prometheus::start`] serves them from a temporary TSDB on a
//! free loopback port; dropping it stops the server and removes the folder (a watchdog kills
//! it if the test process ends without dropping it). [`Prometheus::scraping`] starts one with
//! an empty TSDB that scrapes what its configuration names (the real-node tier: the kubelets'
//! `/metrics/cadvisor`). Where a series asks for it ([`OomSeries`]), kube-state-metrics' series
//! of its pod are written too (`kube_pod_info`, restarts, last terminated reason), and its OOM
//! kills show in them.
//!
//! The synthetic series are scraped every 30 s from a minute boundary: in minute `m` (the
//! interval `(start + m min, start + (m+1) min]`) the container uses `cpu[m]` cores and its
//! working set is `memory[m]` at both scrapes. So a `query_range` with a 1-minute step on
//! minute boundaries sees, at the end of minute `m`, exactly `cpu[m]` from
//! `rate(…[1m])` and `memory[m]` from `max_over_time(…[1m])`: [`Synthetic::expected`]; an OOM
//! kill in minute `m` shows at its end ([`Synthetic::expected_oom`]).

use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};

use crate::process::{Processes, cached_build, write_file};

/// Scrape interval of the synthetic series.
pub const SCRAPE_SECS: i64 = 30;

/// The bin folder holding `prometheus` and `promtool`, built (or found cached) by
/// `tests/promtool/build.sh`.
pub fn binaries() -> Result<PathBuf> {
    cached_build("promtool/build.sh", &["prometheus", "promtool"])
}

/// One container's synthetic usage, minute by minute from `start_ms`.
#[derive(Clone, Debug)]
pub struct Synthetic {
    /// The `namespace` label.
    pub namespace: String,
    /// The `pod` label.
    pub pod: String,
    /// The `container` label.
    pub container: String,
    /// The `node` label.
    pub node: String,
    /// Start, in milliseconds since the Unix epoch (a whole minute).
    pub start_ms: i64,
    /// Cores used in each minute.
    pub cpu: Vec<f64>,
    /// Working set in each minute, in bytes.
    pub memory: Vec<f64>,
    /// Minutes in which the container was OOM-killed once, shown by the series `oom_series` says.
    pub oom_minutes: Vec<usize>,
    /// Which series the pod and its OOM kills show in.
    pub oom_series: OomSeries,
}

/// Which exporter's series a [`Synthetic`] container's OOM kills show in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OomSeries {
    /// The kubelet's cAdvisor counter `container_oom_events_total` (written only for containers
    /// with a kill).
    #[default]
    Cadvisor,
    /// kube-state-metrics, as it exports every pod, scraped once a minute: `kube_pod_info`
    /// (value 1, the pod's `node`),
    /// `kube_pod_container_status_restarts_total` (one restart per kill) and, from the first kill
    /// on, `kube_pod_container_status_last_terminated_reason{reason="OOMKilled"}` (1). Its
    /// container series carry the `node` label a scrape job of endpoints gives them: the node
    /// kube-state-metrics runs on ([`KSM_NODE`]), not the pod's.
    KubeStateMetrics,
    /// Both.
    Both,
}

/// The node kube-state-metrics runs on, in the `node` label of its container series.
pub const KSM_NODE: &str = "monitoring-node";

impl Synthetic {
    fn labels(&self) -> String {
        format!(
            "namespace=\"{}\",pod=\"{}\",container=\"{}\",node=\"{}\",id=\"/kubepods/{}/{}\"",
            self.namespace, self.pod, self.container, self.node, self.pod, self.container
        )
    }

    /// What a 1-minute `query_range` on minute boundaries gives: `(end of minute m in ms,
    /// cpu[m], memory[m])`.
    pub fn expected(&self) -> Vec<(i64, f64, f64)> {
        self.cpu
            .iter()
            .zip(&self.memory)
            .enumerate()
            .map(|(m, (&cpu, &memory))| (self.start_ms + (m as i64 + 1) * 60_000, cpu, memory))
            .collect()
    }

    fn ksm_labels(&self) -> String {
        format!(
            "namespace=\"{}\",pod=\"{}\",container=\"{}\",job=\"kube-state-metrics\",node=\"{KSM_NODE}\"",
            self.namespace, self.pod, self.container
        )
    }

    /// kube-state-metrics' scrapes: one a minute, at the end of each minute (`(minute, ms)`).
    fn ksm_scrapes(&self) -> impl Iterator<Item = (usize, i64)> + '_ {
        (0..self.memory.len()).map(move |m| (m, self.start_ms + (m as i64 + 1) * 60_000))
    }

    fn kills_until(&self, m: usize) -> usize {
        self.oom_minutes.iter().filter(|&&k| k <= m).count()
    }

    /// The OOM kills a 1-minute `query_range` shows: `(end of minute m in ms, kills)`.
    pub fn expected_oom(&self) -> Vec<(i64, u64)> {
        self.oom_minutes
            .iter()
            .map(|&m| (self.start_ms + (m as i64 + 1) * 60_000, 1))
            .collect()
    }
}

fn seconds(ms: i64) -> String {
    format!("{}.{:03}", ms.div_euclid(1000), ms.rem_euclid(1000))
}

/// Writes `series` as OpenMetrics text to `path`: the CPU counter family, the gauge family, the
/// OOM counter family (when a series has kills shown by cAdvisor), kube-state-metrics' families
/// (when a series shows in them), each series' points in time order, ending with `# EOF`.
pub fn write_openmetrics(path: &Path, series: &[Synthetic]) -> Result<()> {
    let file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    writeln!(
        out,
        "# HELP container_cpu_usage_seconds Cumulative cpu time consumed in seconds."
    )?;
    writeln!(out, "# TYPE container_cpu_usage_seconds counter")?;
    for s in series {
        let labels = s.labels();
        let mut total = 0.0;
        writeln!(
            out,
            "container_cpu_usage_seconds_total{{{labels}}} 0 {}",
            seconds(s.start_ms)
        )?;
        for (m, &cores) in s.cpu.iter().enumerate() {
            for k in 1..=(60 / SCRAPE_SECS) {
                total += cores * SCRAPE_SECS as f64;
                let at = s.start_ms + m as i64 * 60_000 + k * SCRAPE_SECS * 1000;
                writeln!(
                    out,
                    "container_cpu_usage_seconds_total{{{labels}}} {total} {}",
                    seconds(at)
                )?;
            }
        }
    }
    writeln!(
        out,
        "# HELP container_memory_working_set_bytes Current working set in bytes."
    )?;
    writeln!(out, "# TYPE container_memory_working_set_bytes gauge")?;
    for s in series {
        let labels = s.labels();
        for (m, &bytes) in s.memory.iter().enumerate() {
            for k in 1..=(60 / SCRAPE_SECS) {
                let at = s.start_ms + m as i64 * 60_000 + k * SCRAPE_SECS * 1000;
                writeln!(
                    out,
                    "container_memory_working_set_bytes{{{labels}}} {bytes} {}",
                    seconds(at)
                )?;
            }
        }
    }
    let cadvisor_oom =
        |s: &&Synthetic| !s.oom_minutes.is_empty() && s.oom_series != OomSeries::KubeStateMetrics;
    let ksm = |s: &&Synthetic| s.oom_series != OomSeries::Cadvisor;
    if series.iter().any(|s| cadvisor_oom(&s)) {
        writeln!(
            out,
            "# HELP container_oom_events Count of out of memory events observed for the container."
        )?;
        writeln!(out, "# TYPE container_oom_events counter")?;
    }
    for s in series.iter().filter(cadvisor_oom) {
        let labels = s.labels();
        let mut kills = 0;
        for m in 0..s.memory.len() {
            // a kill in minute m shows from its first scrape on
            kills += s.oom_minutes.iter().filter(|&&k| k == m).count();
            for k in 1..=(60 / SCRAPE_SECS) {
                let at = s.start_ms + m as i64 * 60_000 + k * SCRAPE_SECS * 1000;
                writeln!(
                    out,
                    "container_oom_events_total{{{labels}}} {kills} {}",
                    seconds(at)
                )?;
            }
        }
    }
    if series.iter().any(|s| ksm(&s)) {
        writeln!(out, "# HELP kube_pod_info Information about pod.")?;
        writeln!(out, "# TYPE kube_pod_info gauge")?;
        for s in series.iter().filter(ksm) {
            let labels = format!(
                "namespace=\"{}\",pod=\"{}\",node=\"{}\",created_by_kind=\"DaemonSet\",job=\"kube-state-metrics\"",
                s.namespace, s.pod, s.node
            );
            for (_, at) in s.ksm_scrapes() {
                writeln!(out, "kube_pod_info{{{labels}}} 1 {}", seconds(at))?;
            }
        }
        writeln!(
            out,
            "# HELP kube_pod_container_status_restarts The number of container restarts per container."
        )?;
        writeln!(out, "# TYPE kube_pod_container_status_restarts counter")?;
        for s in series.iter().filter(ksm) {
            let labels = s.ksm_labels();
            for (m, at) in s.ksm_scrapes() {
                writeln!(
                    out,
                    "kube_pod_container_status_restarts_total{{{labels}}} {} {}",
                    s.kills_until(m),
                    seconds(at)
                )?;
            }
        }
        writeln!(
            out,
            "# HELP kube_pod_container_status_last_terminated_reason Describes the last reason the container was in terminated state."
        )?;
        writeln!(
            out,
            "# TYPE kube_pod_container_status_last_terminated_reason gauge"
        )?;
        for s in series.iter().filter(ksm) {
            let labels = format!("{},reason=\"OOMKilled\"", s.ksm_labels());
            for (_, at) in s.ksm_scrapes().filter(|&(m, _)| s.kills_until(m) > 0) {
                writeln!(
                    out,
                    "kube_pod_container_status_last_terminated_reason{{{labels}}} 1 {}",
                    seconds(at)
                )?;
            }
        }
    }
    writeln!(out, "# EOF")?;
    out.flush()?;
    Ok(())
}

/// A running Prometheus server.
pub struct Prometheus {
    processes: Processes,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Prometheus {
    /// Backfills `series` (none: an empty server) into a new TSDB and serves it on a free
    /// loopback port; `web_config` (YAML), when given, is its `--web.config.file` (e.g.
    /// `basic_auth_users`, which makes it answer 401 to anyone else). Waits until `/-/ready`.
    pub async fn start(series: &[Synthetic], web_config: Option<&str>) -> Result<Self> {
        Self::launch(
            series,
            web_config,
            "global:\n  scrape_interval: 30s\n",
            IpAddr::V4(Ipv4Addr::LOCALHOST),
        )
        .await
    }

    /// An empty Prometheus on a free port of `listen` that scrapes as `config` (its whole
    /// `prometheus.yml`: `global` and `scrape_configs`) says. Waits until `/-/ready`.
    pub async fn scraping(config: &str, listen: IpAddr) -> Result<Self> {
        Self::launch(&[], None, config, listen).await
    }

    async fn launch(
        series: &[Synthetic],
        web_config: Option<&str>,
        config_yaml: &str,
        listen: IpAddr,
    ) -> Result<Self> {
        let bin = binaries()?;
        let dir = tempfile::Builder::new()
            .prefix("nodewarden-prometheus")
            .tempdir()
            .context("creating the Prometheus folder")?;
        let tsdb = dir.path().join("tsdb");
        std::fs::create_dir_all(&tsdb)?;
        if !series.is_empty() {
            let text = dir.path().join("history.om");
            write_openmetrics(&text, series)?;
            let started = std::time::Instant::now();
            let out = Command::new(bin.join("promtool"))
                .args(["tsdb", "create-blocks-from", "openmetrics"])
                .arg(&text)
                .arg(&tsdb)
                .output()
                .context("running promtool tsdb create-blocks-from openmetrics")?;
            ensure!(
                out.status.success(),
                "promtool tsdb create-blocks-from openmetrics failed ({}):\n{}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            eprintln!(
                "prometheus: backfilled the series of {} containers in {:.1}s",
                series.len(),
                started.elapsed().as_secs_f64()
            );
            std::fs::remove_file(&text)?;
        }
        let config = dir.path().join("prometheus.yml");
        write_file(&config, config_yaml.as_bytes(), false)?;
        // free on every address, so on `listen` too; below the ephemeral range (see free_port)
        let port = crate::process::free_port()?;
        let mut args = vec![
            format!("--config.file={}", config.display()),
            format!("--storage.tsdb.path={}", tsdb.display()),
            format!("--web.listen-address={}", SocketAddr::new(listen, port)),
            "--storage.tsdb.retention.time=30d".to_string(),
            "--log.level=warn".to_string(),
        ];
        if let Some(web) = web_config {
            let path = dir.path().join("web.yml");
            write_file(&path, web.as_bytes(), false)?;
            args.push(format!("--web.config.file={}", path.display()));
        }
        let mut processes = Processes::new(dir.path(), false)?;
        processes.spawn("prometheus", &bin.join("prometheus"), &args)?;
        let prometheus = Prometheus {
            processes,
            addr: SocketAddr::new(listen, port),
            dir,
        };
        prometheus.wait_ready().await?;
        Ok(prometheus)
    }

    async fn wait_ready(&self) -> Result<()> {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            // with basic auth every path answers 401: the server is up
            if let Ok((status, _)) = crate::webhooks::http_get_at(self.addr, "/-/ready").await
                && (status == 200 || status == 401)
            {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                bail!(
                    "Prometheus on {} not ready within 60 s:\n{}",
                    self.addr,
                    self.processes.log_tails(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Its base URL, `http://<address>:<port>` (`127.0.0.1` unless started [`Prometheus::scraping`]).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Its folder (the TSDB and its log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The end of its log, for a failure's message.
    pub fn log_tail(&self, lines: usize) -> String {
        self.processes.log_tails(lines)
    }
}
