//! What to do with a running DaemonSet pod whose node's recommendation moved: resize it, evict
//! it, or leave it. Pure: the agent gathers the facts, [`decide`] answers, the agent acts.
//!
//! The rules are VPA's updater's, so a VPA user finds what they expect:
//! * a pod is updated at once when a container's request is outside the recommendation's
//!   `[lowerBound, upperBound]`, or when a container was OOM-killed soon after it started
//!   (within `oom_window`) and the new memory request is higher;
//! * otherwise only once the pod has run for `min_age` and its requests differ from the new
//!   ones by at least `min_change` (VPA's resource diff: per resource `|Σ new − Σ old| / Σ old`
//!   over the pod's containers, summed over CPU and memory);
//! * a resize the kubelet reports `Infeasible`, or that stays `Deferred` past `deferred_limit`
//!   or in progress past `in_progress_limit`, falls back to eviction.
//!
//! One rule is nodewarden's own: while the CPU history behind a container's figures spans less
//! than `min_history`, its requests are only ever raised (a request below the lower bound, a
//! quick OOM kill). A request above the upper bound and a drift wait for the history (VPA acts on
//! them from its first sample, its upper bound unbounded, its target one sample's), and a
//! resize in place keeps every request it would lower (docs/estimator.md).
//!
//! The new figures are [`sizing_on`](super::sizing::sizing_on)'s: exactly what the webhook gives
//! a new pod on the same node.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::sizing::{Amounts, ContainerSizing};
use crate::rightsizing::{ResourceName, RunningPods};

/// When running pods are changed (every figure a flag of the agent).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Thresholds {
    /// The smallest resource diff that updates a pod inside its bounds (VPA: 0.1).
    pub min_change: f64,
    /// How long a pod runs before a change inside its bounds updates it (VPA: 12 h).
    pub min_age: Duration,
    /// An OOM kill this soon after the container started updates the pod at once (VPA: 10 min).
    pub oom_window: Duration,
    /// A resize `Deferred` this long falls back to eviction (VPA: 5 min).
    pub deferred_limit: Duration,
    /// A resize in progress this long falls back to eviction (VPA: 1 h).
    pub in_progress_limit: Duration,
    /// A container whose figures rest on less CPU history than this (first to last sample) is
    /// only raised, never lowered (nodewarden's own; VPA has no such rule).
    pub min_history: Duration,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            min_change: 0.1,
            min_age: Duration::from_secs(12 * 3600),
            oom_window: Duration::from_secs(600),
            deferred_limit: Duration::from_secs(300),
            in_progress_limit: Duration::from_secs(3600),
            min_history: Duration::from_secs(24 * 3600),
        }
    }
}

/// A container as it runs now (its spec: what the API asks of the kubelet).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Current {
    /// The container's name.
    pub name: String,
    /// Its requests in the pod's spec.
    pub requests: Amounts,
    /// Its limits in the pod's spec.
    pub limits: Amounts,
}

/// The recommendation's bounds for one container.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bounds {
    /// The recommendation's `lowerBound`.
    pub lower: Amounts,
    /// The recommendation's `upperBound`.
    pub upper: Amounts,
    /// The CPU history behind the figures, first to last sample (`None`: not known, as VPA).
    pub history: Option<Duration>,
}

impl Bounds {
    /// Whether the figures rest on less history than `min_history`.
    fn short(&self, th: &Thresholds) -> bool {
        self.history.is_some_and(|h| h < th.min_history)
    }
}

/// Where the pod's last resize stands, from its `PodResizePending` and `PodResizeInProgress`
/// conditions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ResizeState {
    /// No resize pending or in progress.
    #[default]
    Idle,
    /// `PodResizePending`, reason `Infeasible`: this node can never give it.
    Infeasible {
        /// The condition's message.
        message: String,
    },
    /// `PodResizePending`, reason `Deferred`, for this long.
    Deferred {
        /// The condition's message.
        message: String,
        /// How long the resize has been deferred.
        for_: Duration,
    },
    /// `PodResizeInProgress`, for this long.
    InProgress {
        /// How long the resize has been in progress.
        for_: Duration,
    },
}

