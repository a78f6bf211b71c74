//! The Feature lifecycle's decision (KEP-3920): [`step`] is a pure function of (Feature, node
//! reports, the outcome of the last action, now) that returns the new status and the action to
//! run next. The controller (`super::controller`) is the I/O shell around it.
//!
//! Transitions: when the desired state differs from where the Feature is (or is going), the
//! Feature enters `TurningOff` / `TurningOn`, `status.transitionTime` is now, and its tasks are
//! listed in order:
//! 1. `WaitForReports`: every node that has a `NodeFeatureReport` must have a fresh one (its
//!    components observed at or after the transition time) that shows the new value of the gate
//!    in every listed component. Nodes without any report are not waited for; a listed
//!    component missing from a node's report, or reporting an error, is waited for; one whose
//!    serving certificate the agent could not verify (`errorReason: CertificateNotVerified`) is
//!    named apart in the task's message, with the settings that fix it. A gate a
//!    component does not report counts as off. Times have whole seconds, so a component must
//!    have been observed in a later second than the one the transition started in.
//! 2. `ClearField <resource>/<path>` (turning off, per `Clear` field): the field is removed from
//!    every stored object that has it, one page of a list at a time; the continue token is kept
//!    in `task.progress`, so a restarted controller resumes there.
//! 3. `WaitForAbsence <resource>` (turning off, per `waitForAbsence`): no object of it is left.
//!
//! Tasks run one at a time, in order; a done task stays in the list (state `Done`) until the
//! next transition. The last one done → the final state. A new Feature (no status yet) starts
//! in the transitional state of its desired value, so it is only called `On` or `Off` once the
//! reports say so; in that first step reports of any age count, so a Feature that matches the
//! cluster is settled at once (adopted: no `transitionTime`, and reports of any age keep
//! counting until its first real transition).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use nodewarden_api::features::{
    ComponentUses, DesiredState, Feature, FeatureState, FeatureStatus, NodeFeatureReport, OnDisable,
    OwnedField, ReadFailure, ResourceRef, Task, TaskState,
};

/// Name of the task that waits for node reports.
pub const WAIT_FOR_REPORTS: &str = "WaitForReports";
/// Condition: the Feature is in the final state its spec asks for.
pub const CONDITION_SETTLED: &str = "Settled";

/// The name of the `ClearField` task of `field`.
pub fn clear_task_name(field: &OwnedField) -> String {
    format!(
        "ClearField {}/{}",
        resource_name(&field.group, &field.resource),
        field.path
    )
}

/// The name of the `WaitForAbsence` task of `resource`.
pub fn absence_task_name(resource: &ResourceRef) -> String {
    format!(
        "WaitForAbsence {}",
        resource_name(&resource.group, &resource.resource)
    )
}

fn resource_name(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

/// What the shell should do next for a Feature.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// List one page of `field`'s resource from `continue_token` and remove the field from
    /// every object of the page that has it.
    ClearPage {
        /// The task's name.
        task: String,
        /// The field to remove.
        field: OwnedField,
        /// Where to resume listing; `None` for the first page.
        continue_token: Option<String>,
    },
    /// Count the objects of `resource`.
    CountObjects {
        /// The task's name.
        task: String,
        /// The resource whose objects are counted.
        resource: ResourceRef,
    },
}

/// What came of the last action.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A page was done; `next` is its continue token (`None`: it was the last page).
    Cleared {
        /// The task's name.
        task: String,
        /// The continue token of the next page; `None` after the last page.
        next: Option<String>,
        /// How many objects of the page had the field removed.
        cleared: usize,
    },
    /// The continue token had expired: start over.
    Expired {
        /// The task's name.
        task: String,
    },
    /// So many objects of the resource are left.
    Remaining {
        /// The task's name.
        task: String,
        /// How many objects are left.
        count: usize,
    },
    /// The action failed; it is retried.
    Failed {
        /// The task's name.
        task: String,
        /// Why it failed.
        message: String,
    },
}

impl Outcome {
    fn task(&self) -> &str {
        match self {
            Outcome::Cleared { task, .. }
            | Outcome::Expired { task }
            | Outcome::Remaining { task, .. }
            | Outcome::Failed { task, .. } => task,
        }
    }
}

/// The gate name of a Feature.
pub fn gate_of(feature: &Feature) -> String {
    feature
        .spec
        .gate
        .clone()
        .filter(|g| !g.is_empty())
        .unwrap_or_else(|| feature.name_any())
}

/// What one node says about the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NodeSays {
    Enabled,
    Disabled,
    /// Observed before the transition, missing, or unreadable.
    Stale,
    /// Unreadable because the agent could not verify the component's serving certificate.
    Unverified,
}

