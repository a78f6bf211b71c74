//! Steps 1 to 3 of the decision: the plan (which container and resource gets which figure, and
//! where it came from), then its caps: LimitRanges of type Pod, then per container.

use super::facts::{Amounts, ContainerFacts, RESOURCES, Targets};
use super::figures::Figures;
use super::limit_ranges::{Ranges, bound, lr_default, lr_max, lr_min};
use crate::domain::rightsizing::PolicyLookup;
use crate::rightsizing::{
    Ceiling, ColdStart, ContainerMode, ContainerPolicy, ControlledValues, DaemonSetAutoscaler, ResourceName,
    Scope,
};

/// Where a container's figures came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The recommendation the agent on this node published.
    Node,
    /// No history on this node (or no figure of its group); the fleet figure (`coldStart:
    /// Fleet`, or `Group` for a node whose group has no figure).
    Fleet,
    /// The figure of the node's group: `scope: NodeGroup`, or `coldStart: Group` on a node
    /// without history of its own.
    Group,
    /// This node has no figures for the autoscaler yet and `coldStart: Template`: the
    /// template's requests stay.
    ColdStartTemplate,
    /// This node has no figures for the autoscaler yet and `coldStart: Fleet` (or `Group`), but
    /// no node (nor group) has a figure for this container: the template's requests stay.
    NoFleetFigure,
    /// This node has figures for the autoscaler, but not for this container (a container new in
    /// the template, or not measured here yet): the template's requests stay (with `coldStart:
    /// Fleet` and a fleet figure, that figure is used instead, source `fleet`).
    ContainerNotMeasured,
    /// The container policy says `Off`.
    PolicyOff,
}

impl Source {
    /// The `source` label of `nodewarden_rightsizing_containers_total` and of the source annotation.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Node => "node-recommendation",
            Source::Fleet => "fleet",
            Source::Group => "group",
            Source::ColdStartTemplate => "cold-start-template",
            Source::NoFleetFigure => "no-fleet-figure-yet",
            Source::ContainerNotMeasured => "container-not-in-node-recommendation",
            Source::PolicyOff => "policy-off",
        }
    }
}

/// Which cap bounded a figure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cap {
    /// A LimitRange of type Pod: the pod's requests summed stay under its max.
    LimitRangePodMax,
    /// A LimitRange of type Pod: the pod's requests summed stay over its min.
    LimitRangePodMin,
    /// A LimitRange of type Container: its max.
    LimitRangeContainerMax,
    /// A LimitRange of type Container: its min.
    LimitRangeContainerMin,
    /// The container policy's `minAllowed`.
    MinAllowed,
    /// The container policy's `maxAllowed`.
    MaxAllowed,
    /// `ceiling: Template`: never above the template's request.
    CeilingTemplate,
    /// `RequestsOnly`: the request may not exceed the existing limit.
    Limit,
}

impl Cap {
    /// The cap's name in the capped annotation.
    pub fn as_str(self) -> &'static str {
        match self {
            Cap::LimitRangePodMax => "limitrange-pod-max",
            Cap::LimitRangePodMin => "limitrange-pod-min",
            Cap::LimitRangeContainerMax => "limitrange-container-max",
            Cap::LimitRangeContainerMin => "limitrange-container-min",
            Cap::MinAllowed => "minAllowed",
            Cap::MaxAllowed => "maxAllowed",
            Cap::CeilingTemplate => "ceiling-template",
            Cap::Limit => "limit",
        }
    }
}

/// One resource of one container the decision covers.
#[derive(Debug)]
pub(super) struct Plan<'a> {
    /// The container's index in the pod.
    pub(super) container: usize,
    /// The resource.
    pub(super) resource: ResourceName,
    /// The figure it was given, before any cap.
    pub(super) target: u64,
    /// The container's request.
    pub(super) request: Option<u64>,
    /// The container's own limit.
    pub(super) own_limit: Option<u64>,
    /// Its own limit, else the LimitRange default that applies to it.
    pub(super) limit: Option<u64>,
    controlled_values: ControlledValues,
    policy: Option<&'a ContainerPolicy>,
    /// The figure after the caps so far.
    pub(super) value: u64,
    /// The caps that bounded it, in the order they did.
    pub(super) caps: Vec<Cap>,
}

/// The containers that have plans, in pod order, each with its index and its plans. The plans
/// are made in pod order ([`plan`]) and the caps keep their order, so each container's plans
/// are next to each other: one pass, and a pod of many containers costs their number.
pub(super) fn by_container<'p, 'a>(plans: &'p [Plan<'a>]) -> impl Iterator<Item = (usize, &'p [Plan<'a>])> {
    plans
        .chunk_by(|a, b| a.container == b.container)
        .map(|mine| (mine.first().map_or(0, |p| p.container), mine))
}

