//! The decision end to end: which figure each container takes, the caps, and the figures of
//! [`sizing_on`] against what the patch of [`mutate_on`] writes.

use super::facts::RESOURCES;
use super::*;
use crate::rightsizing::{ColdStart, DaemonSetAutoscaler};
use k8s_openapi::api::core::v1::{LimitRange, Pod};

#[test]
fn escapes_pointer_tokens() {
    let mut op = AddPatch::new();
    op.add_str(&["metadata", "annotations", "a~b/c"], "");
    let text = op.to_json();
    assert!(text.contains(r#""/metadata/annotations/a~0b~1c""#), "{text}");
}

fn cpu_targets(pairs: &[(&str, u64)]) -> Targets {
    pairs
        .iter()
        .map(|(c, m)| {
            (
                c.to_string(),
                Amounts {
                    cpu: Some(*m),
                    memory: None,
                },
            )
        })
        .collect()
}

/// An autoscaler of scope `scope`, cold start `cold`, grouped by `instance-type`, whose status
/// holds a fleet figure of 900m for `a` and group `big` at 700m for `a` (computed for
/// `status_label`).
fn grouped(scope: &str, cold: &str, status_label: &str) -> DaemonSetAutoscaler {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "nodewarden.io/v1alpha1", "kind": "DaemonSetAutoscaler",
        "metadata": {"name": "x", "namespace": "ns"},
        "spec": {"targetRef": {"kind": "DaemonSet", "name": "ds"}, "scope": scope,
                 "coldStart": cold, "nodeGroupLabel": "instance-type"},
        "status": {
            "fleet": [{"containerName": "a", "target": {"cpu": "900m"}}],
            "nodeGroupLabel": status_label,
            "groups": [{"value": "big", "nodes": 0,
                        "containers": [{"containerName": "a", "target": {"cpu": "700m"}}]}],
        }
    }))
    .expect("autoscaler")
}

/// Which figure container `a` and `b` take (their source and CPU request) for a node with
/// its own targets `own` and group `group`.
fn chosen(
    autoscaler: &DaemonSetAutoscaler,
    own: Option<Targets>,
    group: Option<&str>,
) -> Vec<(Source, Option<u64>)> {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"nodeName": "n1", "containers": [{"name": "a"}, {"name": "b"}]}
    }))
    .expect("pod");
    let status = status_figures(autoscaler);
    let figures = status.for_node(own.as_ref(), group);
    let decision = mutate(&pod, autoscaler, figures, &[]);
    let sizing = sizing_on(&pod, autoscaler, figures, &[]);
    decision
        .sources
        .iter()
        .map(|(c, s)| {
            let cpu = sizing.iter().find(|z| &z.name == c).and_then(|z| z.requests.cpu);
            (*s, cpu)
        })
        .collect()
}

#[test]
fn scope_node_group_takes_the_group_figure_then_the_node_own_then_the_cold_start() {
    let own = || Some(cpu_targets(&[("a", 300), ("b", 50)]));
    let a = grouped("NodeGroup", "Fleet", "instance-type");
    // a node of a known group: its group's figure, even with history of its own; `b` has no
    // group figure, so its own
    assert_eq!(
        chosen(&a, own(), Some("big")),
        vec![(Source::Group, Some(700)), (Source::Node, Some(50))]
    );
    // a node of an unknown group, or without the label: its own figures
    assert_eq!(
        chosen(&a, own(), Some("small")),
        vec![(Source::Node, Some(300)), (Source::Node, Some(50))]
    );
    // a new node of a known group
    assert_eq!(
        chosen(&a, None, Some("big")),
        vec![(Source::Group, Some(700)), (Source::ContainerNotMeasured, None)]
    );
    // a new node without a group: the cold-start choice
    assert_eq!(
        chosen(&a, None, None),
        vec![(Source::Fleet, Some(900)), (Source::NoFleetFigure, None)]
    );
    // groups computed for another label are not read
    let stale = grouped("NodeGroup", "Template", "zone");
    assert_eq!(
        chosen(&stale, None, Some("big")),
        vec![
            (Source::ColdStartTemplate, None),
            (Source::ColdStartTemplate, None)
        ]
    );
}

#[test]
fn cold_start_group_serves_new_nodes_only() {
    let a = grouped("Node", "Group", "instance-type");
    // history of its own wins
    assert_eq!(
        chosen(&a, Some(cpu_targets(&[("a", 300)])), Some("big")),
        vec![(Source::Node, Some(300)), (Source::ContainerNotMeasured, None)]
    );
    // a new node: its group's figure, else the fleet's, else the template
    assert_eq!(
        chosen(&a, None, Some("big")),
        vec![(Source::Group, Some(700)), (Source::NoFleetFigure, None)]
    );
    assert_eq!(
        chosen(&a, None, Some("small")),
        vec![(Source::Fleet, Some(900)), (Source::NoFleetFigure, None)]
    );
    // without groups in the spec, the group figure is never read
    let mut fleet_only = a.clone();
    fleet_only.spec.cold_start = ColdStart::Fleet;
    assert_eq!(
        chosen(&fleet_only, None, Some("big")),
        vec![(Source::Fleet, Some(900)), (Source::NoFleetFigure, None)]
    );
}

