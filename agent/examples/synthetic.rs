//! Benchmark: the agent's sample tick on a synthetic cgroup tree.
//!
//! ```sh
//! cargo run --release -p nodewarden-agent --example synthetic -- --containers 100 --duration 1h
//! ```
//!
//! Builds a cgroup v2 tree (systemd driver, containerd) with `--containers` autoscaled
//! containers (`--per-pod` per DaemonSet pod, one autoscaler per DaemonSet), then runs the
//! agent's tick for `--duration` of agent time at one tick per `--sample-interval` (10 s),
//! without sleeping in between unless `--wall-interval` is set. Between ticks a writer moves the
//! counters (its cost is measured apart and left out). Every 3rd tick the metrics are encoded
//! (a 30 s scrape) and every 6th the checkpoint is written (1 min), as in the agent's defaults.
//! The admin server and the tick run on a current-thread Tokio runtime, as in the binary.
//!
//! `--workload daily|hot --duration 48h` moves the usage through a day (and hourly bursts): the
//! publish decisions per hour then show the API writes a node makes once its histograms are full.
//!
//! Prints the agent's CPU per tick (on-CPU time of the thread from
//! `/proc/thread-self/schedstat`), what that is in millicores at one tick per sample interval,
//! and the process's RSS (`VmRSS`, `VmHWM` from `/proc/self/status`).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use nodewarden_agent::metrics::Metrics;
use nodewarden_agent::rightsizing::pods;
use nodewarden_agent::rightsizing::sampler::{PublishConfig, Sampler};
use nodewarden_api::rightsizing::DaemonSetAutoscaler;
use nodewarden_estimator::recommender::EstimatorConfig;
use serde_json::json;

#[derive(Parser)]
struct Args {
    /// Autoscaled containers on the node.
    #[arg(long, default_value_t = 100)]
    containers: usize,
    /// Containers per pod.
    #[arg(long, default_value_t = 1)]
    per_pod: usize,
    /// Agent time to simulate.
    #[arg(long, default_value = "1h", value_parser = nodewarden_runtime::duration::parse_duration)]
    duration: Duration,
    /// Agent time between ticks.
    #[arg(long, default_value = "10s", value_parser = nodewarden_runtime::duration::parse_duration)]
    sample_interval: Duration,
    /// Wall time between ticks (0: as fast as possible).
    #[arg(long, default_value = "0s", value_parser = nodewarden_runtime::duration::parse_duration)]
    wall_interval: Duration,
    /// How the containers' usage moves: `steady` (constant CPU, memory wandering), `daily` (CPU
    /// and memory follow a day's cycle, ±60 % and ±30 %, with noise), or `hot` (`daily`, plus a
    /// ten-minute burst at four times the CPU every hour and memory that grows through the
    /// burst): what the API writes per node come to once the histograms are full.
    #[arg(long, default_value = "steady")]
    workload: Workload,
    /// The agent's `--publish-budget` (0s: none).
    #[arg(long, default_value = "10m", value_parser = nodewarden_runtime::duration::parse_duration)]
    publish_budget: Duration,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum, PartialEq)]
enum Workload {
    Steady,
    Daily,
    Hot,
}

/// Container `i`'s CPU in millicores and memory in bytes at agent time `t_s` seconds.
fn usage(workload: Workload, i: usize, t_s: u64) -> (u64, u64) {
    let base_cpu = (i as u64 % 10 + 1) * 10;
    let base_mem = (64 + (i as u64 * 37) % 448) << 20;
    if workload == Workload::Steady {
        let t = t_s / 10;
        return (base_cpu, (64 + (i as u64 * 7 + t * 13) % 512) << 20);
    }
    let day = (t_s as f64 / 86_400.0 + i as f64 / 17.0) * std::f64::consts::TAU;
    // noise in [-0.1, 0.1], the same for a given container and time
    let noise = ((i as u64).wrapping_mul(2_654_435_761) ^ t_s.wrapping_mul(40_503)) % 2001;
    let noise = noise as f64 / 10_000.0 - 0.1;
    let mut cpu = base_cpu as f64 * (1.0 + 0.6 * day.sin() + noise);
    let mut mem = base_mem as f64 * (1.0 + 0.3 * day.sin() + noise / 2.0);
    if workload == Workload::Hot {
        let in_hour = t_s % 3600;
        if in_hour < 600 {
            cpu *= 4.0;
            mem *= 1.0 + in_hour as f64 / 600.0;
        }
    }
    (cpu.max(1.0) as u64, mem.max(1.0) as u64)
}

