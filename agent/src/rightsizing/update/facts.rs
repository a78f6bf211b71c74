//! What the updater reads and writes for one pod: this node's figures for its autoscaler, the
//! facts [`decide`](nodewarden_api::domain::update::decide) judges, the `pods/resize` body and
//! the words of its Events.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use nodewarden_api::domain::sizing::{Amounts, ContainerSizing, Targets};
use nodewarden_api::domain::update::{Bounds, Current, Facts, ResizeState, Thresholds};
use nodewarden_api::quantity::format_amount;
use nodewarden_api::rightsizing::{ContainerRecommendation, NodeRecommendationSpec, ResourceName};
use serde_json::{Value, json};

use crate::rightsizing::pods::{NodePod, NodePodStatus};

/// This node's targets and bounds for one autoscaler's containers.
pub fn node_figures(
    spec: &NodeRecommendationSpec,
    ns: &str,
    autoscaler: &str,
) -> (Targets, BTreeMap<String, Bounds>) {
    let mut targets = Targets::new();
    let mut bounds = BTreeMap::new();
    for r in &spec.recommendations {
        if r.autoscaler.namespace != ns || r.autoscaler.name != autoscaler {
            continue;
        }
        let target = Amounts::from_list(r.target.as_ref());
        if target.is_empty() {
            continue;
        }
        targets.insert(r.container_name.clone(), target);
        bounds.insert(
            r.container_name.clone(),
            Bounds {
                lower: Amounts::from_list(r.lower_bound.as_ref()),
                upper: Amounts::from_list(r.upper_bound.as_ref()),
                history: history(r),
            },
        );
    }
    (targets, bounds)
}

