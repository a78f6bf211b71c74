//! End-to-end: per-node right-sizing (KEP-4943) on the real control plane.
//!
//! Three Ready fake Nodes and a DaemonSet over them. The agents of nodes A and B publish their
//! `NodeRecommendation`s with node-bound service-account tokens (a pod bound to each node, a
//! TokenRequest bound to that pod), as the real agent does; node C has none. The webhook runs
//! in this process through `nodewarden_webhook::run` with real flags and the admin kubeconfig;
//! kube-apiserver calls it for the DaemonSet pods the real DaemonSet controller creates and
//! applies its patch. Then: the node-reports guard refuses node A's token for node B's report;
//! cold start with `Template` and with `Fleet`; with the webhook stopped, pods are still
//! created, as the template says (`failurePolicy: Ignore`). A second test groups nodes by
//! instance type (`coldStart: Group`): new nodes get their group's figure, also after the
//! group's nodes are gone.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use nodewarden_api::rightsizing::{DaemonSetAutoscaler, NodeRecommendation, NodeRecommendationSpec};
use nodewarden_tests::process::{free_ports, write_file};
use nodewarden_tests::{
    Hook, LoopbackEndpoint, TestEnv, apply_crds, chart_crd_files, create_ready_node,
    daemonset_pod_target_node, e2e, read_crds, register_mutating_webhooks, register_validating_webhooks,
    simple_daemonset, wait_for_daemonset_pods,
};
use nodewarden_webhook::config::Config;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

const AGENT_SA: &str = "agent";
const DS: &str = "node-agent";
/// The label on this file's NodeRecommendations naming the test that wrote them: the tests run
/// at once on one control plane, and each one's guard must see its own reports only.
const TEST_LABEL: &str = "e2e.nodewarden.io/test";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemonset_pods_get_their_node_figures() {
    e2e("rightsizing", |env| async move {
        apply_crds(env.cp, &env.client, &read_crds(&chart_crd_files()?)?).await?;
        let nodes = env.create_nodes(3).await?;
        let (a, b, c) = (nodes[0].clone(), nodes[1].clone(), nodes[2].clone());
        grant_agent_writes(&env).await?;

        let webhook = Webhook::serving(&env).await?;

        // the agents of A and B publish, each with a token bound to a pod on its own node
        let agent_a = agent_client(&env, &a).await?;
        let agent_b = agent_client(&env, &b).await?;
        publish(&env, &agent_a, &a, "250m", "300Mi")
            .await
            .context("agent A publishes NodeRecommendation/A")?;
        publish(&env, &agent_b, &b, "500m", "200Mi")
            .await
            .context("agent B publishes NodeRecommendation/B")?;

        // the node-reports guard: A's token cannot write B's recommendation
        let err = publish(&env, &agent_a, &b, "4", "4Gi").await.err();
        let message = denial(err)?;
        let agent_user = format!("system:serviceaccount:{}:{AGENT_SA}", env.namespace);
        ensure!(
            message
                == format!(
                    "admission webhook \"node-reports.nodewarden.io\" denied the request: NodeRecommendation/{b} can only be \
                     written by the nodewarden agent on node {b}: the token of {agent_user} is bound to node {a}, not {b}"
                ),
            "unexpected denial: {message}"
        );

        let autoscalers: Api<DaemonSetAutoscaler> = env.api();
        autoscalers
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "nodewarden.io/v1alpha1",
                    "kind": "DaemonSetAutoscaler",
                    "metadata": {"name": DS},
                    "spec": {"targetRef": {"kind": "DaemonSet", "name": DS}, "coldStart": "Template"},
                }))?,
            )
            .await?;
        // a second autoscaler for the same DaemonSet is refused
        let why = second_autoscaler_denial(&autoscalers).await?;
        ensure!(
            why.ends_with(&format!(
                "spec.targetRef.name: DaemonSet {}/{DS} is already right-sized by DaemonSetAutoscaler {DS}; one autoscaler per DaemonSet",
                env.namespace
            )),
            "{why}"
        );

        // the leader's status controller sees both recommendations; so do the webhook's caches
        let status = wait_for_status(&env, |s| s["nodesWithRecommendation"] == 2).await?;
        ensure!(
            status["fleet"]
                == json!([{"containerName": "agent", "target": {"cpu": "500m", "memory": "300Mi"},
                           "median": {"cpu": "250m", "memory": "200Mi"}}]),
            "fleet figure: {status}"
        );
        // the condition is an Event on the autoscaler (what `kubectl describe dsa` lists)
        let provided = status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "RecommendationProvided")
            .and_then(|c| c["reason"].as_str())
            .ok_or_else(|| anyhow!("no RecommendationProvided condition: {status}"))?
            .to_string();
        let note = env.wait_for_event("DaemonSetAutoscaler", DS, &provided).await?;
        ensure!(note.starts_with("RecommendationProvided is True"), "{note}");

        // InPlace: the status says whether this cluster resizes in place (pods/resize is served
        // by default from 1.33); where it does not, it names the version and the gate, and an
        // Event says it once
        autoscalers
            .patch(
                DS,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"updatePolicy": {"updateMode": "InPlace"}}})),
            )
            .await?;
        let status = wait_for_status(&env, |s| {
            s["conditions"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|c| c["type"] == "InPlaceResize"))
        })
        .await?;
        let resize = status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "InPlaceResize")
            .cloned()
            .unwrap_or_default();
        let version = env.cp.kube_version().to_string();
        let message = resize["message"].as_str().unwrap_or_default();
        let reason = resize["reason"].as_str().unwrap_or_default();
        if env.cp.kube_version().resize_by_default() {
            ensure!(resize["status"] == "True" && reason == "ResizeServed", "{resize}");
        } else {
            ensure!(resize["status"] == "False" && reason == "ResizeNotServed", "{resize}");
            for said in [version.as_str(), "InPlacePodVerticalScaling", "acts as Recreate"] {
                ensure!(message.contains(said), "{said} missing from the condition: {message}");
            }
        }
        ensure!(message.contains(&version), "the condition names the version: {message}");
        let note = env.wait_for_event("DaemonSetAutoscaler", DS, reason).await?;
        ensure!(note.starts_with("InPlaceResize is "), "{note}");
        let ds = env.api::<DaemonSet>();
        ds.create(&PostParams::default(), &simple_daemonset(DS, &env.node_selector())?)
            .await?;
        let pods = wait_for_daemonset_pods(env.cp, &env.client, &env.namespace, DS, &nodes).await?;
        expect_resources(&pods[&a], ("250m", "300Mi"), ("500m", "600Mi"))?;
        expect_resources(&pods[&b], ("500m", "200Mi"), ("1", "400Mi"))?;
        expect_resources(&pods[&c], ("100m", "64Mi"), ("200m", "128Mi"))?;
        expect_annotation(&pods[&a], "rightsizing.nodewarden.io/source", "agent=node-recommendation")?;
        expect_annotation(&pods[&a], "rightsizing.nodewarden.io/node", &a)?;
        expect_annotation(&pods[&c], "rightsizing.nodewarden.io/source", "agent=cold-start-template")?;

        // coldStart Fleet: C's next pod gets the fleet figure (p90 of A and B)
        autoscalers
            .patch(DS, &PatchParams::default(), &Patch::Merge(json!({"spec": {"coldStart": "Fleet"}})))
            .await?;
        let fleet_pod = recreate_until(&env, &c, &nodes, |p| {
            p.annotations().get("rightsizing.nodewarden.io/source").map(String::as_str) == Some("agent=fleet")
        })
        .await
        .context("C's pod with the fleet figure")?;
        expect_resources(&fleet_pod, ("500m", "300Mi"), ("1", "600Mi"))?;

        // without the webhook, pods are still created, as the template says
        webhook.stop().await?;
        let plain = recreate_until(&env, &a, &nodes, |_| true).await?;
        expect_resources(&plain, ("100m", "64Mi"), ("200m", "128Mi"))?;
        ensure!(
            !plain.annotations().keys().any(|k| k.starts_with("rightsizing.nodewarden.io/")),
            "a pod created without the webhook has right-sizing annotations: {:?}",
            plain.annotations()
        );
        Ok(())
    })
    .await;
}

