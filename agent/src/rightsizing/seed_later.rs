//! Seeding of the histories the agent first sees after its start: a DaemonSet autoscaled later,
//! or a DaemonSet's pod that starts on the node after the agent.
//!
//! Each (autoscaler, container) key is looked at once per agent lifetime, the first time a
//! sample tick sees it: when it has no history then (none from the checkpoint, none seeded at
//! start), its history is read from Prometheus with [`seed::seed`] (the same queries, limits,
//! retries and budget as at start). One read at a time, in a task of its own, so the sampling
//! loop never waits for Prometheus; keys that come up while a read runs wait for the next one
//! (all waiting keys go in one read). Until its read ends, a key is not measured (its first
//! `NodeRecommendation` entry is then the seeded one, written at once as a new container); a read
//! that fails or finds nothing leaves it to start empty at the next tick, as without seeding.
//! At most [`MAX_KEYS`] keys are remembered: later ones are not seeded.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use nodewarden_estimator::policy::Key;
use nodewarden_estimator::recommender::EstimatorConfig;
use tokio::task::JoinSet;

use crate::rightsizing::pods::Target;
use crate::rightsizing::seed::{self, SeedError, Seeded};

/// The most keys remembered per agent lifetime (seeded, tried or found with a history); keys
/// beyond are measured from empty, as without seeding.
pub const MAX_KEYS: usize = 4096;

/// One finished read: the keys it was for, what it gave, how long it took.
#[derive(Debug)]
pub struct Finished {
    /// The keys read.
    pub keys: Vec<Key>,
    /// The histories read, or why there are none.
    pub outcome: Result<Seeded, SeedError>,
    /// From the read's start to its end.
    pub took: Duration,
}

/// The keys seen so far, those waiting, and the read running.
pub struct SeedLater {
    config: seed::Config,
    node: String,
    estimator: EstimatorConfig,
    seen: HashSet<Key>,
    waiting: Vec<Target>,
    reading: Vec<Key>,
    running: JoinSet<Finished>,
    full_warned: bool,
}

impl SeedLater {
    /// Nothing seen yet.
    pub fn new(config: seed::Config, node: String, estimator: EstimatorConfig) -> Self {
        SeedLater {
            config,
            node,
            estimator,
            seen: HashSet::new(),
            waiting: Vec::new(),
            reading: Vec::new(),
            running: JoinSet::new(),
            full_warned: false,
        }
    }