/// `sizing_on` gives the figures `mutate_on` writes: a pod sized by the patch has exactly
/// them (ratio kept, LimitRange max, per-container `Off`, `RequestsOnly` with a limit cap).
#[test]
fn a_pod_limit_range_as_tight_as_its_min_holds_exactly() {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"nodeName": "n1", "containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}
    }))
    .expect("pod");
    let autoscaler: DaemonSetAutoscaler = serde_json::from_value(serde_json::json!({
        "apiVersion": "nodewarden.io/v1alpha1", "kind": "DaemonSetAutoscaler",
        "metadata": {"name": "x", "namespace": "ns"},
        "spec": {"targetRef": {"kind": "DaemonSet", "name": "ds"}}
    }))
    .expect("autoscaler");
    let cpu = |m| Amounts {
        cpu: Some(m),
        memory: None,
    };
    let targets = Targets::from([
        ("a".to_string(), cpu(100)),
        ("b".to_string(), cpu(100)),
        ("c".to_string(), cpu(100)),
    ]);
    for (min, max) in [("1001m", "1001m"), ("100m", "200m")] {
        let limit_ranges: Vec<LimitRange> = vec![
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "lr", "namespace": "ns"},
                "spec": {"limits": [{"type": "Pod", "min": {"cpu": min}, "max": {"cpu": max}}]}
            }))
            .expect("limit range"),
        ];
        let sizing = sizing_on(
            &pod,
            &autoscaler,
            Figures {
                node: Some(&targets),
                ..Figures::default()
            },
            &limit_ranges,
        );
        let sum: u64 = sizing.iter().filter_map(|s| s.requests.cpu).sum();
        // rounding each container up would give 334m × 3 = 1002m, over the max
        let want = if min == "1001m" { 1001 } else { 200 };
        assert_eq!(sum, want, "{min}..{max}: {sizing:?}");
    }
}

#[test]
fn sizing_is_what_the_patch_writes() {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"nodeName": "n1", "containers": [
            {"name": "app", "resources": {"requests": {"cpu": "100m", "memory": "100Mi"},
                                           "limits": {"cpu": "200m", "memory": "200Mi"}}},
            {"name": "capped", "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "150m"}}},
            {"name": "off", "resources": {"requests": {"cpu": "100m"}}}
        ]}
    }))
    .expect("pod");
    let autoscaler: DaemonSetAutoscaler = serde_json::from_value(serde_json::json!({
        "apiVersion": "nodewarden.io/v1alpha1", "kind": "DaemonSetAutoscaler",
        "metadata": {"name": "a", "namespace": "ns"},
        "spec": {"targetRef": {"kind": "DaemonSet", "name": "ds"}, "resourcePolicy": {"containerPolicies": [
            {"containerName": "capped", "controlledValues": "RequestsOnly"},
            {"containerName": "off", "mode": "Off"}
        ]}}
    }))
    .expect("autoscaler");
    let limit_ranges: Vec<LimitRange> = vec![
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "lr", "namespace": "ns"},
            "spec": {"limits": [{"type": "Container", "max": {"memory": "500Mi"}}]}
        }))
        .expect("limit range"),
    ];
    let mi = 1u64 << 20;
    let targets = Targets::from([
        (
            "app".to_string(),
            Amounts {
                cpu: Some(300),
                memory: Some(300 * mi),
            },
        ),
        (
            "capped".to_string(),
            Amounts {
                cpu: Some(400),
                memory: None,
            },
        ),
        (
            "off".to_string(),
            Amounts {
                cpu: Some(400),
                memory: None,
            },
        ),
    ]);
    let sizing = sizing_on(
        &pod,
        &autoscaler,
        Figures {
            node: Some(&targets),
            ..Figures::default()
        },
        &limit_ranges,
    );
    let want = vec![
        ContainerSizing {
            name: "app".to_string(),
            sidecar: false,
            requests: Amounts {
                cpu: Some(300),
                memory: Some(300 * mi),
            },
            // ratio 2 kept for CPU; memory's 600Mi is over the LimitRange max
            limits: Amounts {
                cpu: Some(600),
                memory: Some(500 * mi),
            },
        },
        ContainerSizing {
            name: "capped".to_string(),
            sidecar: false,
            requests: Amounts {
                cpu: Some(150),
                memory: None,
            },
            limits: Amounts::default(),
        },
    ];
    assert_eq!(sizing, want);

    let decision = mutate_on(
        &PodFacts::of(&pod),
        &autoscaler,
        Ok("n1"),
        Figures {
            node: Some(&targets),
            ..Figures::default()
        },
        &limit_ranges,
    );
    let mut patched = serde_json::to_value(&pod).expect("json");
    json_patch::patch(&mut patched, &decision.patch.to_json_patch().expect("a patch"))
        .expect("patch applies");
    let patched: Pod = serde_json::from_value(patched).expect("pod");
    for s in &want {
        let spec = patched.spec.as_ref().expect("spec");
        let c = spec
            .containers
            .iter()
            .find(|c| c.name == s.name)
            .expect("container");
        let r = c.resources.as_ref().expect("resources");
        let (requests, limits) = (
            Amounts::from_list(r.requests.as_ref()),
            Amounts::from_list(r.limits.as_ref()),
        );
        for resource in RESOURCES {
            if let Some(v) = s.requests.get(resource) {
                assert_eq!(requests.get(resource), Some(v), "{} {resource:?} request", s.name);
            }
            if let Some(v) = s.limits.get(resource) {
                assert_eq!(limits.get(resource), Some(v), "{} {resource:?} limit", s.name);
            }
        }
    }
}