/// A VerticalPodAutoscaler on the same DaemonSet (docs/vpa.md): while it updates pods
/// (`updateMode: Auto`), the autoscaler's condition `VPAConflict` is True and names it (a Warning
/// Event says it once), and the webhook leaves new pods as the template says, with an annotation
/// saying why; once the VPA only recommends (`updateMode: Off`), the condition turns False and new
/// pods get their node's figures again. The VPA API is a CustomResourceDefinition of VPA's group
/// and kind with an open schema, as far as nodewarden reads it (`spec.targetRef`,
/// `spec.updatePolicy.updateMode`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vpa_that_updates_the_daemonsets_pods_is_given_way_until_it_only_recommends() {
    e2e("rightsizing-vpa", |env| async move {
        let mut crds = read_crds(&chart_crd_files()?)?;
        crds.push(serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            // a *.k8s.io group needs the approval VPA's own CRD carries
            "metadata": {"name": "verticalpodautoscalers.autoscaling.k8s.io",
                         "annotations": {"api-approved.kubernetes.io": "https://github.com/kubernetes/kubernetes/pull/63797"}},
            "spec": {
                "group": "autoscaling.k8s.io", "scope": "Namespaced",
                "names": {"kind": "VerticalPodAutoscaler", "plural": "verticalpodautoscalers",
                          "singular": "verticalpodautoscaler", "listKind": "VerticalPodAutoscalerList",
                          "shortNames": ["vpa"]},
                "versions": [{"name": "v1", "served": true, "storage": true,
                              "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                  "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                                  "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}],
            },
        }))?);
        apply_crds(env.cp, &env.client, &crds).await?;
        let nodes = env.create_nodes(1).await?;
        let a = nodes[0].clone();
        grant_agent_writes(&env).await?;
        let webhook = Webhook::serving(&env).await?;
        let agent_a = agent_client(&env, &a).await?;
        publish(&env, &agent_a, &a, "250m", "300Mi").await?;

        let vpas: Api<kube::api::DynamicObject> = Api::namespaced_with(
            env.client.clone(),
            &env.namespace,
            &kube::api::ApiResource::from_gvk_with_plural(
                &kube::api::GroupVersionKind::gvk("autoscaling.k8s.io", "v1", "VerticalPodAutoscaler"),
                "verticalpodautoscalers",
            ),
        );
        // what a VPA user has: the DaemonSet's own VPA, updating its pods
        vpas.create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "autoscaling.k8s.io/v1", "kind": "VerticalPodAutoscaler",
                "metadata": {"name": "agent-vpa"},
                "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": DS},
                         "updatePolicy": {"updateMode": "Auto"}},
            }))?,
        )
        .await?;
        let autoscalers: Api<DaemonSetAutoscaler> = env.api();
        autoscalers
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "nodewarden.io/v1alpha1", "kind": "DaemonSetAutoscaler",
                    "metadata": {"name": DS},
                    "spec": {"targetRef": {"kind": "DaemonSet", "name": DS}},
                }))?,
            )
            .await?;
        let vpa_condition = |s: &serde_json::Value| {
            s["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "VPAConflict")
                .cloned()
        };
        let status = wait_for_status(&env, |s| {
            vpa_condition(s).is_some_and(|c| c["status"] == "True") && s["nodesWithRecommendation"] == 1
        })
        .await?;
        let conflict = vpa_condition(&status).unwrap_or_default();
        let message = conflict["message"].as_str().unwrap_or_default().to_string();
        ensure!(
            conflict["reason"] == "VPAUpdatesPods"
                && message.contains("VerticalPodAutoscaler agent-vpa (updateMode Auto)")
                && message.contains("updateMode to Off"),
            "{conflict}"
        );
        let note = env.wait_for_event("DaemonSetAutoscaler", DS, "VPAUpdatesPods").await?;
        ensure!(note.starts_with("VPAConflict is True"), "{note}");

        // the webhook leaves the pod to the VPA (the template's requests), and says why
        env.api::<DaemonSet>()
            .create(&PostParams::default(), &simple_daemonset(DS, &env.node_selector())?)
            .await?;
        // (the webhook's watch of the autoscaler may trail the status just read by milliseconds:
        // a pod is made again until the webhook has seen the condition, 15 s at most)
        let yielded = recreate_until(&env, &a, &nodes, |p| {
            p.annotations().contains_key("rightsizing.nodewarden.io/skipped")
        })
        .await?;
        expect_resources(&yielded, ("100m", "64Mi"), ("200m", "128Mi"))?;
        expect_annotation(
            &yielded,
            "rightsizing.nodewarden.io/skipped",
            &format!("resources left as the template says: {message}"),
        )?;

        // the VPA only recommends: nodewarden sizes the pods again
        vpas.patch(
            "agent-vpa",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"updatePolicy": {"updateMode": "Off"}}})),
        )
        .await?;
        let status = wait_for_status(&env, |s| vpa_condition(s).is_some_and(|c| c["status"] == "False")).await?;
        ensure!(
            vpa_condition(&status).is_some_and(|c| c["reason"] == "VPARecommendsOnly"),
            "{status}"
        );
        let sized = recreate_until(&env, &a, &nodes, |p| {
            !p.annotations().contains_key("rightsizing.nodewarden.io/skipped")
        })
        .await?;
        expect_resources(&sized, ("250m", "300Mi"), ("500m", "600Mi"))?;
        webhook.stop().await?;
        Ok(())
    })
    .await;
}

