//! End-to-end: `kubectl nodewarden report --prometheus` against a real Prometheus holding 8 days
//! of backfilled cAdvisor history and the real control plane, with nothing of nodewarden
//! installed in the test's namespace (no DaemonSetAutoscaler: the report uses the defaults).
//!
//! Three Ready fake Nodes and a DaemonSet (template 100m / 64Mi) whose pods the real DaemonSet
//! controller creates. The history (tests/src/prometheus.rs, one value per minute, scraped
//! every 30 s) for those pods:
//! - node A, busy: 0.2 core, 0.5 core in 3 minutes of every 20 (15 %); 200 MiB, 300 MiB in the
//!   first hour of every day; one OOM kill on the last day, shown both by cAdvisor's
//!   `container_oom_events_total` and by kube-state-metrics (restarts, last terminated reason; its
//!   series of every pod are there), and counted once;
//! - node B, quiet: 0.02 core, 40 MiB;
//! - node C: a pod that is gone now (0.1 core, 100 MiB) for the first 5 days, then the current
//!   pod (0.3 core, 150 MiB) from day 4 on: a day of overlap, as a replaced pod's series have.
//!
//! The report must give each node the figures a user reads (target, bounds, Δ against the
//! 100m / 64Mi the pods request), computed here from VPA's bucket edges, the same figures as
//! the agent's estimator fed with the same samples, and VPA's own recommender model
//! (`tests/vpa/cmd/recommend`) fed with them agrees within its rounding (the differential
//! checks). Then the errors:
//! an unreachable URL, a 401, too many series, a Prometheus without the cAdvisor series, a
//! DaemonSet that does not exist.

use std::collections::BTreeMap;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use nodewarden_estimator::figures::{self, Figures};
use nodewarden_estimator::policy::Policy;
use nodewarden_estimator::recommender::{EstimatorConfig, History};
use nodewarden_tests::prometheus::{OomSeries, Prometheus, Synthetic};
use nodewarden_tests::{e2e, kubectl_nodewarden, simple_daemonset, vpa, wait_for_daemonset_pods};
use serde_json::Value;

const DS: &str = "log-shipper";
const MIB: f64 = 1024.0 * 1024.0;
const DAY_MIN: usize = 24 * 60;
const DAYS: usize = 8;

/// Upper edge of the VPA histogram bucket holding `v` (first bucket `first`, ratio 1.05).
fn edge(first: f64, v: f64) -> f64 {
    let n = ((v * 0.05 / first + 1.0).ln() / 1.05f64.ln()).floor();
    first * (1.05f64.powi(n as i32 + 1) - 1.0) / 0.05
}

fn minutes(from: usize, to: usize, f: impl Fn(usize) -> f64) -> Vec<f64> {
    (from..to).map(f).collect()
}

/// The synthetic history of the DaemonSet's pods, ending at the last whole minute before `now_ms`.
fn history(
    namespace: &str,
    pods: &BTreeMap<String, String>,
    nodes: &[String],
    now_ms: i64,
) -> Vec<Synthetic> {
    let total = DAYS * DAY_MIN;
    let end_ms = now_ms.div_euclid(60_000) * 60_000 - 60_000;
    let start_ms = end_ms - total as i64 * 60_000;
    let series = |pod: &str, node: &str, start_min: usize, cpu: Vec<f64>, memory: Vec<f64>| Synthetic {
        namespace: namespace.to_string(),
        pod: pod.to_string(),
        container: "agent".to_string(),
        node: node.to_string(),
        start_ms: start_ms + start_min as i64 * 60_000,
        cpu,
        memory,
        oom_minutes: Vec::new(),
        // kube-state-metrics exports every pod: the busy node's kill shows in both exporters
        oom_series: OomSeries::Both,
    };
    let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
    let mut busy = series(
        &pods[a],
        a,
        0,
        minutes(0, total, |m| if m % 20 < 3 { 0.5 } else { 0.2 }),
        minutes(0, total, |m| {
            if m % DAY_MIN < 60 {
                300.0 * MIB
            } else {
                200.0 * MIB
            }
        }),
    );
    // one OOM kill on the last day, at 10:00 of the history's day
    busy.oom_minutes = vec![7 * DAY_MIN + 600];
    vec![
        busy,
        series(
            &pods[b],
            b,
            0,
            minutes(0, total, |_| 0.02),
            minutes(0, total, |_| 40.0 * MIB),
        ),
        // the pod node C had before (gone now), then its current one, a day of overlap
        series(
            &format!("{DS}-old00"),
            c,
            0,
            minutes(0, 5 * DAY_MIN, |_| 0.1),
            minutes(0, 5 * DAY_MIN, |_| 100.0 * MIB),
        ),
        series(
            &pods[c],
            c,
            4 * DAY_MIN,
            minutes(4 * DAY_MIN, total, |_| 0.3),
            minutes(4 * DAY_MIN, total, |_| 150.0 * MIB),
        ),
    ]
}

