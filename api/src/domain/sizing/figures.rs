//! The figures a pod's containers may take besides their node's own: the fleet's and the node
//! group's, read from the autoscaler's status, and the percentile rules the status is computed
//! with.

use std::collections::BTreeMap;

use super::facts::{Amounts, Targets};
use crate::rightsizing::{ColdStart, DaemonSetAutoscaler, FleetRecommendation, NodeRecommendation};

/// The figures a pod's containers may take, by where they come from; which one a container
/// gets is the autoscaler's `scope` and `coldStart` (see [`mutate_on`](super::mutate_on)).
#[derive(Clone, Copy, Debug, Default)]
pub struct Figures<'a> {
    /// The targets the agent of the pod's node published for the autoscaler's containers
    /// (`None`: no recommendation on this node).
    pub node: Option<&'a Targets>,
    /// The figure of the node's group ([`group_targets`]), for `scope: NodeGroup` and
    /// `coldStart: Group`.
    pub group: Option<&'a Targets>,
    /// The fleet figure ([`fleet_targets`]), for `coldStart: Fleet` and `Group`.
    pub fleet: Option<&'a Targets>,
}

/// What an autoscaler's status gives every node, read once: the fleet figure and each group's
/// (only what the spec can use). The webhook keeps one per autoscaler in its index, so the
/// request path parses no quantity of the status; the agent reads it per round. Both then take
/// a node's [`Figures`] from it with [`StatusFigures::for_node`], so they agree.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StatusFigures {
    /// The fleet figure, with `coldStart: Fleet` or `Group`.
    pub fleet: Option<Targets>,
    /// Each group's figure by its label value, with `scope: NodeGroup` or `coldStart: Group`
    /// (see [`group_targets`]).
    pub groups: BTreeMap<String, Targets>,
}

impl StatusFigures {
    /// The figures of a node with its own `node` targets, of group `group_value` (its value of
    /// `spec.nodeGroupLabel`, `None` without the label).
    pub fn for_node<'a>(&'a self, node: Option<&'a Targets>, group_value: Option<&str>) -> Figures<'a> {
        Figures {
            node: node.filter(|t| !t.is_empty()),
            group: group_value.and_then(|v| self.groups.get(v)),
            fleet: self.fleet.as_ref(),
        }
    }
}

/// Reads [`StatusFigures`] from an autoscaler: the fleet figure and the groups' figures, each
/// only when the spec can use it.
pub fn status_figures(autoscaler: &DaemonSetAutoscaler) -> StatusFigures {
    let spec = &autoscaler.spec;
    let fleet = match spec.cold_start {
        ColdStart::Fleet | ColdStart::Group => autoscaler.status.as_ref().map(|s| fleet_targets(&s.fleet)),
        ColdStart::Template => None,
    };
    let groups = match &autoscaler.status {
        Some(status) if spec.uses_groups() => status
            .groups
            .iter()
            .filter_map(|g| Some((g.value.clone(), group_targets(autoscaler, &g.value)?)))
            .collect(),
        _ => BTreeMap::new(),
    };
    StatusFigures { fleet, groups }
}

/// The figure of group `value` in the autoscaler's status; `None` when there is none, or when
/// the status's groups were computed for another label than the spec's `nodeGroupLabel`.
pub fn group_targets(autoscaler: &DaemonSetAutoscaler, value: &str) -> Option<Targets> {
    let status = autoscaler.status.as_ref()?;
    let label = autoscaler.spec.node_group_label.as_deref()?;
    if status.node_group_label.as_deref() != Some(label) {
        return None;
    }
    let group = status.groups.iter().find(|g| g.value == value)?;
    let targets = fleet_targets(&group.containers);
    (!targets.is_empty()).then_some(targets)
}

/// The targets of one autoscaler's containers in a node's recommendation.
pub fn node_targets(rec: &NodeRecommendation, namespace: &str, autoscaler: &str) -> Targets {
    rec.spec
        .recommendations
        .iter()
        .filter(|r| r.autoscaler.namespace == namespace && r.autoscaler.name == autoscaler)
        .map(|r| (r.container_name.clone(), Amounts::from_list(r.target.as_ref())))
        .filter(|(_, a)| !a.is_empty())
        .collect()
}

/// The fleet targets from an autoscaler's status.
pub fn fleet_targets(fleet: &[FleetRecommendation]) -> Targets {
    fleet
        .iter()
        .map(|f| (f.container_name.clone(), Amounts::from_list(f.target.as_ref())))
        .filter(|(_, a)| !a.is_empty())
        .collect()
}

/// The 90th percentile (nearest rank, rounded up) of some values; `None` when there are none.
pub fn p90(values: &mut [u64]) -> Option<u64> {
    percentile(values, 90)
}

/// The `percent`th percentile (nearest rank, rounded up) of some values; `None` when there are
/// none.
pub fn percentile(values: &mut [u64], percent: usize) -> Option<u64> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable();
    let rank = (values.len() * percent.min(100)).div_ceil(100).max(1);
    values.get(rank - 1).copied()
}

/// How far above the median of the node targets the fleet figure may go: the fleet figure is
/// the 90th percentile, but at most this multiple of the median (see [`fleet_from_nodes`]).
pub const FLEET_MEDIAN_MULTIPLE: u64 = 2;