/// Per component, per node: what the node's report says about the gate.
/// Per component (in the order the spec lists them), per node: what the node's report says.
type Read = Vec<(String, BTreeMap<String, NodeSays>)>;

fn read_reports(feature: &Feature, reports: &[Arc<NodeFeatureReport>], since: Option<&Time>) -> Read {
    let gate = gate_of(feature);
    let listed: Vec<String> = if feature.spec.components.is_empty() {
        // no components listed: every component that reports the gate
        let mut seen: Vec<String> = reports
            .iter()
            .flat_map(|r| r.spec.components.iter())
            .filter(|c| c.gates.iter().any(|g| g.name == gate))
            .map(|c| c.name.clone())
            .collect();
        seen.sort();
        seen.dedup();
        seen
    } else {
        feature.spec.components.clone()
    };
    let mut out: Read = Vec::new();
    for component in &listed {
        let mut per_node = BTreeMap::new();
        for report in reports {
            let says = match report.spec.components.iter().find(|c| &c.name == component) {
                None => NodeSays::Stale,
                Some(c) if c.error.is_some() && c.gates.is_empty() => {
                    if c.error_reason == Some(ReadFailure::CertificateNotVerified) {
                        NodeSays::Unverified
                    } else {
                        NodeSays::Stale
                    }
                }
                Some(c) => {
                    let fresh = match (since, &c.observed_time) {
                        (None, _) => true,
                        (Some(_), None) => false,
                        // strictly after: times have whole seconds in the API, so a report
                        // from the second the transition started may predate it
                        (Some(since), Some(seen)) => seen.0 > since.0,
                    };
                    if !fresh {
                        NodeSays::Stale
                    } else if c.gates.iter().any(|g| g.name == gate && g.enabled) {
                        NodeSays::Enabled
                    } else {
                        NodeSays::Disabled
                    }
                }
            };
            per_node.insert(report.name_any(), says);
        }
        out.push((component.clone(), per_node));
    }
    out
}

fn uses_of(read: &Read) -> Vec<ComponentUses> {
    read.iter()
        .map(|(component, nodes)| {
            let count =
                |s: NodeSays| i32::try_from(nodes.values().filter(|n| **n == s).count()).unwrap_or(i32::MAX);
            ComponentUses {
                component: component.clone(),
                enabled: count(NodeSays::Enabled),
                disabled: count(NodeSays::Disabled),
                stale: count(NodeSays::Stale).saturating_add(count(NodeSays::Unverified)),
            }
        })
        .collect()
}