/// Everything [`decide`] looks at besides the new figures.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Facts {
    /// The pod's containers now.
    pub containers: Vec<Current>,
    /// The recommendation's bounds by container (absent: figures not from this node's history).
    pub bounds: BTreeMap<String, Bounds>,
    /// How long the pod has run (`None`: not started).
    pub age: Option<Duration>,
    /// Containers OOM-killed within `oom_window` of their start, since the pod's last change.
    pub quick_oom: Vec<String>,
    /// The last resize.
    pub resize: ResizeState,
}

impl Facts {
    /// The containers by name (the first of a name, as the pod lists them): one lookup per
    /// container, so a pod of many containers costs their number, not its square.
    fn by_name(&self) -> HashMap<&str, &Current> {
        let mut out = HashMap::with_capacity(self.containers.len());
        for c in &self.containers {
            out.entry(c.name.as_str()).or_insert(c);
        }
        out
    }
}

/// Why a pod is changed.
#[derive(Clone, Debug, PartialEq)]
pub enum Why {
    /// A request is outside the recommendation's bounds.
    OutsideBounds {
        /// The container's name.
        container: String,
        /// The resource whose request is out of bounds.
        resource: ResourceName,
        /// The current request (millicores or bytes); `None` when unset.
        request: Option<u64>,
        /// The lower bound (millicores or bytes), if any.
        lower: Option<u64>,
        /// The upper bound (millicores or bytes), if any.
        upper: Option<u64>,
    },
    /// An OOM kill soon after start, and more memory is recommended.
    QuickOom {
        /// The container that was OOM-killed.
        container: String,
    },
    /// The requests drifted from the recommendation by at least `min_change`.
    Drift {
        /// The resource diff, a fraction (0.1 is 10 %).
        diff: f64,
    },
    /// The kubelet said the resize is infeasible on this node.
    Infeasible {
        /// The kubelet's message.
        message: String,
    },
    /// A resize stayed deferred or in progress past its limit.
    ResizeStuck {
        /// `deferred` or `in progress`.
        state: &'static str,
        /// How long it has been in that state.
        for_: Duration,
    },
}

impl Why {
    /// A short, bounded label (metrics).
    pub fn label(&self) -> &'static str {
        match self {
            Why::OutsideBounds { .. } => "outside-bounds",
            Why::QuickOom { .. } => "quick-oom",
            Why::Drift { .. } => "drift",
            Why::Infeasible { .. } => "infeasible",
            Why::ResizeStuck { .. } => "resize-stuck",
        }
    }
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |r: ResourceName, v: Option<u64>| {
            v.map_or_else(|| "none".to_string(), |v| crate::quantity::format_amount(r, v))
        };
        match self {
            Why::OutsideBounds {
                container,
                resource,
                request,
                lower,
                upper,
            } => write!(
                f,
                "container {container}: {} request {} is outside the recommendation's bounds [{}, {}]",
                resource.as_str(),
                show(*resource, *request),
                show(*resource, *lower),
                show(*resource, *upper)
            ),
            Why::QuickOom { container } => write!(
                f,
                "container {container} was OOM-killed soon after it started and more memory is recommended"
            ),
            Why::Drift { diff } => write!(
                f,
                "requests differ from the node's recommendation by {:.0}%",
                diff * 100.0
            ),
            Why::Infeasible { message } => {
                write!(f, "the kubelet cannot apply the resize on this node: {message}")
            }
            Why::ResizeStuck { state, for_ } => {
                write!(f, "the resize has been {state} for {}s", for_.as_secs())
            }
        }
    }
}

/// Why a pod is left as it is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Leave {
    /// The update mode does not touch running pods.
    Mode,
    /// Its requests and limits are the new ones already.
    UpToDate,
    /// A resize is pending or in progress; the kubelet has not said it cannot be done.
    ResizeUnderway,
    /// Inside the bounds and younger than `min_age`.
    TooYoung,
    /// Inside the bounds and the diff is under `min_change`.
    SmallChange {
        /// The resource diff, a fraction (0.1 is 10 %).
        diff: f64,
    },
    /// The figures rest on less than `min_history` and would only lower requests.
    ShortHistory,
}

