//! Sample ticks against fixture cgroup trees: the join keeps real containers only, CPU rates
//! come from counter deltas, OOM kills bump memory, unreadable containers are skipped, and a
//! restart from the checkpoint resumes the figures.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nodewarden_agent::metrics::Metrics;
use nodewarden_agent::rightsizing::pods::{self, Target};
use nodewarden_agent::rightsizing::sampler::{PublishConfig, Sampler};
use nodewarden_api::rightsizing::{AutoscalerRef, CapReason, DaemonSetAutoscaler};
use nodewarden_estimator::figures::{Figures, Snapshot};
use nodewarden_estimator::policy::Key;
use nodewarden_estimator::recommender::{EstimatorConfig, MIB};
use nodewarden_estimator::samples::{self, Samples};
use serde_json::json;

const T0: i64 = 1_763_700_000_000;
/// No minimum between writes unless a test says so.
const MIN_INTERVAL_MS: i64 = 0;

fn hex(s: &str) -> String {
    s.repeat(64)[..64].to_string()
}

fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).expect("test setup");
    for e in fs::read_dir(from).expect("test setup") {
        let e = e.expect("test setup");
        let dest = to.join(e.file_name());
        if e.file_type().expect("test setup").is_dir() {
            copy_tree(&e.path(), &dest);
        } else {
            fs::copy(e.path(), dest).expect("test setup");
        }
    }
}

fn fixture_copy(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("test setup");
    let root = dir.path().join("cgroup");
    copy_tree(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name),
        &root,
    );
    (dir, root)
}

fn dsa() -> Arc<DaemonSetAutoscaler> {
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "nodewarden.io/v1alpha1", "kind": "DaemonSetAutoscaler",
            "metadata": {"name": "agent", "namespace": "mon"},
            "spec": {"targetRef": {"kind": "DaemonSet", "name": "agent"}}
        }))
        .expect("test setup"),
    )
}

/// A DaemonSet pod with the given (container name, container ID) pairs; the sandbox's ID is
/// never among them, as in a real pod status.
fn pod(uid: &str, containers: &[(&str, String)]) -> Arc<pods::NodePod> {
    let specs: Vec<_> = containers
        .iter()
        .map(|(n, _)| json!({"name": n, "image": "i", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}))
        .collect();
    let statuses: Vec<_> = containers
        .iter()
        .map(|(n, id)| {
            json!({"name": n, "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                             "containerID": format!("containerd://{id}")})
        })
        .collect();
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": "agent-abcde", "namespace": "mon", "uid": uid,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "d", "controller": true}]},
            "spec": {"nodeName": "x", "containers": specs},
            "status": {"containerStatuses": statuses}
        }))
        .expect("test setup"),
    )
}

fn alive() -> BTreeMap<AutoscalerRef, ()> {
    pods::autoscaler_refs(&[dsa()])
}

fn sampler(root: &Path, metrics: Arc<Metrics>) -> Sampler {
    sampler_with_min_interval(root, metrics, MIN_INTERVAL_MS)
}

fn sampler_with_min_interval(root: &Path, metrics: Arc<Metrics>, min_interval_ms: i64) -> Sampler {
    sampler_with_publish(root, metrics, min_interval_ms, 0)
}

/// A sampler with the default threshold and refresh, at most one write per `min_interval_ms`
/// and on average one per `budget_interval_ms` (0: no budget).
fn sampler_with_publish(
    root: &Path,
    metrics: Arc<Metrics>,
    min_interval_ms: i64,
    budget_interval_ms: i64,
) -> Sampler {
    Sampler::new(
        "x".into(),
        root.to_path_buf(),
        EstimatorConfig::default(),
        PublishConfig {
            change_threshold: 0.1,
            refresh_ms: 3_600_000,
            min_interval_ms,
            budget_interval_ms,
        },
        metrics,
    )
}

fn key(c: &str) -> Key {
    Key {
        autoscaler: AutoscalerRef {
            namespace: "mon".into(),
            name: "agent".into(),
        },
        container: c.into(),
    }
}

/// Upper edge of the default-layout bucket holding `v`, by hand.
fn edge(first: f64, v: f64) -> f64 {
    let n = ((v * 0.05 / first + 1.0).ln() / 1.05f64.ln()).floor();
    first * (1.05f64.powf(n + 1.0) - 1.0) / 0.05
}

