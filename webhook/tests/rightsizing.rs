//! Per-node right-sizing: a table of pods × policies × recommendations → the pod after applying
//! the webhook's JSON Patch (with the `json-patch` crate), then properties over the whole table
//! (applying twice changes nothing more; no field the pod had is removed), then the
//! `/mutate/pods` handler on the recorded DaemonSet pod review and the `/validate/autoscalers`
//! rules.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{LimitRange, Pod};
use nodewarden_api::domain::sizing::{
    self, ANNOTATION_AUTOSCALER, ANNOTATION_CAPPED, ANNOTATION_NODE, ANNOTATION_SKIPPED, ANNOTATION_SOURCE,
    ANNOTATION_UPDATES, Amounts, Reason, Targets,
};
use nodewarden_api::rightsizing::{
    AutoscalerRef, ContainerRecommendation, DaemonSetAutoscaler, NodeRecommendation, NodeRecommendationSpec,
};
use nodewarden_webhook::admission::{AdmissionRequest, AdmissionResponse, Handler, ReviewIn};
use nodewarden_webhook::rightsizing::{AutoscalerValidator, PodMutator, RightsizingCache};
use serde_json::{Value, json};

const FIXTURE: &str = include_str!("../../tests/fixtures/admission/daemonset-pod-create.json");
const NODE: &str = "webhook-b8hcd8g-node-1";
const NAMESPACE: &str = "webhook-b8hcd8g";

fn review() -> Value {
    serde_json::from_str(FIXTURE).expect("fixture")
}

/// The recorded pod: container `agent`, requests 100m/64Mi, limits 200m/128Mi, node in matchFields.
fn base_pod() -> Value {
    review()["request"]["object"].clone()
}

fn autoscaler(spec: Value) -> DaemonSetAutoscaler {
    let mut full = json!({"targetRef": {"kind": "DaemonSet", "name": "node-agent"}});
    if let (Some(full), Some(extra)) = (full.as_object_mut(), spec.as_object()) {
        for (k, v) in extra {
            full.insert(k.clone(), v.clone());
        }
    }
    serde_json::from_value(json!({
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "DaemonSetAutoscaler",
        "metadata": {"name": "node-agent", "namespace": NAMESPACE},
        "spec": full,
    }))
    .expect("autoscaler")
}

fn targets(entries: &[(&str, Option<&str>, Option<&str>)]) -> Targets {
    entries
        .iter()
        .map(|(c, cpu, mem)| {
            let q = |r, s: &Option<&str>| {
                s.map(|s| {
                    sizing::amount(
                        r,
                        &k8s_openapi::apimachinery::pkg::api::resource::Quantity(s.to_string()),
                    )
                    .expect("quantity")
                })
            };
            (
                c.to_string(),
                Amounts {
                    cpu: q(nodewarden_api::rightsizing::ResourceName::Cpu, cpu),
                    memory: q(nodewarden_api::rightsizing::ResourceName::Memory, mem),
                },
            )
        })
        .collect()
}

fn limit_range(limits: Value) -> LimitRange {
    serde_json::from_value(json!({
        "metadata": {"name": "lr", "namespace": NAMESPACE},
        "spec": {"limits": limits},
    }))
    .expect("limit range")
}

/// `pod` with a decision's patch applied.
fn apply(pod: &Value, patch: &sizing::AddPatch) -> Value {
    let ops = patch
        .to_json_patch()
        .unwrap_or_else(|e| panic!("not a JSON patch: {e}\npatch: {}", patch.to_json()));
    apply_ops(pod, &ops)
}

/// `pod` with `patch` applied.
fn apply_ops(pod: &Value, patch: &json_patch::Patch) -> Value {
    let mut out = pod.clone();
    json_patch::patch(&mut out, patch)
        .unwrap_or_else(|e| panic!("patch does not apply: {e}\npatch: {patch:?}"));
    out
}

fn with_resources(mut pod: Value, container: usize, resources: Option<Value>) -> Value {
    let c = &mut pod["spec"]["containers"][container];
    match resources {
        Some(r) => c["resources"] = r,
        None => {
            c.as_object_mut().expect("container").remove("resources");
        }
    }
    pod
}

fn with_sidecar(mut pod: Value, resources: Value) -> Value {
    let sidecar =
        json!({"name": "side/car~1", "image": "nodewarden-e2e/pause:never-pulled", "resources": resources});
    pod["spec"]["containers"]
        .as_array_mut()
        .expect("containers")
        .push(sidecar);
    pod
}

struct Case {
    name: &'static str,
    pod: Value,
    autoscaler: DaemonSetAutoscaler,
    node: Option<Targets>,
    fleet: Option<Targets>,
    limit_ranges: Vec<LimitRange>,
    /// Expected `resources` of each container after the patch (`null`: no resources field).
    want: Vec<Value>,
    reason: Reason,
    /// Annotations that must be present with these values.
    annotations: Vec<(&'static str, &'static str)>,
}