/// A DaemonSet pod with a container, a run-to-completion init container and native sidecars:
/// one with requests, one without `resources`, one under a policy `Off`, one under `maxAllowed`.
fn sidecar_pod() -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"nodeName": "n1",
            "initContainers": [
                {"name": "setup", "resources": {"requests": {"cpu": "500m"}}},
                {"name": "log", "restartPolicy": "Always",
                 "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "200m"}}},
                {"name": "bare", "restartPolicy": "Always"},
                {"name": "mesh", "restartPolicy": "Always", "resources": {"requests": {"cpu": "100m"}}},
                {"name": "big", "restartPolicy": "Always", "resources": {"requests": {"cpu": "100m"}}}
            ],
            "containers": [{"name": "app", "resources": {"requests": {"cpu": "100m"}}}]}
    }))
    .expect("pod")
}

fn sidecar_autoscaler() -> DaemonSetAutoscaler {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "nodewarden.io/v1alpha1", "kind": "DaemonSetAutoscaler",
        "metadata": {"name": "a", "namespace": "ns"},
        "spec": {"targetRef": {"kind": "DaemonSet", "name": "ds"}, "resourcePolicy": {"containerPolicies": [
            {"containerName": "mesh", "mode": "Off"},
            {"containerName": "big", "maxAllowed": {"cpu": "250m"}}
        ]}}
    }))
    .expect("autoscaler")
}

#[test]
fn sidecars_are_sized_as_containers_and_init_containers_are_left_alone() {
    let pod = sidecar_pod();
    let autoscaler = sidecar_autoscaler();
    let targets = cpu_targets(&[
        ("app", 300),
        ("setup", 50),
        ("log", 40),
        ("bare", 30),
        ("mesh", 20),
        ("big", 900),
    ]);
    let figures = Figures {
        node: Some(&targets),
        ..Figures::default()
    };
    let facts = PodFacts::of(&pod);
    let names: Vec<(&str, Option<usize>)> = facts
        .containers
        .iter()
        .map(|c| (c.name.as_str(), c.sidecar))
        .collect();
    assert_eq!(
        names,
        [
            ("app", None),
            ("log", Some(1)),
            ("bare", Some(2)),
            ("mesh", Some(3)),
            ("big", Some(4))
        ]
    );
    let decision = mutate_on(&facts, &autoscaler, Ok("n1"), figures, &[]);
    assert_eq!(decision.reason, Reason::Resized);
    let text = decision.patch.to_json();
    assert!(
        !text.contains("/spec/initContainers/0/"),
        "setup is not touched: {text}"
    );
    assert!(!text.contains("/spec/initContainers/3/"), "mesh is Off: {text}");
    let sources: Vec<(&str, Source)> = decision.sources.iter().map(|(c, s)| (c.as_str(), *s)).collect();
    assert_eq!(
        sources,
        [
            ("app", Source::Node),
            ("log", Source::Node),
            ("bare", Source::Node),
            ("mesh", Source::PolicyOff),
            ("big", Source::Node)
        ]
    );

    let mut patched = serde_json::to_value(&pod).expect("json");
    json_patch::patch(&mut patched, &decision.patch.to_json_patch().expect("a patch"))
        .expect("patch applies");
    let patched: Pod = serde_json::from_value(patched).expect("pod");
    let spec = patched.spec.as_ref().expect("spec");
    let init = spec.init_containers.as_ref().expect("init containers");
    let cpu = |c: &k8s_openapi::api::core::v1::Container| {
        let r = c.resources.as_ref();
        (
            Amounts::from_list(r.and_then(|r| r.requests.as_ref())).cpu,
            Amounts::from_list(r.and_then(|r| r.limits.as_ref())).cpu,
        )
    };
    assert_eq!(cpu(&spec.containers[0]), (Some(300), None), "app");
    assert_eq!(cpu(&init[0]), (Some(500), None), "setup: the template's");
    assert_eq!(
        cpu(&init[1]),
        (Some(40), Some(80)),
        "log: its node's, the limit ratio kept"
    );
    assert_eq!(
        cpu(&init[2]),
        (Some(30), None),
        "bare: its node's, resources created"
    );
    assert_eq!(cpu(&init[3]), (Some(100), None), "mesh: Off");
    assert_eq!(cpu(&init[4]), (Some(250), None), "big: maxAllowed");
    assert_eq!(init[1].restart_policy.as_deref(), Some("Always"));

    // the figures without a patch are the patch's, the sidecars marked
    let sizing = sizing_on(&pod, &autoscaler, figures, &[]);
    let sized: Vec<(&str, bool, Option<u64>)> = sizing
        .iter()
        .map(|c| (c.name.as_str(), c.sidecar, c.requests.cpu))
        .collect();
    assert_eq!(
        sized,
        [
            ("app", false, Some(300)),
            ("log", true, Some(40)),
            ("bare", true, Some(30)),
            ("big", true, Some(250))
        ]
    );

    // the webhook on its own output changes nothing
    let again = mutate_on(&PodFacts::of(&patched), &autoscaler, Ok("n1"), figures, &[]);
    assert_eq!(again.reason, Reason::Unchanged, "{}", again.patch.to_json());

    // the scheduler's request: the sidecars beside the containers (300 + 40 + 30 + 100 + 250),
    // more than setup's 500m with none started before it
    assert_eq!(effective_requests(spec).cpu, Some(720));
}

