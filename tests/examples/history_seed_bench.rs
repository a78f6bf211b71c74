//! What the agent's seeding from Prometheus costs in memory, against a real Prometheus (issue 32).
//!
//! ```sh
//! cargo run --release -p nodewarden-tests --example history-seed-bench -- --containers 1,8,24,64
//! ```
//!
//! One Prometheus (`tests/promtool/build.sh`, as the history tests) is backfilled with `--days`
//! (8, VPA's window and the agent's default) of cAdvisor series at one scrape per 30 s for the
//! largest count of `--containers`: one DaemonSet per container (`ds<i>`, pod `ds<i>-abcde`,
//! container `c`) on one node, CPU and working set moving every minute. Then, for each count
//! `N`, the agent's own seeding (`nodewarden_agent::rightsizing::seed::seed`, configured by the
//! agent's flags: `--agent-args` adds some, e.g. `--history-max-series 2000
//! --history-max-answer-size 256Mi` for the report's limits) reads the history of the first `N`
//! DaemonSets' containers on that node, as an agent without a checkpoint does at its start.
//!
//! Each count runs in a child process of its own (the same binary), so that its peak RSS is its
//! own: printed per `N`, what the seeding added to the process's peak RSS (`VmHWM` after, less
//! `VmRSS` before), `VmRSS` after (the histories kept, with the process), the largest answer's
//! body, the samples read and the wall time; or the error, when a limit refused the read (what
//! the agent would then put in its Event). Nothing is asserted.

use std::time::Instant;

use anyhow::{Context, Result, ensure};
use clap::Parser;
use nodewarden_agent::config::Config;
use nodewarden_agent::rightsizing::pods::Target;
use nodewarden_agent::rightsizing::seed;
use nodewarden_api::rightsizing::AutoscalerRef;
use nodewarden_estimator::policy::{Key, Policy};
use nodewarden_estimator::recommender::EstimatorConfig;
use nodewarden_tests::prometheus::{OomSeries, Prometheus, Synthetic};

#[derive(Parser)]
struct Args {
    /// Counts of autoscaled containers on the node to seed, comma-separated.
    #[arg(long, default_value = "1,8,24,64", value_delimiter = ',')]
    containers: Vec<usize>,
    /// Days of history backfilled (and the agent's --history-window).
    #[arg(long, default_value_t = 8)]
    days: usize,
    /// More flags of the agent, e.g. "--history-max-series 2000 --history-max-answer-size 256Mi".
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    agent_args: String,
    /// Internal: seed once from this Prometheus (a child process per count, so that each peak
    /// RSS is its own), with `--containers` holding one count and `--now-ms` the history's end.
    #[arg(long, hide = true)]
    seed_from: Option<String>,
    #[arg(long, hide = true, default_value_t = 0)]
    now_ms: i64,
}

const NODE: &str = "bench-node";
const NAMESPACE: &str = "bench";
const MIB: f64 = 1024.0 * 1024.0;

fn target(i: usize) -> Target {
    let ds = format!("ds{i}");
    Target {
        key: Key {
            autoscaler: AutoscalerRef {
                namespace: NAMESPACE.into(),
                name: ds.clone(),
            },
            container: "c".into(),
        },
        pod_namespace: NAMESPACE.into(),
        pod_name: format!("{ds}-abcde"),
        daemonset: ds,
        cgroup_uid: format!("uid{i}"),
        container_id: format!("id{i}"),
        cpu_request_milli: Some(100),
        memory_request_bytes: Some(256 << 20),
        containers_per_pod: 1,
        policy: Policy::default(),
        last_oom: None,
    }
}