impl Leave {
    /// Every label of [`label`](Self::label).
    pub const LABELS: [&'static str; 6] = [
        "mode",
        "up-to-date",
        "resize-underway",
        "too-young",
        "small-change",
        "short-history",
    ];

    /// A short, bounded label (metrics).
    pub fn label(self) -> &'static str {
        match self {
            Leave::Mode => "mode",
            Leave::UpToDate => "up-to-date",
            Leave::ResizeUnderway => "resize-underway",
            Leave::TooYoung => "too-young",
            Leave::SmallChange { .. } => "small-change",
            Leave::ShortHistory => "short-history",
        }
    }
}

/// The answer of [`decide`].
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Leave the pod.
    Leave(Leave),
    /// Resize it in place to these figures (only the containers that change).
    Resize {
        /// The new figures of the containers that change.
        containers: Vec<ContainerSizing>,
        /// Why the pod is resized.
        why: Why,
    },
    /// Evict it; its DaemonSet re-creates it on the node with the webhook's figures.
    Evict {
        /// Why the pod is evicted.
        why: Why,
    },
}

const RESOURCES: [ResourceName; 2] = [ResourceName::Cpu, ResourceName::Memory];

/// Resize, evict or leave a running pod whose containers should have `sizing`.
pub fn decide(mode: RunningPods, sizing: &[ContainerSizing], facts: &Facts, th: &Thresholds) -> Action {
    if mode == RunningPods::Untouched {
        return Action::Leave(Leave::Mode);
    }
    // A resize underway is judged first: the spec already says the new figures.
    match &facts.resize {
        ResizeState::Idle => {}
        ResizeState::Infeasible { message } => {
            return Action::Evict {
                why: Why::Infeasible {
                    message: message.clone(),
                },
            };
        }
        ResizeState::Deferred { for_, .. } if *for_ >= th.deferred_limit => {
            return Action::Evict {
                why: Why::ResizeStuck {
                    state: "deferred",
                    for_: *for_,
                },
            };
        }
        ResizeState::InProgress { for_ } if *for_ >= th.in_progress_limit => {
            return Action::Evict {
                why: Why::ResizeStuck {
                    state: "in progress",
                    for_: *for_,
                },
            };
        }
        ResizeState::Deferred { .. } | ResizeState::InProgress { .. } => {
            return Action::Leave(Leave::ResizeUnderway);
        }
    }
    let now_of = facts.by_name();
    let current = |name: &str| now_of.get(name).copied();
    let changing: Vec<ContainerSizing> = sizing
        .iter()
        .filter(|s| {
            let now = current(&s.name).cloned().unwrap_or_default();
            RESOURCES.iter().any(|&r| {
                s.requests.get(r).is_some_and(|v| now.requests.get(r) != Some(v))
                    || s.limits.get(r).is_some_and(|v| now.limits.get(r) != Some(v))
            })
        })
        .cloned()
        .collect();
    if changing.is_empty() {
        return Action::Leave(Leave::UpToDate);
    }
    let why = match urgent(sizing, facts, th) {
        Some(why) => why,
        None => {
            if facts.age.is_none_or(|age| age < th.min_age) {
                return Action::Leave(Leave::TooYoung);
            }
            if facts.bounds.values().any(|b| b.short(th)) {
                return Action::Leave(Leave::ShortHistory);
            }
            let diff = resource_diff(sizing, facts);
            if diff < th.min_change {
                return Action::Leave(Leave::SmallChange { diff });
            }
            Why::Drift { diff }
        }
    };
    match mode {
        RunningPods::Resize => {
            let containers = keep_lowered_on_short_history(changing, facts, th);
            if containers.is_empty() {
                return Action::Leave(Leave::ShortHistory);
            }
            Action::Resize { containers, why }
        }
        _ => Action::Evict { why },
    }
}