#[test]
fn the_effective_request_counts_sidecars_as_the_scheduler_does() {
    let spec =
        |init: serde_json::Value, overhead: serde_json::Value| -> k8s_openapi::api::core::v1::PodSpec {
            serde_json::from_value(serde_json::json!({
                "initContainers": init, "overhead": overhead,
                "containers": [{"name": "app", "resources": {"requests": {"cpu": "200m", "memory": "100Mi"}}}]
            }))
            .expect("spec")
        };
    let mi = 1u64 << 20;
    let side = |name: &str, cpu: &str| serde_json::json!({"name": name, "restartPolicy": "Always", "resources": {"requests": {"cpu": cpu}}});
    let init = |name: &str, cpu: &str| serde_json::json!({"name": name, "resources": {"requests": {"cpu": cpu, "memory": "300Mi"}}});
    // no init containers: the containers
    let plain = spec(serde_json::Value::Null, serde_json::Value::Null);
    assert_eq!(
        effective_requests(&plain),
        Amounts {
            cpu: Some(200),
            memory: Some(100 * mi)
        }
    );
    // sidecars add to the containers
    let s = spec(
        serde_json::json!([side("a", "100m"), side("b", "50m")]),
        serde_json::Value::Null,
    );
    assert_eq!(effective_requests(&s).cpu, Some(350));
    // an init container runs beside the sidecars started before it, not those after
    let s = spec(
        serde_json::json!([side("a", "100m"), init("setup", "500m"), side("b", "50m")]),
        serde_json::Value::Null,
    );
    assert_eq!(
        effective_requests(&s),
        Amounts {
            cpu: Some(600),
            memory: Some(300 * mi)
        }
    );
    let s = spec(
        serde_json::json!([init("setup", "500m"), side("a", "100m"), side("b", "50m")]),
        serde_json::Value::Null,
    );
    assert_eq!(effective_requests(&s).cpu, Some(500));
    // the pod's overhead on top
    let s = spec(
        serde_json::json!([side("a", "100m")]),
        serde_json::json!({"cpu": "10m"}),
    );
    assert_eq!(effective_requests(&s).cpu, Some(310));
}

#[test]
fn only_the_namespaces_own_limit_ranges_apply() {
    let lr = |ns: &str, name: &str| LimitRange {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(ns.to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    let all = vec![lr("logging", "a"), lr("other", "b"), lr("logging", "c")];
    let names = |v: Vec<LimitRange>| v.into_iter().filter_map(|l| l.metadata.name).collect::<Vec<_>>();
    assert_eq!(names(super::in_namespace("logging", &all)), ["a", "c"]);
    // the agent's watch holds them behind Arcs: the same answer
    let shared: Vec<std::sync::Arc<LimitRange>> = all.into_iter().map(std::sync::Arc::new).collect();
    assert_eq!(names(super::in_namespace("other", &shared)), ["b"]);
    assert!(super::in_namespace("none", &shared).is_empty());
}