fn cases() -> Vec<Case> {
    let rec = |cpu: &str, mem: &str| Some(targets(&[("agent", Some(cpu), Some(mem))]));
    let fixture_resources =
        json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}});
    vec![
        Case {
            name: "node recommendation, proportional limits",
            pod: base_pod(),
            autoscaler: autoscaler(json!({})),
            node: rec("250m", "300Mi"),
            fleet: None,
            limit_ranges: vec![],
            want: vec![
                json!({"requests": {"cpu": "250m", "memory": "300Mi"}, "limits": {"cpu": "500m", "memory": "600Mi"}}),
            ],
            reason: Reason::Resized,
            annotations: vec![
                (ANNOTATION_AUTOSCALER, "node-agent"),
                (ANNOTATION_NODE, NODE),
                (ANNOTATION_SOURCE, "agent=node-recommendation"),
                (
                    ANNOTATION_UPDATES,
                    "agent: cpu request 250m limit 500m, memory request 300Mi limit 600Mi",
                ),
            ],
        },
        Case {
            name: "RequestsOnly keeps limits and caps the request at the limit",
            pod: base_pod(),
            autoscaler: autoscaler(json!({"resourcePolicy": {"containerPolicies": [
                {"containerName": "agent", "controlledValues": "RequestsOnly"}]}})),
            node: rec("250m", "100Mi"),
            fleet: None,
            limit_ranges: vec![],
            want: vec![
                json!({"requests": {"cpu": "200m", "memory": "100Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}}),
            ],
            reason: Reason::Resized,
            annotations: vec![(ANNOTATION_CAPPED, "agent: cpu limit (recommended 250m)")],
        },
        Case {
            name: "minAllowed and maxAllowed",
            pod: base_pod(),
            autoscaler: autoscaler(json!({"resourcePolicy": {"containerPolicies": [
                {"containerName": "*", "minAllowed": {"memory": "128Mi"}, "maxAllowed": {"cpu": "150m"}}]}})),
            node: rec("250m", "100Mi"),
            fleet: None,
            limit_ranges: vec![],
            want: vec![
                json!({"requests": {"cpu": "150m", "memory": "128Mi"}, "limits": {"cpu": "300m", "memory": "256Mi"}}),
            ],
            reason: Reason::Resized,
            annotations: vec![(
                ANNOTATION_CAPPED,
                "agent: cpu maxAllowed (recommended 250m), memory minAllowed (recommended 100Mi)",
            )],
        },
        Case {
            name: "ceiling Template: never above the template's requests",
            pod: base_pod(),
            autoscaler: autoscaler(json!({"ceiling": "Template"})),
            node: rec("250m", "32Mi"),
            fleet: None,
            limit_ranges: vec![],
            want: vec![
                json!({"requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "64Mi"}}),
            ],
            reason: Reason::Resized,
            annotations: vec![(
                ANNOTATION_CAPPED,
                "agent: cpu ceiling-template (recommended 250m)",
            )],
        },
        Case {
            name: "controlledResources: memory only",
            pod: base_pod(),
            autoscaler: autoscaler(json!({"resourcePolicy": {"containerPolicies": [
                {"containerName": "agent", "controlledResources": ["memory"]}]}})),
            node: rec("250m", "96Mi"),
            fleet: None,
            limit_ranges: vec![],
            want: vec![
                json!({"requests": {"cpu": "100m", "memory": "96Mi"}, "limits": {"cpu": "200m", "memory": "192Mi"}}),
            ],
            reason: Reason::Resized,
            annotations: vec![],
        },
        Case {
            name: "container policy Off: untouched",
            pod: base_pod(),
            autoscaler: autoscaler(json!({"resourcePolicy": {"containerPolicies": [
                {"containerName": "*", "maxAllowed": {"cpu": "1"}},
                {"containerName": "agent", "mode": "Off"}]}})),
            node: rec("250m", "300Mi"),
            fleet: None,
            limit_ranges: vec![],
            want: vec![fixture_resources.clone()],
            reason: Reason::Unchanged,
            annotations: vec![(ANNOTATION_SOURCE, "agent=policy-off")],
        },
        Case {
            name: "cold start Template: no node recommendation leaves the template",
            pod: base_pod(),
            autoscaler: autoscaler(json!({"coldStart": "Template"})),
            node: None,
            fleet: rec("400m", "200Mi"),
            limit_ranges: vec![],
            want: vec![fixture_resources.clone()],
            reason: Reason::Unchanged,
            annotations: vec![(ANNOTATION_SOURCE, "agent=cold-start-template")],
        },
        Case {
            name: "cold start Fleet: the fleet figure",
            pod: base_pod(),
            autoscaler: autoscaler(json!({"coldStart": "Fleet"})),
            node: None,
            fleet: rec("400m", "200Mi"),
            limit_ranges: vec![],
            want: vec![
                json!({"requests": {"cpu": "400m", "memory": "200Mi"}, "limits": {"cpu": "800m", "memory": "400Mi"}}),
            ],
            reason: Reason::Resized,
            annotations: vec![(ANNOTATION_SOURCE, "agent=fleet")],
        },
        Case {
            name: "cold start Fleet without any fleet figure yet: template",
            pod: base_pod(),
            autoscaler: autoscaler(json!({"coldStart": "Fleet"})),
            node: Some(targets(&[("other", Some("1"), None)])),
            fleet: None,
            limit_ranges: vec![],
            want: vec![fixture_resources.clone()],
            reason: Reason::Unchanged,
            annotations: vec![(ANNOTATION_SOURCE, "agent=container-not-in-node-recommendation")],
        },
        Case {
            name: "cold start Fleet, no node figures, no fleet figure yet: template",
            pod: base_pod(),
            autoscaler: autoscaler(json!({"coldStart": "Fleet"})),
            node: None,
            fleet: None,
            limit_ranges: vec![],
            want: vec![fixture_resources.clone()],
            reason: Reason::Unchanged,
            annotations: vec![(ANNOTATION_SOURCE, "agent=no-fleet-figure-yet")],
        },
        Case {
            name: "no resources at all: requests created, no limits",
            pod: with_resources(base_pod(), 0, None),
            autoscaler: autoscaler(json!({})),
            node: rec("250m", "300Mi"),
            fleet: None,
            limit_ranges: vec![],
            want: vec![json!({"requests": {"cpu": "250m", "memory": "300Mi"}})],
            reason: Reason::Resized,
            annotations: vec![],
        },
        Case {
            name: "empty resources object",
            pod: with_resources(base_pod(), 0, Some(json!({}))),
            autoscaler: autoscaler(json!({})),
            node: rec("1500m", "1Gi"),
            fleet: None,
            limit_ranges: vec![],
            want: vec![json!({"requests": {"cpu": "1500m", "memory": "1Gi"}})],
            reason: Reason::Resized,
            annotations: vec![],
        },
        Case {
            name: "only limits: limit follows the new request",
            pod: with_resources(base_pod(), 0, Some(json!({"limits": {"cpu": "200m"}}))),
            autoscaler: autoscaler(json!({})),
            node: rec("250m", "300Mi"),
            fleet: None,
            limit_ranges: vec![],
            want: vec![json!({"limits": {"cpu": "250m"}, "requests": {"cpu": "250m", "memory": "300Mi"}})],
            reason: Reason::Resized,
            annotations: vec![],
        },
        Case {
            name: "request equals limit: both follow",
            pod: with_resources(
                base_pod(),
                0,
                Some(
                    json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}}),
                ),
            ),
            autoscaler: autoscaler(json!({})),
            node: rec("2", "1Gi"),
            fleet: None,
            limit_ranges: vec![],
            want: vec![
                json!({"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi"}}),
            ],
            reason: Reason::Resized,
            annotations: vec![],
        },
        Case {
            name: "odd ratio: integer maths rounds the limit up",
            pod: with_resources(
                base_pod(),
                0,
                Some(json!({"requests": {"cpu": "300m"}, "limits": {"cpu": "1"}})),
            ),
            autoscaler: autoscaler(json!({})),
            node: Some(targets(&[("agent", Some("100m"), None)])),
            fleet: None,
            limit_ranges: vec![],
            want: vec![json!({"requests": {"cpu": "100m"}, "limits": {"cpu": "334m"}})],
            reason: Reason::Resized,
            annotations: vec![],
        },
        Case {
            name: "LimitRange container max and default limit",
            pod: with_resources(
                base_pod(),
                0,
                Some(json!({"requests": {"cpu": "100m", "memory": "64Mi"}})),
            ),
            autoscaler: autoscaler(json!({})),
            node: rec("500m", "128Mi"),
            fleet: None,
            limit_ranges: vec![limit_range(
                json!([{"type": "Container", "max": {"cpu": "300m"}, "default": {"memory": "512Mi"}}]),
            )],
            want: vec![json!({"requests": {"cpu": "300m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}})],
            reason: Reason::Resized,
            annotations: vec![(
                ANNOTATION_CAPPED,
                "agent: cpu limitrange-container-max (recommended 500m)",
            )],
        },
        Case {
            name: "LimitRange container min wins over maxAllowed",
            pod: base_pod(),
            autoscaler: autoscaler(json!({"resourcePolicy": {"containerPolicies": [
                {"containerName": "agent", "maxAllowed": {"cpu": "50m"}}]}})),
            node: Some(targets(&[("agent", Some("80m"), None)])),
            fleet: None,
            limit_ranges: vec![limit_range(json!([{"type": "Container", "min": {"cpu": "60m"}}]))],
            want: vec![
                json!({"requests": {"cpu": "60m", "memory": "64Mi"}, "limits": {"cpu": "120m", "memory": "128Mi"}}),
            ],
            reason: Reason::Resized,
            annotations: vec![],
        },
        Case {
            name: "LimitRange pod max shares what is left after the other containers",
            pod: with_sidecar(base_pod(), json!({"requests": {"cpu": "100m"}})),
            autoscaler: autoscaler(json!({})),
            node: Some(targets(&[("agent", Some("400m"), None)])),
            fleet: None,
            limit_ranges: vec![limit_range(json!([{"type": "Pod", "max": {"cpu": "300m"}}]))],
            want: vec![
                json!({"requests": {"cpu": "200m", "memory": "64Mi"}, "limits": {"cpu": "400m", "memory": "128Mi"}}),
                json!({"requests": {"cpu": "100m"}}),
            ],
            reason: Reason::Resized,
            annotations: vec![(
                ANNOTATION_SOURCE,
                "agent=node-recommendation, side/car~1=container-not-in-node-recommendation",
            )],
        },
        Case {
            name: "near the top of the range: the pod sum saturates, the scaled limit is capped",
            pod: with_sidecar(base_pod(), json!({"requests": {"memory": "8Ei"}})),
            autoscaler: autoscaler(json!({})),
            node: Some(targets(&[("agent", None, Some("8Ei"))])),
            fleet: None,
            limit_ranges: vec![limit_range(json!([{"type": "Pod", "max": {"memory": "15Ei"}}]))],
            want: vec![
                // 8Ei + 8Ei is beyond u64; the pod max leaves 7Ei; 7Ei × 2 is capped at 2^63 − 1
                json!({"requests": {"cpu": "100m", "memory": "7168Pi"}, "limits": {"cpu": "200m", "memory": "9223372036854775807"}}),
                json!({"requests": {"memory": "8Ei"}}),
            ],
            reason: Reason::Resized,
            annotations: vec![],
        },
        Case {
            name: "the largest quantities: a proportional limit never overflows nor drops below the request",
            pod: base_pod(),
            autoscaler: autoscaler(json!({})),
            node: Some(targets(&[("agent", Some("18446744073709551"), Some("15Ei"))])),
            fleet: None,
            limit_ranges: vec![],
            want: vec![
                json!({"requests": {"cpu": "18446744073709551", "memory": "15360Pi"}, "limits": {"cpu": "18446744073709551", "memory": "15360Pi"}}),
            ],
            reason: Reason::Resized,
            annotations: vec![],
        },
        Case {
            name: "two containers, named and wildcard policies, a name that needs pointer escaping",
            pod: with_sidecar(
                base_pod(),
                json!({"limits": {"memory": "1Gi"}, "requests": {"memory": "512Mi"}}),
            ),
            autoscaler: autoscaler(json!({"resourcePolicy": {"containerPolicies": [
                {"containerName": "*", "maxAllowed": {"memory": "256Mi"}},
                {"containerName": "agent", "maxAllowed": {"memory": "1Gi"}}]}})),
            node: Some(targets(&[
                ("agent", None, Some("300Mi")),
                ("side/car~1", None, Some("300Mi")),
            ])),
            fleet: None,
            limit_ranges: vec![],
            want: vec![
                json!({"requests": {"cpu": "100m", "memory": "300Mi"}, "limits": {"cpu": "200m", "memory": "600Mi"}}),
                json!({"requests": {"memory": "256Mi"}, "limits": {"memory": "512Mi"}}),
            ],
            reason: Reason::Resized,
            annotations: vec![],
        },
        Case {
            name: "spec.nodeName wins over matchFields",
            pod: {
                let mut p = base_pod();
                p["spec"]["nodeName"] = json!("bound-node");
                p
            },
            autoscaler: autoscaler(json!({})),
            node: rec("250m", "300Mi"),
            fleet: None,
            limit_ranges: vec![],
            want: vec![
                json!({"requests": {"cpu": "250m", "memory": "300Mi"}, "limits": {"cpu": "500m", "memory": "600Mi"}}),
            ],
            reason: Reason::Resized,
            annotations: vec![(ANNOTATION_NODE, "bound-node")],
        },
        Case {
            name: "no single node: unchanged, with the reason",
            pod: {
                let mut p = base_pod();
                p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
                    [0]["matchFields"][0]["values"] = json!(["a", "b"]);
                p
            },
            autoscaler: autoscaler(json!({})),
            node: rec("250m", "300Mi"),
            fleet: None,
            limit_ranges: vec![],
            want: vec![fixture_resources.clone()],
            reason: Reason::NoTargetNode,
            annotations: vec![(
                ANNOTATION_SKIPPED,
                "no single target node, resources left as the template says: the required node affinity does not name exactly one node (1 terms, nodes [\"a\", \"b\"])",
            )],
        },
        Case {
            name: "recommendation equal to the template: nothing but annotations",
            pod: base_pod(),
            autoscaler: autoscaler(json!({})),
            node: rec("100m", "64Mi"),
            fleet: None,
            limit_ranges: vec![],
            want: vec![fixture_resources.clone()],
            reason: Reason::Unchanged,
            annotations: vec![(
                ANNOTATION_UPDATES,
                "agent: cpu request 100m limit 200m, memory request 64Mi limit 128Mi",
            )],
        },
        Case {
            name: "existing annotations are kept",
            pod: {
                let mut p = base_pod();
                p["metadata"]["annotations"] = json!({"team": "observability"});
                p
            },
            autoscaler: autoscaler(json!({})),
            node: rec("250m", "300Mi"),
            fleet: None,
            limit_ranges: vec![],
            want: vec![
                json!({"requests": {"cpu": "250m", "memory": "300Mi"}, "limits": {"cpu": "500m", "memory": "600Mi"}}),
            ],
            reason: Reason::Resized,
            annotations: vec![("team", "observability")],
        },
    ]
}

fn decide(case: &Case, pod: &Value) -> sizing::Decision {
    let typed: Pod = serde_json::from_value(pod.clone()).expect("pod");
    sizing::mutate(
        &typed,
        &case.autoscaler,
        sizing::Figures {
            node: case.node.as_ref(),
            group: None,
            fleet: case.fleet.as_ref(),
        },
        &case.limit_ranges,
    )
}

#[test]
fn table_of_pods_policies_and_recommendations() {
    for case in cases() {
        let decision = decide(&case, &case.pod);
        assert_eq!(decision.reason, case.reason, "{}: reason", case.name);
        let out = apply(&case.pod, &decision.patch);
        for (i, want) in case.want.iter().enumerate() {
            let got = out["spec"]["containers"][i]
                .get("resources")
                .cloned()
                .unwrap_or(Value::Null);
            assert_eq!(&got, want, "{}: container {i} resources", case.name);
        }
        for (key, value) in &case.annotations {
            assert_eq!(
                out["metadata"]["annotations"][key].as_str(),
                Some(*value),
                "{}: annotation {key}; all: {}",
                case.name,
                out["metadata"]["annotations"]
            );
        }
    }
}

#[test]
fn applying_the_webhook_twice_gives_the_same_pod() {
    for case in cases() {
        let once = apply(&case.pod, &decide(&case, &case.pod).patch);
        let twice = apply(&once, &decide(&case, &once).patch);
        assert_eq!(once, twice, "{}: second application changed the pod", case.name);
    }
}

/// Every leaf path of `value`, as JSON Pointers.
fn leaves(value: &Value, prefix: String, out: &mut Vec<String>) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                leaves(
                    v,
                    format!("{prefix}/{}", k.replace('~', "~0").replace('/', "~1")),
                    out,
                );
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for (i, v) in items.iter().enumerate() {
                leaves(v, format!("{prefix}/{i}"), out);
            }
        }
        _ => out.push(prefix),
    }
}

#[test]
fn no_field_of_the_pod_is_removed_and_only_resources_and_annotations_change() {
    for case in cases() {
        let out = apply(&case.pod, &decide(&case, &case.pod).patch);
        let mut paths = Vec::new();
        leaves(&case.pod, String::new(), &mut paths);
        for path in paths {
            let before = case.pod.pointer(&path);
            let after = out.pointer(&path);
            assert!(after.is_some(), "{}: {path} was removed", case.name);
            let may_change = path.contains("/resources") || path.starts_with("/metadata/annotations");
            if !may_change {
                assert_eq!(before, after, "{}: {path} changed", case.name);
            }
        }
        // only spec.containers are touched
        assert_eq!(
            case.pod["spec"].get("initContainers"),
            out["spec"].get("initContainers")
        );
    }
}

#[test]
fn patch_uses_only_add_operations_with_escaped_pointers() {
    let case = cases()
        .into_iter()
        .find(|c| c.name.contains("escaping"))
        .expect("case");
    let decision = decide(&case, &case.pod);
    let text = serde_json::to_string(&decision.patch).expect("json");
    let ops: Vec<Value> = serde_json::from_str(&text).expect("ops");
    assert!(ops.iter().all(|op| op["op"] == "add"), "{text}");
    assert!(
        text.contains("/metadata/annotations/rightsizing.nodewarden.io~1source"),
        "{text}"
    );
    // the JSON patch addresses containers by index, so the escaped name is only in the annotation
    assert!(
        ops.iter()
            .any(|op| op["path"] == "/spec/containers/1/resources/requests/memory" && op["value"] == "256Mi"),
        "{text}"
    );
}

#[test]
fn update_mode_off_changes_nothing() {
    let a = autoscaler(json!({"updatePolicy": {"updateMode": "Off"}}));
    let pod: Pod = serde_json::from_value(base_pod()).expect("pod");
    let node = targets(&[("agent", Some("1"), Some("1Gi"))]);
    let decision = sizing::mutate(
        &pod,
        &a,
        sizing::Figures {
            node: Some(&node),
            ..Default::default()
        },
        &[],
    );
    assert_eq!(decision.reason, Reason::UpdateModeOff);
    // only the annotations that say why: no resource is touched
    let ops = serde_json::to_value(&decision.patch).expect("json");
    assert!(
        ops.as_array().expect("ops").iter().all(|op| op["path"]
            .as_str()
            .is_some_and(|p| p.starts_with("/metadata/annotations"))),
        "{ops}"
    );
    assert_eq!(
        decision
            .annotations
            .get(sizing::ANNOTATION_SKIPPED)
            .map(String::as_str),
        Some("updateMode Off: the autoscaler only recommends; resources left as the template says")
    );
}

#[test]
fn target_node_follows_the_daemonset_controller() {
    let pod: Pod = serde_json::from_value(base_pod()).expect("pod");
    assert_eq!(sizing::target_node(&pod).as_deref(), Ok(NODE));
    let mut bare = base_pod();
    bare["spec"].as_object_mut().expect("spec").remove("affinity");
    let bare: Pod = serde_json::from_value(bare).expect("pod");
    let err = sizing::target_node(&bare).expect_err("no node");
    assert!(err.contains("no spec.nodeName"), "{err}");
}

#[test]
fn fleet_is_the_90th_percentile_of_node_targets() {
    let nodes: Vec<Targets> = (1..=10u64)
        .map(|i| {
            BTreeMap::from([(
                "agent".to_string(),
                Amounts {
                    cpu: Some(i * 100),
                    memory: (i % 2 == 0).then_some(i << 20),
                },
            )])
        })
        .collect();
    let fleet = sizing::fleet_from_nodes(nodes.iter());
    assert_eq!(fleet["agent"].cpu, Some(900));
    // memory from the five nodes that report it: 2, 4, 6, 8, 10 Mi → rank ceil(4.5) = 5
    assert_eq!(fleet["agent"].memory, Some(10 << 20));
}

// ---- the handler, on the recorded review

fn index_with(rec_cpu: &str) -> Arc<RightsizingCache> {
    let index = RightsizingCache::new();
    index.apply_autoscaler(autoscaler(json!({})));
    let rec = NodeRecommendation::new(
        NODE,
        NodeRecommendationSpec {
            update_time: None,
            pods: Vec::new(),
            summary: None,
            recommendations: vec![ContainerRecommendation {
                autoscaler: AutoscalerRef {
                    namespace: NAMESPACE.to_string(),
                    name: "node-agent".to_string(),
                },
                container_name: "agent".to_string(),
                target: Some(BTreeMap::from([
                    (
                        "cpu".to_string(),
                        k8s_openapi::apimachinery::pkg::api::resource::Quantity(rec_cpu.to_string()),
                    ),
                    (
                        "memory".to_string(),
                        k8s_openapi::apimachinery::pkg::api::resource::Quantity("100Mi".to_string()),
                    ),
                ])),
                lower_bound: None,
                upper_bound: None,
                uncapped_target: None,
                sample_count: 100,
                first_sample_time: None,
                last_sample_time: None,
                oom_count: 0,
                capped: None,
            }],
        },
    );
    index.apply_node_recommendation(&rec);
    index
}

fn request(review: &Value) -> AdmissionRequest {
    let parsed: ReviewIn = serde_json::from_value(review.clone()).expect("review");
    parsed.request.expect("request")
}

#[test]
fn handler_patches_the_recorded_daemonset_pod_from_the_cache() {
    let handler = PodMutator::new(index_with("300m"));
    let review = review();
    let response = handler.review_raw(&request(&review));
    assert!(response.allowed);
    assert_eq!(response.patch_type.as_deref(), Some("JSONPatch"));
    let patch = response.decoded_patch().expect("patch");
    let out = apply_ops(&review["request"]["object"], &patch);
    assert_eq!(
        out["spec"]["containers"][0]["resources"],
        json!({"requests": {"cpu": "300m", "memory": "100Mi"}, "limits": {"cpu": "600m", "memory": "200Mi"}})
    );
    // dryRun gets the same answer (the webhook has no side effects)
    let mut dry = review.clone();
    dry["request"]["dryRun"] = json!(true);
    assert_eq!(handler.review_raw(&request(&dry)).patch, response.patch);
}

#[test]
fn handler_leaves_pods_without_an_autoscaler_alone() {
    let handler = PodMutator::new(index_with("300m"));
    let mut other = review();
    other["request"]["object"]["metadata"]["ownerReferences"][0]["name"] = json!("someone-else");
    let response = handler.review_raw(&request(&other));
    assert!(response.allowed && response.patch.is_none());

    let mut replicaset = review();
    replicaset["request"]["object"]["metadata"]["ownerReferences"][0]["kind"] = json!("ReplicaSet");
    let response = handler.review_raw(&request(&replicaset));
    assert!(response.allowed && response.patch.is_none());

    let mut elsewhere = review();
    elsewhere["request"]["namespace"] = json!("another-namespace");
    let response = handler.review_raw(&request(&elsewhere));
    assert!(response.allowed && response.patch.is_none());
}

#[test]
fn handler_admits_an_unreadable_pod_unchanged_with_a_warning() {
    let handler = PodMutator::new(index_with("300m"));
    let mut bad = review();
    bad["request"]["object"]["spec"]["containers"] = json!("not a list");
    let response = handler.review_raw(&request(&bad));
    assert!(response.allowed && response.patch.is_none());
    assert_eq!(response.warnings.len(), 1);
    assert!(response.warnings[0].len() < 120);
}

#[test]
fn a_pod_with_more_containers_than_the_limit_is_admitted_unchanged_with_a_warning() {
    use nodewarden_webhook::rightsizing::MAX_POD_CONTAINERS;
    let handler = PodMutator::new(index_with("300m"));
    let with_sidecars = |n: usize| {
        let mut r = review();
        let first = r["request"]["object"]["spec"]["containers"][0].clone();
        let mut containers = vec![first];
        containers.extend((1..n).map(|i| json!({"name": format!("sidecar-{i}"), "image": "x"})));
        r["request"]["object"]["spec"]["containers"] = json!(containers);
        r
    };
    // at the limit the pod is still right-sized
    let at = handler.review_raw(&request(&with_sidecars(MAX_POD_CONTAINERS)));
    assert!(
        at.allowed && at.patch.is_some(),
        "a pod of {MAX_POD_CONTAINERS} containers was not patched"
    );
    let over = handler.review_raw(&request(&with_sidecars(MAX_POD_CONTAINERS + 1)));
    assert!(over.allowed && over.patch.is_none());
    assert_eq!(over.warnings.len(), 1, "{:?}", over.warnings);
    assert!(
        over.warnings[0].contains("could not be read"),
        "{:?}",
        over.warnings
    );
}

// ---- /validate/autoscalers

fn autoscaler_review(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u1",
            "kind": {"group": "nodewarden.io", "version": "v1alpha1", "kind": "DaemonSetAutoscaler"},
            "resource": {"group": "nodewarden.io", "version": "v1alpha1", "resource": "daemonsetautoscalers"},
            "name": name,
            "namespace": NAMESPACE,
            "operation": "CREATE",
            "userInfo": {"username": "jane"},
            "object": {
                "apiVersion": "nodewarden.io/v1alpha1",
                "kind": "DaemonSetAutoscaler",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "spec": spec,
            }
        }
    })
}