    /// Marks `keys` as seen: never read here (the keys of the start, seeded or tried then).
    pub fn mark_seen<'a>(&mut self, keys: impl IntoIterator<Item = &'a Key>) {
        for key in keys {
            if self.seen.len() >= MAX_KEYS {
                break;
            }
            self.seen.insert(key.clone());
        }
    }

    /// Looks at the keys of `targets` not seen before: those without a history (`has_history`)
    /// wait for a read, which starts now when none runs (`now_ms`: the end of its window).
    pub fn offer(&mut self, targets: &[Target], has_history: impl Fn(&Key) -> bool, now_ms: i64) {
        for t in targets {
            if self.seen.contains(&t.key) {
                // a second pod of a key already waiting (a rollout) goes in the same read
                if self.waiting.iter().any(|w| w.key == t.key) && !self.waiting.contains(t) {
                    self.waiting.push(t.clone());
                }
                continue;
            }
            if self.seen.len() >= MAX_KEYS {
                if !self.full_warned {
                    self.full_warned = true;
                    tracing::warn!(
                        limit = MAX_KEYS,
                        "seen this many autoscaled containers since the start; new ones are not seeded from Prometheus"
                    );
                }
                continue;
            }
            self.seen.insert(t.key.clone());
            if !has_history(&t.key) {
                self.waiting.push(t.clone());
            }
        }
        self.start(now_ms);
    }

    /// Whether `key` waits for its read (it is not measured meanwhile).
    pub fn is_pending(&self, key: &Key) -> bool {
        self.reading.contains(key) || self.waiting.iter().any(|t| &t.key == key)
    }

    fn start(&mut self, now_ms: i64) {
        if !self.running.is_empty() || self.waiting.is_empty() {
            return;
        }
        let targets = std::mem::take(&mut self.waiting);
        let mut keys: Vec<Key> = targets.iter().map(|t| t.key.clone()).collect();
        keys.sort();
        keys.dedup();
        self.reading.clone_from(&keys);
        tracing::info!(
            containers = keys.len(),
            "autoscaled containers without history since the start; seeding them from Prometheus"
        );
        let (config, node, estimator) = (self.config.clone(), self.node.clone(), self.estimator.clone());
        self.running.spawn(async move {
            let started = Instant::now();
            let outcome = seed::seed(&config, &node, &targets, &estimator, now_ms).await;
            Finished {
                keys,
                outcome,
                took: started.elapsed(),
            }
        });
    }

    /// The next finished read; never ends while none runs. Call [`SeedLater::done`] with it.
    pub async fn next(&mut self) -> Finished {
        loop {
            match self.running.join_next().await {
                Some(Ok(finished)) => return finished,
                Some(Err(err)) => {
                    // a read that panicked: its keys start empty
                    tracing::error!(error = %err, "seeding from Prometheus stopped");
                    self.reading.clear();
                }
                None => std::future::pending::<()>().await,
            }
        }
    }

    /// A read ended: its keys are measured from now on; the next read starts when keys wait.
    pub fn done(&mut self, now_ms: i64) {
        self.reading.clear();
        self.start(now_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodewarden_api::rightsizing::AutoscalerRef;

    fn target(autoscaler: &str, container: &str, pod: &str) -> Target {
        Target {
            key: Key {
                autoscaler: AutoscalerRef {
                    namespace: "ns".into(),
                    name: autoscaler.into(),
                },
                container: container.into(),
            },
            pod_namespace: "ns".into(),
            pod_name: pod.into(),
            daemonset: autoscaler.into(),
            cgroup_uid: "uid".into(),
            container_id: format!("{pod}-{container}"),
            cpu_request_milli: None,
            memory_request_bytes: None,
            containers_per_pod: 1,
            policy: nodewarden_estimator::policy::Policy::default(),
            last_oom: None,
        }
    }

    fn later(budget: Duration) -> SeedLater {
        // a port nobody listens on: every read fails at once (then retries within the budget)
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        let config = seed::Config {
            endpoint: nodewarden_history::Endpoint {
                url: format!("http://127.0.0.1:{port}"),
                bearer_token_file: None,
                ca_file: None,
            },
            limits: nodewarden_history::Limits::default(),
            window: Duration::from_secs(3600),
            rate_window: seed::RATE_WINDOW,
            budget,
        };
        SeedLater::new(config, "n1".into(), EstimatorConfig::default())
    }

    #[tokio::test]
    async fn each_key_is_read_once_one_read_at_a_time() {
        let mut l = later(Duration::from_millis(300));
        let a = target("a", "c", "a-00001");
        let b = target("b", "c", "b-00001");
        let known = target("k", "c", "k-00001");
        l.mark_seen([&target("s", "c", "s-00001").key]);
        l.offer(
            &[a.clone(), known.clone(), target("s", "c", "s-00001")],
            |k| k == &known.key,
            0,
        );
        // a has no history: read; the key seen at the start and the one with a history: not
        assert!(l.is_pending(&a.key));
        assert!(!l.is_pending(&known.key));
        assert!(!l.is_pending(&target("s", "c", "").key));
        // b comes while a's read runs: it waits for the next
        l.offer(&[a.clone(), b.clone()], |_| false, 0);
        assert!(l.is_pending(&b.key));
        let first = l.next().await;
        assert_eq!(first.keys, vec![a.key.clone()]);
        assert!(
            matches!(first.outcome, Err(SeedError::Budget { .. })),
            "{:?}",
            first.outcome
        );
        l.done(0);
        assert!(!l.is_pending(&a.key), "a's read ended: measured from now on");
        assert!(l.is_pending(&b.key));
        let second = l.next().await;
        assert_eq!(second.keys, vec![b.key.clone()]);
        l.done(0);
        // seen once: never read again, even without a history
        l.offer(&[a.clone(), b.clone()], |_| false, 0);
        assert!(!l.is_pending(&a.key) && !l.is_pending(&b.key));
        assert!(
            tokio::time::timeout(Duration::from_millis(100), l.next())
                .await
                .is_err(),
            "no read runs"
        );
    }

    #[test]
    fn the_keys_remembered_are_bounded() {
        let mut l = later(Duration::from_secs(1));
        let keys: Vec<Key> = (0..MAX_KEYS + 10)
            .map(|i| target(&format!("a{i}"), "c", "p").key)
            .collect();
        l.mark_seen(&keys);
        assert_eq!(l.seen.len(), MAX_KEYS);
        // a key beyond the bound is not read
        l.offer(&[target("new", "c", "new-00001")], |_| false, 0);
        assert!(!l.is_pending(&target("new", "c", "").key));
    }
}
