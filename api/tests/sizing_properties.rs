//! Properties of the pod mutation (`nodewarden_api::domain::sizing::mutate`) over generated
//! pods, autoscalers, node and fleet targets and LimitRanges, checked on the pod the JSON Patch
//! makes (applied with the `json-patch` crate, as the API server would):
//!
//! * applying twice changes nothing: the patched pod, mutated again, gets no further change;
//! * user fields are never removed, and nothing outside the containers' `resources` and the
//!   `rightsizing.nodewarden.io/` annotations changes;
//! * caps are never exceeded: LimitRange container min/max always hold; `maxAllowed` and
//!   `minAllowed` hold unless a tighter cap named in the docs wins (a LimitRange, `ceiling:
//!   Template`, the limit under `RequestsOnly`); a LimitRange of type Pod bounds the pod's sum
//!   when nothing pushes a container back up;
//! * limits keep their request:limit ratio: new limit = ⌈old limit × new request / old request⌉,
//!   then at most the LimitRange max and never below the request (docs/rightsizing.md).
//!
//! Cases per property: `PROPTEST_CASES` or 256 (about a second each in a debug build).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{LimitRange, Pod};
use nodewarden_api::domain::sizing::{
    ANNOTATION_CAPPED, ANNOTATION_PREFIX, Amounts, Figures, MAX_SCALED_LIMIT, Targets, format_amount, mutate,
    sizing_on,
};
use nodewarden_api::rightsizing::{DaemonSetAutoscaler, ResourceName};
use proptest::prelude::*;
use serde_json::{Value, json};

const NODE: &str = "node-1";
const MI: u64 = 1 << 20;
const RESOURCES: [ResourceName; 2] = [ResourceName::Cpu, ResourceName::Memory];

/// One container of a generated pod: requests and limits (millicores, bytes), absent or set.
#[derive(Clone, Debug)]
struct GenContainer {
    requests: Amounts,
    limits: Amounts,
    /// Written as `1500m`/bytes rather than the canonical form (`1500m` for 1.5 cores is
    /// canonical; `1.5` and `1572864000` are what users write).
    plain: bool,
}

/// The container policy `*` of a generated autoscaler.
#[derive(Clone, Debug)]
struct GenPolicy {
    min: Amounts,
    max: Amounts,
    requests_only: bool,
    only: Option<ResourceName>,
    off_container: Option<usize>,
}

#[derive(Clone, Debug)]
struct GenRange {
    container_min: Amounts,
    container_max: Amounts,
    container_default: Amounts,
    pod_max: Amounts,
    pod_min: Amounts,
}

#[derive(Clone, Debug)]
struct Case {
    containers: Vec<GenContainer>,
    annotations: Option<BTreeMap<String, String>>,
    policy: Option<GenPolicy>,
    ceiling: bool,
    fleet_cold_start: bool,
    node: Option<Vec<Amounts>>,
    fleet: Vec<Amounts>,
    range: Option<GenRange>,
}

fn cpu() -> impl Strategy<Value = u64> {
    prop_oneof![1u64..=4000, Just(1000), (1u64..=8).prop_map(|c| c * 1000)]
}

fn memory() -> impl Strategy<Value = u64> {
    prop_oneof![(1u64..=4096).prop_map(|m| m * MI), 1u64..=(4u64 << 30)]
}

fn amounts() -> impl Strategy<Value = Amounts> {
    (proptest::option::of(cpu()), proptest::option::of(memory()))
        .prop_map(|(cpu, memory)| Amounts { cpu, memory })
}

/// Limits as a ratio of the requests (as users write them), or free.
fn container() -> impl Strategy<Value = GenContainer> {
    (
        amounts(),
        proptest::option::of(1u64..=40),
        amounts(),
        any::<bool>(),
    )
        .prop_map(|(requests, ratio_tenths, free, plain)| {
            let limits = match ratio_tenths {
                Some(r) => Amounts {
                    cpu: requests.cpu.map(|v| v * (10 + r) / 10),
                    memory: requests.memory.map(|v| v * (10 + r) / 10),
                },
                None => free,
            };
            GenContainer {
                requests,
                limits,
                plain,
            }
        })
}