/// Steps 1 to 3, shared by the patch ([`mutate_on`](super::mutate_on)) and the figures ([`sizing_on`](super::sizing_on)): the plan,
/// capped by the LimitRanges of type Pod, then per container.
pub(super) fn capped_plan<'a>(
    containers: &[ContainerFacts],
    autoscaler: &'a DaemonSetAutoscaler,
    figures: Figures,
    ranges: &Ranges,
) -> (Vec<Plan<'a>>, Vec<(String, Source)>) {
    let (mut plans, sources) = plan(containers, autoscaler, figures, ranges);
    cap_pod(&mut plans, containers, ranges);
    cap_containers(&mut plans, autoscaler.spec.ceiling, ranges);
    // `by_container` groups each container's plans by adjacency
    debug_assert!(plans.is_sorted_by_key(|p| p.container), "plans are in pod order");
    (plans, sources)
}

/// Step 1, the raw plan: which container and resource gets which target, and where each
/// container's figures came from (in pod order).
fn plan<'a>(
    containers: &[ContainerFacts],
    autoscaler: &'a DaemonSetAutoscaler,
    figures: Figures,
    ranges: &Ranges,
) -> (Vec<Plan<'a>>, Vec<(String, Source)>) {
    let mut sources = Vec::new();
    let mut plans: Vec<Plan> = Vec::new();
    let policies = PolicyLookup::of(autoscaler);
    // where figures are looked for, in order: the history of the node (or its group), then the
    // cold-start choice
    let history = match autoscaler.spec.scope {
        Scope::Node => [(Source::Node, figures.node), (Source::Node, None)],
        Scope::NodeGroup => [(Source::Group, figures.group), (Source::Node, figures.node)],
    };
    let has_history = history.iter().any(|(_, t)| t.is_some_and(|t| !t.is_empty()));
    let cold = match autoscaler.spec.cold_start {
        ColdStart::Template => [(Source::Fleet, None), (Source::Fleet, None)],
        ColdStart::Fleet => [(Source::Fleet, figures.fleet), (Source::Fleet, None)],
        ColdStart::Group => [(Source::Group, figures.group), (Source::Fleet, figures.fleet)],
    };
    let chain: [(Source, Option<&Targets>); 4] = [history[0], history[1], cold[0], cold[1]];
    for (index, container) in containers.iter().enumerate() {
        let policy = policies.get(&container.name);
        if policy.is_some_and(|p| p.mode == ContainerMode::Off) {
            sources.push((container.name.clone(), Source::PolicyOff));
            continue;
        }
        let found = chain
            .iter()
            .find_map(|(source, t)| Some((*source, *t.and_then(|t| t.get(&container.name))?)));
        let (source, targets) = match found {
            Some((source, t)) => (source, Some(t)),
            None if has_history => (Source::ContainerNotMeasured, None),
            None => match autoscaler.spec.cold_start {
                ColdStart::Template => (Source::ColdStartTemplate, None),
                ColdStart::Fleet | ColdStart::Group => (Source::NoFleetFigure, None),
            },
        };
        sources.push((container.name.clone(), source));
        let Some(targets) = targets else { continue };
        let controlled: &[ResourceName] = policy
            .and_then(|p| p.controlled_resources.as_deref())
            .unwrap_or(&RESOURCES);
        let requests = container.requests();
        let limits = container.limits();
        for resource in RESOURCES {
            if !controlled.contains(&resource) {
                continue;
            }
            let Some(target) = targets.get(resource) else {
                continue;
            };
            let own_limit = limits.get(resource);
            let default_limit = bound(&ranges.container, resource, lr_default, u64::min);
            plans.push(Plan {
                container: index,
                resource,
                target,
                request: requests.get(resource),
                own_limit,
                limit: own_limit.or(default_limit),
                controlled_values: policy.map(|p| p.controlled_values).unwrap_or_default(),
                policy,
                value: target,
                caps: Vec::new(),
            });
        }
    }
    (plans, sources)
}

/// Step 2, LimitRanges of type Pod: the sum of the pod's requests stays within min and max,
/// the planned containers scaled together.
fn cap_pod(plans: &mut [Plan], containers: &[ContainerFacts], ranges: &Ranges) {
    if ranges.pod.is_empty() {
        return;
    }
    for resource in RESOURCES {
        let planned: Vec<usize> = (0..plans.len())
            .filter(|&i| plans[i].resource == resource)
            .collect();
        if planned.is_empty() {
            continue;
        }
        // one flag per container: a pod of many containers costs their number, not its square
        let mut is_planned = vec![false; containers.len()];
        for &p in &planned {
            if let Some(flag) = is_planned.get_mut(plans[p].container) {
                *flag = true;
            }
        }
        let others: u64 = containers
            .iter()
            .enumerate()
            .filter(|(i, _)| !is_planned[*i])
            .filter_map(|(_, c)| c.requests().get(resource))
            .fold(0, u64::saturating_add);
        let ours: u64 = planned
            .iter()
            .map(|&p| plans[p].value)
            .fold(0, u64::saturating_add);
        // saturating: a sum beyond u64 is over any max and never under a min
        let total = others.saturating_add(ours);
        if let Some(max) = bound(&ranges.pod, resource, lr_max, u64::min)
            && total > max
            && ours > 0
        {
            let room = max.saturating_sub(others);
            scale_to_sum(plans, &planned, room, ours);
            for &p in &planned {
                plans[p].caps.push(Cap::LimitRangePodMax);
            }
        } else if let Some(min) = bound(&ranges.pod, resource, lr_min, u64::max)
            && total < min
            && ours > 0
        {
            let need = min.saturating_sub(others);
            scale_to_sum(plans, &planned, need, ours);
            for &p in &planned {
                plans[p].caps.push(Cap::LimitRangePodMin);
            }
        }
    }
}