/// Node groups (`coldStart: Group`, nodes grouped by instance type): a node of each type with
/// history, then a new node of each type whose pod gets its group's figure; then the nodes
/// with history are deleted (and their recommendations with them, as the garbage collector
/// does for the real agent's, which the Node owns), the groups keep their figures in the
/// autoscaler's status, and a pod on another new node still gets its group's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_nodes_get_their_group_figure_after_the_group_nodes_are_gone() {
    const TYPE: &str = "node.kubernetes.io/instance-type";
    e2e("rightsizing-groups", |env| async move {
        apply_crds(env.cp, &env.client, &read_crds(&chart_crd_files()?)?).await?;
        grant_agent_writes(&env).await?;
        let node = |name: &str, kind: &str| {
            let env = &env;
            let name = format!("{}-{name}", env.id);
            let kind = kind.to_string();
            async move {
                let mut labels = env.node_selector();
                labels.insert("kubernetes.io/hostname".to_string(), name.clone());
                labels.insert(TYPE.to_string(), kind);
                create_ready_node(env.cp, &env.client, &name, labels).await?;
                anyhow::Ok(name)
            }
        };
        let big_old = node("big-0", "big").await?;
        let small_old = node("small-0", "small").await?;

        let webhook = Webhook::serving(&env).await?;

        publish(
            &env,
            &agent_client(&env, &big_old).await?,
            &big_old,
            "800m",
            "400Mi",
        )
        .await?;
        publish(
            &env,
            &agent_client(&env, &small_old).await?,
            &small_old,
            "200m",
            "100Mi",
        )
        .await?;
        let autoscalers: Api<DaemonSetAutoscaler> = env.api();
        autoscalers
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "nodewarden.io/v1alpha1",
                    "kind": "DaemonSetAutoscaler",
                    "metadata": {"name": DS},
                    "spec": {"targetRef": {"kind": "DaemonSet", "name": DS},
                             "coldStart": "Group", "nodeGroupLabel": TYPE},
                }))?,
            )
            .await?;
        let figure = |cpu: &str, memory: &str| {
            json!([{"containerName": "agent", "target": {"cpu": cpu, "memory": memory},
                    "median": {"cpu": cpu, "memory": memory}}])
        };
        let groups = |s: &serde_json::Value| -> Vec<(String, i64, serde_json::Value)> {
            s["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|g| {
                    (
                        g["value"].as_str().unwrap_or_default().to_string(),
                        g["nodes"].as_i64().unwrap_or(-1),
                        g["containers"].clone(),
                    )
                })
                .collect()
        };
        let both = vec![
            ("big".to_string(), 1, figure("800m", "400Mi")),
            ("small".to_string(), 1, figure("200m", "100Mi")),
        ];
        let status = wait_for_status(&env, |s| groups(s) == both).await?;
        ensure!(status["nodeGroupLabel"] == TYPE, "{status}");

        // a new node of each type: its pod gets its group's figure
        let big_new = node("big-1", "big").await?;
        let small_new = node("small-1", "small").await?;
        let mut nodes = vec![
            big_old.clone(),
            small_old.clone(),
            big_new.clone(),
            small_new.clone(),
        ];
        env.api::<DaemonSet>()
            .create(
                &PostParams::default(),
                &simple_daemonset(DS, &env.node_selector())?,
            )
            .await?;
        let pods = wait_for_daemonset_pods(env.cp, &env.client, &env.namespace, DS, &nodes).await?;
        expect_resources(&pods[&big_old], ("800m", "400Mi"), ("1600m", "800Mi"))?;
        expect_annotation(
            &pods[&big_old],
            "rightsizing.nodewarden.io/source",
            "agent=node-recommendation",
        )?;
        // the webhook may see a pod before it sees its brand-new Node's labels (that pod gets the
        // fleet figure); the DaemonSet's next pod there has them
        let from_group = |p: &Pod| {
            p.annotations()
                .get("rightsizing.nodewarden.io/source")
                .map(String::as_str)
                == Some("agent=group")
        };
        let big_pod = recreate_until(&env, &big_new, &nodes, from_group).await?;
        expect_resources(&big_pod, ("800m", "400Mi"), ("1600m", "800Mi"))?;
        let small_pod = recreate_until(&env, &small_new, &nodes, from_group).await?;
        expect_resources(&small_pod, ("200m", "100Mi"), ("400m", "200Mi"))?;

        // the nodes with history go, and their recommendations with them
        let pp = DeleteParams::default();
        for old in [&big_old, &small_old] {
            Api::<k8s_openapi::api::core::v1::Node>::all(env.client.clone())
                .delete(old, &pp)
                .await?;
            Api::<NodeRecommendation>::all(env.client.clone())
                .delete(old, &pp)
                .await?;
            // the DaemonSet controller may have deleted the pod of a gone node already
            match env.api::<Pod>().delete(&pods[old].name_any(), &pp).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(err) => return Err(err.into()),
            }
        }
        nodes.retain(|n| n != &big_old && n != &small_old);
        let kept = vec![
            ("big".to_string(), 0, figure("800m", "400Mi")),
            ("small".to_string(), 0, figure("200m", "100Mi")),
        ];
        // (once the webhook has seen both deletions: no node left, no fleet figure)
        wait_for_status(&env, |s| {
            groups(s) == kept && s["nodesWithRecommendation"] == 0 && s.get("fleet").is_none()
        })
        .await
        .context("the groups keep their figures once their nodes are gone")?;

        // a node of a known type that joins now still starts from its group's figure
        let big_later = node("big-2", "big").await?;
        nodes.push(big_later.clone());
        let later_pod = recreate_until(&env, &big_later, &nodes, from_group).await?;
        expect_resources(&later_pod, ("800m", "400Mi"), ("1600m", "800Mi"))?;
        webhook.stop().await?;
        Ok(())
    })
    .await;
}

