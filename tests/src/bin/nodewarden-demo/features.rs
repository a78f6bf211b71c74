//! The demo's feature lifecycle section (KEP-3920): one Feature goes On → TurningOff → Off.
//! The NodeFeatureReports of two nodes are written here directly, as their agents would; the
//! webhook's leader-elected controller moves the Feature.

use std::time::{Duration, Instant};

use anyhow::Result;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use nodewarden_api::features::{
    ComponentReport, Feature, FeatureState, GateState, NodeFeatureReport, NodeFeatureReportSpec,
};
use nodewarden_tests::ControlPlane;
use serde_json::json;

use super::step;

const FEATURE_NAMESPACE: &str = "kube-system";
const FEATURE: &str = "demo-glow";
const GATE: &str = "DemoGlow";

async fn report(admin: &Client, node: &str, enabled: bool) -> Result<()> {
    let api: Api<NodeFeatureReport> = Api::all(admin.clone());
    let r = NodeFeatureReport::new(
        node,
        NodeFeatureReportSpec {
            components: vec![ComponentReport {
                name: "kubelet".into(),
                observed_time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
                error: None,
                error_reason: None,
                gates: vec![GateState {
                    name: GATE.into(),
                    enabled,
                    stage: "ALPHA".into(),
                }],
            }],
        },
    );
    api.patch(
        node,
        &PatchParams::apply("nodewarden-demo").force(),
        &Patch::Apply(&r),
    )
    .await?;
    Ok(())
}

async fn wait_for(cp: &ControlPlane, features: &Api<Feature>, want: FeatureState) -> Result<Feature> {
    cp.poll(&format!("Feature {FEATURE} to be {want:?}"), || {
        let features = features.clone();
        async move {
            let f = features.get(FEATURE).await?;
            Ok((f.status.as_ref().and_then(|s| s.state) == Some(want)).then_some(f))
        }
    })
    .await
}

fn uses(f: &Feature) -> String {
    f.status
        .as_ref()
        .and_then(|s| s.uses_summary.clone())
        .unwrap_or_default()
}

/// Times in the API have whole seconds; a report counts for a transition from the next second on.
async fn next_second() {
    tokio::time::sleep(Duration::from_millis(1100)).await;
}

pub async fn features(cp: &ControlPlane, admin: &Client) -> Result<()> {
    step(&format!(
        "feature lifecycle: Feature {FEATURE_NAMESPACE}/{FEATURE} (gate {GATE}), reported by the kubelets of 2 nodes"
    ));
    let nodes = ["gates-node-1", "gates-node-2"];
    for node in nodes {
        report(admin, node, true).await?;
    }
    let features: Api<Feature> = Api::namespaced(admin.clone(), FEATURE_NAMESPACE);
    let feature: Feature = serde_json::from_value(json!({
        "apiVersion": "nodewarden.io/v1alpha1", "kind": "Feature",
        "metadata": {"name": FEATURE},
        "spec": {"desired": "On", "gate": GATE, "stage": "Alpha", "components": ["kubelet"]}
    }))?;
    let t = Instant::now();
    features.create(&PostParams::default(), &feature).await?;
    let f = wait_for(cp, &features, FeatureState::On).await?;
    println!(
        "    created desired On   -> On          in {:>6} ms  uses: {}",
        t.elapsed().as_millis(),
        uses(&f)
    );

    next_second().await;
    let t = Instant::now();
    features
        .patch(
            FEATURE,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"desired": "Off"}})),
        )
        .await?;
    let f = wait_for(cp, &features, FeatureState::TurningOff).await?;
    let waiting = f
        .status
        .as_ref()
        .and_then(|s| s.tasks.first())
        .and_then(|task| task.message.clone())
        .unwrap_or_default();
    println!(
        "    set desired Off      -> TurningOff  in {:>6} ms  uses: {}",
        t.elapsed().as_millis(),
        uses(&f)
    );
    println!("                            WaitForReports: {waiting}");

    next_second().await;
    report(admin, nodes[0], false).await?;
    let f = cp
        .poll("the first node's report to count", || {
            let features = features.clone();
            async move {
                let f = features.get(FEATURE).await?;
                Ok(uses(&f).starts_with("kubelet 1/2 off").then_some(f))
            }
        })
        .await?;
    println!(
        "    {} reports off -> {:?}  after {:>6} ms  uses: {}",
        nodes[0],
        f.status
            .as_ref()
            .and_then(|s| s.state)
            .unwrap_or(FeatureState::TurningOff),
        t.elapsed().as_millis(),
        uses(&f)
    );
    report(admin, nodes[1], false).await?;
    let f = wait_for(cp, &features, FeatureState::Off).await?;
    println!(
        "    {:<28} -> {:<10}  after {:>5} ms  uses: {}",
        format!("{} reports off", nodes[1]),
        "Off",
        t.elapsed().as_millis(),
        uses(&f)
    );
    Ok(())
}