fn scope(root: &Path, pod_uid_: &str, id: &str) -> PathBuf {
    root.join("kubepods.slice/kubepods-burstable.slice")
        .join(format!("kubepods-burstable-pod{pod_uid_}.slice"))
        .join(format!("cri-containerd-{id}.scope"))
}

fn set_usage(scope: &Path, usec: u64) {
    fs::write(
        scope.join("cpu.stat"),
        format!("usage_usec {usec}\nuser_usec {usec}\nsystem_usec 0\n"),
    )
    .expect("test setup");
}

fn targets(p: &Arc<pods::NodePod>) -> Vec<Target> {
    pods::targets(std::slice::from_ref(p), &[dsa()])
}

#[test]
fn ticks_measure_recommend_and_publish_on_material_change() {
    let (_tmp, root) = fixture_copy("systemd-containerd");
    let metrics = Arc::new(Metrics::new());
    let mut s = sampler(&root, metrics.clone());
    let p = pod(
        "0a1b2c3d-0000-4000-8000-000000000001",
        &[("app", hex("a1")), ("side", hex("b2"))],
    );
    let t = targets(&p);
    assert_eq!(t.len(), 2);

    // first tick: memory only (a CPU rate needs two readings): nothing before the first CPU
    // sample, so nothing to publish (no figures at the floors for the webhook or an update)
    let first = s.tick(T0, &t, &alive());
    assert_eq!(first.tracked, 2);
    assert!(first.publish.is_none(), "nothing published before a CPU sample");
    assert!(s.snapshot().is_empty());
    assert_eq!(s.history_count(), 2, "the sandbox container is not measured");

    // 10 s later the app used 5 s of CPU: 0.5 core; the first figures go out
    let app = scope(&root, "0a1b2c3d_0000_4000_8000_000000000001", &hex("a1"));
    set_usage(&app, 12_500_000 + 5_000_000);
    let second = s.tick(T0 + 10_000, &t, &alive());
    let (reason, spec) = second.publish.expect("the first CPU sample's figures");
    assert_eq!(reason.as_str(), "first");
    assert_eq!(spec.recommendations.len(), 2);
    let snap: Snapshot = s.snapshot();
    let e = &snap[&key("app")];
    let cpu = (edge(0.01, 0.5) * 1.15 * 1000.0).ceil() as u64;
    assert_eq!(e.target.cpu_milli, Some(cpu));
    // working set 300 MiB − 50 MiB inactive_file = 250 MiB
    let mem = (edge(1e7, 250.0 * MIB) * 1.15).ceil() as u64;
    assert_eq!(e.target.memory_bytes, Some(mem));
    assert_eq!(e.sample_count, 1);
    assert_eq!(e.request_cpu_milli, Some(100));

    // same usage rate again: nothing material, no write
    set_usage(&app, 12_500_000 + 10_000_000);
    assert!(s.tick(T0 + 20_000, &t, &alive()).publish.is_none());

    // the sidecar is OOM-killed (counter 2 → 3): memory goes to at least request 64 Mi + 100 Mi
    let side = scope(&root, "0a1b2c3d_0000_4000_8000_000000000001", &hex("b2"));
    let events = fs::read_to_string(side.join("memory.events")).expect("test setup");
    fs::write(
        side.join("memory.events"),
        events.replace("oom_kill 2", "oom_kill 3"),
    )
    .expect("test setup");
    let tick = s.tick(T0 + 30_000, &t, &alive());
    assert!(tick.publish.is_some());
    let snap = s.snapshot();
    let e = &snap[&key("side")];
    assert_eq!(e.oom_count, 1);
    let bumped = (edge(1e7, 164.0 * MIB) * 1.15).ceil() as u64;
    assert_eq!(e.target.memory_bytes, Some(bumped));
    let text = metrics.encode();
    assert!(text.contains("nodewarden_agent_recommendation_target{namespace=\"mon\",autoscaler=\"agent\",container=\"side\",resource=\"memory\"}"), "{text}");
    assert!(
        text.contains("nodewarden_agent_samples{namespace=\"mon\",autoscaler=\"agent\",container=\"app\"} 3"),
        "{text}"
    );
    assert!(
        text.contains(
            "nodewarden_agent_oom_kills_total{namespace=\"mon\",autoscaler=\"agent\",container=\"side\"} 1"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "nodewarden_agent_container_request{namespace=\"mon\",autoscaler=\"agent\",container=\"app\",resource=\"cpu\"} 0.1"
        ),
        "{text}"
    );
}