/// A lower and an upper bound with lower ≤ upper, each optional; now and then equal.
fn bounds() -> impl Strategy<Value = (Amounts, Amounts)> {
    (amounts(), amounts(), proptest::bool::weighted(0.2)).prop_map(|(a, b, equal)| {
        let order = |x: Option<u64>, y: Option<u64>| match (x, y) {
            (Some(x), Some(_)) if equal => (Some(x), Some(x)),
            (Some(x), Some(y)) => (Some(x.min(y)), Some(x.max(y))),
            other => other,
        };
        let (cmin, cmax) = order(a.cpu, b.cpu);
        let (mmin, mmax) = order(a.memory, b.memory);
        (
            Amounts {
                cpu: cmin,
                memory: mmin,
            },
            Amounts {
                cpu: cmax,
                memory: mmax,
            },
        )
    })
}

fn policy() -> impl Strategy<Value = GenPolicy> {
    (
        bounds(),
        any::<bool>(),
        prop_oneof![
            Just(None),
            Just(Some(ResourceName::Cpu)),
            Just(Some(ResourceName::Memory))
        ],
        proptest::option::of(0usize..3),
    )
        .prop_map(|((min, max), requests_only, only, off_container)| GenPolicy {
            min,
            max,
            requests_only,
            only,
            off_container,
        })
}

fn range() -> impl Strategy<Value = GenRange> {
    (bounds(), amounts(), bounds()).prop_map(
        |((container_min, container_max), container_default, (pod_min, pod_max))| GenRange {
            container_min,
            container_max,
            container_default,
            pod_max,
            pod_min,
        },
    )
}

fn case() -> impl Strategy<Value = Case> {
    (
        proptest::collection::vec(container(), 1..=3),
        proptest::option::of(proptest::collection::btree_map(
            "[a-z]{1,3}(/[a-z~]{1,3})?",
            "[a-z ]{0,5}",
            0..3,
        )),
        proptest::option::of(policy()),
        any::<bool>(),
        any::<bool>(),
        proptest::option::of(proptest::collection::vec(amounts(), 3)),
        proptest::collection::vec(amounts(), 3),
        proptest::option::of(range()),
    )
        .prop_map(
            |(containers, annotations, policy, ceiling, fleet_cold_start, node, fleet, range)| Case {
                containers,
                annotations,
                policy,
                ceiling,
                fleet_cold_start,
                node,
                fleet,
                range,
            },
        )
}

fn name(i: usize) -> String {
    format!("c{i}")
}

/// A resource list as a user writes it: canonical, or millicores and plain bytes.
fn list(a: &Amounts, plain: bool) -> Value {
    let mut out = serde_json::Map::new();
    for r in RESOURCES {
        if let Some(v) = a.get(r) {
            let text = match (plain, r) {
                (true, ResourceName::Cpu) => format!("{v}m"),
                (true, ResourceName::Memory) => v.to_string(),
                (false, _) => format_amount(r, v),
            };
            out.insert(r.as_str().to_string(), json!(text));
        }
    }
    Value::Object(out)
}

fn pod_json(case: &Case) -> Value {
    let containers: Vec<Value> = case
        .containers
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut resources = serde_json::Map::new();
            if !c.requests.is_empty() {
                resources.insert("requests".into(), list(&c.requests, c.plain));
            }
            if !c.limits.is_empty() {
                resources.insert("limits".into(), list(&c.limits, c.plain));
            }
            let mut container = json!({"name": name(i), "image": "registry.invalid/app:1", "args": ["--x"]});
            if !resources.is_empty() || i % 2 == 0 {
                container["resources"] = Value::Object(resources);
            }
            container
        })
        .collect();
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "ds-abc", "namespace": "ns", "labels": {"app": "ds"}},
        "spec": {"nodeName": NODE, "containers": containers, "tolerations": [{"operator": "Exists"}]},
    });
    if let Some(a) = &case.annotations {
        pod["metadata"]["annotations"] = json!(a);
    }
    pod
}

fn autoscaler(case: &Case) -> DaemonSetAutoscaler {
    let mut policies = Vec::new();
    if let Some(p) = &case.policy {
        let mut star = json!({"containerName": "*"});
        if !p.min.is_empty() {
            star["minAllowed"] = list(&p.min, false);
        }
        if !p.max.is_empty() {
            star["maxAllowed"] = list(&p.max, false);
        }
        if p.requests_only {
            star["controlledValues"] = json!("RequestsOnly");
        }
        if let Some(only) = p.only {
            star["controlledResources"] = json!([only.as_str()]);
        }
        policies.push(star);
        if let Some(off) = p.off_container {
            policies.push(json!({"containerName": name(off), "mode": "Off"}));
        }
    }
    serde_json::from_value(json!({
        "apiVersion": "nodewarden.io/v1alpha1", "kind": "DaemonSetAutoscaler",
        "metadata": {"name": "a", "namespace": "ns"},
        "spec": {
            "targetRef": {"kind": "DaemonSet", "name": "ds"},
            "updatePolicy": {"updateMode": "Initial"},
            "resourcePolicy": {"containerPolicies": policies},
            "coldStart": if case.fleet_cold_start { "Fleet" } else { "Template" },
            "ceiling": if case.ceiling { "Template" } else { "None" },
        }
    }))
    .expect("generated autoscaler")
}

