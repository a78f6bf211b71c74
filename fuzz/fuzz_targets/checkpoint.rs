//! The agent's checkpoint file (histories kept on the node's disk across restarts): loaded as
//! the agent loads it at start, restored into a sampler, which then takes two ticks of
//! readings (so what was restored goes through the estimator's arithmetic), and saved again.
//!
//! Invariants: a file that does not load is moved aside and the agent starts without it; what
//! the agent saves after restoring a file it loads back unchanged.
#![no_main]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use nodewarden_agent::cgroup::{Reading, Throttling};
use nodewarden_agent::metrics::Metrics;
use nodewarden_agent::rightsizing::checkpoint::{self, Loaded};
use nodewarden_agent::rightsizing::pods::Target;
use nodewarden_estimator::policy::Policy;
use nodewarden_estimator::recommender::EstimatorConfig;
use nodewarden_agent::rightsizing::sampler::{PublishConfig, Sampler};

const NODE: &str = "node-1";
/// A fixed "now" (2027-01-15), so a crash reproduces.
const NOW_MS: i64 = 1_800_000_000_000;

fn reading(cpu_usage_usec: u64, memory: u64, oom_kill: u64) -> Reading {
    Reading {
        cpu_usage_usec,
        memory_current: memory,
        inactive_file: memory / 4,
        oom_kill,
        throttled: Some(Throttling {
            periods: 1,
            time_usec: 100,
        }),
    }
}

fuzz_target!(|data: &[u8]| {
    // two folders for the whole run; loading tidies what earlier inputs left behind
    static DIRS: std::sync::OnceLock<(tempfile::TempDir, tempfile::TempDir)> = std::sync::OnceLock::new();
    let (dir, again) = DIRS.get_or_init(|| {
        let dir = || tempfile::tempdir().expect("a temporary folder");
        (dir(), dir())
    });
    let file = checkpoint::path(dir.path(), NODE);
    std::fs::write(&file, data).expect("writing the checkpoint");
    let loaded = checkpoint::load(dir.path(), NODE, (NOW_MS / 1000) as u64);
    let restored = match loaded {
        Loaded::Found(c) => c,
        Loaded::MovedAside { moved_to, .. } => {
            assert!(!file.exists() && moved_to.exists(), "a bad file is moved aside");
            return;
        }
        other => panic!("a file that exists loads or is moved aside, not {other:?}"),
    };

    let mut sampler = Sampler::new(
        NODE.to_string(),
        dir.path().to_path_buf(),
        EstimatorConfig::default(),
        PublishConfig {
            change_threshold: 0.1,
            refresh_ms: 3_600_000,
            min_interval_ms: 0,
            budget_interval_ms: 0,
        },
        Arc::new(Metrics::new()),
    );
    sampler.restore(&restored);
    // every restored history's container is running, and was OOM-killed once before
    let targets: Vec<Target> = restored
        .entries
        .iter()
        .take(64)
        .enumerate()
        .map(|(i, e)| Target {
            key: nodewarden_estimator::policy::Key {
                autoscaler: e.autoscaler.clone(),
                container: e.container.clone(),
            },
            pod_namespace: e.autoscaler.namespace.clone(),
            pod_name: format!("pod-{i}"),
            daemonset: "ds".to_string(),
            cgroup_uid: format!("uid-{i}"),
            container_id: format!("{i:064x}"),
            cpu_request_milli: Some(100),
            memory_request_bytes: Some(64 << 20),
            containers_per_pod: e.containers_per_pod,
            policy: Policy::default(),
            last_oom: Some((format!("old-{i}"), NOW_MS - 60_000)),
        })
        .collect();
    let autoscalers: BTreeMap<_, ()> = targets.iter().map(|t| (t.key.autoscaler.clone(), ())).collect();
    for (tick, (at, cpu, memory, ooms)) in [
        (NOW_MS, 1_000_000, 50 << 20, 0),
        (NOW_MS + 10_000, 6_000_000, 80 << 20, 1),
    ]
    .into_iter()
    .enumerate()
    {
        let readings: HashMap<_, _> = targets
            .iter()
            .map(|t| (t.container_id.clone(), Ok(reading(cpu, memory, ooms))))
            .collect();
        let out = sampler.observe(at, &targets, &autoscalers, &readings);
        assert!(out.tracked <= targets.len(), "tick {tick}");
    }

    let saved = sampler.checkpoint(NOW_MS + 10_000);
    checkpoint::save(again.path(), &saved).expect("saving the checkpoint");
    match checkpoint::load(again.path(), NODE, (NOW_MS / 1000) as u64) {
        Loaded::Found(back) => assert_eq!(back, saved, "the saved checkpoint loads back unchanged"),
        other => panic!("the agent cannot read the checkpoint it wrote: {other:?}"),
    }
});