/// One node's samples as its agent takes them from Prometheus: one per minute (the higher where
/// two pods overlap), its OOM kills, oldest first.
struct NodeSamples {
    cpu: Vec<(i64, f64)>,
    memory: Vec<(i64, f64)>,
    ooms: Vec<i64>,
}

fn node_samples(series: &[&Synthetic]) -> NodeSamples {
    let mut points: Vec<(i64, f64, f64)> = series.iter().flat_map(|s| s.expected()).collect();
    // where two pods overlap, the higher sample of the minute
    points.sort_by(|x, y| x.0.cmp(&y.0).then(y.1.total_cmp(&x.1)));
    let mut memory: BTreeMap<i64, f64> = BTreeMap::new();
    for &(at, _, bytes) in &points {
        let m = memory.entry(at).or_insert(bytes);
        *m = m.max(bytes);
    }
    points.dedup_by_key(|p| p.0);
    let mut ooms: Vec<i64> = series
        .iter()
        .flat_map(|s| s.expected_oom())
        .map(|(at, _)| at)
        .collect();
    ooms.sort_unstable();
    NodeSamples {
        cpu: points.iter().map(|&(at, cores, _)| (at, cores)).collect(),
        memory: memory.into_iter().collect(),
        ooms,
    }
}

/// The pods' memory request, against which an OOM kill is recorded.
const REQUEST_BYTES: f64 = 64.0 * MIB;

/// What the agent's estimator gives for one node's samples, as the node's agent would publish
/// it: (target, lower, upper) in millicores and bytes.
fn agent_figures(samples: &NodeSamples) -> ((u64, u64), (u64, u64), (u64, u64)) {
    let cfg = EstimatorConfig::default();
    let mut h = History::new(&cfg).expect("default configuration");
    for &(at, cores) in &samples.cpu {
        h.add_cpu(&cfg, at, cores);
    }
    // as one agent tick: the working set, then the OOM kill seen in the same tick, recorded
    // against the pod's memory request (64Mi)
    for &(at, bytes) in &samples.memory {
        h.add_memory(&cfg, at, bytes);
        for _ in samples.ooms.iter().filter(|&&o| o == at) {
            h.record_oom(&cfg, at, REQUEST_BYTES);
        }
    }
    // no node allocatable and no maxAllowed: VPA knows neither, so nothing is capped
    let e = figures::entry(
        &h.estimate(&cfg, 1),
        &h,
        &Policy::default(),
        (None, None),
        Figures::default(),
    )
    .expect("the node's history has CPU samples");
    let pair = |f: &Figures| (f.cpu_milli.unwrap_or(0), f.memory_bytes.unwrap_or(0));
    (
        pair(&e.target),
        pair(&e.lower),
        e.upper.as_ref().map(pair).unwrap_or_default(),
    )
}

/// The same samples as a trace for VPA's recommender model, fed in the agent's order: every
/// CPU sample (whole millicores), then the working sets with each OOM kill after the sample of
/// its minute.
fn vpa_trace(name: &str, samples: &NodeSamples) -> vpa::Trace {
    let mut events: Vec<vpa::Event> = samples
        .cpu
        .iter()
        .map(|&(at, cores)| vpa::Event::cpu(at, ((cores * 1000.0) - 1e-6).ceil() as i64))
        .collect();
    for &(at, bytes) in &samples.memory {
        events.push(vpa::Event::memory(at, bytes.ceil() as i64));
        for _ in samples.ooms.iter().filter(|&&o| o == at) {
            events.push(vpa::Event::oom(at, REQUEST_BYTES as i64));
        }
    }
    vpa::Trace {
        name: name.to_string(),
        containers: 1,
        events,
    }
}