fn targets(amounts: &[Amounts]) -> Targets {
    amounts
        .iter()
        .enumerate()
        .filter(|(_, a)| !a.is_empty())
        .map(|(i, a)| (name(i), *a))
        .collect()
}

fn limit_ranges(case: &Case) -> Vec<LimitRange> {
    let Some(r) = &case.range else {
        return Vec::new();
    };
    let item = |kind: &str, fields: [(&str, &Amounts); 3]| {
        let mut item = json!({"type": kind});
        for (key, a) in fields {
            if !a.is_empty() {
                item[key] = list(a, false);
            }
        }
        item
    };
    let container = item(
        "Container",
        [
            ("min", &r.container_min),
            ("max", &r.container_max),
            ("default", &r.container_default),
        ],
    );
    let none = Amounts::default();
    let pod = item(
        "Pod",
        [("min", &r.pod_min), ("max", &r.pod_max), ("default", &none)],
    );
    vec![
        serde_json::from_value(json!({
            "metadata": {"name": "lr", "namespace": "ns"},
            "spec": {"limits": [container, pod]},
        }))
        .expect("generated limit range"),
    ]
}

struct Run {
    before: Value,
    after: Value,
    sizing: Vec<nodewarden_api::domain::sizing::ContainerSizing>,
}

fn run(case: &Case) -> Run {
    let before = pod_json(case);
    let pod: Pod = serde_json::from_value(before.clone()).expect("generated pod");
    let autoscaler = autoscaler(case);
    let node = case.node.as_deref().map(targets);
    let fleet = targets(&case.fleet);
    let ranges = limit_ranges(case);
    let figures = Figures {
        node: node.as_ref(),
        group: None,
        fleet: Some(&fleet),
    };
    let decision = mutate(&pod, &autoscaler, figures, &ranges);
    let mut after = before.clone();
    json_patch::patch(&mut after, &decision.patch.to_json_patch().expect("a patch"))
        .expect("the patch applies");
    let sizing = sizing_on(&pod, &autoscaler, figures, &ranges);
    Run {
        before,
        after,
        sizing,
    }
}

/// Requests and limits of container `i` of a pod (JSON).
fn resources_of(pod: &Value, i: usize) -> (Amounts, Amounts) {
    let pod: Pod = serde_json::from_value(pod.clone()).expect("pod");
    let c = &pod.spec.expect("spec").containers[i];
    let r = c.resources.as_ref();
    (
        Amounts::from_list(r.and_then(|r| r.requests.as_ref())),
        Amounts::from_list(r.and_then(|r| r.limits.as_ref())),
    )
}

/// Every JSON Pointer to a leaf.
fn leaves(value: &Value, at: String, out: &mut Vec<String>) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                leaves(
                    v,
                    format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")),
                    out,
                );
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for (i, v) in items.iter().enumerate() {
                leaves(v, format!("{at}/{i}"), out);
            }
        }
        _ => out.push(at),
    }
}

/// The capped annotation read back: per (container, resource), the caps named and the
/// recommendation (`c0: cpu maxAllowed+limit (recommended 2), memory …; c1: …`).
fn caps(pod: &Value) -> BTreeMap<(String, String), (std::collections::BTreeSet<String>, String)> {
    let text = pod["metadata"]["annotations"][ANNOTATION_CAPPED]
        .as_str()
        .unwrap_or_default();
    let mut out = BTreeMap::new();
    for container in text.split("; ").filter(|c| !c.is_empty()) {
        let (name, rest) = container.split_once(": ").expect("container: caps");
        for item in rest.split(", ") {
            let mut words = item.splitn(3, ' ');
            let (resource, names, recommended) = (
                words.next().unwrap_or_default(),
                words.next().unwrap_or_default(),
                words.next().unwrap_or_default(),
            );
            out.insert(
                (name.to_string(), resource.to_string()),
                (
                    names.split('+').map(str::to_string).collect(),
                    recommended.to_string(),
                ),
            );
        }
    }
    out
}