/// Ten seconds of history: VPA's upper bound is hundreds of times the usage; the agent
/// publishes its node's allocatable instead and says so.
#[test]
fn figures_stay_within_the_nodes_allocatable_and_say_why() {
    let (_tmp, root) = fixture_copy("systemd-containerd");
    let mut s = sampler(&root, Arc::new(Metrics::new()));
    s.set_allocatable(Figures {
        cpu_milli: Some(2000),
        memory_bytes: Some(4 << 30),
    });
    let p = pod("0a1b2c3d-0000-4000-8000-000000000001", &[("app", hex("a1"))]);
    let t = targets(&p);
    let app = scope(&root, "0a1b2c3d_0000_4000_8000_000000000001", &hex("a1"));
    assert!(s.tick(T0, &t, &alive()).publish.is_none());
    set_usage(&app, 12_500_000 + 5_000_000);
    let (_, spec) = s.tick(T0 + 10_000, &t, &alive()).publish.expect("first figures");
    let r = &spec.recommendations[0];
    let upper = r
        .upper_bound
        .as_ref()
        .expect("an upper bound with a single sample");
    assert_eq!(
        (upper["cpu"].0.as_str(), upper["memory"].0.as_str()),
        ("2", "4Gi")
    );
    let capped = r.capped.as_ref().expect("the reason");
    let up = capped.upper_bound.expect("upper bound capped");
    assert_eq!(
        (up.cpu, up.memory),
        (Some(CapReason::NodeAllocatable), Some(CapReason::NodeAllocatable))
    );
    assert_eq!(capped.history, "1 sample");
    // a second sample: confidence above 0, VPA's bound finite but still far above the node
    set_usage(&app, 12_500_000 + 10_000_000);
    s.tick(T0 + 20_000, &t, &alive());
    let e = &s.snapshot()[&key("app")];
    assert_eq!(e.upper.and_then(|u| u.cpu_milli), Some(2000));
    assert_eq!(e.capped.as_ref().map(|c| c.history.as_str()), Some("10s"));
    // the target is VPA's (well below the node), not capped
    assert!(e.target.cpu_milli.unwrap() < 2000);
    assert!(e.capped.as_ref().unwrap().target.is_none());
}

#[test]
fn a_restart_resumes_history_from_the_checkpoint() {
    let (tmp, root) = fixture_copy("systemd-containerd");
    let p = pod(
        "0a1b2c3d-0000-4000-8000-000000000001",
        &[("app", hex("a1")), ("side", hex("b2"))],
    );
    let t = targets(&p);
    let mut s = sampler(&root, Arc::new(Metrics::new()));
    let app = scope(&root, "0a1b2c3d_0000_4000_8000_000000000001", &hex("a1"));
    for i in 0..5u64 {
        set_usage(&app, 12_500_000 + i * 3_000_000);
        s.tick(T0 + i as i64 * 10_000, &t, &alive());
    }
    let before = s.snapshot();
    let dir = tmp.path().join("checkpoint");
    fs::create_dir_all(&dir).expect("test setup");
    nodewarden_agent::rightsizing::checkpoint::save(&dir, &s.checkpoint(T0 + 50_000)).expect("test setup");

    let mut restarted = sampler(&root, Arc::new(Metrics::new()));
    let node = s.checkpoint(T0 + 50_000).node;
    match nodewarden_agent::rightsizing::checkpoint::load(&dir, &node, 1) {
        nodewarden_agent::rightsizing::checkpoint::Loaded::Found(c) => restarted.restore(&c),
        other => panic!("{other:?}"),
    }
    let mut after = restarted.snapshot();
    // requests are learnt again from the pods on the first tick; the figures are the same
    for (k, e) in after.iter_mut() {
        e.request_cpu_milli = before[k].request_cpu_milli;
        e.request_memory_bytes = before[k].request_memory_bytes;
    }
    assert_eq!(after, before);
    assert_eq!(after[&key("app")].sample_count, 4);
    // and measuring goes on from there
    set_usage(&app, 12_500_000 + 5 * 3_000_000);
    restarted.tick(T0 + 60_000, &t, &alive());
    set_usage(&app, 12_500_000 + 6 * 3_000_000);
    restarted.tick(T0 + 70_000, &t, &alive());
    assert_eq!(restarted.snapshot()[&key("app")].sample_count, 5);
}

