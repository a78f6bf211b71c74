//! AdmissionReviews as the API server posts them, through the webhook's own pipeline
//! (`admission::process`: decode, envelope checks, the route's handler, uid echo) for every
//! route. The first byte picks the route, the rest is the request body:
//!
//! 0 `/mutate/pods`, 1 `/validate/autoscalers`, 2 `/validate/claims`, 3 `/validate/features`,
//! 4 `/validate/node-reports`, 5 `/validate/evictions`.
//!
//! Handlers read in-memory caches filled here (an autoscaler for the recorded DaemonSet pod's
//! namespace and another for `shop`, a node recommendation, LimitRanges, Features that are off,
//! fixed claims and pods), so no API server is needed.
//!
//! `NODEWARDEN_FUZZ_SHOW=1` prints each input's outcome (run the binary on seed files to see
//! which paths they reach).
//!
//! Invariants, every route: the answer encodes, and the webhook writes it as serde does; its uid is the request's; a denial carries a
//! code and a message; warnings stay under 120 characters; only the pod route patches.
//! A body the usual decode refuses is denied as malformed (never decided in one pass).
//! Pod route: its one-pass answer is the one the handler gives the request decoded the usual way
//! (object raw, then the pod's view: `PodMutator::review_raw`);
//! the patch applies to the object; it removes no field the pod had; the pod it
//! makes, reviewed again, gets no further change (save the `capped` annotation's cap names).
//! Node reports: a write by someone outside the allowed groups is admitted only with a token
//! bound to the report's node. Evictions: the agent's eviction is admitted only of a pod on its
//! own node (or one that does not exist).
#![no_main]

use std::sync::{Arc, OnceLock};

use futures::future::BoxFuture;
use libfuzzer_sys::fuzz_target;
use nodewarden_api::domain::sizing::ANNOTATION_CAPPED;
use nodewarden_webhook::admission::{Endpoint, Outcome, Processed, ReviewIn};
use nodewarden_webhook::claims::{ClaimsGuard, ClaimsPolicy, Principals, Shape, StaticView};
use nodewarden_webhook::features::{FeatureCaches, FeaturesGuard};
use nodewarden_webhook::node_reports::evictions::{EvictionGuard, PodNode, PodNodes};
use nodewarden_webhook::node_reports::{NODE_NAME_EXTRA, NodeReportsGuard, NodeReportsPolicy};
use nodewarden_webhook::rightsizing::{AutoscalerValidator, PodMutator, RightsizingCache};
use serde_json::{Value, json};

const NAMESPACE: &str = "webhook-b8hcd8g";
const NODE: &str = "webhook-b8hcd8g-node-1";
const AGENT: &str = "system:serviceaccount:nodewarden:nodewarden-agent";
const MASTERS: &str = "system:masters";

struct Routes {
    pods: PodMutator,
    autoscalers: AutoscalerValidator,
    features: FeaturesGuard,
    node_reports: NodeReportsGuard,
    evictions: EvictionGuard,
}

fn from_json<T: serde::de::DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).expect("the target's own objects are well-formed")
}

fn autoscaler(
    namespace: &str,
    spec: Value,
    fleet: Value,
) -> nodewarden_api::rightsizing::DaemonSetAutoscaler {
    from_json(json!({
        "apiVersion": "nodewarden.io/v1alpha1", "kind": "DaemonSetAutoscaler",
        "metadata": {"name": "node-agent", "namespace": namespace},
        "spec": spec,
        "status": {"fleet": fleet},
    }))
}