/// The agent's service account and its right to write NodeRecommendations (so that what refuses
/// a write is the guard, not RBAC).
/// `kubectl nodewarden report` shows, for each node, the requests the webhook gives a new pod of
/// the DaemonSet there: one rule for both, over every scope, cold start, ceiling and cap. Four
/// nodes in two groups (`big`, `small`); three have recommendations, the last none; a LimitRange
/// keeps every container's CPU limit at or under 1 (so, with the template's 2:1 limit, its
/// request at or under 500m). Six autoscalers, one per DaemonSet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_shows_what_the_webhook_gives_each_node() {
    const TYPE: &str = "node.kubernetes.io/instance-type";
    e2e("rightsizing-report", |env| async move {
        apply_crds(env.cp, &env.client, &read_crds(&chart_crd_files()?)?).await?;
        let mut nodes = Vec::new();
        for (i, kind) in ["big", "big", "small", "small"].into_iter().enumerate() {
            let name = format!("{}-n{i}", env.id);
            let mut labels = env.node_selector();
            labels.insert("kubernetes.io/hostname".to_string(), name.clone());
            labels.insert(TYPE.to_string(), kind.to_string());
            create_ready_node(env.cp, &env.client, &name, labels).await?;
            nodes.push(name);
        }
        env.api::<k8s_openapi::api::core::v1::LimitRange>()
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": "cpu-limit"},
                    "spec": {"limits": [{"type": "Container", "max": {"cpu": "1"}}]},
                }))?,
            )
            .await?;

        let webhook = Webhook::serving(&env).await?;

        let cases: [(&str, serde_json::Value); 6] = [
            ("node-template", json!({"coldStart": "Template"})),
            ("node-fleet", json!({"coldStart": "Fleet"})),
            (
                "group-scope",
                json!({"scope": "NodeGroup", "nodeGroupLabel": TYPE, "coldStart": "Group"}),
            ),
            (
                "group-cold",
                json!({"coldStart": "Group", "nodeGroupLabel": TYPE}),
            ),
            ("ceiling", json!({"coldStart": "Fleet", "ceiling": "Template"})),
            (
                "bounded",
                json!({"coldStart": "Fleet", "resourcePolicy": {"containerPolicies": [
                    {"containerName": "*", "maxAllowed": {"cpu": "300m"}, "minAllowed": {"memory": "96Mi"}}
                ]}}),
            ),
        ];
        // what each node's agent published, for every autoscaler (the last node: nothing)
        let figures = [("400m", "300Mi"), ("700m", "100Mi"), ("50m", "40Mi")];
        for (node, (cpu, memory)) in nodes.iter().zip(figures) {
            let entries = cases
                .iter()
                .map(|(name, _)| {
                    nodewarden_tests::target_recommendation(&env.namespace, name, "agent", cpu, memory)
                })
                .collect();
            let rec = NodeRecommendation::new(
                node,
                NodeRecommendationSpec {
                    update_time: None,
                    pods: Vec::new(),
                    summary: None,
                    recommendations: entries,
                },
            );
            Api::<NodeRecommendation>::all(env.client.clone())
                .create(&PostParams::default(), &rec)
                .await?;
        }
        let autoscalers: Api<DaemonSetAutoscaler> = env.api();
        for (name, extra) in &cases {
            let mut spec = json!({"targetRef": {"kind": "DaemonSet", "name": name}});
            if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
                spec.extend(extra.clone());
            }
            autoscalers
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(json!({
                        "apiVersion": "nodewarden.io/v1alpha1",
                        "kind": "DaemonSetAutoscaler",
                        "metadata": {"name": name},
                        "spec": spec,
                    }))?,
                )
                .await?;
        }
        // every status counts the three nodes (fleet and group figures are in), then the DaemonSets
        for (name, _) in &cases {
            let api = autoscalers.clone();
            env.cp
                .poll(&format!("the status of {name}"), || {
                    let api = api.clone();
                    async move {
                        let status = api.get(name).await?.status.unwrap_or_default();
                        Ok((status.nodes_with_recommendation == Some(3)).then_some(()))
                    }
                })
                .await?;
        }
        let ds = env.api::<DaemonSet>();
        for (name, _) in &cases {
            ds.create(
                &PostParams::default(),
                &simple_daemonset(name, &env.node_selector())?,
            )
            .await?;
        }

        let mut pods_of = BTreeMap::new();
        for (name, _) in &cases {
            let pods = wait_for_daemonset_pods(env.cp, &env.client, &env.namespace, name, &nodes).await?;
            pods_of.insert(*name, pods);
        }
        let report: serde_json::Value = serde_json::from_str(
            &nodewarden_tests::kubectl_nodewarden(&[
                "report",
                "--kubeconfig",
                &env.cp.kubeconfig_path().display().to_string(),
                "-n",
                &env.namespace,
                "-o",
                "json",
            ])
            .await?,
        )?;
        // The webhook's cache follows the statuses and recommendations through its watches, so
        // the pods above may have been admitted before it had them all. Until it has, a dry-run
        // copy of each pod (as its DaemonSet's template makes it) is answered with other figures
        // than the report's; once every copy gets the report's figures, the pods are made again.
        let template = simple_daemonset("template", &env.node_selector())?;
        let template_resources = template
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|s| s.containers.first())
            .and_then(|c| c.resources.clone());
        let pods_api = env.api::<Pod>();
        let last = std::sync::Mutex::new(String::new());
        let probed = env
            .cp
            .poll("dry-run copies of every pod get the report's figures", || {
                let (pods_api, pods_of, report, nodes, last) = (&pods_api, &pods_of, &report, &nodes, &last);
                let template_resources = template_resources.clone();
                async move {
                    for (name, pods) in pods_of {
                        for node in nodes {
                            let mut copy = pods[node].clone();
                            copy.metadata = kube::api::ObjectMeta {
                                generate_name: Some(format!("{name}-probe-")),
                                labels: copy.metadata.labels.take(),
                                owner_references: copy.metadata.owner_references.take(),
                                ..Default::default()
                            };
                            copy.status = None;
                            if let Some(c) = copy.spec.as_mut().and_then(|s| s.containers.first_mut()) {
                                c.resources = template_resources.clone();
                            }
                            let answered = pods_api
                                .create(
                                    &PostParams {
                                        dry_run: true,
                                        ..Default::default()
                                    },
                                    &copy,
                                )
                                .await?;
                            let target = report_row(report, name, node)?["target"].clone();
                            let given = requests_json(&answered)?;
                            if given != target {
                                *last.lock().unwrap_or_else(|p| p.into_inner()) =
                                    format!("{name} on {node}: report {target}, dry run {given}");
                                return Ok(None);
                            }
                        }
                    }
                    Ok(Some(()))
                }
            })
            .await;
        if let Err(e) = probed {
            bail!(
                "{e}: last difference: {}",
                last.lock().unwrap_or_else(|p| p.into_inner())
            );
        }
        for pods in pods_of.values() {
            for pod in pods.values() {
                pods_api
                    .delete(
                        &pod.name_any(),
                        &DeleteParams {
                            grace_period_seconds: Some(0),
                            ..Default::default()
                        },
                    )
                    .await?;
            }
        }
        for (name, _) in &cases {
            let pods = wait_for_daemonset_pods(env.cp, &env.client, &env.namespace, name, &nodes).await?;
            let before = &pods_of[name];
            ensure!(
                pods.iter().all(|(node, p)| p.uid() != before[node].uid()),
                "{name}: every pod was made again"
            );
            pods_of.insert(*name, pods);
        }
        let mut compared = 0;
        for (name, _) in &cases {
            let pods = &pods_of[name];
            for node in &nodes {
                let row = report_row(&report, name, node)?;
                let pod = &pods[node];
                let given = requests_json(pod)?;
                ensure!(
                    row["target"] == given,
                    "{name} on {node}: the report says {}, the webhook gave the new pod {given} \
                     (source {}, annotations {:?})",
                    row["target"],
                    row["sourceDetail"],
                    pod.annotations()
                );
                let annotated = pod
                    .annotations()
                    .get("rightsizing.nodewarden.io/source")
                    .cloned()
                    .unwrap_or_default();
                ensure!(
                    Some(annotated.as_str())
                        == row["sourceDetail"]
                            .as_str()
                            .map(|s| format!("agent={s}"))
                            .as_deref(),
                    "{name} on {node}: the report's source {} is not the pod's {annotated}",
                    row["sourceDetail"]
                );
                compared += 1;
            }
        }
        ensure!(compared == cases.len() * nodes.len(), "compared {compared} rows");
        // the rule's outcomes differ across the cases, so the comparison covered them
        let targets: std::collections::BTreeSet<String> = report["daemonsets"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|d| d["rows"].as_array().cloned().unwrap_or_default())
            .map(|r| format!("{}/{}", r["source"], r["target"]))
            .collect();
        ensure!(targets.len() >= 8, "too few distinct outcomes: {targets:?}");
        webhook.stop().await
    })
    .await;
}