#[test]
fn an_unreadable_container_is_counted_and_the_others_go_on() {
    let (_tmp, root) = fixture_copy("unreadable");
    let metrics = Arc::new(Metrics::new());
    let mut s = sampler(&root, metrics.clone());
    let p = pod(
        "0a1b2c3d-0000-4000-8000-000000000009",
        &[("good", hex("1e")), ("dir", hex("2f")), ("missing", hex("3a"))],
    );
    let t = targets(&p);
    s.tick(T0, &t, &alive());
    assert_eq!(metrics.unreadable_count(), 2);
    assert!(s.history(&key("good")).is_some());
    assert!(s.history(&key("dir")).is_none());
    assert!(s.history(&key("missing")).is_none());
    assert!(
        metrics
            .encode()
            .contains("nodewarden_agent_unreadable_containers_total 2")
    );
}

#[test]
fn deleting_the_autoscaler_drops_its_history_and_empties_the_publication() {
    let (_tmp, root) = fixture_copy("systemd-containerd");
    let mut s = sampler(&root, Arc::new(Metrics::new()));
    let p = pod("0a1b2c3d-0000-4000-8000-000000000001", &[("app", hex("a1"))]);
    assert!(s.tick(T0, &targets(&p), &alive()).publish.is_none());
    assert!(s.tick(T0 + 10_000, &targets(&p), &alive()).publish.is_some());
    let tick = s.tick(T0 + 20_000, &[], &BTreeMap::new());
    let (reason, spec) = tick.publish.expect("the entries must be withdrawn");
    assert_eq!(reason.as_str(), "containers-changed");
    assert!(spec.recommendations.is_empty());
    assert_eq!(s.history_count(), 0);
}

#[test]
fn a_pod_going_away_keeps_its_recommendation_for_the_replacement() {
    let (_tmp, root) = fixture_copy("systemd-containerd");
    let mut s = sampler(&root, Arc::new(Metrics::new()));
    let p = pod("0a1b2c3d-0000-4000-8000-000000000001", &[("app", hex("a1"))]);
    s.tick(T0, &targets(&p), &alive());
    s.tick(T0 + 10_000, &targets(&p), &alive());
    // pod deleted, autoscaler still there: the webhook needs the figures for the new pod
    assert!(s.tick(T0 + 20_000, &[], &alive()).publish.is_none());
    assert!(s.snapshot().contains_key(&key("app")));
}

#[test]
fn material_changes_within_the_minimum_interval_wait_for_its_end() {
    let (_tmp, root) = fixture_copy("systemd-containerd");
    let mut s = sampler_with_min_interval(&root, Arc::new(Metrics::new()), 30_000);
    let p = pod("0a1b2c3d-0000-4000-8000-000000000001", &[("app", hex("a1"))]);
    let t = targets(&p);
    let app = scope(&root, "0a1b2c3d_0000_4000_8000_000000000001", &hex("a1"));
    assert!(s.tick(T0, &t, &alive()).publish.is_none(), "no CPU sample yet");
    // the first CPU sample: an idle 10 ms over 10 s, 1m
    set_usage(&app, 12_500_000 + 10_000);
    assert!(s.tick(T0 + 10_000, &t, &alive()).publish.is_some(), "first write");
    // CPU jumps to 0.5 core: material, but only 10 s after the last write
    set_usage(&app, 12_510_000 + 5_000_000);
    assert!(s.tick(T0 + 20_000, &t, &alive()).publish.is_none());
    set_usage(&app, 12_510_000 + 10_000_000);
    assert!(s.tick(T0 + 30_000, &t, &alive()).publish.is_none());
    // 30 s after the last write the pending change goes out
    set_usage(&app, 12_510_000 + 15_000_000);
    let (reason, spec) = s
        .tick(T0 + 40_000, &t, &alive())
        .publish
        .expect("the change is written once allowed");
    assert_eq!(reason.as_str(), "target-moved");
    let cpu = &spec.recommendations[0].target.as_ref().expect("target")["cpu"].0;
    assert_eq!(
        cpu,
        &format!("{}m", (edge(0.01, 0.5) * 1.15 * 1000.0).ceil() as u64)
    );
}