fn routes() -> &'static Routes {
    static ROUTES: OnceLock<Routes> = OnceLock::new();
    ROUTES.get_or_init(|| {
        let index = RightsizingCache::new();
        // the recorded pod's namespace: every cap in play (policy min/max, ceiling, LimitRanges)
        index.apply_autoscaler(autoscaler(
            NAMESPACE,
            json!({
                "targetRef": {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "node-agent"},
                "updatePolicy": {"updateMode": "Initial"},
                "resourcePolicy": {"containerPolicies": [
                    {"containerName": "*", "minAllowed": {"cpu": "10m", "memory": "32Mi"},
                     "maxAllowed": {"cpu": "1", "memory": "512Mi"}},
                    {"containerName": "sidecar", "mode": "Off"}
                ]},
                "coldStart": "Fleet",
                "ceiling": "Template",
            }),
            json!([{"containerName": "helper", "target": {"cpu": "75m", "memory": "100Mi"}}]),
        ));
        // another namespace: requests only, template cold start, no ceiling, no LimitRange
        index.apply_autoscaler(autoscaler(
            "shop",
            json!({
                "targetRef": {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "node-agent"},
                "resourcePolicy": {"containerPolicies": [
                    {"containerName": "*", "controlledValues": "RequestsOnly", "controlledResources": ["memory"]}
                ]},
            }),
            json!([]),
        ));
        index.apply_node_recommendation(&from_json(json!({
            "apiVersion": "nodewarden.io/v1alpha1", "kind": "NodeRecommendation",
            "metadata": {"name": NODE},
            "spec": {"recommendations": [
                {"autoscaler": {"namespace": NAMESPACE, "name": "node-agent"}, "containerName": "agent",
                 "target": {"cpu": "250m", "memory": "300Mi"}},
                {"autoscaler": {"namespace": NAMESPACE, "name": "node-agent"}, "containerName": "sidecar",
                 "target": {"cpu": "5m", "memory": "1Gi"}},
                {"autoscaler": {"namespace": "shop", "name": "node-agent"}, "containerName": "agent",
                 "target": {"cpu": "3", "memory": "2Gi"}}
            ]}
        })));
        index.apply_limit_range(from_json(json!({
            "metadata": {"name": "limits", "namespace": NAMESPACE},
            "spec": {"limits": [
                {"type": "Container", "max": {"cpu": "2", "memory": "1Gi"}, "min": {"cpu": "5m"},
                 "default": {"cpu": "500m", "memory": "256Mi"}},
                {"type": "Pod", "max": {"cpu": "3", "memory": "2Gi"}}
            ]}
        })));

        let features = FeatureCaches::new();
        features.apply_feature(from_json(json!({
            "apiVersion": "nodewarden.io/v1alpha1", "kind": "Feature",
            "metadata": {"name": "sidecar-containers", "namespace": "kube-system", "generation": 1},
            "spec": {"desired": "Off", "gate": "SidecarContainers", "components": ["kubelet"], "fields": [
                {"group": "", "version": "v1", "resource": "pods",
                 "path": "spec.initContainers[*].restartPolicy", "onDisable": "Deny"}
            ]},
            "status": {"state": "Off"}
        })));
        features.apply_feature(from_json(json!({
            "apiVersion": "nodewarden.io/v1alpha1", "kind": "Feature",
            "metadata": {"name": "widget-tints", "namespace": "shop", "generation": 1},
            "spec": {"desired": "Off", "components": ["kubelet"], "fields": [
                {"group": "example.nodewarden.io", "version": "v1", "resource": "widgets",
                 "path": "spec.shades[*].tint.glow", "onDisable": "Warn"},
                {"group": "example.nodewarden.io", "version": "v1", "resource": "widgets",
                 "path": "spec.size", "onDisable": "Clear"}
            ]},
            "status": {"state": "TurningOff"}
        })));

        let policy = NodeReportsPolicy {
            agent_user: Some(AGENT.to_string()),
            allowed_groups: vec![MASTERS.to_string()],
        };
        Routes {
            pods: PodMutator::new(index.clone()),
            autoscalers: AutoscalerValidator::new(index),
            features: FeaturesGuard::new(features),
            node_reports: NodeReportsGuard::new(policy.clone()),
            evictions: EvictionGuard::new(policy, Arc::new(FixedPods)),
        }
    })
}

/// Pods the eviction guard reads: by name.
struct FixedPods;

impl FixedPods {
    fn node(name: &str) -> PodNode {
        match name {
            "on-node-1" => PodNode::Bound("node-1".to_string()),
            "on-node-2" => PodNode::Bound("node-2".to_string()),
            "unbound" => PodNode::Unbound,
            "gone" => PodNode::NotFound,
            _ => PodNode::Unknown("the API server did not answer".to_string()),
        }
    }
}

impl PodNodes for FixedPods {
    fn node_of<'a>(&'a self, _namespace: &'a str, name: &'a str) -> BoxFuture<'a, PodNode> {
        Box::pin(async move { FixedPods::node(name) })
    }
}

/// A claims guard with no memory of earlier inputs, so every crash reproduces from its input.
fn claims_guard() -> ClaimsGuard {
    let view = StaticView::empty()
        .with(Shape::Nodewarden, &["id.k8s.io"])
        .with(Shape::About, &["clusterset.k8s.io"])
        .without(Shape::OpenClusterManagement);
    let policy = ClaimsPolicy {
        principals: Principals::new(["admin".to_string()], ["claim-writers".to_string()], []),
        id_subdomain: false,
    };
    ClaimsGuard::new(policy, Arc::new(view), Arc::new(()))
}

