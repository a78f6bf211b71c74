//! The node agent against the real control plane: with a token bound to a pod on node X and the
//! chart's agent RBAC, it watches X's pods and the autoscalers, measures a synthetic cgroup tree
//! holding the autoscaled DaemonSet pod's container, and writes `NodeRecommendation/X`, owned by
//! Node X. Without write permission it keeps retrying and writes once permission arrives.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use nodewarden_agent::config::Config;
use nodewarden_api::rightsizing::{DaemonSetAutoscaler, NodeRecommendation};
use nodewarden_tests::helm::Helm;
use nodewarden_tests::{TestEnv, apply_crds, chart_crd_files, e2e, read_crds, simple_daemonset};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const CONTAINER_ID: &str = "5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed";
const MIB: u64 = 1024 * 1024;

/// The agent's ClusterRole rules as the chart renders them.
async fn chart_agent_rules() -> Result<Vec<PolicyRule>> {
    let helm = Helm::locate().await?;
    let rendered = helm.template("nw", "nw", &[] as &[&str]).await?;
    let role = rendered.get("ClusterRole", "nw-nodewarden-agent")?;
    Ok(serde_json::from_value(role["rules"].clone()).context("the chart's agent ClusterRole rules")?)
}

/// A cgroup v2 tree with the pod's container in it (systemd driver, containerd): 300 MiB in
/// use, 0 inactive file pages, CPU counter standing still.
fn synthetic_cgroup_tree(root: &Path, pod_uid: &str) -> Result<()> {
    std::fs::create_dir_all(root)?;
    std::fs::write(root.join("cgroup.controllers"), "cpuset cpu io memory pids\n")?;
    let scope = root
        .join("kubepods.slice/kubepods-burstable.slice")
        .join(format!(
            "kubepods-burstable-pod{}.slice",
            pod_uid.replace('-', "_")
        ))
        .join(format!("cri-containerd-{CONTAINER_ID}.scope"));
    std::fs::create_dir_all(&scope)?;
    std::fs::write(
        scope.join("cpu.stat"),
        "usage_usec 5000000\nuser_usec 4000000\nsystem_usec 1000000\n",
    )?;
    std::fs::write(scope.join("memory.current"), format!("{}\n", 300 * MIB))?;
    std::fs::write(
        scope.join("memory.stat"),
        "anon 314572800\nfile 0\ninactive_file 0\nactive_file 0\n",
    )?;
    std::fs::write(
        scope.join("memory.events"),
        "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
    )?;
    Ok(())
}

/// Upper edge of the default memory bucket holding `v` (first bucket 1e7 B, growth 5 %).
fn memory_bucket_edge(v: f64) -> f64 {
    let n = ((v * 0.05 / 1e7 + 1.0).ln() / 1.05f64.ln()).floor();
    1e7 * (1.05f64.powf(n + 1.0) - 1.0) / 0.05
}

async fn set_rules(env: &TestEnv, name: &str, rules: Vec<PolicyRule>) -> Result<()> {
    let roles: Api<ClusterRole> = Api::all(env.client.clone());
    let role = ClusterRole {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        rules: Some(rules),
        ..Default::default()
    };
    roles
        .patch(
            name,
            &PatchParams::apply("nodewarden-e2e").force(),
            &Patch::Apply(&role),
        )
        .await?;
    Ok(())
}