#[test]
fn validator_denies_min_above_max_duplicates_and_a_second_autoscaler() {
    let index = index_with("300m");
    let validator = AutoscalerValidator::new(index);
    let target = json!({"kind": "DaemonSet", "name": "other-ds"});

    let ok = validator.review(&request(&autoscaler_review("a", json!({"targetRef": target,
        "resourcePolicy": {"containerPolicies": [{"containerName": "*", "minAllowed": {"cpu": "100m"}, "maxAllowed": {"cpu": "0.1"}}]}}))));
    assert!(ok.allowed, "{ok:?}");

    let bad = validator.review(&request(&autoscaler_review(
        "a",
        json!({"targetRef": target,
        "resourcePolicy": {"containerPolicies": [
            {"containerName": "agent", "minAllowed": {"memory": "1Gi"}, "maxAllowed": {"memory": "512Mi"}},
            {"containerName": "agent"}]}}),
    )));
    assert!(!bad.allowed);
    assert_eq!(
        bad.status.expect("status").message,
        "spec.resourcePolicy.containerPolicies[0]: minAllowed.memory 1Gi is above maxAllowed.memory 512Mi; minAllowed must be at most maxAllowed; \
         spec.resourcePolicy.containerPolicies[1].containerName: \"agent\" has a policy already; give each container (and `*`) one policy"
    );

    let second = validator.review(&request(&autoscaler_review(
        "second",
        json!({"targetRef": {"kind": "DaemonSet", "name": "node-agent"}}),
    )));
    assert!(!second.allowed);
    assert_eq!(
        second.status.expect("status").message,
        format!(
            "spec.targetRef.name: DaemonSet {NAMESPACE}/node-agent is already right-sized by DaemonSetAutoscaler node-agent; one autoscaler per DaemonSet"
        )
    );

    // the existing autoscaler itself may still be updated
    let same = validator.review(&request(&autoscaler_review(
        "node-agent",
        json!({"targetRef": {"kind": "DaemonSet", "name": "node-agent"}}),
    )));
    assert!(same.allowed, "{same:?}");
}