/// The `kubectl nodewarden report -o json` row for `autoscaler`'s container `agent` on `node`.
fn report_row<'a>(
    report: &'a serde_json::Value,
    autoscaler: &str,
    node: &str,
) -> Result<&'a serde_json::Value> {
    let rows = report["daemonsets"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|d| d["autoscaler"] == autoscaler)
        .map(|d| &d["rows"])
        .ok_or_else(|| anyhow!("no report for {autoscaler}: {report}"))?;
    rows.as_array()
        .into_iter()
        .flatten()
        .find(|r| r["node"] == node && r["container"] == "agent")
        .ok_or_else(|| anyhow!("{autoscaler}: no row for {node}: {rows}"))
}

/// A pod's first container's requests as the report writes a target.
fn requests_json(pod: &Pod) -> Result<serde_json::Value> {
    let (cpu, memory) = nodewarden_tests::shipper::container_requests(pod)?;
    Ok(json!({"cpuMillis": cpu, "memoryBytes": memory}))
}

async fn grant_agent_writes(env: &TestEnv) -> Result<()> {
    let pp = PostParams::default();
    Api::<ServiceAccount>::namespaced(env.client.clone(), &env.namespace)
        .create(
            &pp,
            &serde_json::from_value(json!({"metadata": {"name": AGENT_SA}}))?,
        )
        .await?;
    let role = format!("{}-agent", env.id);
    Api::<ClusterRole>::all(env.client.clone())
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": {"name": role},
                "rules": [{"apiGroups": ["nodewarden.io"], "resources": ["noderecommendations"],
                           "verbs": ["get", "create", "update", "patch"]}],
            }))?,
        )
        .await?;
    Api::<ClusterRoleBinding>::all(env.client.clone())
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": {"name": role},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": AGENT_SA, "namespace": env.namespace}],
            }))?,
        )
        .await?;
    Ok(())
}

/// A client with the agent's token bound to a pod on `node`.
async fn agent_client(env: &TestEnv, node: &str) -> Result<Client> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": format!("agent-{node}")},
        "spec": {
            "nodeName": node,
            "serviceAccountName": AGENT_SA,
            "containers": [{"name": "agent", "image": "nodewarden-e2e/pause:never-pulled"}],
        },
    }))?;
    let pod = env.api::<Pod>().create(&PostParams::default(), &pod).await?;
    let uid = pod.uid().ok_or_else(|| anyhow!("pod without uid"))?;
    let token = env
        .cp
        .service_account_token(&env.namespace, AGENT_SA, Some((&pod.name_any(), &uid)))
        .await?;
    env.cp.client_with_token(&token).await
}