/// One line for `kubectl get features`: per component, how many nodes report the value the
/// Feature is heading for, e.g. `kubelet 2/3 off (1 stale), kube-proxy 3/3 off`.
pub fn uses_summary(uses: &[ComponentUses], desired: DesiredState) -> String {
    if uses.is_empty() {
        return "no reports".to_string();
    }
    uses.iter()
        .map(|u| {
            let total = u.enabled + u.disabled + u.stale;
            let (n, word) = match desired {
                DesiredState::On => (u.enabled, "on"),
                DesiredState::Off => (u.disabled, "off"),
            };
            if u.stale > 0 {
                format!("{} {n}/{total} {word} ({} stale)", u.component, u.stale)
            } else {
                format!("{} {n}/{total} {word}", u.component)
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The tasks of a transition to `target`, in order.
pub fn tasks_for(feature: &Feature, target: DesiredState) -> Vec<Task> {
    let task = |name: String| Task {
        name,
        state: TaskState::Pending,
        message: None,
        progress: None,
    };
    let mut tasks = vec![task(WAIT_FOR_REPORTS.to_string())];
    if target == DesiredState::Off {
        for field in &feature.spec.fields {
            if field.on_disable == OnDisable::Clear {
                tasks.push(task(clear_task_name(field)));
            }
        }
        for resource in &feature.spec.wait_for_absence {
            tasks.push(task(absence_task_name(resource)));
        }
    }
    tasks
}

fn heading_for(state: FeatureState) -> DesiredState {
    match state {
        FeatureState::On | FeatureState::TurningOn => DesiredState::On,
        FeatureState::Off | FeatureState::TurningOff => DesiredState::Off,
    }
}

fn set_condition(conditions: &mut Vec<Condition>, mut new: Condition) {
    if let Some(old) = conditions.iter_mut().find(|c| c.type_ == new.type_) {
        if old.status == new.status {
            new.last_transition_time = old.last_transition_time.clone();
        }
        *old = new;
    } else {
        conditions.push(new);
    }
}

/// Most nodes a message names; the rest are counted.
const NAMED_NODES: usize = 5;

/// `a, b, c` or, past [`NAMED_NODES`], `a, b, c, d, e and 3 more`.
fn named(names: Vec<String>) -> String {
    let total = names.len();
    let shown: Vec<String> = names.into_iter().take(NAMED_NODES).collect();
    if total > NAMED_NODES {
        format!("{} and {} more", shown.join(", "), total - NAMED_NODES)
    } else {
        shown.join(", ")
    }
}

/// What to set so the agent can verify `component`'s serving certificate.
fn verification_hint(component: &str) -> String {
    if component == "kubelet" {
        "give the agent the CA that signs the kubelets' serving certificates (chart value \
         agent.kubelet.caFile, mounted with agent.extraVolumes), or point \
         agent.kubelet.servingCertificate.hostPath at the kubelets' certificate folder where they \
         sign their own, or set serverTLSBootstrap: true in \
         the kubelet configuration and approve the kubelet-serving CSRs, or turn verification off \
         with agent.kubelet.insecureSkipVerify=true"
            .to_string()
    } else {
        format!("give the agent the CA that signs the {component} serving certificate")
    }
}

/// Checks the `WaitForReports` task: `None` when done, else what it waits for. Nodes whose
/// component could not be verified are named apart, with what to set.
fn waiting_for_reports(read: &Read, target: DesiredState) -> Option<String> {
    let want = match target {
        DesiredState::On => NodeSays::Enabled,
        DesiredState::Off => NodeSays::Disabled,
    };
    let mut behind = Vec::new();
    let mut unverified: Vec<(String, Vec<String>)> = Vec::new();
    for (component, nodes) in read {
        let mut cannot_verify = Vec::new();
        for (node, says) in nodes {
            if *says != want {
                let what = match says {
                    NodeSays::Unverified => {
                        cannot_verify.push(node.clone());
                        continue;
                    }
                    NodeSays::Stale => "no fresh report",
                    NodeSays::Enabled => "reports on",
                    NodeSays::Disabled => "reports off",
                };
                behind.push(format!("{node} ({component} {what})"));
            }
        }
        if !cannot_verify.is_empty() {
            unverified.push((component.clone(), cannot_verify));
        }
    }
    let mut parts: Vec<String> = unverified
        .into_iter()
        .map(|(component, nodes)| {
            format!(
                "the {component} serving certificate of {} node(s) cannot be verified: {}; {}",
                nodes.len(),
                named(nodes),
                verification_hint(&component)
            )
        })
        .collect();
    if !behind.is_empty() {
        let total = behind.len();
        let mut shown: Vec<String> = behind.into_iter().take(5).collect();
        if total > 5 {
            shown.push(format!("{} more", total - 5));
        }
        parts.push(format!("waiting for {}", shown.join(", ")));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// One decision for a Feature: the status it should have and the action to run next.
///
/// `outcome` is what came of the action the previous call asked for (if any); an outcome for
/// another task than the current one is ignored.
pub fn step(
    feature: &Feature,
    reports: &[Arc<NodeFeatureReport>],
    outcome: Option<&Outcome>,
    now: Timestamp,
) -> (FeatureStatus, Option<Action>) {
    let mut status = feature.status.clone().unwrap_or_default();
    let desired = feature.spec.desired;
    // the API keeps whole seconds; keep the same here so a step sees what a re-read would
    let now_time = Time(Timestamp::from_second(now.as_second()).unwrap_or(now));

    // a Feature the controller has never looked at describes the present: reports of any age
    // count in this first step (there is no earlier value for them to predate)
    let first = status.state.is_none();
    // start a transition when the Feature is not on its way to the desired value
    let heading = status.state.map(heading_for);
    if heading != Some(desired) {
        status.state = Some(match desired {
            DesiredState::On => FeatureState::TurningOn,
            DesiredState::Off => FeatureState::TurningOff,
        });
        status.transition_time = Some(now_time.clone());
        status.tasks = tasks_for(feature, desired);
    }
    let state = status.state.unwrap_or(FeatureState::TurningOn);
    let transitioning = matches!(state, FeatureState::TurningOn | FeatureState::TurningOff);

    let since = if first {
        None
    } else {
        status.transition_time.as_ref()
    };
    let read = read_reports(feature, reports, since);
    status.uses = uses_of(&read);
    status.uses_summary = Some(uses_summary(&status.uses, desired));
    status.observed_generation = feature.metadata.generation;

    let mut action = None;
    if transitioning {
        for i in 0..status.tasks.len() {
            if status.tasks[i].state == TaskState::Done {
                continue;
            }
            let name = status.tasks[i].name.clone();
            let mine = outcome.filter(|o| o.task() == name);
            let task = &mut status.tasks[i];
            if name == WAIT_FOR_REPORTS {
                match waiting_for_reports(&read, desired) {
                    None => {
                        task.state = TaskState::Done;
                        let nodes = read.iter().map(|(_, n)| n.len()).max().unwrap_or(0);
                        task.message = Some(if nodes == 0 {
                            "no node reports the gate".to_string()
                        } else {
                            format!(
                                "{nodes} nodes report {}",
                                if desired == DesiredState::On { "on" } else { "off" }
                            )
                        });
                        continue;
                    }
                    Some(message) => {
                        task.state = TaskState::Running;
                        task.message = Some(message);
                        break;
                    }
                }
            } else if let Some(field) = feature.spec.fields.iter().find(|f| clear_task_name(f) == name) {
                task.state = TaskState::Running;
                match mine {
                    Some(Outcome::Cleared {
                        next: None, cleared, ..
                    }) => {
                        task.state = TaskState::Done;
                        task.progress = None;
                        task.message = Some(format!("last page done ({cleared} cleared in it)"));
                        continue;
                    }
                    Some(Outcome::Cleared {
                        next: Some(token),
                        cleared,
                        ..
                    }) => {
                        task.progress = Some(token.clone());
                        task.message = Some(format!("{cleared} cleared in the last page; continuing"));
                    }
                    Some(Outcome::Expired { .. }) => {
                        task.progress = None;
                        task.message = Some("the list continue token expired; starting over".to_string());
                    }
                    Some(Outcome::Failed { message, .. }) => task.message = Some(message.clone()),
                    _ => {}
                }
                action = Some(Action::ClearPage {
                    task: name,
                    field: field.clone(),
                    continue_token: task.progress.clone(),
                });
                break;
            } else if let Some(resource) = feature
                .spec
                .wait_for_absence
                .iter()
                .find(|r| absence_task_name(r) == name)
            {
                task.state = TaskState::Running;
                match mine {
                    Some(Outcome::Remaining { count: 0, .. }) => {
                        task.state = TaskState::Done;
                        task.message = Some("none left".to_string());
                        continue;
                    }
                    Some(Outcome::Remaining { count, .. }) => {
                        task.message =
                            Some(format!("{count} objects left; delete them to finish turning off"))
                    }
                    Some(Outcome::Failed { message, .. }) => task.message = Some(message.clone()),
                    _ => {}
                }
                action = Some(Action::CountObjects {
                    task: name,
                    resource: resource.clone(),
                });
                break;
            } else {
                // the spec no longer owns what this task was about
                task.state = TaskState::Done;
                task.message = Some("no longer in the Feature's spec".to_string());
            }
        }
        if status.tasks.iter().all(|t| t.state == TaskState::Done) {
            status.state = Some(match desired {
                DesiredState::On => FeatureState::On,
                DesiredState::Off => FeatureState::Off,
            });
            action = None;
            if first {
                // adopted as it is, not a transition: every report keeps counting
                status.transition_time = None;
            }
        }
    }

    let final_state = status.state.unwrap_or(FeatureState::TurningOn);
    let settled = !matches!(final_state, FeatureState::TurningOn | FeatureState::TurningOff);
    let current = status.tasks.iter().find(|t| t.state != TaskState::Done);
    let condition = Condition {
        type_: CONDITION_SETTLED.to_string(),
        status: if settled { "True" } else { "False" }.to_string(),
        reason: final_state.as_str().to_string(),
        message: if settled {
            match status.transition_time.as_ref() {
                Some(t) => format!(
                    "{} since the transition that started at {}",
                    final_state.as_str(),
                    fmt_time(Some(t))
                ),
                None => format!(
                    "{}: the node reports matched when the Feature was created",
                    final_state.as_str()
                ),
            }
        } else {
            current
                .map(|t| format!("{}: {}", t.name, t.message.clone().unwrap_or_default()))
                .unwrap_or_default()
        },
        observed_generation: feature.metadata.generation,
        last_transition_time: now_time,
    };
    set_condition(&mut status.conditions, condition);
    (status, action)
}

fn fmt_time(t: Option<&Time>) -> String {
    t.map(|t| t.0.to_string())
        .unwrap_or_else(|| "an unknown time".to_string())
}

/// The Event of a transition into `state`: its reason (the state's name) and its note.
pub fn transition_event(
    before: Option<FeatureState>,
    state: FeatureState,
    desired: DesiredState,
) -> (&'static str, String) {
    let from = before.map_or("no state", FeatureState::as_str);
    let desired = match desired {
        DesiredState::On => "On",
        DesiredState::Off => "Off",
    };
    (
        state.as_str(),
        format!("{from} → {} (desired {desired})", state.as_str()),
    )
}
