//! The CPU one hostile review costs, per route, at growing sizes: each size doubles the input,
//! so linear work doubles the time and quadratic work quadruples it.
//!
//! `cargo run --release -p nodewarden-webhook --example hostile-cpu [-- --max-bytes N]`
//!
//! Each line: the shape, its item count, its body size, and the time of one pass of the whole
//! pipeline (decode, decide, encode) on this thread, the best of three. Figures are in
//! docs/server.md.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nodewarden_api::rightsizing::{
    AutoscalerRef, ContainerRecommendation, DaemonSetAutoscaler, NodeRecommendation, NodeRecommendationSpec,
};
use nodewarden_webhook::admission::{Endpoint, Processed};
use nodewarden_webhook::rightsizing::{AutoscalerValidator, PodMutator, RightsizingCache};
use serde_json::{Value, json};

const NAMESPACE: &str = "shippers";
const NODE: &str = "node-1";

fn review(kind: Value, resource: Value, object: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": kind,
            "resource": resource,
            "namespace": NAMESPACE,
            "operation": "CREATE",
            "userInfo": {"username": "mallory"},
            "object": object,
        }
    }))
    .expect("review")
}

fn autoscaler_object(policies: Vec<Value>) -> Value {
    json!({
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "DaemonSetAutoscaler",
        "metadata": {"name": "shipper", "namespace": NAMESPACE},
        "spec": {
            "targetRef": {"kind": "DaemonSet", "name": "shipper"},
            "coldStart": "Fleet",
            "resourcePolicy": {"containerPolicies": policies},
        }
    })
}

fn autoscaler_review(policies: Vec<Value>) -> Vec<u8> {
    review(
        json!({"group": "nodewarden.io", "version": "v1alpha1", "kind": "DaemonSetAutoscaler"}),
        json!({"group": "nodewarden.io", "version": "v1alpha1", "resource": "daemonsetautoscalers"}),
        autoscaler_object(policies),
    )
}

fn pod_review(names: impl Iterator<Item = String>) -> Vec<u8> {
    let containers: Vec<Value> = names
        .map(|name| json!({"name": name, "image": "x", "resources": {"requests": {"cpu": "10m"}}}))
        .collect();
    review(
        json!({"group": "", "version": "v1", "kind": "Pod"}),
        json!({"group": "", "version": "v1", "resource": "pods"}),
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": "shipper-",
                "namespace": NAMESPACE,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "shipper",
                                     "uid": "d", "controller": true}],
            },
            "spec": {
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}}},
                "containers": containers,
            }
        }),
    )
}

/// An index with the `shipper` autoscaler (with `policies`) and a recommendation for `NODE`.
fn index(policies: Vec<Value>) -> Arc<RightsizingCache> {
    let index = RightsizingCache::new();
    let autoscaler: DaemonSetAutoscaler =
        serde_json::from_value(autoscaler_object(policies)).expect("autoscaler");
    index.apply_autoscaler(autoscaler);
    let target = |cpu: &str| {
        Some(
            [
                (
                    "cpu".to_string(),
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity(cpu.to_string()),
                ),
                (
                    "memory".to_string(),
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity("64Mi".to_string()),
                ),
            ]
            .into(),
        )
    };
    let recommendation = |name: &str| ContainerRecommendation {
        autoscaler: AutoscalerRef {
            namespace: NAMESPACE.to_string(),
            name: "shipper".to_string(),
        },
        container_name: name.to_string(),
        target: target("50m"),
        lower_bound: None,
        upper_bound: None,
        uncapped_target: None,
        sample_count: 10,
        first_sample_time: None,
        last_sample_time: None,
        oom_count: 0,
        capped: None,
    };
    index.apply_node_recommendation(&NodeRecommendation::new(
        NODE,
        NodeRecommendationSpec {
            update_time: None,
            pods: Vec::new(),
            summary: None,
            recommendations: vec![recommendation("c"), recommendation("c0")],
        },
    ));
    index
}

fn time_of(body: &[u8], handler: &dyn Endpoint) -> Duration {
    (0..3)
        .map(|_| {
            let started = Instant::now();
            let processed = handler.process(body);
            let took = started.elapsed();
            assert!(
                matches!(processed, Processed::Review(..)),
                "the review was answered"
            );
            took
        })
        .min()
        .unwrap_or_default()
}

fn main() {
    let max_bytes: usize = std::env::args()
        .skip_while(|a| a != "--max-bytes")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(6 * 1024 * 1024);
    let policy = |name: String| json!({"containerName": name, "minAllowed": {"cpu": "1m"}, "maxAllowed": {"cpu": "2"}});
    type Shape = (&'static str, Box<dyn Fn(usize) -> (Vec<u8>, Arc<dyn Endpoint>)>);
    let shapes: Vec<Shape> = vec![
        (
            "autoscaler, n policies of one name",
            Box::new(move |n| {
                let body = autoscaler_review((0..n).map(|_| policy("c".to_string())).collect());
                (
                    body,
                    Arc::new(AutoscalerValidator::new(index(Vec::new()))) as Arc<dyn Endpoint>,
                )
            }),
        ),
        (
            "autoscaler, n policies of n names",
            Box::new(move |n| {
                let body = autoscaler_review((0..n).map(|i| policy(format!("c{i}"))).collect());
                (
                    body,
                    Arc::new(AutoscalerValidator::new(index(Vec::new()))) as Arc<dyn Endpoint>,
                )
            }),
        ),
        (
            "pod, n containers of one name",
            Box::new(|n| {
                let body = pod_review((0..n).map(|_| "c".to_string()));
                (
                    body,
                    Arc::new(PodMutator::new(index(Vec::new()))) as Arc<dyn Endpoint>,
                )
            }),
        ),
        (
            "pod, n containers, autoscaler with n policies",
            Box::new(move |n| {
                let body = pod_review((0..n).map(|i| format!("c{i}")));
                let policies = (0..n).map(|i| policy(format!("p{i}"))).collect();
                (
                    body,
                    Arc::new(PodMutator::new(index(policies))) as Arc<dyn Endpoint>,
                )
            }),
        ),
    ];
    println!("{:<48} {:>8} {:>10} {:>10}", "shape", "n", "bytes", "ms");
    for (name, make) in &shapes {
        let mut n = 1000;
        loop {
            let (body, handler) = make(n);
            if body.len() > max_bytes {
                break;
            }
            let took = time_of(&body, handler.as_ref());
            println!(
                "{name:<48} {n:>8} {:>10} {:>10.1}",
                body.len(),
                took.as_secs_f64() * 1000.0
            );
            n *= 2;
        }
    }
}