/// With a short history, a resize in place raises only: a request it would lower stays as it is,
/// with its limit. Containers left with nothing to change are dropped.
fn keep_lowered_on_short_history(
    changing: Vec<ContainerSizing>,
    facts: &Facts,
    th: &Thresholds,
) -> Vec<ContainerSizing> {
    let now_of = facts.by_name();
    changing
        .into_iter()
        .filter_map(|mut s| {
            if !facts.bounds.get(&s.name).is_some_and(|b| b.short(th)) {
                return Some(s);
            }
            let now = now_of.get(s.name.as_str()).copied().cloned().unwrap_or_default();
            for r in RESOURCES {
                let (new, old) = (s.requests.get(r), now.requests.get(r));
                if let (Some(new), Some(old)) = (new, old)
                    && new < old
                {
                    s.requests.set(r, Some(old));
                    if s.limits.get(r).is_some() {
                        s.limits.set(r, now.limits.get(r));
                    }
                }
            }
            let changes = RESOURCES.iter().any(|&r| {
                s.requests.get(r).is_some_and(|v| now.requests.get(r) != Some(v))
                    || s.limits.get(r).is_some_and(|v| now.limits.get(r) != Some(v))
            });
            changes.then_some(s)
        })
        .collect()
}

/// A reason to update the pod whatever its age and the size of the change.
fn urgent(sizing: &[ContainerSizing], facts: &Facts, th: &Thresholds) -> Option<Why> {
    let mut new_of: HashMap<&str, &ContainerSizing> = HashMap::with_capacity(sizing.len());
    for s in sizing {
        new_of.entry(s.name.as_str()).or_insert(s);
    }
    let now_of = facts.by_name();
    for container in &facts.containers {
        let Some(bounds) = facts.bounds.get(&container.name) else {
            continue;
        };
        let Some(new) = new_of.get(container.name.as_str()) else {
            continue;
        };
        for r in RESOURCES {
            // only resources the decision sets
            if new.requests.get(r).is_none() {
                continue;
            }
            let request = container.requests.get(r);
            let (lower, upper) = (bounds.lower.get(r), bounds.upper.get(r));
            let below = lower.is_some_and(|l| request.is_none_or(|q| q < l));
            // a short history never lowers a request
            let above = !bounds.short(th) && upper.is_some_and(|u| request.is_some_and(|q| q > u));
            if below || above {
                return Some(Why::OutsideBounds {
                    container: container.name.clone(),
                    resource: r,
                    request,
                    lower,
                    upper,
                });
            }
        }
    }
    for name in &facts.quick_oom {
        let now = now_of.get(name.as_str());
        let new = new_of.get(name.as_str());
        if let (Some(now), Some(new)) = (now, new)
            && let Some(memory) = new.requests.memory
            && now.requests.memory.is_none_or(|m| memory > m)
        {
            return Some(Why::QuickOom {
                container: name.clone(),
            });
        }
    }
    None
}

/// VPA's resource diff: per resource, `|Σ new − Σ old| / Σ old` over the containers the
/// decision sets, summed over the resources. A resource requested nowhere yet counts as 1
/// (a full change) when something is recommended for it.
pub fn resource_diff(sizing: &[ContainerSizing], facts: &Facts) -> f64 {
    let mut diff = 0.0;
    let now_of = facts.by_name();
    for r in RESOURCES {
        let (mut old, mut new) = (0u128, 0u128);
        for s in sizing {
            let Some(value) = s.requests.get(r) else {
                continue;
            };
            new += u128::from(value);
            let now = now_of.get(s.name.as_str());
            old += u128::from(now.and_then(|c| c.requests.get(r)).unwrap_or(0));
        }
        if old == 0 {
            if new > 0 {
                diff += 1.0;
            }
            continue;
        }
        diff += (new as f64 - old as f64).abs() / old as f64;
    }
    diff
}

#[cfg(test)]
mod tests {
    use super::*;

    const MI: u64 = 1 << 20;
    const HOUR: Duration = Duration::from_secs(3600);

    fn amounts(cpu: u64, memory_mi: u64) -> Amounts {
        Amounts {
            cpu: Some(cpu),
            memory: Some(memory_mi * MI),
        }
    }

    fn sized(name: &str, cpu: u64, memory_mi: u64) -> ContainerSizing {
        ContainerSizing {
            name: name.to_string(),
            sidecar: false,
            requests: amounts(cpu, memory_mi),
            limits: Amounts::default(),
        }
    }

    fn running(name: &str, cpu: u64, memory_mi: u64) -> Current {
        Current {
            name: name.to_string(),
            requests: amounts(cpu, memory_mi),
            limits: Amounts::default(),
        }
    }

