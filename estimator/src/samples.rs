//! A container's samples read from elsewhere (Prometheus: the kubelet's cAdvisor series and
//! kube-state-metrics' OOM kills), fed into a [`History`] as the agent feeds its live samples.
//!
//! The agent seeds its histories with [`history_of`], and `kubectl nodewarden report
//! --prometheus` builds its figures with the same function from the same window, so a seeded
//! agent's first `NodeRecommendation` is what the report prints for its node.

use crate::recommender::{EstimatorConfig, History};

/// One container's samples on one node: what its node's agent would have seen.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Samples {
    /// `(ms, cores)`, oldest first, one per time (the highest where pods overlap).
    pub cpu: Vec<(i64, f64)>,
    /// `(ms, bytes)`, oldest first, one per time (the highest where pods overlap).
    pub memory: Vec<(i64, f64)>,
    /// `(ms, OOM kills)`, oldest first (the pods' kills at the same time added up).
    pub oom: Vec<(i64, u64)>,
}

impl Samples {
    /// Adds the series of one pod's container (a DaemonSet's pods on a node, one after the
    /// other, are one history): CPU in cores and memory in bytes per time, OOM kills per time.
    pub fn add(&mut self, cpu: Vec<(i64, f64)>, memory: Vec<(i64, f64)>, oom: Vec<(i64, u64)>) {
        self.cpu.extend(cpu);
        self.memory.extend(memory);
        self.oom.extend(oom);
    }

    /// Puts the samples in time order, one per time: the highest CPU and memory sample where
    /// pods overlap, their OOM kills added up.
    pub fn merge(&mut self) {
        merge(&mut self.cpu);
        merge(&mut self.memory);
        merge_oom(&mut self.oom);
    }
}

/// `into` in time order, the highest value kept where two share a time.
pub fn merge(into: &mut Vec<(i64, f64)>) {
    into.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.total_cmp(&a.1)));
    into.dedup_by_key(|p| p.0);
}

/// `into` in time order, the counts of the same time added up.
pub fn merge_oom(into: &mut Vec<(i64, u64)>) {
    into.sort_by_key(|p| p.0);
    let mut out: Vec<(i64, u64)> = Vec::with_capacity(into.len());
    for &(at, n) in into.iter() {
        match out.last_mut() {
            Some(last) if last.0 == at => last.1 = last.1.saturating_add(n),
            _ => out.push((at, n)),
        }
    }
    *into = out;
}

/// The estimator fed with `samples` (merged: [`Samples::merge`]) as the agent feeds it: every
/// CPU sample, then memory samples and OOM kills in time order (at the same time the memory
/// sample first, as in one agent tick); an OOM kill is recorded against `memory_request` bytes
/// (the container's request, as the agent passes it) and counts its further kills of that
/// step. `None` when `cfg`'s half-lives are not usable (never with the defaults).
pub fn history_of(cfg: &EstimatorConfig, samples: &Samples, memory_request: f64) -> Option<History> {
    let mut h = History::new(cfg).ok()?;
    for &(at, cores) in &samples.cpu {
        h.add_cpu(cfg, at, cores);
    }
    let mut ooms = samples.oom.iter().peekable();
    for &(at, bytes) in &samples.memory {
        while let Some(&&(oom_at, kills)) = ooms.peek()
            && oom_at < at
        {
            record_oom(cfg, &mut h, oom_at, kills, memory_request);
            ooms.next();
        }
        h.add_memory(cfg, at, bytes);
    }
    for &(oom_at, kills) in ooms {
        record_oom(cfg, &mut h, oom_at, kills, memory_request);
    }
    Some(h)
}

fn record_oom(cfg: &EstimatorConfig, h: &mut History, at: i64, kills: u64, memory_request: f64) {
    if kills > 0 && h.record_oom(cfg, at, memory_request).is_some() {
        h.oom_count = h.oom_count.saturating_add(kills - 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_pods_keep_the_highest_sample_per_time() {
        let mut v = vec![(2, 0.1), (1, 0.5), (2, 0.3), (1, 0.2)];
        merge(&mut v);
        assert_eq!(v, vec![(1, 0.5), (2, 0.3)]);
        let mut oom = vec![(2, 1), (1, 1), (2, 2)];
        merge_oom(&mut oom);
        assert_eq!(oom, vec![(1, 1), (2, 3)]);
    }

    #[test]
    fn oom_kills_are_fed_between_memory_samples_as_an_agent_sees_them() {
        let cfg = EstimatorConfig::default();
        let mib = 1024.0 * 1024.0;
        let t0 = 1_700_000_000_000;
        let samples = Samples {
            cpu: vec![(t0, 0.1)],
            memory: vec![(t0, 300.0 * mib), (t0 + 60_000, 200.0 * mib)],
            oom: vec![(t0, 2)],
        };
        let h = history_of(&cfg, &samples, 64.0 * mib).unwrap();
        // two kills in one step: one bump, both counted
        assert_eq!(h.oom_count, 2);
        // the bump is on the interval's peak, 300 MiB (the memory sample of the same time first)
        let mut agent = History::new(&cfg).unwrap();
        agent.add_cpu(&cfg, t0, 0.1);
        agent.add_memory(&cfg, t0, 300.0 * mib);
        agent.record_oom(&cfg, t0, 64.0 * mib);
        agent.oom_count += 1;
        agent.add_memory(&cfg, t0 + 60_000, 200.0 * mib);
        assert_eq!(h, agent);
    }
}