/// Fleet targets from the targets of many nodes: per container and resource, the 90th
/// percentile (nearest rank), but at most [`FLEET_MEDIAN_MULTIPLE`] × the median (nearest rank,
/// the lower of two middle values).
///
/// Why the cap: below ten nodes the nearest-rank 90th percentile is the largest figure, so one
/// node that reports a huge target (a compromised agent may write its own node's
/// recommendation, nothing else) would decide the requests of every new node. The median
/// cannot be raised above the largest honest figure while at most half of the nodes lie, so:
/// - while at most ⌊n/2⌋ of n nodes report false figures, the fleet figure is at most twice the
///   largest figure of an honest node;
/// - while at most n − ⌈0.9·n⌉ (about a tenth) do, it is at most that largest honest figure.
///
/// In a fleet whose busiest tenth runs at up to twice its median, the figure is the plain 90th
/// percentile.
pub fn fleet_from_nodes<'a>(nodes: impl IntoIterator<Item = &'a Targets>) -> Targets {
    let robust = |values: &mut Vec<u64>| {
        let p90 = percentile(values, 90)?;
        let median = percentile(values, 50)?;
        Some(p90.min(median.saturating_mul(FLEET_MEDIAN_MULTIPLE)))
    };
    per_container(nodes)
        .into_iter()
        .map(|(c, (mut cpu, mut mem))| {
            (
                c,
                Amounts {
                    cpu: robust(&mut cpu),
                    memory: robust(&mut mem),
                },
            )
        })
        .filter(|(_, a)| !a.is_empty())
        .collect()
}

/// Every node's CPU and memory targets, by container.
fn per_container<'a>(nodes: impl IntoIterator<Item = &'a Targets>) -> BTreeMap<String, (Vec<u64>, Vec<u64>)> {
    let mut samples: BTreeMap<String, (Vec<u64>, Vec<u64>)> = BTreeMap::new();
    for targets in nodes {
        for (container, a) in targets {
            let entry = samples.entry(container.clone()).or_default();
            entry.0.extend(a.cpu);
            entry.1.extend(a.memory);
        }
    }
    samples
}

/// Per container and resource, the `percent`th percentile of many nodes' targets.
pub fn fleet_percentile<'a>(nodes: impl IntoIterator<Item = &'a Targets>, percent: usize) -> Targets {
    per_container(nodes)
        .into_iter()
        .map(|(c, (mut cpu, mut mem))| {
            (
                c,
                Amounts {
                    cpu: percentile(&mut cpu, percent),
                    memory: percentile(&mut mem, percent),
                },
            )
        })
        .filter(|(_, a)| !a.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes_with_cpu(cpus: &[u64]) -> Vec<Targets> {
        cpus.iter()
            .map(|&cpu| {
                BTreeMap::from([(
                    "agent".to_string(),
                    Amounts {
                        cpu: Some(cpu),
                        memory: None,
                    },
                )])
            })
            .collect()
    }

    fn fleet_cpu(cpus: &[u64]) -> Option<u64> {
        fleet_from_nodes(nodes_with_cpu(cpus).iter())
            .get("agent")
            .and_then(|a| a.cpu)
    }

    #[test]
    fn fleet_figure_resists_a_minority_of_nodes() {
        let liar = u64::MAX / 3;
        // one node alone is the fleet
        assert_eq!(fleet_cpu(&[300]), Some(300));
        // one liar among five honest nodes (below ten nodes the 90th percentile is the largest
        // figure): at most twice the honest median
        assert_eq!(fleet_cpu(&[100, 120, 150, 200, 250, liar]), Some(300));
        // half the nodes lying: still at most twice the largest honest figure
        assert_eq!(fleet_cpu(&[100, 200, 300, liar, liar, liar]), Some(600));
        // a tenth lying in a fleet of twenty: not above the largest honest figure
        let mut twenty: Vec<u64> = (1..=18).map(|i| 100 + i).collect();
        twenty.extend([liar, liar]);
        assert_eq!(fleet_cpu(&twenty), Some(118));
        // an honest fleet whose busiest tenth runs at under twice its median: the plain p90
        let honest: Vec<u64> = (1..=10).map(|i| 100 + 10 * i).collect();
        assert_eq!(fleet_cpu(&honest), Some(190));
        // a fleet of two: the busier node, but at most twice the other
        assert_eq!(fleet_cpu(&[100, 150]), Some(150));
        assert_eq!(fleet_cpu(&[100, 900]), Some(200));
        // no overflow at the top of the range
        assert_eq!(fleet_cpu(&[u64::MAX, u64::MAX]), Some(u64::MAX));
    }

    #[test]
    fn p90_is_nearest_rank() {
        assert_eq!(p90(&mut []), None);
        assert_eq!(p90(&mut [5]), Some(5));
        assert_eq!(p90(&mut [1, 2]), Some(2));
        let mut ten: Vec<u64> = (1..=10).rev().collect();
        assert_eq!(p90(&mut ten), Some(9));
        let mut hundred: Vec<u64> = (1..=100).collect();
        assert_eq!(p90(&mut hundred), Some(90));
        assert_eq!(percentile(&mut hundred, 50), Some(50));
        assert_eq!(percentile(&mut [3, 1, 2], 50), Some(2));
        assert_eq!(percentile(&mut [1, 2], 50), Some(1));
    }
}