/// The write budget (`--publish-budget`, one write per 10 minutes on average, bursts of 3):
/// a node whose targets keep moving writes three times, then waits for the budget to refill.
#[test]
fn the_write_budget_paces_a_node_whose_targets_keep_moving() {
    let (_tmp, root) = fixture_copy("systemd-containerd");
    let mut s = sampler_with_publish(&root, Arc::new(Metrics::new()), 0, 600_000);
    let p = pod("0a1b2c3d-0000-4000-8000-000000000001", &[("app", hex("a1"))]);
    let t = targets(&p);
    let app = scope(&root, "0a1b2c3d_0000_4000_8000_000000000001", &hex("a1"));
    let mut used = 12_500_000u64;
    // each step the CPU used over the last interval is four times the step before's
    let mut step = |s: &mut Sampler, at_ms: i64, since_ms: i64, cores: f64| {
        used += (cores * since_ms as f64 * 1000.0) as u64;
        set_usage(&app, used);
        s.tick(T0 + at_ms, &t, &alive())
            .publish
            .map(|(reason, _)| reason.as_str())
    };
    // nothing before the first CPU sample
    assert_eq!(s.tick(T0, &t, &alive()).publish.map(|(r, _)| r.as_str()), None);
    assert_eq!(step(&mut s, 10_000, 10_000, 0.5), Some("first"));
    assert_eq!(step(&mut s, 20_000, 10_000, 2.0), Some("target-moved"));
    assert_eq!(step(&mut s, 30_000, 10_000, 8.0), Some("target-moved"));
    // the burst is spent: a move now waits
    assert_eq!(step(&mut s, 40_000, 10_000, 32.0), None);
    assert_eq!(step(&mut s, 50_000, 10_000, 128.0), None);
    // ten minutes after the last write a token is back, and the next move goes out
    assert_eq!(step(&mut s, 630_000, 580_000, 512.0), Some("target-moved"));
    assert_eq!(step(&mut s, 640_000, 10_000, 2048.0), None);
}

#[test]
fn an_oom_kill_in_the_pod_status_bumps_memory_once() {
    let (_tmp, root) = fixture_copy("systemd-containerd");
    let mut s = sampler(&root, Arc::new(Metrics::new()));
    // the sidecar was OOM-killed before (its previous ID); the current one is b2, whose
    // working set is only 19 MiB; two containers, so the floor is 125 MiB each
    let mut p = (*pod(
        "0a1b2c3d-0000-4000-8000-000000000001",
        &[("app", hex("a1")), ("side", hex("b2"))],
    ))
    .clone();
    let status = &mut p
        .status
        .as_mut()
        .expect("status")
        .container_statuses
        .as_mut()
        .expect("statuses")[1];
    status.last_state = serde_json::from_value(json!({"terminated": {
        "reason": "OOMKilled", "containerID": format!("containerd://{}", hex("9f")),
        "finishedAt": "2025-11-21T04:39:50Z"}}))
    .expect("last state");
    let p = Arc::new(p);
    let t = targets(&p);
    // T0 is 2025-11-21T04:40:00Z: the kill was 10 s before the first reading
    s.tick(T0, &t, &alive());
    s.tick(T0 + 10_000, &t, &alive());
    s.tick(T0 + 20_000, &t, &alive());
    let e = &s.snapshot()[&key("side")];
    assert_eq!(e.oom_count, 1, "recorded once, not at every tick");
    // used = max(request 64 Mi, no peak yet) → max(64 + 100 Mi, 64 Mi × 1.2) = 164 Mi
    let want = (edge(1e7, 164.0 * MIB) * 1.15).ceil() as u64;
    assert_eq!(e.target.memory_bytes, Some(want));
}

/// The sidecar's pod with its last run OOM-killed 10 s before T0 (its status says so).
fn pod_with_side_oom_killed() -> Vec<Target> {
    let mut p = (*pod(
        "0a1b2c3d-0000-4000-8000-000000000001",
        &[("app", hex("a1")), ("side", hex("b2"))],
    ))
    .clone();
    let status = &mut p
        .status
        .as_mut()
        .expect("status")
        .container_statuses
        .as_mut()
        .expect("statuses")[1];
    status.last_state = serde_json::from_value(json!({"terminated": {
        "reason": "OOMKilled", "containerID": format!("containerd://{}", hex("9f")),
        "finishedAt": "2025-11-21T04:39:50Z"}}))
    .expect("last state");
    targets(&Arc::new(p))
}