#[tokio::test]
async fn agent_with_a_token_bound_to_a_pod_on_node_x_writes_node_recommendation_x() {
    e2e("agent-publish", |env| async move {
        let cp = env.cp;
        let ns = env.namespace.clone();
        apply_crds(cp, &env.client, &read_crds(&chart_crd_files()?)?).await?;
        let node = env.create_nodes(1).await?.remove(0);
        let node_uid = Api::<Node>::all(env.client.clone())
            .get(&node)
            .await?
            .uid()
            .ok_or_else(|| anyhow!("node without uid"))?;

        // The agent's identity: a service account with the chart's rules, minus the write of
        // NodeRecommendation for now.
        let full_rules = chart_agent_rules().await?;
        let read_only: Vec<PolicyRule> = full_rules
            .iter()
            .filter(|r| !r.resources.iter().flatten().any(|x| x == "noderecommendations"))
            .cloned()
            .collect();
        assert!(read_only.len() < full_rules.len(), "the chart lets the agent write noderecommendations");
        let role_name = format!("{}-agent", env.id);
        set_rules(&env, &role_name, read_only).await?;
        let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "nodewarden-agent"}}))?;
        env.api::<ServiceAccount>().create(&PostParams::default(), &sa).await?;
        let binding: ClusterRoleBinding = serde_json::from_value(json!({
            "metadata": {"name": role_name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
            "subjects": [{"kind": "ServiceAccount", "name": "nodewarden-agent", "namespace": ns}]
        }))?;
        Api::<ClusterRoleBinding>::all(env.client.clone())
            .create(&PostParams::default(), &binding)
            .await?;

        // The agent's own pod on X, for a token bound to it (and so to X).
        let agent_pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "nodewarden-agent-x"},
            "spec": {"nodeName": node, "serviceAccountName": "nodewarden-agent",
                     "containers": [{"name": "agent", "image": "nodewarden-agent:e2e"}]}
        }))?;
        let agent_pod = env.api::<Pod>().create(&PostParams::default(), &agent_pod).await?;
        let token = cp
            .service_account_token(
                &ns,
                "nodewarden-agent",
                Some((&agent_pod.name_any(), &agent_pod.uid().unwrap_or_default())),
            )
            .await?;

        // The autoscaled DaemonSet; its pod on X is bound like the scheduler would, and given
        // the container status a kubelet would report.
        let ds = simple_daemonset("workload", &env.node_selector())?;
        env.api::<DaemonSet>().create(&PostParams::default(), &ds).await?;
        let dsa: DaemonSetAutoscaler = serde_json::from_value(json!({
            "apiVersion": "nodewarden.io/v1alpha1", "kind": "DaemonSetAutoscaler",
            "metadata": {"name": "workload"},
            "spec": {"targetRef": {"kind": "DaemonSet", "name": "workload"}}
        }))?;
        env.api::<DaemonSetAutoscaler>().create(&PostParams::default(), &dsa).await?;
        let pods = env.api::<Pod>();
        let ds_pod = cp
            .poll("the DaemonSet pod", || {
                let pods = pods.clone();
                async move {
                    let list = pods.list(&Default::default()).await?;
                    Ok(list.items.into_iter().find(|p| {
                        p.owner_references().iter().any(|o| o.kind == "DaemonSet" && o.name == "workload")
                    }))
                }
            })
            .await?;
        let pod_name = ds_pod.name_any();
        let pod_uid = ds_pod.uid().ok_or_else(|| anyhow!("pod without uid"))?;
        let binding = json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": pod_name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}
        });
        pods.create_subresource::<_, serde_json::Value>("binding", &pod_name, &PostParams::default(), &binding)
        .await
        .context("binding the DaemonSet pod to the node")?;
        pods.patch_status(
            &pod_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running", "containerStatuses": [{
                "name": "agent", "image": "registry.invalid/agent:1", "imageID": "", "ready": true,
                "restartCount": 0, "started": true, "state": {"running": {"startedAt": "2026-11-21T07:00:00Z"}},
                "containerID": format!("containerd://{CONTAINER_ID}")
            }]}})),
        )
        .await
        .context("setting the pod's container status")?;

        // The agent, in-process, with the node-bound token and a synthetic cgroup tree.
        let tmp = tempfile::tempdir()?;
        let cgroup_root = tmp.path().join("cgroup");
        synthetic_cgroup_tree(&cgroup_root, &pod_uid)?;
        let checkpoint_dir = tmp.path().join("checkpoint");
        let config = Config::try_from_args([
            "nodewarden-agent",
            "--node-name",
            &node,
            "--cgroup-root",
            cgroup_root.to_str().unwrap_or_default(),
            "--checkpoint-dir",
            checkpoint_dir.to_str().unwrap_or_default(),
            "--admin-addr",
            "127.0.0.1:0",
            "--sample-interval",
            "200ms",
            "--log-format",
            "text",
        ])?;
        let agent_client = cp.client_with_token(&token).await?;
        let stop = CancellationToken::new();
        let agent = tokio::spawn(nodewarden_agent::run_with_client(config, agent_client, stop.clone()));

        // No write permission yet: nothing appears, the agent keeps measuring and retrying.
        let recs: Api<NodeRecommendation> = Api::all(env.client.clone());
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(recs.get_opt(&node).await?.is_none(), "written without permission?");
        assert!(!agent.is_finished(), "the agent must keep running while writes fail");

        // Permission arrives: the next retry writes.
        set_rules(&env, &role_name, full_rules).await?;
        let rec = cp
            .poll("NodeRecommendation for the node", || {
                let recs = recs.clone();
                let node = node.clone();
                async move {
                    Ok(recs
                        .get_opt(&node)
                        .await?
                        .filter(|r| !r.spec.recommendations.is_empty()))
                }
            })
            .await?;

        let owner = rec
            .owner_references()
            .first()
            .cloned()
            .ok_or_else(|| anyhow!("no owner reference"))?;
        assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Node", node.as_str()));
        assert_eq!(owner.uid, node_uid);
        let managers: Vec<_> = rec
            .managed_fields()
            .iter()
            .filter_map(|m| m.manager.clone())
            .collect();
        assert_eq!(managers, vec!["nodewarden-agent".to_string()]);
        let r = &rec.spec.recommendations[0];
        assert_eq!(r.autoscaler.namespace, ns);
        assert_eq!(r.autoscaler.name, "workload");
        assert_eq!(r.container_name, "agent");
        let target = r.target.as_ref().ok_or_else(|| anyhow!("no target"))?;
        // CPU counter stood still: the floor of 25 millicores (one container per pod)
        assert_eq!(target["cpu"].0, "25m");
        // 300 MiB working set → its bucket's upper edge + 15 %
        let memory = (memory_bucket_edge((300 * MIB) as f64) * 1.15).ceil() as u64;
        assert_eq!(target["memory"].0, memory.to_string());

        stop.cancel();
        agent.await??;
        assert!(
            checkpoint_dir.join("checkpoint.json").exists(),
            "the agent writes its checkpoint when it stops"
        );
        Ok(())
    })
    .await;
}