#[test]
fn a_denial_names_ten_problems_and_counts_the_rest() {
    let validator = AutoscalerValidator::new(index_with("300m"));
    let policies: Vec<Value> = (0..1000).map(|_| json!({"containerName": "agent"})).collect();
    let denied = validator.review(&request(&autoscaler_review(
        "a",
        json!({"targetRef": {"kind": "DaemonSet", "name": "other-ds"},
               "resourcePolicy": {"containerPolicies": policies}}),
    )));
    assert!(!denied.allowed);
    let message = denied.status.expect("status").message;
    assert!(
        message.starts_with(
            "spec.resourcePolicy.containerPolicies[1].containerName: \"agent\" has a policy already"
        ),
        "{message}"
    );
    assert!(
        message.contains("containerPolicies[10].containerName"),
        "{message}"
    );
    assert!(!message.contains("containerPolicies[11]"), "{message}");
    assert!(message.ends_with("; and 989 more problems"), "{message}");
}

/// The worked example of docs/rightsizing.md, row by row.
#[test]
fn worked_example_of_the_docs() {
    let policy = json!({"resourcePolicy": {"containerPolicies": [{"containerName": "*", "maxAllowed": {"memory": "256Mi"}}]}});
    let mut fleet_policy = policy.clone();
    fleet_policy["coldStart"] = json!("Fleet");
    let mut ceiling_policy = policy.clone();
    ceiling_policy["ceiling"] = json!("Template");
    let a = targets(&[("agent", Some("250m"), Some("300Mi"))]);
    let b = targets(&[("agent", Some("500m"), Some("200Mi"))]);
    let fleet = sizing::fleet_from_nodes([&a, &b]);
    let rows: Vec<(Value, Option<&Targets>, Value)> = vec![
        (
            policy.clone(),
            Some(&a),
            json!({"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"cpu": "500m", "memory": "512Mi"}}),
        ),
        (
            policy.clone(),
            Some(&b),
            json!({"requests": {"cpu": "500m", "memory": "200Mi"}, "limits": {"cpu": "1", "memory": "400Mi"}}),
        ),
        (
            policy.clone(),
            None,
            json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}}),
        ),
        (
            fleet_policy,
            None,
            json!({"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}}),
        ),
        (
            ceiling_policy.clone(),
            Some(&a),
            json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}}),
        ),
        (
            ceiling_policy,
            Some(&b),
            json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}}),
        ),
    ];
    for (i, (spec, node, want)) in rows.into_iter().enumerate() {
        let pod = base_pod();
        let typed: Pod = serde_json::from_value(pod.clone()).expect("pod");
        let decision = sizing::mutate(
            &typed,
            &autoscaler(spec),
            sizing::Figures {
                node,
                group: None,
                fleet: Some(&fleet),
            },
            &[],
        );
        let out = apply(&pod, &decision.patch);
        assert_eq!(out["spec"]["containers"][0]["resources"], want, "row {i}");
        if i == 0 {
            assert_eq!(
                out["metadata"]["annotations"][ANNOTATION_CAPPED],
                "agent: memory maxAllowed (recommended 300Mi)"
            );
        }
    }
}