    /// One container `app` requesting 100m / 100Mi, running 24 h, bounds [50m, 200m] and
    /// [50Mi, 200Mi], no resize underway.
    fn facts() -> Facts {
        Facts {
            containers: vec![running("app", 100, 100)],
            bounds: BTreeMap::from([(
                "app".to_string(),
                Bounds {
                    lower: amounts(50, 50),
                    upper: amounts(200, 200),
                    history: None,
                },
            )]),
            age: Some(24 * HOUR),
            quick_oom: Vec::new(),
            resize: ResizeState::Idle,
        }
    }

    fn label(action: &Action) -> String {
        match action {
            Action::Leave(l) => format!("leave:{}", l.label()),
            Action::Resize { why, .. } => format!("resize:{}", why.label()),
            Action::Evict { why } => format!("evict:{}", why.label()),
        }
    }

    #[test]
    fn the_table() {
        let th = Thresholds::default();
        let young = Facts {
            age: Some(HOUR),
            ..facts()
        };
        let too_small_bounds = Facts {
            containers: vec![running("app", 300, 100)],
            ..young.clone()
        };
        let below_lower = Facts {
            containers: vec![running("app", 40, 100)],
            ..young.clone()
        };
        let oom = Facts {
            quick_oom: vec!["app".to_string()],
            ..young.clone()
        };
        let infeasible = Facts {
            resize: ResizeState::Infeasible {
                message: "Node didn't have enough capacity".to_string(),
            },
            ..facts()
        };
        let deferred = |mins: u64| Facts {
            resize: ResizeState::Deferred {
                message: "not now".to_string(),
                for_: Duration::from_secs(60 * mins),
            },
            ..facts()
        };
        let in_progress = |mins: u64| Facts {
            resize: ResizeState::InProgress {
                for_: Duration::from_secs(60 * mins),
            },
            ..facts()
        };
        let no_request = Facts {
            containers: vec![Current {
                name: "app".to_string(),
                ..Current::default()
            }],
            ..young.clone()
        };
        use RunningPods::*;
        let cases: Vec<(&str, RunningPods, Vec<ContainerSizing>, Facts, &str)> = vec![
            (
                "Initial never touches a running pod",
                Untouched,
                vec![sized("app", 180, 100)],
                facts(),
                "leave:mode",
            ),
            (
                "same figures",
                Resize,
                vec![sized("app", 100, 100)],
                facts(),
                "leave:up-to-date",
            ),
            (
                "drift over 10% after 12 h: resize",
                Resize,
                vec![sized("app", 120, 100)],
                facts(),
                "resize:drift",
            ),
            (
                "drift over 10% after 12 h: evict in Recreate",
                Evict,
                vec![sized("app", 120, 100)],
                facts(),
                "evict:drift",
            ),
            (
                "drift under 10%",
                Resize,
                vec![sized("app", 105, 102)],
                facts(),
                "leave:small-change",
            ),
            (
                "drift, but younger than 12 h",
                Resize,
                vec![sized("app", 150, 100)],
                young.clone(),
                "leave:too-young",
            ),
            (
                "young, request above the upper bound",
                Resize,
                vec![sized("app", 150, 100)],
                too_small_bounds,
                "resize:outside-bounds",
            ),
            (
                "young, request below the lower bound",
                Evict,
                vec![sized("app", 150, 100)],
                below_lower,
                "evict:outside-bounds",
            ),
            (
                "young, quick OOM and more memory",
                Resize,
                vec![sized("app", 100, 150)],
                oom.clone(),
                "resize:quick-oom",
            ),
            (
                "young, quick OOM but less memory",
                Resize,
                vec![sized("app", 100, 90)],
                oom,
                "leave:too-young",
            ),
            (
                "young, no request at all: below the lower bound",
                Resize,
                vec![sized("app", 100, 100)],
                no_request,
                "resize:outside-bounds",
            ),
            (
                "infeasible resize falls back to eviction",
                Resize,
                vec![sized("app", 100, 100)],
                infeasible,
                "evict:infeasible",
            ),
            (
                "deferred 2 min: wait",
                Resize,
                vec![sized("app", 150, 100)],
                deferred(2),
                "leave:resize-underway",
            ),
            (
                "deferred 5 min: evict",
                Resize,
                vec![sized("app", 150, 100)],
                deferred(5),
                "evict:resize-stuck",
            ),
            (
                "in progress 30 min: wait",
                Resize,
                vec![sized("app", 150, 100)],
                in_progress(30),
                "leave:resize-underway",
            ),
            (
                "in progress 60 min: evict",
                Resize,
                vec![sized("app", 150, 100)],
                in_progress(60),
                "evict:resize-stuck",
            ),
        ];
        for (what, mode, sizing, facts, want) in cases {
            let got = decide(mode, &sizing, &facts, &th);
            assert_eq!(label(&got), want, "{what}: {got:?}");
        }
    }