async fn publish(env: &TestEnv, client: &Client, node: &str, cpu: &str, memory: &str) -> Result<()> {
    let rec = NodeRecommendation::new(
        node,
        NodeRecommendationSpec {
            update_time: None,
            pods: Vec::new(),
            summary: None,
            recommendations: vec![nodewarden_tests::target_recommendation(
                &env.namespace,
                DS,
                "agent",
                cpu,
                memory,
            )],
        },
    );
    let mut rec = rec;
    rec.metadata.labels = Some(BTreeMap::from([(TEST_LABEL.to_string(), env.id.clone())]));
    Api::<NodeRecommendation>::all(client.clone())
        .create(&PostParams::default(), &rec)
        .await?;
    Ok(())
}

fn denial(err: Option<anyhow::Error>) -> Result<String> {
    let err = err.ok_or_else(|| anyhow!("expected a denial, but the API server accepted the write"))?;
    match err.downcast_ref::<kube::Error>() {
        Some(kube::Error::Api(status)) if status.code == 403 || status.code == 422 => {
            Ok(status.message.clone())
        }
        _ => Err(err.context("expected an admission denial")),
    }
}

/// Creates a second autoscaler for the DaemonSet and returns the denial. The webhook's cache
/// shows the first autoscaler a moment after it is written: while the second one is accepted
/// (for at most 10 s), it is deleted and created again.
async fn second_autoscaler_denial(autoscalers: &Api<DaemonSetAutoscaler>) -> Result<String> {
    let second: DaemonSetAutoscaler = serde_json::from_value(json!({
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "DaemonSetAutoscaler",
        "metadata": {"name": "another"},
        "spec": {"targetRef": {"kind": "DaemonSet", "name": DS}},
    }))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match autoscalers.create(&PostParams::default(), &second).await {
            Err(err) => return denial(Some(err.into())),
            Ok(_) if Instant::now() > deadline => {
                bail!("a second autoscaler for the same DaemonSet was accepted")
            }
            Ok(_) => {
                autoscalers.delete("another", &DeleteParams::default()).await?;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

async fn wait_for_status(
    env: &TestEnv,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> Result<serde_json::Value> {
    let api: Api<DaemonSetAutoscaler> = env.api();
    env.cp
        .poll("the autoscaler status", || {
            let api = api.clone();
            let ok = &ok;
            async move {
                let a = api.get(DS).await?;
                let status = serde_json::to_value(a.status.unwrap_or_default())?;
                Ok(ok(&status).then_some(status))
            }
        })
        .await
}

/// Deletes the DaemonSet's pod on `node` until the controller's replacement satisfies `ok`
/// (at most 15 s: the webhook's cache may take a moment to show a change); returns it.
async fn recreate_until(
    env: &TestEnv,
    node: &str,
    nodes: &[String],
    ok: impl Fn(&Pod) -> bool,
) -> Result<Pod> {
    let pods = env.api::<Pod>();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let before = wait_for_daemonset_pods(env.cp, &env.client, &env.namespace, DS, nodes).await?;
        let old = before.get(node).ok_or_else(|| anyhow!("no pod on {node}"))?;
        pods.delete(&old.name_any(), &DeleteParams::default()).await?;
        let old_uid = old.uid();
        let new = env
            .cp
            .poll(&format!("a new pod on {node}"), || {
                let pods = pods.clone();
                let old_uid = old_uid.clone();
                async move {
                    let list = pods.list(&Default::default()).await?;
                    Ok(list.items.into_iter().find(|p| {
                        daemonset_pod_target_node(p).as_deref() == Some(node)
                            && p.uid() != old_uid
                            && p.owner_references().iter().any(|o| o.kind == "DaemonSet")
                    }))
                }
            })
            .await?;
        if ok(&new) {
            return Ok(new);
        }
        if Instant::now() > deadline {
            bail!(
                "the pod on {node} never came out as expected; last: {:?}",
                new.annotations()
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn expect_resources(pod: &Pod, requests: (&str, &str), limits: (&str, &str)) -> Result<()> {
    let resources = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.resources.clone())
        .unwrap_or_default();
    let get = |list: &Option<BTreeMap<String, Quantity>>, r: &str| {
        list.as_ref()
            .and_then(|l| l.get(r))
            .map(|q| q.0.clone())
            .unwrap_or_default()
    };
    let got = (
        (
            get(&resources.requests, "cpu"),
            get(&resources.requests, "memory"),
        ),
        (get(&resources.limits, "cpu"), get(&resources.limits, "memory")),
    );
    let want = (
        (requests.0.to_string(), requests.1.to_string()),
        (limits.0.to_string(), limits.1.to_string()),
    );
    ensure!(
        got == want,
        "pod {} for node {:?}: (requests, limits) {got:?}, want {want:?}; annotations {:?}",
        pod.name_any(),
        daemonset_pod_target_node(pod),
        pod.annotations()
    );
    Ok(())
}

fn expect_annotation(pod: &Pod, key: &str, want: &str) -> Result<()> {
    let got = pod.annotations().get(key).map(String::as_str);
    ensure!(
        got == Some(want),
        "pod {}: annotation {key} is {got:?}, want {want:?}",
        pod.name_any()
    );
    Ok(())
}

async fn register(env: &TestEnv, port: u16) -> Result<()> {
    let endpoint = LoopbackEndpoint {
        port,
        ca_pem: env.cp.ca_pem().to_string(),
    };
    let pods = Hook::pods().only_namespace(&env.namespace);
    register_mutating_webhooks(
        &env.client,
        &format!("{}-rightsizing", env.id),
        &endpoint,
        &[pods],
    )
    .await?;
    let mut reports = Hook::node_reports();
    reports.timeout_seconds = 5;
    // NodeRecommendations are cluster-scoped: this test's guard sees only this test's
    reports.object_selector = Some(serde_json::from_value(
        json!({"matchLabels": {TEST_LABEL: env.id}}),
    )?);
    let autoscalers = Hook::autoscalers().only_namespace(&env.namespace);
    register_validating_webhooks(
        &env.client,
        &format!("{}-rightsizing", env.id),
        &endpoint,
        &[reports, autoscalers],
    )
    .await?;
    Ok(())
}

struct Webhook {
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<()>>,
    /// Its serving certificate's folder (read again while it runs).
    _certs: Option<tempfile::TempDir>,
}

impl Webhook {
    /// The webhook in this process on free loopback ports, with a serving certificate of the
    /// cluster CA, once ready, and registered with kube-apiserver for this test's objects.
    async fn serving(env: &TestEnv) -> Result<Self> {
        let ports = free_ports(2)?;
        let certs = tempfile::tempdir()?;
        let cert = env.cp.issue_loopback_serving_cert()?;
        write_file(&certs.path().join("tls.crt"), cert.cert_pem.as_bytes(), false)?;
        write_file(&certs.path().join("tls.key"), cert.key_pem.as_bytes(), true)?;
        let mut webhook = Webhook::start(env, certs.path(), ports[0], ports[1]).await?;
        webhook._certs = Some(certs);
        register(env, ports[0]).await?;
        Ok(webhook)
    }

    async fn start(env: &TestEnv, cert_dir: &Path, listen_port: u16, admin_port: u16) -> Result<Self> {
        let args = vec![
            "nodewarden-webhook".to_string(),
            format!("--listen-addr=127.0.0.1:{listen_port}"),
            format!("--admin-addr=127.0.0.1:{admin_port}"),
            format!("--tls-cert-file={}", cert_dir.join("tls.crt").display()),
            format!("--tls-key-file={}", cert_dir.join("tls.key").display()),
            format!("--kubeconfig={}", env.cp.kubeconfig_path().display()),
            format!("--namespace={}", env.namespace),
            "--pod-name=e2e-rightsizing".to_string(),
            format!("--agent-service-account={}:{AGENT_SA}", env.namespace),
            "--rightsizing-status-interval=300ms".to_string(),
            "--shutdown-grace=2s".to_string(),
        ];
        let config = Config::from_args(&args).map_err(|e| anyhow!("webhook flags: {e}"))?;
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(nodewarden_webhook::run(config, shutdown.clone()));
        let webhook = Webhook {
            shutdown,
            task,
            _certs: None,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match readyz(admin_port).await {
                Ok(200) => return Ok(webhook),
                _ if Instant::now() > deadline => bail!("webhook not ready after 60 s"),
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
            if webhook.task.is_finished() {
                bail!("the webhook exited while starting");
            }
        }
    }

    async fn stop(self) -> Result<()> {
        self.shutdown.cancel();
        self.task.await.context("webhook task")?.context("webhook run")
    }
}

async fn readyz(port: u16) -> Result<u16> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("not an HTTP answer: {answer:?}"))
}

/// Native sidecars (init containers with `restartPolicy: Always`) through the real DaemonSet
/// controller: on each node with figures, the created pod's sidecars (one without requests in the
/// template) and its container have that node's requests, its run-to-completion init container
/// the template's although a figure for it was published; on the node without figures, the
/// template's. The report marks the sidecar rows, never the init container, and the pod request
/// it says each node needs is the created pod's as the scheduler counts it (KEP-753): the
/// containers plus the sidecars, or the init phase's peak (the init container plus the sidecars
/// started before it) where that is higher. Figures are picked so that one node is held up by
/// the init container and the other by its containers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_sidecars_get_their_node_figures() {
    e2e("rightsizing-sidecars", |env| async move {
        apply_crds(env.cp, &env.client, &read_crds(&chart_crd_files()?)?).await?;
        let nodes = env.create_nodes(3).await?;
        let webhook = Webhook::serving(&env).await?;

        // each of the first two nodes' agents measured the container and both sidecars, and (as
        // no agent would publish, but to show it is not used) the init container; the third
        // node has nothing
        let entry = |container: &str, (cpu, memory): (&str, &str)| nodewarden_tests::target_recommendation(&env.namespace, DS, container, cpu, memory);
        // (agent, log-forwarder, mesh) per node
        let figures = [
            [("300m", "200Mi"), ("40m", "48Mi"), ("30m", "24Mi")],
            [("900m", "400Mi"), ("60m", "64Mi"), ("20m", "16Mi")],
        ];
        for (node, [agent, forwarder, mesh]) in nodes.iter().zip(figures) {
            let rec = NodeRecommendation::new(
                node,
                NodeRecommendationSpec {
                    update_time: None,
                    pods: Vec::new(),
                    summary: None,
                    recommendations: vec![
                        entry("agent", agent),
                        entry("log-forwarder", forwarder),
                        entry("mesh", mesh),
                        entry("setup", ("5m", "8Mi")),
                    ],
                },
            );
            Api::<NodeRecommendation>::all(env.client.clone())
                .create(&PostParams::default(), &rec)
                .await?;
        }
        let autoscalers: Api<DaemonSetAutoscaler> = env.api();
        autoscalers
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "nodewarden.io/v1alpha1",
                    "kind": "DaemonSetAutoscaler",
                    "metadata": {"name": DS},
                    "spec": {"targetRef": {"kind": "DaemonSet", "name": DS}, "coldStart": "Template"},
                }))?,
            )
            .await?;
        wait_for_status(&env, |s| s["nodesWithRecommendation"] == 2).await?;

        // the sidecar log-forwarder starts first, then the run-to-completion setup (the
        // forwarder runs beside it), then the sidecar mesh, without requests
        let mut ds: DaemonSet = simple_daemonset(DS, &env.node_selector())?;
        let spec = ds
            .spec
            .as_mut()
            .and_then(|s| s.template.spec.as_mut())
            .ok_or_else(|| anyhow!("no pod template"))?;
        spec.init_containers = Some(serde_json::from_value(json!([
            {"name": "log-forwarder", "image": "nodewarden-e2e/pause:never-pulled", "restartPolicy": "Always",
             "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}}},
            {"name": "setup", "image": "nodewarden-e2e/pause:never-pulled",
             "resources": {"requests": {"cpu": "800m", "memory": "32Mi"}}},
            {"name": "mesh", "image": "nodewarden-e2e/pause:never-pulled", "restartPolicy": "Always"}
        ]))?);
        env.api::<DaemonSet>().create(&PostParams::default(), &ds).await?;
        let mut pods = wait_for_daemonset_pods(env.cp, &env.client, &env.namespace, DS, &nodes).await?;
        // the webhook's caches follow the statuses through their watches: a pod admitted before
        // they caught up is replaced until its node's figures are in
        let sized = "agent=node-recommendation, log-forwarder=node-recommendation, mesh=node-recommendation";
        let cold = "agent=cold-start-template, log-forwarder=cold-start-template, mesh=cold-start-template";
        for (node, want) in nodes.iter().zip([sized, sized, cold]) {
            let source = |p: &Pod| p.annotations().get("rightsizing.nodewarden.io/source").cloned();
            if source(&pods[node]).as_deref() != Some(want) {
                let pod = recreate_until(&env, node, &nodes, |p| source(p).as_deref() == Some(want)).await?;
                pods.insert(node.clone(), pod);
            }
        }

        let resources = |pod: &Pod, name: &str| -> serde_json::Value {
            pod.spec
                .as_ref()
                .and_then(|s| s.containers.iter().chain(s.init_containers.iter().flatten()).find(|c| c.name == name))
                .map(|c| serde_json::to_value(&c.resources).unwrap_or_default())
                .unwrap_or_default()
        };
        // what each pod's containers run with: requests as the node's figures (limits keep the
        // template's ratio, 2), setup always the template's
        let want = [
            [
                json!({"requests": {"cpu": "300m", "memory": "200Mi"}, "limits": {"cpu": "600m", "memory": "400Mi"}}),
                json!({"requests": {"cpu": "40m", "memory": "48Mi"}, "limits": {"cpu": "80m", "memory": "96Mi"}}),
                json!({"requests": {"cpu": "30m", "memory": "24Mi"}}),
            ],
            [
                json!({"requests": {"cpu": "900m", "memory": "400Mi"}, "limits": {"cpu": "1800m", "memory": "800Mi"}}),
                json!({"requests": {"cpu": "60m", "memory": "64Mi"}, "limits": {"cpu": "120m", "memory": "128Mi"}}),
                json!({"requests": {"cpu": "20m", "memory": "16Mi"}}),
            ],
            [
                json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}}),
                json!({"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}}),
                // the API server defaults nothing for a sidecar without requests
                json!({}),
            ],
        ];
        for (node, [agent, forwarder, mesh]) in nodes.iter().zip(want) {
            let pod = &pods[node];
            for (name, want) in [("agent", agent), ("log-forwarder", forwarder), ("mesh", mesh)] {
                let got = resources(pod, name);
                ensure!(got == want, "{name} on {node}: {got}, want {want}");
            }
            let setup = resources(pod, "setup");
            ensure!(
                setup == json!({"requests": {"cpu": "800m", "memory": "32Mi"}}),
                "the init container on {node} is not the template's: {setup}"
            );
        }

        // what the scheduler reserves for each pod, worked out by hand (millicores, MiB):
        // node 0: containers 300+40+30 = 370 < setup's peak 800+40 = 840; memory 200+48+24 = 272
        // node 1: containers 900+60+20 = 980 > setup's peak 800+60 = 860; memory 400+64+16 = 480
        // node 2: the template's, 100+50+0 = 150 < 800+50 = 850; memory 64+32+0 = 96 > 32+32
        let scheduler = [(840, 272), (980, 480), (850, 96)];
        for (node, (cpu, mib)) in nodes.iter().zip(scheduler) {
            let effective = nodewarden_api::domain::sizing::effective_requests(
                pods[node].spec.as_ref().ok_or_else(|| anyhow!("no spec"))?,
            );
            ensure!(
                (effective.cpu, effective.memory) == (Some(cpu), Some(mib << 20)),
                "the pod on {node} counts {effective:?}, want {cpu}m and {mib}Mi"
            );
        }

        let report: serde_json::Value = serde_json::from_str(
            &nodewarden_tests::kubectl_nodewarden(&[
                "report",
                "--kubeconfig",
                &env.cp.kubeconfig_path().display().to_string(),
                "-n",
                &env.namespace,
                "-o",
                "json",
            ])
            .await?,
        )?;
        let ds_report = report["daemonsets"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|d| d["autoscaler"] == DS)
            .ok_or_else(|| anyhow!("no report for {DS}: {report}"))?;
        let mut rows: Vec<(String, String, bool)> = ds_report["rows"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| {
                (
                    r["node"].as_str().unwrap_or_default().to_string(),
                    r["container"].as_str().unwrap_or_default().to_string(),
                    r["sidecar"] == true,
                )
            })
            .collect();
        rows.sort();
        let mut want_rows: Vec<(String, String, bool)> = nodes
            .iter()
            .flat_map(|n| {
                [("agent", false), ("log-forwarder", true), ("mesh", true)]
                    .map(|(c, sidecar)| (n.clone(), c.to_string(), sidecar))
            })
            .collect();
        want_rows.sort();
        ensure!(rows == want_rows, "report rows (node, container, sidecar): {rows:?}");
        let by_node = |list: &serde_json::Value, node: &str, field: &str| -> Result<serde_json::Value> {
            list.as_array()
                .into_iter()
                .flatten()
                .find(|p| p["node"] == node)
                .map(|p| p[field].clone())
                .ok_or_else(|| anyhow!("no {field} for {node}: {list}"))
        };
        for (node, (cpu, mib)) in nodes.iter().zip(scheduler) {
            let want = json!({"cpuMillis": cpu, "memoryBytes": mib << 20});
            // the pods there run with their figures already: now and target are the same
            for field in ["current", "target"] {
                let pod = by_node(&ds_report["pods"], node, field)?;
                ensure!(pod == want, "{node}: the report's pod request {field} is {pod}, the scheduler's {want}");
                let total = by_node(&report["nodes"], node, field)?;
                ensure!(total == want, "{node}: the report's node {field} is {total}, the scheduler's {want}");
            }
        }
        let table = nodewarden_tests::kubectl_nodewarden(&[
            "report",
            "--kubeconfig",
            &env.cp.kubeconfig_path().display().to_string(),
            "-n",
            &env.namespace,
        ])
        .await?;
        ensure!(
            table.contains("log-forwarder (sidecar)")
                && table.contains("mesh (sidecar)")
                && !table.contains("setup")
                && !table.contains("agent (sidecar)"),
            "the table:\n{table}"
        );
        webhook.stop().await
    })
    .await;
}