/// An autoscaler that resizes in place says whether this cluster can: where the API server does
/// not serve pods/resize, the condition is False and names the version, the gate and what the
/// agents do instead; other modes carry no such condition; an unknown answer adds none.
#[test]
fn in_place_autoscalers_say_whether_the_cluster_resizes() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{APIResource, APIResourceList};
    use nodewarden_runtime::discovery::ResizeSupport;
    use nodewarden_webhook::rightsizing::controller::{IN_PLACE_RESIZE, resize_condition};
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    let core = |names: &[&str]| APIResourceList {
        group_version: "v1".to_string(),
        resources: names
            .iter()
            .map(|n| APIResource {
                name: n.to_string(),
                ..APIResource::default()
            })
            .collect(),
    };
    let old = ResizeSupport::from_discovery(&core(&["pods", "pods/eviction"]), "v1.30.14");
    let new = ResizeSupport::from_discovery(&core(&["pods", "pods/resize"]), "v1.37.2");
    let in_place = autoscaler(json!({"updatePolicy": {"updateMode": "InPlace"}}));
    let c = resize_condition(&in_place, Some(&old), &now).expect("a condition");
    assert_eq!((c.type_.as_str(), c.status.as_str()), (IN_PLACE_RESIZE, "False"));
    assert_eq!(c.reason, "ResizeNotServed");
    for said in [
        "v1.30.14",
        "InPlacePodVerticalScaling",
        "acts as Recreate",
        "disruption budget",
    ] {
        assert!(c.message.contains(said), "{said} missing from: {}", c.message);
    }
    let c = resize_condition(&in_place, Some(&new), &now).expect("a condition");
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "ResizeServed"));
    let either = autoscaler(json!({"updatePolicy": {"updateMode": "InPlaceOrRecreate"}}));
    assert!(resize_condition(&either, Some(&old), &now).is_some());
    for mode in ["Off", "Initial", "Recreate"] {
        let a = autoscaler(json!({"updatePolicy": {"updateMode": mode}}));
        assert_eq!(resize_condition(&a, Some(&old), &now), None, "{mode}");
    }
    assert_eq!(resize_condition(&in_place, None, &now), None);
}

#[test]
fn status_reports_nodes_fleet_and_conditions() {
    use nodewarden_webhook::rightsizing::controller::{
        CONFIG_UNSUPPORTED, RECOMMENDATION_PROVIDED, desired_status,
    };
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    let nodes = vec![
        targets(&[("agent", Some("100m"), Some("100Mi"))]),
        targets(&[("agent", Some("300m"), Some("200Mi"))]),
        targets(&[("agent", Some("200m"), None)]),
    ];
    let status = desired_status(
        &autoscaler(json!({})),
        &nodes,
        &BTreeMap::new(),
        Some((3, 2)),
        false,
        &now,
    );
    assert_eq!(status.nodes_with_recommendation, Some(3));
    assert_eq!((status.pods_running, status.pods_up_to_date), (Some(3), Some(2)));
    let fleet = serde_json::to_value(&status.fleet).expect("json");
    assert_eq!(
        fleet,
        json!([{"containerName": "agent", "target": {"cpu": "300m", "memory": "200Mi"},
                "median": {"cpu": "200m", "memory": "100Mi"}}])
    );
    let by_type: BTreeMap<&str, (&str, &str)> = status
        .conditions
        .iter()
        .map(|c| (c.type_.as_str(), (c.status.as_str(), c.reason.as_str())))
        .collect();
    assert_eq!(by_type[RECOMMENDATION_PROVIDED], ("True", "NodesReported"));
    assert_eq!(by_type[CONFIG_UNSUPPORTED], ("True", "TargetNotFound"));

    // no node yet, target present; a condition keeps its transition time while its status stays
    let mut a = autoscaler(json!({}));
    a.status = Some(desired_status(&a, &[], &BTreeMap::new(), None, true, &now));
    let later = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::from_second(3600).expect("time"),
    );
    let again = desired_status(&a, &[], &BTreeMap::new(), None, true, &later);
    assert_eq!(
        Some(&again),
        a.status.as_ref(),
        "nothing changed, so nothing to write"
    );
    let provided = again
        .conditions
        .iter()
        .find(|c| c.type_ == RECOMMENDATION_PROVIDED)
        .expect("condition");
    assert_eq!(
        (provided.status.as_str(), provided.reason.as_str()),
        ("False", "NoNodeRecommendation")
    );
    assert!(again.fleet.is_empty());
}

#[test]
fn validator_lets_an_existing_duplicate_keep_its_target_and_status_flags_bad_policies() {
    let index = index_with("300m");
    let mut older = autoscaler(json!({}));
    older.metadata.name = Some("older".to_string());
    index.apply_autoscaler(older);
    let validator = AutoscalerValidator::new(index);
    let mut update = autoscaler_review(
        "node-agent",
        json!({"targetRef": {"kind": "DaemonSet", "name": "node-agent"}}),
    );
    update["request"]["operation"] = json!("UPDATE");
    update["request"]["oldObject"] = update["request"]["object"].clone();
    assert!(validator.review(&request(&update)).allowed);
    // moving it onto another autoscaler's DaemonSet is refused
    let mut moved = update.clone();
    moved["request"]["oldObject"]["spec"]["targetRef"]["name"] = json!("elsewhere");
    assert!(!validator.review(&request(&moved)).allowed);

    use nodewarden_webhook::rightsizing::controller::{CONFIG_UNSUPPORTED, desired_status};
    let bad = autoscaler(json!({"resourcePolicy": {"containerPolicies": [
        {"containerName": "*", "minAllowed": {"cpu": "2"}, "maxAllowed": {"cpu": "1"}}]}}));
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    let status = desired_status(&bad, &[], &BTreeMap::new(), None, true, &now);
    let c = status
        .conditions
        .iter()
        .find(|c| c.type_ == CONFIG_UNSUPPORTED)
        .expect("condition");
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "InvalidPolicy"));
    assert_eq!(
        c.message,
        "spec.resourcePolicy.containerPolicies[0]: minAllowed.cpu 2 is above maxAllowed.cpu 1; minAllowed must be at most maxAllowed"
    );
}

#[test]
fn handler_only_mutates_pod_creates() {
    let handler = PodMutator::new(index_with("300m"));
    let mut update = review();
    update["request"]["operation"] = json!("UPDATE");
    update["request"]["oldObject"] = update["request"]["object"].clone();
    let response = handler.review_raw(&request(&update));
    assert!(response.allowed && response.patch.is_none());
}