/// The agent's default `--min-publish-interval`.
const MIN_INTERVAL_MS: i64 = 30_000;

fn thread_cpu_ns() -> u64 {
    fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

fn status_kib(field: &str) -> u64 {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn id(i: usize) -> String {
    format!("{i:064x}")
}

fn uid(p: usize) -> String {
    format!("0a1b2c3d-0000-4000-8000-{p:012}")
}

fn scope(root: &Path, p: usize, i: usize) -> PathBuf {
    root.join("kubepods.slice/kubepods-burstable.slice")
        .join(format!(
            "kubepods-burstable-pod{}.slice",
            uid(p).replace('-', "_")
        ))
        .join(format!("cri-containerd-{}.scope", id(i)))
}

fn write_counters(dir: &Path, cpu_usec: u64, memory: u64, oom: u64) -> std::io::Result<()> {
    fs::write(
        dir.join("cpu.stat"),
        format!(
            "usage_usec {cpu_usec}\nuser_usec {}\nsystem_usec {}\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n",
            cpu_usec / 2,
            cpu_usec / 2
        ),
    )?;
    fs::write(dir.join("memory.current"), format!("{memory}\n"))?;
    fs::write(
        dir.join("memory.stat"),
        format!(
            "anon {}\nfile {}\nkernel 1228800\ninactive_anon 0\nactive_anon 0\ninactive_file {}\nactive_file 0\n",
            memory / 2,
            memory / 2,
            memory / 4
        ),
    )?;
    fs::write(
        dir.join("memory.events"),
        format!("low 0\nhigh 0\nmax 0\noom {oom}\noom_kill {oom}\noom_group_kill 0\n"),
    )
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let per_pod = args.per_pod.max(1);
    let pods_n = args.containers.div_ceil(per_pod);
    let tmp = tempfile::tempdir()?;
    let root = tmp.path().join("cgroup");
    fs::create_dir_all(&root)?;
    fs::write(root.join("cgroup.controllers"), "cpuset cpu io memory pids\n")?;
    let checkpoint_dir = tmp.path().join("checkpoint");
    fs::create_dir_all(&checkpoint_dir)?;

    // pods and autoscalers as the watches would hold them
    let mut pod_objs = Vec::new();
    let mut autoscalers = Vec::new();
    for p in 0..pods_n {
        let ids: Vec<usize> = (p * per_pod..((p + 1) * per_pod).min(args.containers)).collect();
        let containers: Vec<_> = ids
            .iter()
            .map(|i| json!({"name": format!("c{i}"), "image": "i", "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}))
            .collect();
        let statuses: Vec<_> = ids
            .iter()
            .map(|i| {
                json!({"name": format!("c{i}"), "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                            "containerID": format!("containerd://{}", id(*i))})
            })
            .collect();
        for i in &ids {
            let dir = scope(&root, p, *i);
            fs::create_dir_all(&dir)?;
            write_counters(&dir, 0, 100 << 20, 0)?;
        }
        pod_objs.push(Arc::new(serde_json::from_value::<pods::NodePod>(json!({
            "metadata": {"name": format!("ds{p}-x"), "namespace": "bench", "uid": uid(p),
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": format!("ds{p}"), "uid": "d", "controller": true}]},
            "spec": {"nodeName": "x", "containers": containers},
            "status": {"containerStatuses": statuses}
        }))?));
        autoscalers.push(Arc::new(serde_json::from_value::<DaemonSetAutoscaler>(json!({
            "apiVersion": "nodewarden.io/v1alpha1", "kind": "DaemonSetAutoscaler",
            "metadata": {"name": format!("ds{p}"), "namespace": "bench"},
            "spec": {"targetRef": {"kind": "DaemonSet", "name": format!("ds{p}")}}
        }))?));
    }

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let metrics = Arc::new(Metrics::new());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let encoded = metrics.clone();
        let admin = nodewarden_runtime::admin::router(
            Arc::new(nodewarden_runtime::admin::Readiness::default()),
            Arc::new(move || encoded.encode()),
        );
        tokio::spawn(async move { axum::serve(listener, admin).await });

        let mut sampler = Sampler::new(
            "x".into(),
            root.clone(),
            EstimatorConfig::default(),
            PublishConfig {
                change_threshold: 0.1,
                refresh_ms: 3_600_000,
                min_interval_ms: MIN_INTERVAL_MS,
                budget_interval_ms: i64::try_from(args.publish_budget.as_millis())?,
            },
            metrics.clone(),
        );
        let step_ms = i64::try_from(args.sample_interval.as_millis())?;
        let ticks = (args.duration.as_millis() / args.sample_interval.as_millis().max(1)).max(1) as usize;
        let start_ms = nodewarden_agent::now_ms();
        let mut cpu_usec = vec![0u64; args.containers];
        let mut agent_ns = 0u64;
        let mut writer_ns = 0u64;
        let mut publishes = 0usize;
        // publish decisions per hour of agent time
        let mut per_hour: Vec<usize> = vec![0; (args.duration.as_secs() as usize).div_ceil(3600).max(1)];
        let mut scrape_bytes = 0usize;
        let wall = Instant::now();
        for t in 0..ticks {
            // the workload: container i uses (i % 10 + 1) × 10 millicores, memory wanders
            let w0 = thread_cpu_ns();
            let t_s = t as u64 * args.sample_interval.as_secs();
            for (i, used) in cpu_usec.iter_mut().enumerate() {
                let (cpu, memory) = usage(args.workload, i, t_s);
                *used += cpu * args.sample_interval.as_millis() as u64;
                write_counters(&scope(&root, i / per_pod, i), *used, memory, 0)?;
            }
            writer_ns += thread_cpu_ns() - w0;

            let a0 = thread_cpu_ns();
            let now = start_ms + t as i64 * step_ms;
            let targets = pods::targets(&pod_objs, &autoscalers);
            let alive: BTreeMap<_, _> = pods::autoscaler_refs(&autoscalers);
            let tick = sampler.tick(now, &targets, &alive);
            if tick.publish.is_some() {
                publishes += 1;
                if let Some(h) = per_hour.get_mut(t_s as usize / 3600) {
                    *h += 1;
                }
            }
            if t % 3 == 0 {
                scrape_bytes = metrics.encode().len();
            }
            if t % 6 == 0 {
                nodewarden_agent::rightsizing::checkpoint::save(&checkpoint_dir, &sampler.checkpoint(now))?;
            }
            agent_ns += thread_cpu_ns() - a0;
            if !args.wall_interval.is_zero() {
                tokio::time::sleep(args.wall_interval).await;
            } else {
                tokio::task::yield_now().await;
            }
        }
        let per_tick_ms = agent_ns as f64 / ticks as f64 / 1e6;
        let millicores = per_tick_ms / args.sample_interval.as_secs_f64();
        let checkpoint_size = fs::metadata(nodewarden_agent::rightsizing::checkpoint::path(&checkpoint_dir, &sampler.checkpoint(0).node))?.len();
        println!(
            "containers={} pods={} ticks={} (agent time {:?} at {:?}; wall {:.1?})",
            args.containers,
            pods_n,
            ticks,
            args.duration,
            args.sample_interval,
            wall.elapsed()
        );
        println!(
            "agent cpu: {per_tick_ms:.3} ms per tick = {millicores:.3} millicores at one tick per {:?}",
            args.sample_interval
        );
        println!(
            "synthetic writer cpu (left out): {:.3} ms per tick",
            writer_ns as f64 / ticks as f64 / 1e6
        );
        println!(
            "rss: VmRSS {} KiB, VmHWM {} KiB",
            status_kib("VmRSS:"),
            status_kib("VmHWM:")
        );
        let steady = &per_hour[per_hour.len() / 2..];
        println!(
            "workload {:?}: publish decisions per hour {:?}; in the second half, {:.2} per 10 minutes",
            args.workload,
            per_hour,
            steady.iter().sum::<usize>() as f64 / (steady.len() * 6) as f64
        );
        println!(
            "publish decisions: {publishes}; /metrics body {scrape_bytes} B; checkpoint {checkpoint_size} B; cgroup tree walks {}",
            sampler.locator_walks()
        );
        Ok::<(), anyhow::Error>(())
    })
}