#[test]
fn a_kill_seeded_from_prometheus_is_not_counted_again_from_the_pod_status() {
    // the sidecar's history from Prometheus: a minute's samples, the kill in the step ending at
    // T0 (Prometheus dates a kill at the end of its step, after the container's finishedAt)
    let seeded = |kill_at: i64| {
        let cfg = EstimatorConfig::default();
        let samples = Samples {
            cpu: vec![(T0 - 60_000, 0.01), (T0, 0.01)],
            memory: vec![(T0 - 60_000, 19.0 * MIB), (T0, 19.0 * MIB)],
            oom: vec![(kill_at, 1)],
        };
        samples::history_of(&cfg, &samples, 64.0 * MIB).expect("history")
    };
    let count_after_ticks = |kill_at: i64| {
        let (_tmp, root) = fixture_copy("systemd-containerd");
        let mut s = sampler(&root, Arc::new(Metrics::new()));
        assert!(s.seed(key("side"), seeded(kill_at), 2));
        let t = pod_with_side_oom_killed();
        for i in 1..=3 {
            s.tick(T0 + i * 10_000, &t, &alive());
        }
        s.snapshot()[&key("side")].oom_count
    };
    // the status's kill is the one in the history: counted once
    assert_eq!(count_after_ticks(T0), 1);
    // a kill in the history an hour earlier is another one: the status's counts too
    assert_eq!(count_after_ticks(T0 - 3_600_000), 2);
}

#[test]
fn on_cgroup_v1_the_same_estimator_reads_the_v1_files() {
    use nodewarden_agent::cgroup::{Hierarchy, Version};
    let (_tmp, root) = fixture_copy("v1-cgroupfs");
    let hierarchy = Hierarchy::detect_with(&root, Version::Auto, None).expect("test setup");
    assert!(matches!(hierarchy, Hierarchy::V1(_)), "{hierarchy}");
    let mut s = Sampler::new(
        "x".into(),
        hierarchy,
        EstimatorConfig::default(),
        PublishConfig {
            change_threshold: 0.1,
            refresh_ms: 3_600_000,
            min_interval_ms: MIN_INTERVAL_MS,
            budget_interval_ms: 0,
        },
        Arc::new(Metrics::new()),
    );
    let uid = "0a1b2c3d-0000-4000-8000-000000000011";
    let p = pod(uid, &[("app", hex("1b"))]);
    let t = targets(&p);
    let rel = format!("node-a/kubepods/burstable/pod{uid}/{}", hex("1b"));
    // 400 MiB in use (above the pod minimum, so the figure shows)
    fs::write(
        root.join("memory").join(&rel).join("memory.usage_in_bytes"),
        format!("{}\n", 400 * 1024 * 1024),
    )
    .expect("test setup");
    assert!(s.tick(T0, &t, &alive()).publish.is_none(), "no CPU sample yet");
    // 10 s later 5 s more CPU in cpuacct.usage (nanoseconds): 0.5 core, as on v2
    fs::write(
        root.join("cpuacct").join(&rel).join("cpuacct.usage"),
        format!("{}\n", 7_250_000_000u64 + 5_000_000_000),
    )
    .expect("test setup");
    s.tick(T0 + 10_000, &t, &alive());
    let snap = s.snapshot();
    let e = &snap[&key("app")];
    assert_eq!(
        e.target.cpu_milli,
        Some((edge(0.01, 0.5) * 1.15 * 1000.0).ceil() as u64)
    );
    // working set 400 MiB − 20 MiB total_inactive_file = 380 MiB
    assert_eq!(
        e.target.memory_bytes,
        Some((edge(1e7, 380.0 * MIB) * 1.15).ceil() as u64)
    );
    // an OOM kill in memory.oom_control (1 → 2) bumps memory as memory.events does on v2
    let oom = root.join("memory").join(&rel).join("memory.oom_control");
    fs::write(&oom, "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n").expect("test setup");
    s.tick(T0 + 20_000, &t, &alive());
    assert_eq!(s.snapshot()[&key("app")].oom_count, 1);
}