/// The pipeline reads a pod review in one pass (envelope and pod view together); what it answers
/// is what the handler answers the request decoded the usual way, for every shape of review.
#[test]
fn the_one_pass_pipeline_answers_as_the_handler_does() {
    use nodewarden_webhook::admission::{Processed, process};
    let handler = PodMutator::new(index_with("300m"));
    let mut cases: Vec<(&str, Value)> = vec![("recorded", review())];
    let mut edit = |name, f: &dyn Fn(&mut Value)| {
        let mut r = review();
        f(&mut r);
        cases.push((name, r));
    };
    edit("unreadable containers", &|r| {
        r["request"]["object"]["spec"]["containers"] = json!("not a list")
    });
    edit("no object", &|r| {
        drop(r["request"].as_object_mut().map(|o| o.remove("object")))
    });
    edit("null object", &|r| r["request"]["object"] = Value::Null);
    edit("update", &|r| {
        r["request"]["operation"] = json!("UPDATE");
        r["request"]["oldObject"] = r["request"]["object"].clone();
    });
    edit("subresource", &|r| r["request"]["subResource"] = json!("status"));
    edit("another kind", &|r| {
        r["request"]["kind"]["kind"] = json!("Secret")
    });
    edit("another owner", &|r| {
        r["request"]["object"]["metadata"]["ownerReferences"][0]["name"] = json!("someone-else")
    });
    edit("no namespace in the request", &|r| {
        drop(r["request"].as_object_mut().map(|o| o.remove("namespace")))
    });
    edit("dry run", &|r| r["request"]["dryRun"] = json!(true));
    let mut patched = 0;
    for (name, review) in &cases {
        let body = serde_json::to_vec(review).expect("encodes");
        let Processed::Review(out, _, _) = process(&body, &handler) else {
            panic!("{name}: not answered as a review");
        };
        assert_eq!(out.response, handler.review_raw(&request(review)), "{name}");
        patched += usize::from(out.response.patch.is_some());
    }
    // the recorded pod, its dry run and the one the request names no namespace for
    assert_eq!(patched, 3);
}

/// The one-pass read keeps none of `userInfo`, `requestKind`, `requestResource`,
/// `requestSubResource`, `oldObject` and `options`, but refuses what the usual decode refuses in
/// them: such a review is answered as malformed, as before, not decided.
#[test]
fn the_one_pass_read_refuses_what_the_usual_decode_refuses() {
    use nodewarden_webhook::admission::{Processed, process};
    let handler = PodMutator::new(index_with("300m"));
    let fields: [(&str, &[Value]); 6] = [
        (
            "userInfo",
            &[
                json!(5),
                Value::Null,
                json!({"username": 5}),
                json!({"groups": "system:masters"}),
                json!({"groups": [1]}),
                json!({"extra": {"a": "not a list"}}),
                json!({"extra": {"a": [1]}}),
                json!({"extra": []}),
            ],
        ),
        ("requestKind", &[json!("Pod"), json!({"kind": 1})]),
        ("requestResource", &[json!(7), json!({"resource": true})]),
        ("requestSubResource", &[json!(1), json!({})]),
        ("oldObject", &[]),
        ("options", &[]),
    ];
    let mut refused = 0;
    for (field, values) in fields {
        for value in values {
            let mut review = review();
            review["request"][field] = value.clone();
            let body = serde_json::to_vec(&review).expect("encodes");
            let Processed::Review(out, _, _) = process(&body, &handler) else {
                panic!("{field}: {value}: not answered as a review");
            };
            assert!(!out.response.allowed, "{field}: {value}: decided, not refused");
            let message = out.response.status.map(|s| s.message).unwrap_or_default();
            assert!(
                message.starts_with("malformed AdmissionReview"),
                "{field}: {value}: {message}"
            );
            refused += 1;
        }
    }
    assert_eq!(refused, 14);
    // and what the usual decode accepts in them, the one pass accepts and decides
    let accepted: [(&str, Value); 9] = [
        ("userInfo", json!({})),
        (
            "userInfo",
            json!({"username": "u", "uid": "1", "groups": ["g"], "extra": {"a": ["b"], "c": []}}),
        ),
        ("requestKind", Value::Null),
        (
            "requestResource",
            json!({"group": "", "version": "v1", "resource": "pods", "other": 1}),
        ),
        // a struct may be written as the list of its fields
        ("requestResource", json!(["", "v1"])),
        ("requestSubResource", Value::Null),
        ("oldObject", json!({"anything": [1, {"x": null}]})),
        ("options", json!([1, "two"])),
        ("options", Value::Null),
    ];
    for (field, value) in accepted {
        let mut review = review();
        review["request"][field] = value.clone();
        let body = serde_json::to_vec(&review).expect("encodes");
        let Processed::Review(out, _, _) = process(&body, &handler) else {
            panic!("{field}: {value}: not answered as a review");
        };
        assert!(
            out.response.patch.is_some(),
            "{field}: {value}: {:?}",
            out.response.status
        );
        assert_eq!(
            out.response,
            handler.review_raw(&request(&review)),
            "{field}: {value}"
        );
    }
}

/// The handler reads a pod's few fields straight from the review; what it decides is what it
/// decides on the same pod read whole as the API's `Pod` type, for every shape of the fields it
/// reads (resources, quantities, annotations, node affinity, owners).
#[test]
fn the_pod_is_read_as_the_api_types_read_it() {
    let handler = PodMutator::new(index_with("300m"));
    let mut cases: Vec<(&str, Value)> = vec![("recorded", base_pod())];
    let mut edit = |name, f: &dyn Fn(&mut Value)| {
        let mut pod = base_pod();
        f(&mut pod);
        cases.push((name, pod));
    };
    edit("no resources", &|p| {
        drop(
            p["spec"]["containers"][0]
                .as_object_mut()
                .map(|c| c.remove("resources")),
        )
    });
    edit("null resources", &|p| {
        p["spec"]["containers"][0]["resources"] = Value::Null
    });
    edit("empty resources", &|p| {
        p["spec"]["containers"][0]["resources"] = json!({})
    });
    edit("requests only", &|p| {
        p["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "100m"}})
    });
    edit("null requests", &|p| {
        p["spec"]["containers"][0]["resources"] = json!({"requests": null, "limits": {"cpu": "1"}})
    });
    edit("empty limits", &|p| {
        p["spec"]["containers"][0]["resources"] = json!({"requests": {"memory": "64Mi"}, "limits": {}})
    });
    edit("odd quantities", &|p| {
        p["spec"]["containers"][0]["resources"] = json!({
            "requests": {"cpu": "0.25", "memory": "1e8", "nvidia.com/gpu": "1"},
            "limits": {"cpu": "not a quantity", "memory": "128M", "ephemeral-storage": "1Gi"},
        })
    });
    edit("big quantities", &|p| {
        p["spec"]["containers"][0]["resources"] = json!({
            "requests": {"cpu": "18446744073709551615", "memory": "16Ei"},
            "limits": {"cpu": "99999999999999999999m", "memory": "1.5Gi"},
        })
    });
    edit("no annotations", &|p| {
        drop(p["metadata"].as_object_mut().map(|m| m.remove("annotations")))
    });
    edit("null annotations", &|p| {
        p["metadata"]["annotations"] = Value::Null
    });
    edit("empty annotations", &|p| p["metadata"]["annotations"] = json!({}));
    edit("node name", &|p| p["spec"]["nodeName"] = json!(NODE));
    edit("empty node name", &|p| p["spec"]["nodeName"] = json!(""));
    edit("no affinity", &|p| {
        drop(p["spec"].as_object_mut().map(|s| s.remove("affinity")))
    });
    edit("two terms", &|p| {
        let term = p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0]
            .clone();
        p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] =
            json!([term.clone(), term]);
    });
    edit("two nodes", &|p| {
        p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchFields"][0]["values"] = json!([NODE, "other"]);
    });
    edit("another operator", &|p| {
        p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchFields"][0]["operator"] = json!("NotIn");
    });
    edit("match expressions and pod affinity", &|p| {
        p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchExpressions"] =
            json!([{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]);
        p["spec"]["affinity"]["podAntiAffinity"] =
            json!({"preferredDuringSchedulingIgnoredDuringExecution": []});
    });
    edit("an owner before the controller", &|p| {
        let controller = p["metadata"]["ownerReferences"][0].clone();
        let mut other = controller.clone();
        other["controller"] = json!(false);
        other["name"] = json!("someone-else");
        p["metadata"]["ownerReferences"] = json!([other, controller]);
    });
    edit("a controller of another kind", &|p| {
        p["metadata"]["ownerReferences"][0]["kind"] = json!("ReplicaSet")
    });
    edit("a DaemonSet of another group", &|p| {
        p["metadata"]["ownerReferences"][0]["apiVersion"] = json!("extensions/v1beta1")
    });
    edit("no owners", &|p| {
        drop(p["metadata"].as_object_mut().map(|m| m.remove("ownerReferences")))
    });
    edit("two containers", &|p| {
        let mut second = p["spec"]["containers"][0].clone();
        second["name"] = json!("sidecar");
        p["spec"]["containers"] = json!([p["spec"]["containers"][0].clone(), second]);
    });
    let mut patched = 0;
    for (name, pod) in &cases {
        let mut review = review();
        review["request"]["object"] = pod.clone();
        let answer = handler.review_raw(&request(&review));
        let whole: Pod = serde_json::from_value(pod.clone()).expect(name);
        let expected = match handler.decide(NAMESPACE, &whole) {
            Some(decision) => AdmissionResponse::allow(&answer.uid).with_add_patch(decision.patch),
            None => AdmissionResponse::allow(&answer.uid),
        };
        assert_eq!(answer, expected, "{name}");
        patched += usize::from(answer.patch.is_some());
    }
    // all but the three whose owner is not the autoscaler's DaemonSet
    assert_eq!(patched, cases.len() - 3);
}