/// Whether the report's whole figure `ours` agrees with VPA's within VPA's rounding: VPA
/// truncates to whole units after the percentile, the margin (15 % of it truncated again), the
/// confidence factor `factor` and the floor; the report keeps fractions and rounds up once. So
/// `VPA ≤ ours < VPA + 2.15 × factor + 2` (estimator/tests/vpa_differential.rs gives the same bound
/// before the rounding up).
fn within_rounding(ours: u64, vpa: i64, factor: f64) -> bool {
    let (ours, vpa) = (ours as f64, vpa as f64);
    ours >= vpa && ours < vpa + 2.15 * factor + 2.0
}

fn figures(row: &Value, field: &str) -> (u64, u64) {
    (
        row[field]["cpuMillis"].as_u64().unwrap_or(0),
        row[field]["memoryBytes"].as_u64().unwrap_or(0),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_from_prometheus_history_matches_the_agents_estimator() {
    e2e("history", |env| async move {
        let kubeconfig = env.cp.kubeconfig_path().display().to_string();
        let nodes = env.create_nodes(3).await?;
        let mut ds = simple_daemonset(DS, &env.node_selector())?;
        ds.metadata.labels = Some([("app".to_string(), DS.to_string())].into());
        env.api::<DaemonSet>().create(&PostParams::default(), &ds).await?;
        wait_for_daemonset_pods(env.cp, &env.client, &env.namespace, DS, &nodes).await?;
        let pods: BTreeMap<String, String> = Api::<Pod>::namespaced(env.client.clone(), &env.namespace)
            .list(&ListParams::default().labels(&format!("app={DS}")))
            .await?
            .items
            .iter()
            .filter_map(|p| Some((nodewarden_tests::daemonset_pod_target_node(p)?, p.name_any())))
            .collect();
        ensure!(pods.len() == 3, "one pod per node: {pods:?}");

        let now_ms = nodewarden_agent::now_ms();
        let series = history(&env.namespace, &pods, &nodes, now_ms);
        let started = std::time::Instant::now();
        let prometheus = Prometheus::start(&series, None).await?;
        eprintln!(
            "history: Prometheus with 8 days backfilled ready in {:.1}s",
            started.elapsed().as_secs_f64()
        );
        let url = prometheus.url();
        let base = [
            "report",
            "--kubeconfig",
            &kubeconfig,
            "-n",
            &env.namespace,
            "--prometheus",
            &url,
            "--rate-window",
            "1m",
        ];
        let with =
            |extra: &[&str]| -> Vec<String> { base.iter().chain(extra).map(|s| s.to_string()).collect() };
        let run = |args: Vec<String>| async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            kubectl_nodewarden(&args).await
        };

        let started = std::time::Instant::now();
        let out = run(with(&["-o", "json", "--daemonset", DS]))
            .await
            .map_err(|e| anyhow::anyhow!("{e}\n{}", prometheus.log_tail(30)))?;
        eprintln!(
            "history: report over 14 days took {:.1}s",
            started.elapsed().as_secs_f64()
        );
        let json: Value = serde_json::from_str(&out).with_context(|| format!("report JSON: {out}"))?;
        let ds = &json["daemonsets"][0];
        ensure!(ds["daemonset"] == DS && ds["mode"] == "none", "{ds}");
        ensure!(
            json["history"]["prometheus"] == url.as_str()
                && json["history"]["withoutAutoscaler"][0] == format!("{}/{DS}", env.namespace),
            "{}",
            json["history"]
        );
        let row = |node: &str| -> Result<&Value> {
            ds["rows"]
                .as_array()
                .and_then(|rows| rows.iter().find(|r| r["node"] == node))
                .with_context(|| format!("no row for {node}: {ds}"))
        };
        let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);

        // what a user reads, from VPA's rules by hand: target = p90 bucket's upper edge × 1.15,
        // confidence 8 days: upper × (1 + 1/8), lower (p50) × (1 + 0.001/8)^−2, floors 25m / 250Mi
        let conf = 8.0;
        let milli = |cores: f64| (cores * 1000.0).ceil() as u64;
        let bytes = |b: f64| b.ceil() as u64;
        let busy = row(a)?;
        ensure!(busy["source"] == "node", "{busy}");
        // p90 of CPU: 15 % of the minutes at 0.5 core → the 0.5-core bucket: 588m
        ensure!(
            figures(busy, "target")
                == (
                    milli(edge(0.01, 0.5) * 1.15),
                    bytes(edge(1e7, 400.0 * MIB) * 1.15)
                ),
            "busy node target: {busy}"
        );
        ensure!(figures(busy, "target").0 == 588, "{busy}");
        // the OOM kill of the last day: that day's peak is max(300Mi + 100Mi, 300Mi × 1.2) =
        // 400Mi, and weighs about half of all the days' peaks → p90 is its bucket. cAdvisor's
        // counter and kube-state-metrics both show it: one kill, not two
        ensure!(busy["oomKills"] == 1, "{busy}");
        ensure!(
            figures(busy, "upperBound").0 == milli(edge(0.01, 0.5) * 1.15 * (1.0 + 1.0 / conf)),
            "{busy}"
        );
        ensure!(
            figures(busy, "lowerBound").0 == milli(edge(0.01, 0.2) * 1.15 * (1.0 + 0.001 / conf).powi(-2)),
            "{busy}"
        );
        ensure!(
            busy["delta"]["cpuMillis"] == 588 - 100 && busy["current"]["cpuMillis"] == 100,
            "{busy}"
        );
        let quiet = row(b)?;
        // 0.02 core and 40 MiB are under the floors: 25m and 250 MiB
        ensure!(
            figures(quiet, "target") == (25, 250 * 1024 * 1024),
            "quiet node: {quiet}"
        );
        ensure!(quiet["delta"]["cpuMillis"] == 25 - 100, "{quiet}");
        let replaced = row(c)?;
        // node C: old pod 5 days at 0.1, current pod 4 days at 0.3 (a day both): the newer, heavier
        // days hold more than 10 % of the weight → 0.3-core bucket
        ensure!(
            figures(replaced, "target").0 == milli(edge(0.01, 0.3) * 1.15),
            "replaced pod's node: {replaced}"
        );

        // the differential check: the agent's estimator on the same samples
        let by_node = |node: &str| -> NodeSamples {
            node_samples(&series.iter().filter(|s| s.node == node).collect::<Vec<_>>())
        };
        for node in [a, b, c] {
            let r = row(node)?;
            let (target, lower, upper) = agent_figures(&by_node(node));
            ensure!(
                (
                    figures(r, "target"),
                    figures(r, "lowerBound"),
                    figures(r, "upperBound")
                ) == (target, lower, upper),
                "node {node}: the report says target {:?} lower {:?} upper {:?}, the agent's estimator \
                 {target:?} {lower:?} {upper:?}",
                figures(r, "target"),
                figures(r, "lowerBound"),
                figures(r, "upperBound")
            );
        }
        // …and VPA's own recommender model on the same samples (tests/vpa/cmd/recommend): the
        // same CPU samples and OOM kills taken, every figure within VPA's rounding. Confidence 8
        // days: upper bounds × (1 + 1/8), lower bounds × (1 + 0.001/8)^−2.
        let traces: Vec<vpa::Trace> = [a, b, c]
            .iter()
            .map(|node| vpa_trace(node, &by_node(node)))
            .collect();
        let vpa = vpa::recommend(&traces)?;
        let (up_f, low_f) = (1.0 + 1.0 / conf, (1.0 + 0.001 / conf).powi(-2));
        for (node, v) in [a, b, c].into_iter().zip(&vpa) {
            let r = row(node)?;
            let (target, lower, upper) = (
                figures(r, "target"),
                figures(r, "lowerBound"),
                figures(r, "upperBound"),
            );
            eprintln!(
                "history: node {node}: report target {target:?} lower {lower:?} upper {upper:?}; VPA {:?} {:?} {:?}",
                v.target, v.lower_bound, v.upper_bound
            );
            let samples = by_node(node);
            ensure!(
                v.sample_count == samples.cpu.len() as u64 && v.ooms_accepted == r["oomKills"].as_u64().unwrap_or(0),
                "node {node}: VPA took {} CPU samples and {} OOM kills, the report read {} and {}",
                v.sample_count,
                v.ooms_accepted,
                samples.cpu.len(),
                r["oomKills"]
            );
            let agree = within_rounding(target.0, v.target.cpu_milli, 1.0)
                && within_rounding(target.1, v.target.memory_bytes, 1.0)
                && within_rounding(lower.0, v.lower_bound.cpu_milli, low_f)
                && within_rounding(lower.1, v.lower_bound.memory_bytes, low_f)
                && within_rounding(upper.0, v.upper_bound.cpu_milli, up_f)
                && within_rounding(upper.1, v.upper_bound.memory_bytes, up_f);
            ensure!(
                agree,
                "node {node}: the report says target {target:?} lower {lower:?} upper {upper:?} (millicores, \
                 bytes), VPA's recommender {:?} {:?} {:?}",
                v.target,
                v.lower_bound,
                v.upper_bound
            );
        }

        let totals = &json["totals"];
        ensure!(
            totals["cpuFreeMillis"] == 75
                && totals["cpuNeededMillis"] == 488 + (figures(row(c)?, "target").0 - 100),
            "{totals}"
        );

        // the other outputs carry the same figures
        let table = run(with(&[])).await?;
        eprintln!("{table}");
        ensure!(
            table.starts_with("Figures computed from Prometheus history (") && table.contains("588m"),
            "{table}"
        );
        let csv = run(with(&["-o", "csv"])).await?;
        ensure!(csv.lines().count() == 4 && csv.contains(",588,"), "{csv}");
        let html = run(with(&["-o", "html"])).await?;
        ensure!(html.contains("<p id=\"history\">Figures computed"), "html");

        // -l selects DaemonSets by their labels
        let none = run(with(&["-l", "app=nothing"])).await?;
        ensure!(none.contains("No DaemonSets found in namespace"), "{none}");
        let selected = run(with(&["-l", &format!("app={DS}"), "-o", "json"])).await?;
        ensure!(selected.contains("\"cpuMillis\": 588"), "{selected}");

        // errors: too many series for the limit (4 pods' series)
        let err = run(with(&["--max-series", "3"]))
            .await
            .err()
            .context("--max-series 3 must fail")?;
        ensure!(
            err.to_string()
                .contains("returned 4 series, more than the limit of 3"),
            "{err}"
        );
        // a DaemonSet that does not exist
        let err = run(with(&["--daemonset", "nope"]))
            .await
            .err()
            .context("unknown DaemonSet")?;
        ensure!(
            err.to_string()
                == format!(
                    "DaemonSet {}/nope does not exist (-A for every namespace)",
                    env.namespace
                ),
            "{err}"
        );
        drop(prometheus);

        // unreachable: nothing listens there any more
        let err = run(with(&[]))
            .await
            .err()
            .context("a stopped Prometheus must fail")?;
        ensure!(
            err.to_string()
                .starts_with(&format!("cannot reach Prometheus at {url}: ")),
            "{err}"
        );

        // a Prometheus without the cAdvisor series
        let empty = Prometheus::start(&[], None).await?;
        let empty_url = empty.url();
        let args = [
            "report",
            "--kubeconfig",
            &kubeconfig,
            "-n",
            &env.namespace,
            "--prometheus",
            &empty_url,
        ];
        let err = kubectl_nodewarden(&args)
            .await
            .err()
            .context("no series must fail")?;
        ensure!(
            err.to_string().starts_with(&format!(
                "Prometheus at {empty_url} has no container_cpu_usage_seconds_total series"
            )),
            "{err}"
        );
        drop(empty);

        // 401: a Prometheus that wants a password (a hash of none anyone knows)
        let guarded = Prometheus::start(
            &[],
            Some(
                "basic_auth_users:\n  admin: $2y$10$abcdefghijklmnopqrstuuJ3Qy0gQ7yqQ5w1YUdVQy8rXqk9n3ZSy\n",
            ),
        )
        .await?;
        let guarded_url = guarded.url();
        let token = tempfile::NamedTempFile::new()?;
        std::fs::write(token.path(), "not-a-valid-token\n")?;
        let token_path = token.path().display().to_string();
        let args = [
            "report",
            "--kubeconfig",
            &kubeconfig,
            "-n",
            &env.namespace,
            "--prometheus",
            &guarded_url,
            "--prometheus-token-file",
            &token_path,
        ];
        let err = kubectl_nodewarden(&args).await.err().context("401 must fail")?;
        ensure!(
            err.to_string().starts_with(&format!(
                "Prometheus at {guarded_url} refused the query: HTTP 401"
            )),
            "{err}"
        );
        Ok(())
    })
    .await;
}