fn without_caps(mut pod: Value) -> Value {
    if let Some(a) = pod
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        a.remove(ANNOTATION_CAPPED);
    }
    pod
}

/// The pod without what the mutation may change: containers' `resources` and our annotations.
fn user_part(pod: &Value) -> Value {
    let mut pod = pod.clone();
    if let Some(containers) = pod["spec"]["containers"].as_array_mut() {
        for c in containers {
            if let Some(c) = c.as_object_mut() {
                c.remove("resources");
            }
        }
    }
    let Some(metadata) = pod.get_mut("metadata").and_then(Value::as_object_mut) else {
        return pod;
    };
    if let Some(annotations) = metadata.get_mut("annotations").and_then(Value::as_object_mut) {
        annotations.retain(|k, _| !k.starts_with(ANNOTATION_PREFIX));
        if annotations.is_empty() {
            metadata.remove("annotations");
        }
    }
    pod
}

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(256);
    ProptestConfig {
        cases,
        // the failure file would land in the source tree; the seed is printed instead
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// The patched pod, mutated again, gets a patch that changes nothing.
    #[test]
    fn applying_twice_changes_nothing(case in case()) {
        let first = run(&case);
        let pod: Pod = serde_json::from_value(first.after.clone()).expect("patched pod");
        let autoscaler = autoscaler(&case);
        let node = case.node.as_deref().map(targets);
        let fleet = targets(&case.fleet);
        let second = mutate(&pod, &autoscaler, Figures { node: node.as_ref(), group: None, fleet: Some(&fleet) }, &limit_ranges(&case));
        let mut twice = first.after.clone();
        json_patch::patch(&mut twice, &second.patch.to_json_patch().expect("a patch")).expect("the second patch applies");
        // The one exception: the capped annotation, which names the caps that bounded the
        // recommendation as the pod stood when reviewed. With `ceiling: Template` the second
        // review's template is the patched request, so `ceiling-template` may appear (the
        // recommendation is above the patched request) or go (a LimitRange min had overridden
        // it); the figures stay the same. The recommendation quoted stays the same too.
        let (once_caps, twice_caps) = (caps(&first.after), caps(&twice));
        for (key, (_, recommended)) in &twice_caps {
            if let Some((_, first_recommended)) = once_caps.get(key) {
                prop_assert_eq!(recommended, first_recommended);
            }
        }
        prop_assert_eq!(without_caps(twice), without_caps(first.after.clone()), "second patch {:?}", second.patch);
    }

    /// Every field the pod had is still there, and outside the containers' resources and
    /// nodewarden's own annotations nothing changed at all (user annotations included).
    #[test]
    fn user_fields_are_never_removed(case in case()) {
        let r = run(&case);
        let mut had = Vec::new();
        leaves(&r.before, String::new(), &mut had);
        for pointer in had {
            prop_assert!(r.after.pointer(&pointer).is_some(), "{} was removed", pointer);
        }
        prop_assert_eq!(user_part(&r.before), user_part(&r.after));
        // resources the decision does not cover keep their values
        for (i, c) in case.containers.iter().enumerate() {
            let (requests, limits) = resources_of(&r.after, i);
            let covered = r.sizing.iter().find(|s| s.name == name(i));
            for res in RESOURCES {
                if covered.is_none_or(|s| s.requests.get(res).is_none()) {
                    prop_assert_eq!(requests.get(res), c.requests.get(res));
                    prop_assert_eq!(limits.get(res), c.limits.get(res));
                }
            }
        }
    }

    /// LimitRange container min/max always hold; the policy's min/max hold unless a cap the
    /// docs put after them wins; a Pod LimitRange max bounds the sum when nothing raises a
    /// container back above its share.
    #[test]
    fn caps_are_never_exceeded(case in case()) {
        let r = run(&case);
        let range = case.range.as_ref();
        let policy = case.policy.as_ref();
        let mut pod_sum = [0u64; 2];
        for (i, c) in case.containers.iter().enumerate() {
            let (requests, limits) = resources_of(&r.after, i);
            let covered = r.sizing.iter().any(|s| s.name == name(i));
            for (k, res) in RESOURCES.into_iter().enumerate() {
                pod_sum[k] = pod_sum[k].saturating_add(requests.get(res).unwrap_or(0));
                let planned = covered && r.sizing.iter().any(|s| s.name == name(i) && s.requests.get(res).is_some());
                if !planned {
                    continue;
                }
                let request = requests.get(res).expect("a planned resource has a request");
                let lr_min = range.and_then(|g| g.container_min.get(res));
                let lr_max = range.and_then(|g| g.container_max.get(res));
                if let Some(max) = lr_max {
                    prop_assert!(request <= max, "{res:?} request {request} over LimitRange max {max}");
                    if let Some(limit) = limits.get(res).filter(|_| limits.get(res) != c.limits.get(res)) {
                        prop_assert!(limit <= max, "{res:?} limit {limit} over LimitRange max {max}");
                    }
                }
                if let Some(min) = lr_min {
                    prop_assert!(request >= min, "{res:?} request {request} under LimitRange min {min}");
                }
                let Some(p) = policy else { continue };
                if let Some(max) = p.max.get(res) && lr_min.is_none_or(|m| m <= max) {
                    prop_assert!(request <= max, "{res:?} request {request} over maxAllowed {max}");
                }
                if let Some(min) = p.min.get(res) {
                    let template = c.requests.get(res).filter(|_| case.ceiling);
                    let limit = if p.requests_only {
                        c.limits.get(res).or_else(|| range.and_then(|g| g.container_default.get(res)))
                    } else {
                        None
                    };
                    let lower_cap = [lr_max, template, limit].into_iter().flatten().min();
                    if lower_cap.is_none_or(|cap| cap >= min) {
                        prop_assert!(request >= min, "{res:?} request {request} under minAllowed {min}");
                    }
                }
            }
        }
        // the Pod max: when no container minimum can push a scaled-down container back up and
        // the containers the decision leaves alone fit under it
        if let Some(g) = range {
            for (k, res) in RESOURCES.into_iter().enumerate() {
                let Some(max) = g.pod_max.get(res) else { continue };
                let raisers = g.container_min.get(res).is_some()
                    || policy.is_some_and(|p| p.min.get(res).is_some());
                let others: u64 = case
                    .containers
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !r.sizing.iter().any(|s| s.name == name(*i) && s.requests.get(res).is_some()))
                    .filter_map(|(_, c)| c.requests.get(res))
                    .sum();
                if !raisers && others <= max {
                    prop_assert!(pod_sum[k] <= max, "{res:?} pod sum {} over Pod max {max}", pod_sum[k]);
                }
            }
        }
    }

    /// With `RequestsAndLimits` a limit follows its request in proportion, rounded up, then at
    /// most the LimitRange max and never below the request; with `RequestsOnly` it is left as is.
    #[test]
    fn limits_keep_their_ratio(case in case()) {
        let r = run(&case);
        for s in &r.sizing {
            let i: usize = s.name[1..].parse().expect("generated name");
            let c = &case.containers[i];
            let (requests, limits) = resources_of(&r.after, i);
            for res in RESOURCES {
                let Some(new_request) = s.requests.get(res) else { continue };
                prop_assert_eq!(requests.get(res), Some(new_request));
                let requests_only = case.policy.as_ref().is_some_and(|p| p.requests_only);
                if requests_only {
                    prop_assert_eq!(limits.get(res), c.limits.get(res), "RequestsOnly keeps the limit");
                    continue;
                }
                let default = case.range.as_ref().and_then(|g| g.container_default.get(res));
                let Some(old_limit) = c.limits.get(res).or(default) else {
                    prop_assert_eq!(limits.get(res), None, "no limit, none is set");
                    continue;
                };
                let lr_max = case.range.as_ref().and_then(|g| g.container_max.get(res));
                let scaled = match c.requests.get(res) {
                    Some(old) if old != old_limit && old > 0 => {
                        let exact = u128::from(old_limit) * u128::from(new_request);
                        let up = exact.div_ceil(u128::from(old));
                        // rounded up: within one unit of the exact ratio
                        prop_assert!(up * u128::from(old) >= exact);
                        prop_assert!(up == 0 || (up - 1) * u128::from(old) < exact);
                        u64::try_from(up).unwrap_or(u64::MAX).min(MAX_SCALED_LIMIT)
                    }
                    _ => new_request,
                };
                let want = lr_max.map_or(scaled, |m| scaled.min(m)).max(new_request);
                prop_assert_eq!(limits.get(res), Some(want), "{:?} limit of {}", res, s.name);
            }
        }
    }
}