/// Step 3, per container: LimitRange, minAllowed/maxAllowed, ceiling, the existing limit; and
/// the LimitRange again, so a policy bound never takes the pod outside what is admissible.
fn cap_containers(plans: &mut [Plan], ceiling: Ceiling, ranges: &Ranges) {
    for plan in plans {
        let r = plan.resource;
        let lr_container_max = bound(&ranges.container, r, lr_max, u64::min);
        let lr_container_min = bound(&ranges.container, r, lr_min, u64::max);
        clamp(
            plan,
            lr_container_min,
            lr_container_max,
            Cap::LimitRangeContainerMin,
            Cap::LimitRangeContainerMax,
        );
        let policy_min = plan
            .policy
            .and_then(|p| Amounts::from_list(p.min_allowed.as_ref()).get(r));
        let policy_max = plan
            .policy
            .and_then(|p| Amounts::from_list(p.max_allowed.as_ref()).get(r));
        clamp(plan, policy_min, policy_max, Cap::MinAllowed, Cap::MaxAllowed);
        if ceiling == Ceiling::Template
            && let Some(template) = plan.request
            && plan.value > template
        {
            plan.value = template;
            plan.caps.push(Cap::CeilingTemplate);
        }
        if plan.controlled_values == ControlledValues::RequestsOnly
            && let Some(limit) = plan.limit
            && plan.value > limit
        {
            plan.value = limit;
            plan.caps.push(Cap::Limit);
        }
        clamp(
            plan,
            lr_container_min,
            lr_container_max,
            Cap::LimitRangeContainerMin,
            Cap::LimitRangeContainerMax,
        );
        plan.caps.dedup();
    }
}

/// The largest limit the ratio may scale to: 2^63 − 1 (millicores or bytes), the largest amount
/// Kubernetes keeps exactly as an integer. Never below the request (see docs/rightsizing.md).
pub const MAX_SCALED_LIMIT: u64 = i64::MAX as u64;

/// The limit that goes with a planned request: `RequestsOnly` keeps the limit as it is;
/// `RequestsAndLimits` keeps the limit-to-request ratio, within the LimitRange max and never
/// below the request.
pub(super) fn scaled_limit(plan: &Plan, request: u64, ranges: &Ranges) -> Option<u64> {
    match plan.controlled_values {
        ControlledValues::RequestsOnly => None,
        ControlledValues::RequestsAndLimits => plan.limit.map(|old_limit| {
            let scaled = match plan.request {
                Some(old_request) if old_request != old_limit && old_request > 0 => {
                    scale_ceil(old_limit, request, old_request).min(MAX_SCALED_LIMIT)
                }
                _ => request,
            };
            let lr_max = bound(&ranges.container, plan.resource, lr_max, u64::min);
            lr_max.map_or(scaled, |m| scaled.min(m)).max(request)
        }),
    }
}

fn clamp(plan: &mut Plan, min: Option<u64>, max: Option<u64>, min_cap: Cap, max_cap: Cap) {
    if let Some(max) = max
        && plan.value > max
    {
        plan.value = max;
        plan.caps.push(max_cap);
    }
    if let Some(min) = min
        && plan.value < min
    {
        plan.value = min;
        plan.caps.push(min_cap);
    }
}

/// Scales the `planned` values (summing to `ours`) in proportion so that they sum to exactly
/// `sum`: each rounded down, then the units lost to rounding given one each to the values that
/// lost the most (largest remainder). Rounding each value up instead could end a pod a few
/// units over a Pod LimitRange max as tight as its min (`1001m` and two containers: 501m + 501m).
fn scale_to_sum(plans: &mut [Plan], planned: &[usize], sum: u64, ours: u64) {
    if ours == 0 {
        return;
    }
    let mut remainders: Vec<(u128, usize)> = Vec::with_capacity(planned.len());
    let mut given: u128 = 0;
    for &p in planned {
        let exact = u128::from(plans[p].value) * u128::from(sum);
        let floor = exact / u128::from(ours);
        given += floor;
        remainders.push((exact % u128::from(ours), p));
        plans[p].value = u64::try_from(floor).unwrap_or(u64::MAX);
    }
    // fewer units are missing than there are values (each lost less than one)
    let missing = u128::from(sum).saturating_sub(given);
    remainders.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for &(_, p) in remainders
        .iter()
        .take(usize::try_from(missing).unwrap_or(usize::MAX))
    {
        plans[p].value = plans[p].value.saturating_add(1);
    }
}

/// `value × num / den`, rounded up, saturating.
fn scale_ceil(value: u64, num: u64, den: u64) -> u64 {
    if den == 0 {
        return value;
    }
    u64::try_from((u128::from(value) * u128::from(num)).div_ceil(u128::from(den))).unwrap_or(u64::MAX)
}