/// The CPU history behind a recommendation, first to last sample (`None` when it says neither).
fn history(r: &ContainerRecommendation) -> Option<Duration> {
    let (first, last) = (r.first_sample_time.as_ref()?, r.last_sample_time.as_ref()?);
    let ms = last.0.as_millisecond().saturating_sub(first.0.as_millisecond());
    Some(Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
}

fn since(t: Option<&Time>) -> Option<Duration> {
    let t = t?;
    let ms = Timestamp::now()
        .as_millisecond()
        .saturating_sub(t.0.as_millisecond());
    u64::try_from(ms).ok().map(Duration::from_millis)
}

/// The facts [`decide`] needs, read from the pod.
pub fn facts(pod: &NodePod, bounds: BTreeMap<String, Bounds>, th: &Thresholds) -> Facts {
    let containers = pod
        .spec
        .as_ref()
        .map(|s| {
            s.sized()
                .map(|c| Current {
                    name: c.name.clone(),
                    requests: Amounts::from_list(c.resources.as_ref().and_then(|r| r.requests.as_ref())),
                    limits: Amounts::from_list(c.resources.as_ref().and_then(|r| r.limits.as_ref())),
                })
                .collect()
        })
        .unwrap_or_default();
    let status = pod.status.as_ref();
    let quick_oom = status
        .map(NodePodStatus::all)
        .unwrap_or_default()
        .into_iter()
        .filter(|c| {
            c.last_state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .is_some_and(|t| {
                    t.reason.as_deref() == Some("OOMKilled")
                        && match (t.started_at.as_ref(), t.finished_at.as_ref()) {
                            (Some(start), Some(end)) => {
                                let ran = end.0.as_millisecond().saturating_sub(start.0.as_millisecond());
                                u128::try_from(ran).is_ok_and(|ran| ran < th.oom_window.as_millis())
                            }
                            _ => false,
                        }
                })
        })
        .map(|c| c.name.clone())
        .collect();
    let conditions = status.and_then(|s| s.conditions.as_deref()).unwrap_or_default();
    let condition = |t: &str| conditions.iter().find(|c| c.type_ == t && c.status == "True");
    let resize = if let Some(pending) = condition("PodResizePending") {
        let message = pending.message.clone().unwrap_or_default();
        if pending.reason.as_deref() == Some("Infeasible") {
            ResizeState::Infeasible { message }
        } else {
            ResizeState::Deferred {
                message,
                for_: since(pending.last_transition_time.as_ref()).unwrap_or_default(),
            }
        }
    } else if let Some(progress) = condition("PodResizeInProgress") {
        ResizeState::InProgress {
            for_: since(progress.last_transition_time.as_ref()).unwrap_or_default(),
        }
    } else {
        ResizeState::Idle
    };
    Facts {
        containers,
        bounds,
        age: since(status.and_then(|s| s.start_time.as_ref())),
        quick_oom,
        resize,
    }
}

/// The strategic-merge patch of `pods/resize` for these containers (merged by name): the
/// sidecars under `initContainers` (the API server takes their resources there from 1.33 on).
pub fn resize_body(containers: &[ContainerSizing]) -> Value {
    let item = |c: &ContainerSizing| {
        let mut resources = serde_json::Map::new();
        for (key, amounts) in [("requests", c.requests), ("limits", c.limits)] {
            let mut map = serde_json::Map::new();
            for r in [ResourceName::Cpu, ResourceName::Memory] {
                if let Some(v) = amounts.get(r) {
                    map.insert(r.as_str().to_string(), Value::String(format_amount(r, v)));
                }
            }
            if !map.is_empty() {
                resources.insert(key.to_string(), Value::Object(map));
            }
        }
        json!({"name": c.name, "resources": resources})
    };
    let list = |sidecar: bool| -> Vec<Value> {
        containers
            .iter()
            .filter(|c| c.sidecar == sidecar)
            .map(item)
            .collect()
    };
    let mut spec = serde_json::Map::new();
    for (key, sidecar) in [("containers", false), ("initContainers", true)] {
        let items = list(sidecar);
        if !items.is_empty() {
            spec.insert(key.to_string(), Value::Array(items));
        }
    }
    json!({ "spec": spec })
}

/// `app: cpu 250m/500m, memory 300Mi` (request/limit).
pub fn describe(containers: &[ContainerSizing]) -> String {
    containers
        .iter()
        .map(|c| {
            let parts: Vec<String> = [ResourceName::Cpu, ResourceName::Memory]
                .into_iter()
                .filter_map(|r| {
                    let request = c.requests.get(r)?;
                    let mut text = format!("{} {}", r.as_str(), format_amount(r, request));
                    if let Some(limit) = c.limits.get(r) {
                        text.push_str(&format!("/{}", format_amount(r, limit)));
                    }
                    Some(text)
                })
                .collect();
            format!("{}: {}", c.name, parts.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resize_body_names_containers_and_canonical_quantities() {
        let body = resize_body(&[ContainerSizing {
            name: "app".into(),
            sidecar: false,
            requests: Amounts {
                cpu: Some(250),
                memory: Some(300 << 20),
            },
            limits: Amounts {
                cpu: Some(500),
                memory: None,
            },
        }]);
        assert_eq!(
            body,
            json!({"spec": {"containers": [{"name": "app", "resources": {
                "requests": {"cpu": "250m", "memory": "300Mi"}, "limits": {"cpu": "500m"}}}]}})
        );
    }

    #[test]
    fn a_resize_carries_sidecars_under_init_containers() {
        let sized = |name: &str, sidecar: bool, cpu: u64| ContainerSizing {
            name: name.into(),
            sidecar,
            requests: Amounts {
                cpu: Some(cpu),
                memory: None,
            },
            limits: Amounts::default(),
        };
        assert_eq!(
            resize_body(&[sized("app", false, 250), sized("log", true, 40)]),
            json!({"spec": {
                "containers": [{"name": "app", "resources": {"requests": {"cpu": "250m"}}}],
                "initContainers": [{"name": "log", "resources": {"requests": {"cpu": "40m"}}}]
            }})
        );
        assert_eq!(
            resize_body(&[sized("log", true, 40)]),
            json!({"spec": {"initContainers": [{"name": "log", "resources": {"requests": {"cpu": "40m"}}}]}}),
            "a sidecar alone: no empty containers list"
        );
    }

    #[test]
    fn facts_count_sidecars_as_containers() {
        let pod: NodePod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {
                "initContainers": [
                    {"name": "setup", "resources": {"requests": {"cpu": "1"}}},
                    {"name": "log", "restartPolicy": "Always", "resources": {"requests": {"cpu": "50m"}}}
                ],
                "containers": [{"name": "app", "resources": {"requests": {"cpu": "100m"}}}]
            },
            "status": {
                "phase": "Running",
                "initContainerStatuses": [{"name": "log", "lastState": {"terminated": {
                    "reason": "OOMKilled", "startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:01:00Z"}}}]
            }
        }))
        .expect("pod");
        let f = facts(&pod, BTreeMap::new(), &Thresholds::default());
        let names: Vec<(&str, Option<u64>)> = f
            .containers
            .iter()
            .map(|c| (c.name.as_str(), c.requests.cpu))
            .collect();
        assert_eq!(names, [("app", Some(100)), ("log", Some(50))]);
        assert_eq!(f.quick_oom, ["log"]);
    }

    #[test]
    fn facts_read_resize_conditions_and_quick_ooms() {
        let pod: NodePod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "app", "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "200m"}}}]},
            "status": {
                "phase": "Running",
                "startTime": "2026-01-01T00:00:00Z",
                "conditions": [{"type": "PodResizePending", "status": "True", "reason": "Infeasible", "message": "no room"}],
                "containerStatuses": [{"name": "app", "lastState": {"terminated": {
                    "reason": "OOMKilled", "startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:01:00Z"}}}]
            }
        }))
        .expect("pod");
        let f = facts(&pod, BTreeMap::new(), &Thresholds::default());
        assert_eq!(
            f.resize,
            ResizeState::Infeasible {
                message: "no room".into()
            }
        );
        assert_eq!(f.quick_oom, vec!["app".to_string()]);
        assert_eq!(f.containers[0].limits.cpu, Some(200));
        assert!(f.age.is_some_and(|a| a > Duration::from_secs(3600)));
    }
}