/// Ticks `n` times, 10 s apart from `t0`: the unrecognised trees said in each tick, and
/// whether any write named a container.
fn ticks(s: &mut Sampler, t0: i64, n: i64, t: &[Target]) -> (Vec<usize>, bool) {
    let mut said = Vec::new();
    let mut published_figures = false;
    for i in 0..n {
        let tick = s.tick(t0 + i * 10_000, t, &alive());
        said.push(tick.unrecognised.len());
        if let Some((_, spec)) = tick.publish {
            published_figures |= !spec.recommendations.is_empty();
        }
    }
    (said, published_figures)
}

#[test]
fn containers_in_an_unknown_cgroup_form_are_said_once_and_never_published() {
    let (_tmp, root) = fixture_copy("systemd-containerd");
    let pod_dir = root.join(
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0a1b2c3d_0000_4000_8000_000000000001.slice",
    );
    // an unknown runtime's names for the two containers
    for id in ["a1", "b2"] {
        fs::rename(
            pod_dir.join(format!("cri-containerd-{}.scope", hex(id))),
            pod_dir.join(format!("youki-{}.scope", hex(id))),
        )
        .expect("test setup");
    }
    let metrics = Arc::new(Metrics::new());
    let mut s = sampler(&root, metrics.clone());
    let p = pod(
        "0a1b2c3d-0000-4000-8000-000000000001",
        &[("app", hex("a1")), ("side", hex("b2"))],
    );
    let t = targets(&p);
    let (said, published_figures) = ticks(&mut s, T0, 30, &t);
    // each container's cgroup named once, in the first tick; nothing measured or published
    assert_eq!(said[0], 2, "{said:?}");
    assert!(said[1..].iter().all(|&n| n == 0), "{said:?}");
    assert!(!published_figures);
    assert!(s.history(&key("app")).is_none());
    assert!(s.history(&key("side")).is_none());
    assert_eq!(metrics.unrecognised_count("outside_pod"), 2);
    assert!(
        metrics
            .encode()
            .contains(r#"nodewarden_agent_unrecognised_cgroups_total{reason="outside_pod"} 2"#)
    );
    // the tree is looked at again every few ticks, not at every one
    assert!(s.locator_walks() <= 6, "{} walks in 30 ticks", s.locator_walks());

    // the runtime's names back in a known form: found at the next look, measured, published
    for id in ["a1", "b2"] {
        fs::rename(
            pod_dir.join(format!("youki-{}.scope", hex(id))),
            pod_dir.join(format!("cri-containerd-{}.scope", hex(id))),
        )
        .expect("test setup");
    }
    let (said, published_figures) = ticks(&mut s, T0 + 300_000, 10, &t);
    assert!(said.iter().all(|&n| n == 0), "{said:?}");
    assert!(published_figures);
    assert!(s.history(&key("app")).is_some());
    assert_eq!(metrics.unrecognised_count("outside_pod"), 2);
}

#[test]
fn a_tree_without_kubepods_is_said_once_naming_the_root() {
    let dir = tempfile::tempdir().expect("test setup");
    let root = dir.path().join("cgroup");
    fs::create_dir_all(root.join("system.slice/containerd.service")).expect("test setup");
    fs::write(root.join("cgroup.controllers"), "cpu memory\n").expect("test setup");
    let metrics = Arc::new(Metrics::new());
    let mut s = sampler(&root, metrics.clone());
    let p = pod("0a1b2c3d-0000-4000-8000-000000000001", &[("app", hex("a1"))]);
    let mut said = Vec::new();
    for i in 0..30 {
        let tick = s.tick(T0 + i * 10_000, &targets(&p), &alive());
        if let Some((_, spec)) = &tick.publish {
            assert!(spec.recommendations.is_empty(), "{spec:?}");
        }
        said.extend(tick.unrecognised);
    }
    assert_eq!(said.len(), 1, "{said:?}");
    assert_eq!(said[0].path(), root.as_path());
    let message = said[0].to_string();
    assert!(message.contains("no kubepods cgroup below"), "{message}");
    assert!(message.contains("system.slice"), "{message}");
    assert_eq!(metrics.unrecognised_count("no_kubepods"), 1);
}