    #[test]
    fn a_resize_carries_only_the_containers_that_change_with_their_limits() {
        let mut facts = facts();
        facts.containers.push(running("sidecar", 10, 10));
        let mut app = sized("app", 150, 100);
        app.limits.cpu = Some(300);
        let sizing = vec![app.clone(), sized("sidecar", 10, 10)];
        let Action::Resize { containers, why } =
            decide(RunningPods::Resize, &sizing, &facts, &Thresholds::default())
        else {
            panic!("expected a resize");
        };
        assert_eq!(containers, vec![app]);
        assert_eq!(
            why.to_string(),
            "requests differ from the node's recommendation by 45%"
        );
    }

    #[test]
    fn a_limit_alone_that_differs_is_a_change() {
        let mut app = sized("app", 100, 100);
        app.limits.memory = Some(400 * MI);
        let got = decide(RunningPods::Resize, &[app], &facts(), &Thresholds::default());
        // the requests are equal, so the diff is 0: a limit alone never updates a pod in bounds
        assert_eq!(got, Action::Leave(Leave::SmallChange { diff: 0.0 }));
    }

    #[test]
    fn thresholds_are_honoured() {
        let th = Thresholds {
            min_change: 0.5,
            min_age: Duration::from_secs(60),
            ..Thresholds::default()
        };
        let young = Facts {
            age: Some(Duration::from_secs(120)),
            ..facts()
        };
        let sizing = vec![sized("app", 140, 100)];
        assert_eq!(
            label(&decide(RunningPods::Resize, &sizing, &young, &th)),
            "leave:small-change"
        );
        let sizing = vec![sized("app", 160, 100)];
        assert_eq!(
            label(&decide(RunningPods::Resize, &sizing, &young, &th)),
            "resize:drift"
        );
    }

    #[test]
    fn outside_bounds_names_the_figures() {
        let facts = Facts {
            containers: vec![running("app", 300, 100)],
            ..facts()
        };
        let Action::Evict { why } = decide(
            RunningPods::Evict,
            &[sized("app", 150, 100)],
            &facts,
            &Thresholds::default(),
        ) else {
            panic!("expected an eviction");
        };
        assert_eq!(
            why.to_string(),
            "container app: cpu request 300m is outside the recommendation's bounds [50m, 200m]"
        );
    }

    /// nodewarden's own rule: figures from less than `min_history` never lower a request. A pod
    /// requesting 500m, measured for two minutes at 100m, is not shrunk (VPA would resize it
    /// by drift once the pod is 12 h old, its upper bound being unbounded); a memory request
    /// below the lower bound is still raised, and the resize keeps the CPU request.
    #[test]
    fn every_leave_label_is_listed() {
        let all = [
            Leave::Mode,
            Leave::UpToDate,
            Leave::ResizeUnderway,
            Leave::TooYoung,
            Leave::SmallChange { diff: 0.0 },
            Leave::ShortHistory,
        ];
        let labels: Vec<&str> = all.iter().map(|l| l.label()).collect();
        assert_eq!(labels, Leave::LABELS);
    }