fn synthetic(i: usize, days: usize, now_ms: i64) -> Synthetic {
    let minutes = days * 24 * 60;
    let end_ms = now_ms.div_euclid(60_000) * 60_000 - 60_000;
    Synthetic {
        namespace: NAMESPACE.into(),
        pod: format!("ds{i}-abcde"),
        container: "c".into(),
        node: NODE.into(),
        start_ms: end_ms - minutes as i64 * 60_000,
        // values that print as long decimals, as real rates do
        cpu: (0..minutes)
            .map(|m| 0.1 + 0.013 * ((m * 7 + i) % 23) as f64 / 3.0)
            .collect(),
        memory: (0..minutes)
            .map(|m| (100.0 + ((m / 60 + i) % 50) as f64) * MIB + (m % 4096) as f64)
            .collect(),
        oom_minutes: Vec::new(),
        oom_series: OomSeries::Cadvisor,
    }
}

fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .trim()
        .trim_end_matches(" kB")
        .parse()
        .ok()
}

fn main() -> Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match &args.seed_from {
        Some(url) => runtime.block_on(seed_once(&args, url)),
        None => runtime.block_on(bench(&args)),
    }
}

/// Backfills one Prometheus, then runs a child per count.
async fn bench(args: &Args) -> Result<()> {
    let most = args.containers.iter().copied().max().context("no --containers")?;
    let now_ms = nodewarden_agent::now_ms();
    let series: Vec<Synthetic> = (0..most).map(|i| synthetic(i, args.days, now_ms)).collect();
    let prometheus = Prometheus::start(&series, None).await?;
    drop(series);
    let url = prometheus.url();
    println!(
        "| containers | peak RSS of the seeding (VmHWM − VmRSS before) | VmRSS after (histories kept) | largest answer | samples | time |"
    );
    println!("|---|---|---|---|---|---|");
    for &n in &args.containers {
        let out = tokio::process::Command::new(std::env::current_exe()?)
            .arg("--containers")
            .arg(n.to_string())
            .arg("--days")
            .arg(args.days.to_string())
            .arg(format!("--agent-args={}", args.agent_args))
            .arg("--seed-from")
            .arg(&url)
            .arg("--now-ms")
            .arg(now_ms.to_string())
            .output()
            .await?;
        ensure!(
            out.status.success(),
            "the seeding of {n} containers: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        print!("{}", String::from_utf8_lossy(&out.stdout));
    }
    drop(prometheus);
    Ok(())
}

/// One seeding of the first `--containers` containers, as an agent without a checkpoint does
/// at its start; prints one row.
async fn seed_once(args: &Args, url: &str) -> Result<()> {
    let n = args.containers.first().copied().context("no --containers")?;
    let window = format!("{}d", args.days);
    let mut argv = vec![
        "nodewarden-agent",
        "--node-name",
        NODE,
        "--history-prometheus-url",
        url,
        "--history-window",
        &window,
    ];
    argv.extend(args.agent_args.split_whitespace());
    let config = Config::try_from_args(argv)?
        .rightsizing
        .history
        .seed()
        .context("no seeding configured")?;
    if n == 1 {
        eprintln!(
            "limits: {} series, {} bytes per answer, pages of {} steps",
            config.limits.max_series,
            config.limits.max_response_bytes,
            config.limits.steps_per_page()
        );
    }
    let targets: Vec<Target> = (0..n).map(target).collect();
    let cfg = EstimatorConfig::default();
    let before = status_kib("VmRSS:").context("VmRSS")?;
    let started = Instant::now();
    let outcome = seed::seed(&config, NODE, &targets, &cfg, args.now_ms).await;
    let took = started.elapsed();
    let hwm = status_kib("VmHWM:").context("VmHWM")?;
    let after = status_kib("VmRSS:").context("VmRSS")?;
    let peak = mib_kib(hwm.saturating_sub(before));
    match outcome {
        Ok(seeded) => println!(
            "| {n} | {peak:.1} MiB | {:.1} MiB | {:.2} MiB | {} | {:.1} s |",
            mib_kib(after),
            seeded.largest_answer_bytes as f64 / MIB,
            seeded.samples,
            took.as_secs_f64()
        ),
        Err(err) => println!(
            "| {n} | {peak:.1} MiB | refused: {err} | | | {:.1} s |",
            took.as_secs_f64()
        ),
    }
    Ok(())
}

fn mib_kib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}