#[test]
fn the_pod_mutator_fails_open_and_the_autoscaler_validator_fails_closed() {
    assert!(PodMutator::new(index_with("300m")).fails_open());
    assert!(!AutoscalerValidator::new(index_with("300m")).fails_open());
}

/// The status's pod counts are the sum of the nodes' reports; a node's report replaces its
/// earlier one, and a deleted NodeRecommendation takes its pods out.
#[test]
fn pods_up_to_date_sum_the_nodes_reports() {
    let index = RightsizingCache::new();
    let report = |node: &str, running: i32, up_to_date: i32| {
        NodeRecommendation::new(
            node,
            NodeRecommendationSpec {
                update_time: None,
                pods: vec![nodewarden_api::rightsizing::NodePods {
                    autoscaler: AutoscalerRef {
                        namespace: NAMESPACE.to_string(),
                        name: "node-agent".to_string(),
                    },
                    running,
                    up_to_date,
                }],
                recommendations: Vec::new(),
                summary: None,
            },
        )
    };
    assert_eq!(index.pods_of(NAMESPACE, "node-agent"), None);
    index.apply_node_recommendation(&report("a", 1, 0));
    index.apply_node_recommendation(&report("b", 1, 1));
    assert_eq!(index.pods_of(NAMESPACE, "node-agent"), Some((2, 1)));
    index.apply_node_recommendation(&report("a", 1, 1));
    assert_eq!(index.pods_of(NAMESPACE, "node-agent"), Some((2, 2)));
    // a report claiming more up to date than running counts no more than running
    index.apply_node_recommendation(&report("b", 1, 5));
    assert_eq!(index.pods_of(NAMESPACE, "node-agent"), Some((2, 2)));
    index.delete_node_recommendation("a");
    assert_eq!(index.pods_of(NAMESPACE, "node-agent"), Some((1, 1)));
    assert_eq!(index.pods_of(NAMESPACE, "other"), None);
}

#[test]
fn an_autoscaler_with_more_policies_than_a_pod_has_containers_is_denied() {
    use nodewarden_webhook::rightsizing::MAX_CONTAINER_POLICIES;
    let validator = AutoscalerValidator::new(index_with("300m"));
    let with = |n: usize| {
        let policies: Vec<Value> = (0..n)
            .map(|i| json!({"containerName": format!("c{i}"), "minAllowed": {"cpu": "1m"}}))
            .collect();
        autoscaler_review(
            "many",
            json!({"targetRef": {"kind": "DaemonSet", "name": "other-ds"},
                "resourcePolicy": {"containerPolicies": policies}}),
        )
    };
    let at = validator.review(&request(&with(MAX_CONTAINER_POLICIES)));
    assert!(at.allowed, "{at:?}");
    let over = validator.review(&request(&with(MAX_CONTAINER_POLICIES + 1)));
    assert!(!over.allowed);
    let message = over.status.expect("status").message;
    assert!(
        message.contains("containerPolicies: more than 1001 entries"),
        "{message}"
    );
}

/// The status's groups: each label value's figure from its nodes; a group whose nodes are gone
/// keeps its figure (with `nodes: 0`); nothing is rewritten when nothing changed; another label
/// starts over; at most `MAX_GROUPS`, the ones with nodes kept first.
#[test]
fn groups_are_computed_per_label_value_and_outlive_their_nodes() {
    use nodewarden_webhook::rightsizing::controller::{MAX_GROUPS, desired_status};
    let t = |s: i64| {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(s).expect("time"),
        )
    };
    let mut a =
        autoscaler(json!({"scope": "NodeGroup", "nodeGroupLabel": "node.kubernetes.io/instance-type"}));
    let big = vec![
        targets(&[("agent", Some("800m"), Some("400Mi"))]),
        targets(&[("agent", Some("600m"), Some("300Mi"))]),
    ];
    let small = vec![targets(&[("agent", Some("100m"), Some("64Mi"))])];
    let all: Vec<Targets> = big.iter().chain(&small).cloned().collect();
    let live = BTreeMap::from([
        ("big".to_string(), big.clone()),
        ("small".to_string(), small.clone()),
    ]);
    let status = desired_status(&a, &all, &live, None, true, &t(0));
    assert_eq!(
        status.node_group_label.as_deref(),
        Some("node.kubernetes.io/instance-type")
    );
    let groups = serde_json::to_value(&status.groups).expect("json");
    assert_eq!(
        groups,
        json!([
            {"value": "big", "nodes": 2, "updateTime": "1970-01-01T00:00:00Z", "containers": [
                {"containerName": "agent", "target": {"cpu": "800m", "memory": "400Mi"},
                 "median": {"cpu": "600m", "memory": "300Mi"}}]},
            {"value": "small", "nodes": 1, "updateTime": "1970-01-01T00:00:00Z", "containers": [
                {"containerName": "agent", "target": {"cpu": "100m", "memory": "64Mi"},
                 "median": {"cpu": "100m", "memory": "64Mi"}}]},
        ])
    );
    a.status = Some(status.clone());
    // an hour later, the same figures: the same status, nothing to write
    assert_eq!(desired_status(&a, &all, &live, None, true, &t(3600)), status);

    // the small nodes are deleted: their group keeps its figure, with no node
    let only_big = BTreeMap::from([("big".to_string(), big.clone())]);
    let after = desired_status(&a, &big, &only_big, None, true, &t(7200));
    let small_group = after.groups.iter().find(|g| g.value == "small").expect("kept");
    assert_eq!(small_group.nodes, 0);
    assert_eq!(small_group.containers, status.groups[1].containers);
    assert_eq!(small_group.update_time, Some(t(7200)));
    a.status = Some(after.clone());
    // with no node left at all, both stay
    let none = desired_status(&a, &[], &BTreeMap::new(), None, true, &t(9000));
    assert_eq!(
        none.groups
            .iter()
            .map(|g| (g.value.as_str(), g.nodes))
            .collect::<Vec<_>>(),
        [("big", 0), ("small", 0)]
    );
    assert_eq!(
        none.groups[1], after.groups[1],
        "a group without nodes is not rewritten"
    );

    // another label: the groups are for it alone
    let mut zoned = a.clone();
    zoned.spec.node_group_label = Some("topology.kubernetes.io/zone".to_string());
    let z = desired_status(&zoned, &[], &BTreeMap::new(), None, true, &t(9000));
    assert!(z.groups.is_empty(), "{:?}", z.groups);
    // a spec without groups has none
    let plain = autoscaler(json!({}));
    assert!(
        desired_status(&plain, &all, &live, None, true, &t(0))
            .groups
            .is_empty()
    );

    // the cap: groups with nodes are kept before old ones
    let mut many = a.clone();
    let old: BTreeMap<String, Vec<Targets>> = (0..MAX_GROUPS)
        .map(|i| (format!("old-{i:03}"), small.clone()))
        .collect();
    many.status = Some(desired_status(&many, &[], &old, None, true, &t(0)));
    let now_live = BTreeMap::from([("new".to_string(), big.clone())]);
    let capped = desired_status(&many, &big, &now_live, None, true, &t(60));
    assert_eq!(capped.groups.len(), MAX_GROUPS);
    assert!(capped.groups.iter().any(|g| g.value == "new" && g.nodes == 2));
}