    #[test]
    fn a_short_history_only_raises() {
        let th = Thresholds::default();
        let with = |requests: (u64, u64), history: Option<Duration>| Facts {
            containers: vec![running("app", requests.0, requests.1)],
            bounds: BTreeMap::from([(
                "app".to_string(),
                Bounds {
                    lower: amounts(25, 250),
                    upper: amounts(4000, 8192),
                    history,
                },
            )]),
            age: Some(24 * HOUR),
            quick_oom: Vec::new(),
            resize: ResizeState::Idle,
        };
        let fresh = Some(Duration::from_secs(120));
        let sizing = vec![sized("app", 115, 300)];
        // drift down: VPA's rule (history unknown or long enough) resizes, a short one waits
        for (history, want) in [
            (None, "resize:drift"),
            (Some(25 * HOUR), "resize:drift"),
            (fresh, "leave:short-history"),
        ] {
            let got = decide(RunningPods::Resize, &sizing, &with((500, 300), history), &th);
            assert_eq!(label(&got), want, "{history:?}");
            let got = decide(RunningPods::Evict, &sizing, &with((500, 300), history), &th);
            assert_eq!(label(&got).replace("evict", "resize"), want, "{history:?}");
        }
        // above the upper bound: not with a short history
        let capped = Facts {
            bounds: BTreeMap::from([(
                "app".to_string(),
                Bounds {
                    lower: amounts(25, 250),
                    upper: amounts(200, 8192),
                    history: fresh,
                },
            )]),
            age: Some(HOUR),
            ..with((500, 300), fresh)
        };
        assert_eq!(
            label(&decide(RunningPods::Resize, &sizing, &capped, &th)),
            "leave:too-young"
        );
        // a memory request below the lower bound is raised; the CPU request is kept, not lowered
        let got = decide(RunningPods::Resize, &sizing, &with((500, 16), fresh), &th);
        let Action::Resize { containers, why } = got else {
            panic!("{got:?}")
        };
        assert_eq!(why.label(), "outside-bounds");
        assert_eq!(containers, vec![sized("app", 500, 300)]);
        // with a history long enough the same resize also lowers the CPU request
        let got = decide(
            RunningPods::Resize,
            &sizing,
            &with((500, 16), Some(25 * HOUR)),
            &th,
        );
        assert!(
            matches!(got, Action::Resize { ref containers, .. } if containers == &sizing),
            "{got:?}"
        );
        // Recreate evicts for the raise (the new pod gets the webhook's figures in full)
        let got = decide(RunningPods::Evict, &sizing, &with((500, 16), fresh), &th);
        assert_eq!(label(&got), "evict:outside-bounds");
        // a limit set by the decision is kept with the request it belongs to
        let mut limited = sized("app", 115, 300);
        limited.limits = amounts(230, 600);
        let mut pod = with((500, 16), fresh);
        pod.containers[0].limits = amounts(1000, 32);
        let Action::Resize { containers, .. } = decide(RunningPods::Resize, &[limited], &pod, &th) else {
            panic!("a resize")
        };
        assert_eq!(containers[0].requests, amounts(500, 300));
        assert_eq!(containers[0].limits, amounts(1000, 600));
    }

    /// A native sidecar (an init container that runs as long as the pod) follows the same rule:
    /// with a short history its memory is raised and its CPU request is not lowered, beside a
    /// container whose history is long enough and is lowered.
    #[test]
    fn a_sidecar_with_a_short_history_is_only_raised() {
        let th = Thresholds::default();
        let bounds = |history: u64| Bounds {
            lower: amounts(25, 250),
            upper: amounts(4000, 8192),
            history: Some(Duration::from_secs(history)),
        };
        let facts = Facts {
            containers: vec![running("app", 500, 300), running("proxy", 500, 16)],
            bounds: BTreeMap::from([
                ("app".to_string(), bounds(25 * 3600)),
                ("proxy".to_string(), bounds(120)),
            ]),
            age: Some(24 * HOUR),
            quick_oom: Vec::new(),
            resize: ResizeState::Idle,
        };
        let mut proxy = sized("proxy", 115, 300);
        proxy.sidecar = true;
        let sizing = vec![sized("app", 115, 300), proxy.clone()];
        let Action::Resize { containers, why } = decide(RunningPods::Resize, &sizing, &facts, &th) else {
            panic!("a resize")
        };
        assert_eq!(why.label(), "outside-bounds");
        let mut kept = proxy;
        kept.requests = amounts(500, 300);
        assert_eq!(containers, vec![sized("app", 115, 300), kept]);
    }
}