/// Every JSON Pointer to a leaf of `value`.
fn leaves(value: &Value, at: String, out: &mut Vec<String>) {
    let escape = |s: &str| s.replace('~', "~0").replace('/', "~1");
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                leaves(v, format!("{at}/{}", escape(k)), out);
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

/// The review's answer, checked for what every route promises.
fn answer(
    route: u8,
    body: &[u8],
    handler: &dyn Endpoint,
) -> Option<(nodewarden_webhook::admission::AdmissionResponse, Outcome)> {
    let processed = if route == 5 {
        futures::executor::block_on(handler.process_async(body))
    } else {
        handler.process(body)
    };
    // a uid longer than the limit is never echoed: the answer is a 400 without it
    if let Some(request) = serde_json::from_slice::<ReviewIn>(body)
        .ok()
        .and_then(|r| r.request)
    {
        if request.uid.len() > nodewarden_webhook::admission::MAX_UID_BYTES {
            assert!(
                matches!(processed, Processed::BadRequest(_)),
                "a uid of {} bytes was echoed",
                request.uid.len()
            );
        }
    }
    let Processed::Review(out, outcome, _) = processed else {
        return None;
    };
    assert!(
        out.response.uid.len() <= nodewarden_webhook::admission::MAX_UID_BYTES,
        "an answer echoes a uid over the limit"
    );
    let encoded = serde_json::to_vec(&*out).expect("the answer encodes");
    assert_eq!(
        out.to_json().expect("the answer is written"),
        encoded,
        "the webhook writes the answer as serde does"
    );
    let decoded: Value = serde_json::from_slice(&encoded).expect("the answer is JSON");
    assert_eq!(decoded["apiVersion"], "admission.k8s.io/v1");
    let response = out.response;
    let usual = serde_json::from_slice::<ReviewIn>(body);
    // a body the usual decode refuses is answered as malformed on every route: the pod route's
    // one-pass read refuses it too, never decides it
    if usual.is_err() {
        assert!(
            !response.allowed,
            "a body the usual decode refuses was decided: {response:?}"
        );
    }
    if let Ok(ReviewIn {
        api_version,
        kind,
        request: Some(request),
    }) = usual
    {
        assert_eq!(response.uid, request.uid, "the uid is echoed");
        // the pod route decides in one pass over the body; its answer is the one the handler
        // gives the request decoded the usual way (raw object, then the pod's view)
        if route == 0
            && api_version == "admission.k8s.io/v1"
            && kind == "AdmissionReview"
            && !request.uid.is_empty()
        {
            assert_eq!(
                routes().pods.review_raw(&request),
                response,
                "the one-pass answer differs from the two-pass one"
            );
        }
    }
    assert!(!response.uid.is_empty());
    if !response.allowed {
        let status = response.status.as_ref().expect("a denial has a status");
        assert!(status.code.is_some() && !status.message.is_empty(), "{status:?}");
    }
    for warning in &response.warnings {
        assert!(warning.chars().count() < 120, "warning too long: {warning:?}");
    }
    if response.patch.is_some() {
        assert_eq!(route, 0, "only the pod route patches");
        assert_eq!(response.patch_type.as_deref(), Some("JSONPatch"));
        assert!(
            response.decoded_patch().is_some(),
            "the patch is base64 of a JSON Patch"
        );
    }
    Some((response, outcome))
}

fn check_pod(body: &[u8], response: &nodewarden_webhook::admission::AdmissionResponse) {
    let Some(patch) = response.decoded_patch() else {
        // the patch's text is written by hand (`AddPatch`): it must read as a JSON patch
        assert!(response.patch.is_none(), "the answer's patch is not a JSON patch");
        return;
    };
    // serde_json checks escapes only in what it reads into values: a review the webhook read
    // (skipping a field holding a lone surrogate `\ud800`) may not read as a whole JSON value.
    // The API server never sends one (Go writes invalid UTF-8 as U+FFFD).
    let Ok(mut review) = serde_json::from_slice::<Value>(body) else {
        return;
    };
    let original = review["request"]["object"].clone();
    let mut patched = original.clone();
    json_patch::patch(&mut patched, &patch).expect("the patch applies to the pod");
    let mut had = Vec::new();
    leaves(&original, String::new(), &mut had);
    for pointer in had {
        assert!(patched.pointer(&pointer).is_some(), "the patch removed {pointer}");
    }
    // the pod the patch made, reviewed again: nothing more to change
    review["request"]["object"] = patched.clone();
    let again = serde_json::to_vec(&review).expect("encodes");
    let Some((second, _)) = answer(0, &again, &routes().pods) else {
        panic!("the patched review is still a review");
    };
    if let Some(patch) = second.decoded_patch() {
        let mut twice = patched.clone();
        json_patch::patch(&mut twice, &patch).expect("the second patch applies");
        // save the capped annotation: it names the caps as the pod stood when reviewed, and
        // with `ceiling: Template` the second review's template is the patched request (a known
        // drift of the annotation only, see docs/fuzzing.md); the figures must not move
        let without_capped = |mut pod: Value| {
            if let Some(a) = pod
                .pointer_mut("/metadata/annotations")
                .and_then(Value::as_object_mut)
            {
                a.remove(ANNOTATION_CAPPED);
            }
            pod
        };
        assert_eq!(
            without_capped(twice),
            without_capped(patched),
            "a second review changed the pod again: {patch:?}"
        );
    }
}

/// An object's `metadata.name`, read the way the guards read it (the rest skipped).
#[derive(serde::Deserialize)]
struct Named {
    #[serde(default)]
    metadata: Option<NamedMeta>,
}

#[derive(serde::Deserialize)]
struct NamedMeta {
    #[serde(default)]
    name: Option<String>,
}

fn check_node_report(body: &[u8], allowed: bool) {
    let Ok(ReviewIn {
        request: Some(request),
        ..
    }) = serde_json::from_slice::<ReviewIn>(body)
    else {
        return;
    };
    let guarded = matches!(
        request.kind.kind.as_str(),
        "NodeRecommendation" | "NodeFeatureReport"
    ) && matches!(request.operation.as_str(), "CREATE" | "UPDATE")
        && !request.user_info.groups.iter().any(|g| g == MASTERS);
    if !(allowed && guarded) {
        return;
    }
    let name = request
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .or_else(|| request.object_as::<Named>().ok()?.metadata?.name)
        .expect("an admitted report has a name");
    assert_eq!(request.user_info.username, AGENT, "only the agent writes reports");
    let nodes = request
        .user_info
        .extra
        .get(NODE_NAME_EXTRA)
        .cloned()
        .unwrap_or_default();
    assert_eq!(nodes, vec![name], "a report is written only from its own node");
}

fn check_eviction(body: &[u8], allowed: bool) {
    let Ok(ReviewIn {
        request: Some(request),
        ..
    }) = serde_json::from_slice::<ReviewIn>(body)
    else {
        return;
    };
    let agent_eviction = request.user_info.username == AGENT
        && request.operation.as_str() == "CREATE"
        && request.resource.group.is_empty()
        && request.resource.resource == "pods"
        && request.sub_resource.as_deref() == Some("eviction");
    if !(allowed && agent_eviction) {
        return;
    }
    let name = request
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .or_else(|| request.object_as::<Named>().ok()?.metadata?.name);
    let nodes = request
        .user_info
        .extra
        .get(NODE_NAME_EXTRA)
        .cloned()
        .unwrap_or_default();
    match FixedPods::node(name.as_deref().unwrap_or_default()) {
        PodNode::NotFound => {}
        PodNode::Bound(node) => assert_eq!(nodes, vec![node], "the agent evicted a pod of another node"),
        other => panic!("the agent's eviction of a pod that is {other:?} was admitted"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    let routes = routes();
    let route = which % 6;
    let claims;
    let handler: &dyn Endpoint = match route {
        0 => &routes.pods,
        1 => &routes.autoscalers,
        2 => {
            claims = claims_guard();
            &claims
        }
        3 => &routes.features,
        4 => &routes.node_reports,
        _ => &routes.evictions,
    };
    let Some((response, outcome)) = answer(route, body, handler) else {
        return;
    };
    assert_ne!(outcome, Outcome::Error, "a handler panicked");
    // `NODEWARDEN_FUZZ_SHOW=1 <binary> <input>…`: what each input got, to see what a seed reaches
    static SHOW: OnceLock<bool> = OnceLock::new();
    if *SHOW.get_or_init(|| std::env::var_os("NODEWARDEN_FUZZ_SHOW").is_some()) {
        let message = response
            .status
            .as_ref()
            .map(|s| s.message.as_str())
            .unwrap_or_default();
        eprintln!(
            "route {route}: {outcome:?}, {} patch operations; {message}",
            response.decoded_patch().map_or(0, |p| p.0.len())
        );
    }
    match route {
        0 => check_pod(body, &response),
        4 => check_node_report(body, response.allowed),
        5 => check_eviction(body, response.allowed),
        _ => {}
    }
});