/// A new node of a known group gets its group's figure through the handler (its labels from
/// the index's Node watch, the figure from the autoscaler's status); a node without the label
/// falls back to the cold-start choice.
#[test]
fn handler_gives_a_new_node_its_group_figure() {
    let index = RightsizingCache::new();
    let mut a =
        autoscaler(json!({"coldStart": "Group", "nodeGroupLabel": "node.kubernetes.io/instance-type"}));
    a.status = Some(
        serde_json::from_value(json!({
            "fleet": [{"containerName": "agent", "target": {"cpu": "900m", "memory": "900Mi"}}],
            "nodeGroupLabel": "node.kubernetes.io/instance-type",
            "groups": [{"value": "m5.large", "nodes": 0,
                        "containers": [{"containerName": "agent", "target": {"cpu": "350m", "memory": "160Mi"}}]}],
        }))
        .expect("status"),
    );
    index.apply_autoscaler(a);
    let handler = PodMutator::new(index.clone());
    let resources = || {
        let review = review();
        let response = handler.review_raw(&request(&review));
        let out = apply_ops(
            &review["request"]["object"],
            &response.decoded_patch().expect("patch"),
        );
        (
            out["spec"]["containers"][0]["resources"]["requests"].clone(),
            out["metadata"]["annotations"][ANNOTATION_SOURCE].clone(),
        )
    };
    // the node's labels are not known yet: the fleet figure
    assert_eq!(
        resources(),
        (json!({"cpu": "900m", "memory": "900Mi"}), json!("agent=fleet"))
    );
    index.apply_node_labels(NODE, [("node.kubernetes.io/instance-type", "m5.large")]);
    assert_eq!(
        resources(),
        (json!({"cpu": "350m", "memory": "160Mi"}), json!("agent=group"))
    );
    index.apply_node_labels(NODE, [("node.kubernetes.io/instance-type", "m5.xlarge")]);
    assert_eq!(resources().1, json!("agent=fleet"));
}

#[test]
fn validator_requires_a_valid_node_group_label_with_groups() {
    let validator = AutoscalerValidator::new(RightsizingCache::new());
    let denial = |spec: Value| {
        let mut full = json!({"targetRef": {"kind": "DaemonSet", "name": "node-agent"}});
        for (k, v) in spec.as_object().expect("object") {
            full[k] = v.clone();
        }
        let response = validator.review(&request(&autoscaler_review("node-agent", full)));
        response.status.map(|s| s.message).unwrap_or_default()
    };
    assert!(denial(json!({"scope": "NodeGroup"})).contains(
        "spec.nodeGroupLabel: required with scope NodeGroup: name the node label whose value groups the nodes, \
         e.g. node.kubernetes.io/instance-type"
    ));
    assert!(
        denial(json!({"coldStart": "Group"})).contains("spec.nodeGroupLabel: required with coldStart Group")
    );
    assert!(
        denial(json!({"scope": "NodeGroup", "nodeGroupLabel": "pool name"}))
            .contains("spec.nodeGroupLabel: \"pool name\" is not a label key: it contains ' '")
    );
    assert_eq!(
        denial(json!({"scope": "NodeGroup", "nodeGroupLabel": "cloud.example.com/pool"})),
        ""
    );
}

// ---- native sidecars

/// The recorded pod with init containers: `setup` runs to completion, `log-forwarder` is a
/// native sidecar with requests and limits, `mesh` one without `resources`.
fn sidecar_review() -> Value {
    let mut review = review();
    review["request"]["object"]["spec"]["initContainers"] = json!([
        {"name": "setup", "image": "nodewarden-e2e/pause:never-pulled",
         "resources": {"requests": {"cpu": "1", "memory": "32Mi"}}},
        {"name": "log-forwarder", "image": "nodewarden-e2e/pause:never-pulled", "restartPolicy": "Always",
         "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}}},
        {"name": "mesh", "image": "nodewarden-e2e/pause:never-pulled", "restartPolicy": "Always"}
    ]);
    review
}

/// The cache of [`index_with`], with figures for the sidecars and for `setup` too (which the
/// webhook must not use: it runs to completion).
fn index_with_sidecars() -> Arc<RightsizingCache> {
    let index = index_with("300m");
    let entry = |container: &str, cpu: &str, memory: &str| ContainerRecommendation {
        autoscaler: AutoscalerRef {
            namespace: NAMESPACE.to_string(),
            name: "node-agent".to_string(),
        },
        container_name: container.to_string(),
        target: Some(BTreeMap::from([
            (
                "cpu".to_string(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity(cpu.to_string()),
            ),
            (
                "memory".to_string(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity(memory.to_string()),
            ),
        ])),
        lower_bound: None,
        upper_bound: None,
        uncapped_target: None,
        sample_count: 100,
        first_sample_time: None,
        last_sample_time: None,
        oom_count: 0,
        capped: None,
    };
    let rec = NodeRecommendation::new(
        NODE,
        NodeRecommendationSpec {
            update_time: None,
            pods: Vec::new(),
            summary: None,
            recommendations: vec![
                entry("agent", "300m", "100Mi"),
                entry("log-forwarder", "20m", "48Mi"),
                entry("mesh", "10m", "16Mi"),
                entry("setup", "5m", "8Mi"),
            ],
        },
    );
    index.apply_node_recommendation(&rec);
    index
}

#[test]
fn handler_sizes_native_sidecars_and_leaves_init_containers_alone() {
    use nodewarden_webhook::admission::{Processed, process};
    let handler = PodMutator::new(index_with_sidecars());
    let review = sidecar_review();
    let response = handler.review_raw(&request(&review));
    assert!(response.allowed);
    let patch = response.decoded_patch().expect("patch");
    let out = apply_ops(&review["request"]["object"], &patch);
    let init = &out["spec"]["initContainers"];
    assert_eq!(
        init[0], review["request"]["object"]["spec"]["initContainers"][0],
        "the run-to-completion init container is untouched"
    );
    assert_eq!(
        init[1]["resources"],
        json!({"requests": {"cpu": "20m", "memory": "48Mi"}, "limits": {"cpu": "40m", "memory": "96Mi"}}),
        "the sidecar gets its node's figures, its limit ratios kept"
    );
    assert_eq!(
        init[2]["resources"],
        json!({"requests": {"cpu": "10m", "memory": "16Mi"}}),
        "a sidecar without requests gets its node's figures as a container would"
    );
    assert_eq!(init[1]["restartPolicy"], json!("Always"));
    assert_eq!(
        out["spec"]["containers"][0]["resources"]["requests"],
        json!({"cpu": "300m", "memory": "100Mi"})
    );
    let annotations = &out["metadata"]["annotations"];
    let source = annotations[sizing::ANNOTATION_SOURCE].as_str().expect("source");
    assert_eq!(
        source,
        "agent=node-recommendation, log-forwarder=node-recommendation, mesh=node-recommendation"
    );
    assert!(!source.contains("setup"), "{source}");

    // the scheduler's request of the admitted pod: containers and sidecars summed (300m + 20m
    // + 10m of CPU), or setup's 1 CPU, which runs before the sidecars start and is more
    let pod: Pod = serde_json::from_value(out.clone()).expect("pod");
    let effective = sizing::effective_requests(pod.spec.as_ref().expect("spec"));
    assert_eq!(effective.cpu, Some(1000));
    assert_eq!(effective.memory, Some((100 + 48 + 16) << 20));

    // the one-pass read of the review answers the same
    let body = serde_json::to_vec(&review).expect("encodes");
    let Processed::Review(one_pass, _, _) = process(&body, &handler) else {
        panic!("not answered as a review");
    };
    assert_eq!(one_pass.response, response);

    // the webhook on its own output changes no resources
    let mut again = review.clone();
    again["request"]["object"] = out.clone();
    let second = handler.review_raw(&request(&again));
    let twice = apply_ops(&out, &second.decoded_patch().expect("patch"));
    assert_eq!(twice["spec"], out["spec"]);
}

#[test]
fn a_sidecar_policy_applies_by_name_as_to_a_container() {
    let index = index_with_sidecars();
    index.apply_autoscaler(autoscaler(json!({"resourcePolicy": {"containerPolicies": [
        {"containerName": "log-forwarder", "mode": "Off"},
        {"containerName": "mesh", "controlledResources": ["memory"], "minAllowed": {"memory": "24Mi"}}
    ]}})));
    let handler = PodMutator::new(index);
    let review = sidecar_review();
    let response = handler.review_raw(&request(&review));
    let out = apply_ops(
        &review["request"]["object"],
        &response.decoded_patch().expect("patch"),
    );
    let init = &out["spec"]["initContainers"];
    assert_eq!(
        init[1], review["request"]["object"]["spec"]["initContainers"][1],
        "mode Off leaves the sidecar as the template says"
    );
    assert_eq!(init[2]["resources"], json!({"requests": {"memory": "24Mi"}}));
    let annotations = &out["metadata"]["annotations"];
    assert!(
        annotations[sizing::ANNOTATION_SOURCE]
            .as_str()
            .expect("source")
            .contains("log-forwarder=policy-off"),
        "{annotations}"
    );
    assert!(
        annotations[sizing::ANNOTATION_CAPPED]
            .as_str()
            .expect("capped")
            .contains("mesh: memory minAllowed"),
        "{annotations}"
    );
}
