//! The node agent against the real control plane: with a token bound to a pod on node X and the
//! chart's agent RBAC, it watches X's pods and the autoscalers, measures a synthetic cgroup tree
//! holding the autoscaled DaemonSet pod's container, and writes `NodeRecommendation/X`, owned by
//! Node X. Without write permission it keeps retrying and writes once permission arrives.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use nodewarden_agent::config::Config;
use nodewarden_api::rightsizing::{DaemonSetAutoscaler, NodeRecommendation};
use nodewarden_tests::helm::Helm;
use nodewarden_tests::{
    TestEnv, apply_crds, cgroupfs, chart_crd_files, daemonset_pod_target_node, e2e, procfs, read_crds,
    simple_daemonset,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const MIB: u64 = 1024 * 1024;

/// Container ID `i` as a runtime would report it (64 hex digits).
fn container_id(i: usize) -> String {
    format!("5eed{i:060x}")
}

/// The agent's ClusterRole rules as the chart renders them.
async fn chart_agent_rules() -> Result<Vec<PolicyRule>> {
    let helm = Helm::locate().await?;
    let rendered = helm.template("nw", "nw", &[] as &[&str]).await?;
    let role = rendered.get("ClusterRole", "nw-nodewarden-agent")?;
    serde_json::from_value(role["rules"].clone()).context("the chart's agent ClusterRole rules")
}

/// The environment the chart gives the agent container besides its own flags (the variables
/// not named `NODEWARDEN_*` that have a literal value, such as the allocator's
/// `GLIBC_TUNABLES`): the footprint benchmark runs the binary with exactly these.
/// `NODEWARDEN_BENCH_HELM_SET` renders the chart with that `--set-string` instead of its
/// defaults, to compare settings, e.g.
/// `agent.extraEnv[0].name=GLIBC_TUNABLES,agent.extraEnv[0].value=glibc.malloc.mmap_threshold=65536`.
async fn chart_agent_process_env() -> Result<Vec<(String, String)>> {
    let helm = Helm::locate().await?;
    let set: Vec<String> = std::env::var("NODEWARDEN_BENCH_HELM_SET")
        .map(|s| vec!["--set-string".to_string(), s])
        .unwrap_or_default();
    let rendered = helm.template("nw", "nw", &set).await?;
    let ds = rendered.get("DaemonSet", "nw-nodewarden-agent")?;
    let containers = ds["spec"]["template"]["spec"]["containers"]
        .as_array()
        .ok_or_else(|| anyhow!("the chart's agent DaemonSet has no containers"))?;
    let agent = containers
        .iter()
        .find(|c| c["name"] == "agent")
        .ok_or_else(|| anyhow!("the chart's agent DaemonSet has no container named agent"))?;
    Ok(agent["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| Some((e["name"].as_str()?.to_string(), e["value"].as_str()?.to_string())))
        .filter(|(name, _)| !name.starts_with("NODEWARDEN_"))
        .collect())
}

/// The cgroup scope of container `i` of the pod (systemd driver, containerd).
fn scope(root: &Path, pod_uid: &str, i: usize) -> PathBuf {
    cgroupfs::container_scope(root, pod_uid, &container_id(i))
}

/// A cgroup v2 tree with the pod's `n` containers in it: 300 MiB in use, no inactive file
/// pages, CPU counters standing still.
fn synthetic_cgroup_tree(root: &Path, pod_uid: &str, n: usize) -> Result<()> {
    cgroupfs::write_root(root)?;
    for i in 0..n {
        cgroupfs::write_container(&scope(root, pod_uid, i), 5_000_000, 300 * MIB)?;
    }
    Ok(())
}

/// The chart's CRDs, one Ready node, and a token of the agent's identity (the chart's rules)
/// bound to a pod on it: (node, token).
async fn node_with_an_agent_token(env: &TestEnv) -> Result<(String, String)> {
    apply_crds(env.cp, &env.client, &read_crds(&chart_crd_files()?)?).await?;
    let node = env.create_nodes(1).await?.remove(0);
    let (_, token) = agent_identity(env, &node, agent_rules_for(env).await?).await?;
    Ok((node, token))
}

/// The chart's rules for the agent, and where `InPlace` falls back to eviction (no `pods/resize`)
/// the disruption lease's too: the agent takes one before it evicts.
async fn agent_rules_for(env: &TestEnv) -> Result<Vec<PolicyRule>> {
    if env.cp.kube_version().resize_by_default() {
        chart_agent_rules().await
    } else {
        agent_rules_with_leases().await
    }
}

/// The name of the pod with `uid` in the test's namespace.
async fn pod_name_of(env: &TestEnv, uid: &str) -> Result<String> {
    env.api::<Pod>()
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .find(|p| p.uid().as_deref() == Some(uid))
        .map(|p| p.name_any())
        .ok_or_else(|| anyhow!("the DaemonSet pod is gone"))
}

/// Where the API server serves no `pods/resize` with its default gates (before 1.33), `InPlace`
/// acts as `Recreate`: the pod `name` (taken before the agent could act) is evicted, and its Event
/// says why, naming the version.
async fn evicted_for_want_of_resize(env: &TestEnv, name: &str) -> Result<()> {
    let note = env.wait_for_event("Pod", name, "Evicted").await?;
    let version = env.cp.kube_version().to_string();
    anyhow::ensure!(
        note.contains("not in place") && note.contains(&version),
        "the eviction names the missing resize and {version}: {note}"
    );
    Ok(())
}

/// Creates the agent's service account bound to a ClusterRole `<id>-agent` with `rules`, and
/// the agent's own pod on `node`; returns a token bound to that pod (and so to the node).
async fn agent_identity(env: &TestEnv, node: &str, rules: Vec<PolicyRule>) -> Result<(String, String)> {
    let role_name = format!("{}-agent", env.id);
    set_rules(env, &role_name, rules).await?;
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "nodewarden-agent"}}))?;
    env.api::<ServiceAccount>()
        .create(&PostParams::default(), &sa)
        .await?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": role_name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
        "subjects": [{"kind": "ServiceAccount", "name": "nodewarden-agent", "namespace": env.namespace}]
    }))?;
    Api::<ClusterRoleBinding>::all(env.client.clone())
        .create(&PostParams::default(), &binding)
        .await?;
    let agent_pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "nodewarden-agent-x"},
        "spec": {"nodeName": node, "serviceAccountName": "nodewarden-agent",
                 "containers": [{"name": "agent", "image": "nodewarden-agent:e2e"}]}
    }))?;
    let agent_pod = env
        .api::<Pod>()
        .create(&PostParams::default(), &agent_pod)
        .await?;
    let token = env
        .cp
        .service_account_token(
            &env.namespace,
            "nodewarden-agent",
            Some((&agent_pod.name_any(), &agent_pod.uid().unwrap_or_default())),
        )
        .await?;
    Ok((role_name, token))
}

/// A DaemonSet `workload` with containers `c0…` (or the harness's single `agent` container
/// when `n` is 1) and an autoscaler for it; its pod on `node` is bound like the scheduler
/// would and given the container statuses a kubelet would report. Returns the pod's UID.
async fn autoscaled_pod_on(env: &TestEnv, node: &str, n: usize) -> Result<String> {
    autoscaled_pod_with_mode(env, node, n, "Initial").await
}

/// [`autoscaled_pod_on`] with the autoscaler's `updateMode`.
async fn autoscaled_pod_with_mode(env: &TestEnv, node: &str, n: usize, mode: &str) -> Result<String> {
    let mut ds = simple_daemonset("workload", &env.node_selector())?;
    if n > 1 {
        let spec = ds
            .spec
            .as_mut()
            .and_then(|s| s.template.spec.as_mut())
            .ok_or_else(|| anyhow!("no pod spec"))?;
        let template = spec.containers[0].clone();
        spec.containers = (0..n)
            .map(|i| {
                let mut c = template.clone();
                c.name = format!("c{i}");
                c
            })
            .collect();
    }
    let names: Vec<String> = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .map(|s| s.containers.iter().map(|c| c.name.clone()).collect())
        .unwrap_or_default();
    env.api::<DaemonSet>().create(&PostParams::default(), &ds).await?;
    let dsa: DaemonSetAutoscaler = serde_json::from_value(json!({
        "apiVersion": "nodewarden.io/v1alpha1", "kind": "DaemonSetAutoscaler",
        "metadata": {"name": "workload"},
        "spec": {"targetRef": {"kind": "DaemonSet", "name": "workload"}, "updatePolicy": {"updateMode": mode}}
    }))?;
    env.api::<DaemonSetAutoscaler>()
        .create(&PostParams::default(), &dsa)
        .await?;
    let pods = env.api::<Pod>();
    let ds_pod = env
        .cp
        .poll("the DaemonSet pod", || {
            let pods = pods.clone();
            async move {
                let list = pods.list(&Default::default()).await?;
                // the pod the DaemonSet controller made for this node (with several nodes,
                // binding another node's pod here would make the controller delete a surplus)
                Ok(list.items.into_iter().find(|p| {
                    p.owner_references()
                        .iter()
                        .any(|o| o.kind == "DaemonSet" && o.name == "workload")
                        && daemonset_pod_target_node(p).as_deref() == Some(node)
                        && p.metadata.deletion_timestamp.is_none()
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
    let statuses: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            json!({
                "name": name, "image": "registry.invalid/agent:1", "imageID": "", "ready": true,
                "restartCount": 0, "started": true, "state": {"running": {"startedAt": "2026-11-21T07:00:00Z"}},
                "containerID": format!("containerd://{}", container_id(i)),
                // what a kubelet that supports in-place resize reports (the API server refuses
                // resizes of running containers without it)
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}}
            })
        })
        .collect();
    pods.patch_status(
        &pod_name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "phase": "Running", "startTime": "2026-11-21T07:00:00Z", "containerStatuses": statuses,
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-21T07:00:01Z"}]
        }})),
    )
    .await
    .context("setting the pod's container statuses")?;
    Ok(pod_uid)
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

        // The agent's identity: the chart's rules, minus the write of NodeRecommendation for now.
        let full_rules = chart_agent_rules().await?;
        let read_only: Vec<PolicyRule> = full_rules
            .iter()
            .filter(|r| !r.resources.iter().flatten().any(|x| x == "noderecommendations"))
            .cloned()
            .collect();
        assert!(
            read_only.len() < full_rules.len(),
            "the chart lets the agent write noderecommendations"
        );
        let (role_name, token) = agent_identity(&env, &node, read_only).await?;
        let pod_uid = autoscaled_pod_on(&env, &node, 1).await?;

        // The agent, in-process, with the node-bound token and a synthetic cgroup tree.
        let tmp = tempfile::tempdir()?;
        let cgroup_root = tmp.path().join("cgroup");
        synthetic_cgroup_tree(&cgroup_root, &pod_uid, 1)?;
        let checkpoint_dir = tmp.path().join("checkpoint");
        let config = agent_config(&node, &cgroup_root, &checkpoint_dir, &[])?;
        let admin = config.admin_addr;
        let agent_client = cp.client_with_token(&token).await?;
        let stop = CancellationToken::new();
        let agent = tokio::spawn(nodewarden_agent::run_with_client(
            config,
            agent_client,
            stop.clone(),
        ));

        // No write permission yet: nothing appears, the agent keeps measuring and retrying
        // (two refused writes seen).
        let recs: Api<NodeRecommendation> = Api::all(env.client.clone());
        cp.poll("two refused NodeRecommendation writes", || async {
            let refused =
                agent_counter(admin, "nodewarden_agent_recommendation_write_errors_total", &[]).await?;
            Ok((refused >= 2.0).then_some(()))
        })
        .await?;
        assert!(
            recs.get_opt(&node).await?.is_none(),
            "written without permission?"
        );
        assert!(
            !agent.is_finished(),
            "the agent must keep running while writes fail"
        );

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
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("Node", node.as_str())
        );
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
            nodewarden_agent::rightsizing::checkpoint::path(&checkpoint_dir, &node).exists(),
            "the agent writes its checkpoint when it stops"
        );
        Ok(())
    })
    .await;
}

/// Benchmark of the real `nodewarden-agent` binary (not a timed test: it prints figures and
/// checks only that all containers were published). 100 autoscaled containers in one DaemonSet
/// pod on node X, sampled every 10 s; counters move every 10 s. Run by hand:
///
/// ```sh
/// cargo build --release -p nodewarden-agent
/// cargo test -p nodewarden-tests --test agent -- --ignored --nocapture agent_binary_footprint
/// ```
///
/// `NODEWARDEN_BENCH_SECONDS` (default 120) sets the measured span, `NODEWARDEN_AGENT_BIN` the
/// binary (default `target/release/nodewarden-agent`).
#[tokio::test]
#[ignore = "benchmark: run by hand, figures go to docs/benchmarks.md"]
async fn agent_binary_footprint_with_100_containers() {
    e2e("agent-bench", |env| async move {
        const N: usize = 100;
        let cp = env.cp;
        let (node, token) = node_with_an_agent_token(&env).await?;
        // `NODEWARDEN_BENCH_UPDATE_MODE=InPlace` has the agent also resize the running pod
        let mode = std::env::var("NODEWARDEN_BENCH_UPDATE_MODE").unwrap_or_else(|_| "Initial".to_string());
        let pod_uid = autoscaled_pod_with_mode(&env, &node, N, &mode).await?;
        let tmp = tempfile::tempdir()?;
        let cgroup_root = tmp.path().join("cgroup");
        synthetic_cgroup_tree(&cgroup_root, &pod_uid, N)?;
        let kubeconfig = tmp.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            serde_yaml_ng::to_string(&json!({
                "apiVersion": "v1", "kind": "Config",
                "clusters": [{"name": "e2e", "cluster": {
                    "server": cp.apiserver_url(),
                    "certificate-authority-data": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, cp.ca_pem()),
                }}],
                "users": [{"name": "agent", "user": {"token": token}}],
                "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "agent"}}],
                "current-context": "e2e",
            }))?,
        )?;
        let bin = std::env::var_os("NODEWARDEN_AGENT_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/nodewarden-agent"));
        anyhow::ensure!(
            bin.exists(),
            "{} missing: cargo build --release -p nodewarden-agent",
            bin.display()
        );
        let port = nodewarden_tests::process::free_port()?;
        let chart_env = chart_agent_process_env().await?;
        let mut child = tokio::process::Command::new(&bin)
            .env_clear()
            .envs(chart_env.iter().map(|(k, v)| (k, v)))
            .env("KUBECONFIG", &kubeconfig)
            .env("NODEWARDEN_NODE_NAME", &node)
            .env("NODEWARDEN_CGROUP_ROOT", &cgroup_root)
            .env("NODEWARDEN_CHECKPOINT_DIR", tmp.path().join("checkpoint"))
            .env("NODEWARDEN_ADMIN_ADDR", format!("127.0.0.1:{port}"))
            .env("NODEWARDEN_SAMPLE_INTERVAL", "10s")
            .env("NODEWARDEN_LOG_LEVEL", "warn")
            .kill_on_drop(true)
            .spawn()?;
        let pid = child.id().ok_or_else(|| anyhow!("agent exited at once"))?;

        // the workload: container i uses (i % 10 + 1) × 10 millicores; memory wanders
        let writer_root = cgroup_root.clone();
        let writer_uid = pod_uid.clone();
        let writer = tokio::spawn(async move {
            let mut usage = [5_000_000u64; N];
            for t in 0u64.. {
                tokio::time::sleep(Duration::from_secs(10)).await;
                for (i, u) in usage.iter_mut().enumerate() {
                    *u += (i as u64 % 10 + 1) * 10 * 10_000;
                    let memory = (64 + (i as u64 * 7 + t * 13) % 512) * MIB;
                    let _ = cgroupfs::write_container(&scope(&writer_root, &writer_uid, i), *u, memory);
                }
            }
        });

        let recs: Api<NodeRecommendation> = Api::all(env.client.clone());
        let rec = cp
            .poll("NodeRecommendation with every container", || {
                let recs = recs.clone();
                let node = node.clone();
                async move { Ok(recs.get_opt(&node).await?.filter(|r| r.spec.recommendations.len() == N)) }
            })
            .await?;
        assert_eq!(rec.spec.recommendations.len(), N);

        let seconds: u64 = std::env::var("NODEWARDEN_BENCH_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(120);
        let cpu0 = procfs::cpu_seconds(pid).context("the agent process is gone")?;
        let started = std::time::Instant::now();
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        let cpu1 = procfs::cpu_seconds(pid).context("the agent process is gone")?;
        let wall = started.elapsed().as_secs_f64();
        let rec = recs.get(&node).await?;
        // what the agent reads: the pod as a watch event or an answer carries it, and its
        // DaemonSet's ControllerRevision (JSON bytes, managed fields included)
        let pod_bytes = env
            .api::<Pod>()
            .list(&Default::default())
            .await?
            .items
            .iter()
            .find(|p| p.uid().as_deref() == Some(pod_uid.as_str()))
            .map(|p| serde_json::to_vec(p).map(|v| v.len()))
            .transpose()?
            .unwrap_or(0);
        let revision_bytes: usize = env
            .api::<ControllerRevision>()
            .list(&Default::default())
            .await?
            .items
            .iter()
            .map(|r| serde_json::to_vec(r).map(|v| v.len()))
            .sum::<Result<usize, _>>()?;
        println!("  the pod: {pod_bytes} bytes of JSON; its ControllerRevisions: {revision_bytes} bytes");
        let chart_env: Vec<String> = chart_env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!(
            "agent binary, {N} containers, updateMode {mode}, 10 s samples, {wall:.0} s measured after the first publish:\n  \
             environment from the chart: {}\n  \
             cpu {:.2} s = {:.2} millicores average\n  VmRSS {} KiB (RssAnon {} KiB, RssFile {} KiB), VmHWM {} KiB\n  \
             NodeRecommendation resourceVersion {} (containers: {})",
            if chart_env.is_empty() { "none".to_string() } else { chart_env.join(" ") },
            cpu1 - cpu0,
            (cpu1 - cpu0) / wall * 1000.0,
            procfs::status_kib(pid, "VmRSS:"),
            procfs::status_kib(pid, "RssAnon:"),
            procfs::status_kib(pid, "RssFile:"),
            procfs::status_kib(pid, "VmHWM:"),
            rec.resource_version().unwrap_or_default(),
            rec.spec.recommendations.len(),
        );
        writer.abort();
        child.kill().await?;
        Ok(())
    })
    .await;
}

/// The in-process agent's flags: this node, these folders, fast sampling, text logs, and `extra`.
fn agent_config(node: &str, cgroup_root: &Path, checkpoint_dir: &Path, extra: &[&str]) -> Result<Config> {
    // a port the test knows, to read the agent's metrics (`admin_addr` in the answer)
    let admin = format!("127.0.0.1:{}", nodewarden_tests::process::free_ports(1)?[0]);
    let mut args = vec![
        "nodewarden-agent",
        "--node-name",
        node,
        "--cgroup-root",
        cgroup_root.to_str().unwrap_or_default(),
        "--checkpoint-dir",
        checkpoint_dir.to_str().unwrap_or_default(),
        "--admin-addr",
        &admin,
        "--sample-interval",
        "200ms",
        "--publish-budget",
        "1s",
        "--log-format",
        "text",
    ];
    args.extend_from_slice(extra);
    Ok(Config::try_from_args(args)?)
}

/// With `NODEWARDEN_TEST_LOG` set, the in-process agents log (debug) to stderr.
fn test_log() {
    if std::env::var_os("NODEWARDEN_TEST_LOG").is_some() {
        let format = nodewarden_runtime::telemetry::LogFormat::Text;
        let _ = nodewarden_runtime::telemetry::init(format, "nodewarden_agent=debug", "test");
    }
}

/// A token of the agent's service account bound to a new agent pod on `node` (the identity
/// must exist: [`agent_identity`]).
async fn agent_token_on(env: &TestEnv, node: &str, pod_name: &str) -> Result<String> {
    let agent_pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": pod_name},
        "spec": {"nodeName": node, "serviceAccountName": "nodewarden-agent",
                 "containers": [{"name": "agent", "image": "nodewarden-agent:e2e"}]}
    }))?;
    let agent_pod = env
        .api::<Pod>()
        .create(&PostParams::default(), &agent_pod)
        .await?;
    env.cp
        .service_account_token(
            &env.namespace,
            "nodewarden-agent",
            Some((&agent_pod.name_any(), &agent_pod.uid().unwrap_or_default())),
        )
        .await
}

/// The chart's agent rules, plus leases in any namespace (the chart grants those in its own
/// namespace only, by a Role; here the test namespace is that namespace).
async fn agent_rules_with_leases() -> Result<Vec<PolicyRule>> {
    let mut rules = chart_agent_rules().await?;
    rules.push(serde_json::from_value(json!({
        "apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
        "verbs": ["get", "list", "create", "update", "delete"]
    }))?);
    Ok(rules)
}

/// An in-process agent on `node` with a synthetic cgroup tree holding the pod's container, and
/// a fast update round.
fn start_agent(
    env: &TestEnv,
    node: &str,
    pod_uid: &str,
    kube: kube::Config,
    stop: &CancellationToken,
) -> Result<Agent> {
    // VPA's update rules from the first sample: these tests check the resize and eviction
    // mechanics on seconds of history (the rule that a short history never lowers a request
    // has its own test below and api's, domain/update.rs, a_short_history_only_raises)
    start_agent_with(env, node, pod_uid, kube, stop, "0s")
}

/// [`start_agent`] with `--update-min-history`.
fn start_agent_with(
    env: &TestEnv,
    node: &str,
    pod_uid: &str,
    kube: kube::Config,
    stop: &CancellationToken,
    min_history: &str,
) -> Result<Agent> {
    let tmp = tempfile::tempdir()?;
    synthetic_cgroup_tree(&tmp.path().join("cgroup"), pod_uid, 1)?;
    launch_agent(env, node, tmp, kube, stop, min_history)
}

/// Starts an in-process agent over the cgroup tree `tmp`/cgroup (see [`start_agent_with`]).
fn launch_agent(
    env: &TestEnv,
    node: &str,
    tmp: tempfile::TempDir,
    kube: kube::Config,
    stop: &CancellationToken,
    min_history: &str,
) -> Result<Agent> {
    let cgroup_root = tmp.path().join("cgroup");
    let checkpoint_dir = tmp.path().join("checkpoint");
    let config = agent_config(
        node,
        &cgroup_root,
        &checkpoint_dir,
        &[
            "--update-interval",
            "500ms",
            "--update-min-history",
            min_history,
            "--eviction-retry-interval",
            "1s",
            "--disruption-namespace",
            &env.namespace,
        ],
    )?;
    let admin = config.admin_addr;
    let task = tokio::spawn(nodewarden_agent::run_with_kube_config(config, kube, stop.clone()));
    Ok(Agent {
        _tmp: tmp,
        task,
        admin,
    })
}

/// An in-process agent: its folders, its task, and its admin address (metrics).
struct Agent {
    _tmp: tempfile::TempDir,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    admin: std::net::SocketAddr,
}

impl Agent {
    /// The cgroup scope of container `i` of pod `pod_uid` in the agent's tree.
    fn scope(&self, pod_uid: &str, i: usize) -> PathBuf {
        scope(&self._tmp.path().join("cgroup"), pod_uid, i)
    }
}

/// A counter of the agent's `/metrics` (the sum over its series that carry every label of
/// `labels`), 0 when it has none yet.
async fn agent_counter(admin: std::net::SocketAddr, name: &str, labels: &[&str]) -> Result<f64> {
    let (status, body) = nodewarden_tests::webhooks::http_get_at(admin, "/metrics").await?;
    anyhow::ensure!(status == 200, "GET /metrics on the agent: {status}");
    Ok(body
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| {
            series.split('{').next() == Some(name) && labels.iter().all(|label| series.contains(label))
        })
        .filter_map(|(_, v)| v.parse::<f64>().ok())
        .sum())
}

fn requests_of(pod: &Pod) -> (String, String) {
    let r = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.resources.as_ref())
        .and_then(|r| r.requests.clone())
        .unwrap_or_default();
    let get = |k: &str| r.get(k).map(|q| q.0.clone()).unwrap_or_default();
    (get("cpu"), get("memory"))
}

#[tokio::test]
async fn in_place_mode_resizes_the_running_pod_to_its_nodes_figures_and_initial_does_not() {
    e2e("agent-in-place", |env| async move {
        test_log();
        let cp = env.cp;
        apply_crds(cp, &env.client, &read_crds(&chart_crd_files()?)?).await?;
        let node = env.create_nodes(1).await?.remove(0);
        let (_, token) = agent_identity(&env, &node, agent_rules_for(&env).await?).await?;
        let pod_uid = autoscaled_pod_on(&env, &node, 1).await?;
        let stop = CancellationToken::new();
        let kube = cp.config_with_token(&token).await?;
        let agent = start_agent(&env, &node, &pod_uid, kube, &stop)?;

        let recs: Api<NodeRecommendation> = Api::all(env.client.clone());
        let rec = cp
            .poll("NodeRecommendation for the node", || {
                let (recs, node) = (recs.clone(), node.clone());
                async move {
                    Ok(recs
                        .get_opt(&node)
                        .await?
                        .filter(|r| !r.spec.recommendations.is_empty()))
                }
            })
            .await?;
        let target = rec.spec.recommendations[0].target.clone().unwrap_or_default();
        let pods = env.api::<Pod>();
        let pod_name = pod_name_of(&env, &pod_uid).await?;

        // Initial: several update rounds pass, the running pod keeps its requests.
        let rounds = agent_counter(agent.admin, "nodewarden_agent_update_rounds_total", &[]).await?;
        cp.poll("three more update rounds", || async {
            let now = agent_counter(agent.admin, "nodewarden_agent_update_rounds_total", &[]).await?;
            Ok((now >= rounds + 3.0).then_some(()))
        })
        .await?;
        assert_eq!(
            requests_of(&pods.get(&pod_name).await?),
            ("100m".to_string(), "64Mi".to_string()),
            "updateMode Initial must not touch a running pod"
        );

        // InPlace: the agent resizes it to exactly its node's figures, limits by the template's ratio.
        env.api::<DaemonSetAutoscaler>()
            .patch(
                "workload",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"updatePolicy": {"updateMode": "InPlace"}}})),
            )
            .await?;
        if !cp.kube_version().resize_by_default() {
            // no pods/resize on this version: InPlace acts as Recreate, and the pod's Event says why
            let note = env.wait_for_event("Pod", &pod_name, "Evicted").await?;
            let version = cp.kube_version().to_string();
            anyhow::ensure!(
                note.contains("not in place") && note.contains(&version),
                "the eviction names the missing resize and {version}: {note}"
            );
            let pod = pods.get_opt(&pod_name).await?;
            anyhow::ensure!(
                pod.is_none_or(|p| p.metadata.deletion_timestamp.is_some()),
                "the pod was evicted, not resized"
            );
            stop.cancel();
            agent.task.await??;
            return Ok(());
        }
        let resized = cp
            .poll("the pod resized in place", || {
                let (pods, pod_name) = (pods.clone(), pod_name.clone());
                async move {
                    let pod = pods.get(&pod_name).await?;
                    Ok((requests_of(&pod).1 != "64Mi").then_some(pod))
                }
            })
            .await?;
        assert_eq!(
            resized.uid().as_deref(),
            Some(pod_uid.as_str()),
            "resized, not replaced"
        );
        assert_eq!(
            requests_of(&resized),
            (target["cpu"].0.clone(), target["memory"].0.clone()),
            "the pod's requests are the node's target"
        );
        let limits = resized
            .spec
            .as_ref()
            .and_then(|s| s.containers[0].resources.as_ref())
            .and_then(|r| r.limits.clone())
            .unwrap_or_default();
        // 25m × 200m / 100m: the template's limit-to-request ratio
        assert_eq!(limits["cpu"].0, "50m");
        // the node's report counts the pod as up to date (the autoscaler's status sums these)
        let pods_report = cp
            .poll("the NodeRecommendation counting the pod up to date", || {
                let (recs, node) = (recs.clone(), node.clone());
                async move {
                    let rec = recs.get(&node).await?;
                    Ok(rec.spec.pods.first().filter(|p| p.up_to_date == 1).cloned())
                }
            })
            .await?;
        assert_eq!(
            (pods_report.running, pods_report.autoscaler.name.as_str()),
            (1, "workload")
        );
        let note = env.wait_for_event("Pod", &pod_name, "Resized").await?;
        assert!(note.contains("resized in place to agent: cpu 25m/50m"), "{note}");
        assert!(note.contains("outside the recommendation's bounds"), "{note}");

        stop.cancel();
        agent.task.await??;
        Ok(())
    })
    .await;
}

/// The chart's default `--update-min-history` (24h): on seconds of history an InPlace resize
/// raises the memory request that is below the recommendation's lower bound (64Mi, the floor
/// 250Mi) and keeps the CPU request (100m) that the node's target (the 25m floor) would lower.
/// Nothing before the first measurement (issue 43): with VPA's rules from the first sample
/// (`--update-min-history 0s`) and `InPlace`, a container whose CPU the agent cannot read yet
/// (its `cpu.stat` missing) gets no NodeRecommendation entry, and its pod keeps its 100m request
/// over five sample ticks, where an entry would take it to the 25m floor; once its CPU is read,
/// its figures are published and the pod is resized to them.
#[tokio::test]
async fn nothing_is_published_or_resized_before_the_first_cpu_sample() {
    e2e("agent-first-sample", |env| async move {
        test_log();
        let cp = env.cp;
        let (node, token) = node_with_an_agent_token(&env).await?;
        let pod_uid = autoscaled_pod_with_mode(&env, &node, 1, "InPlace").await?;
        let pod_name = pod_name_of(&env, &pod_uid).await?;
        let tmp = tempfile::tempdir()?;
        synthetic_cgroup_tree(&tmp.path().join("cgroup"), &pod_uid, 1)?;
        std::fs::remove_file(scope(&tmp.path().join("cgroup"), &pod_uid, 0).join("cpu.stat"))?;
        let stop = CancellationToken::new();
        let kube = cp.config_with_token(&token).await?;
        let agent = launch_agent(&env, &node, tmp, kube, &stop, "0s")?;

        // five sample ticks pass, each failing to read the container's CPU (the pod and the
        // cgroup are there: the agent tracks the container and counts each failed reading)
        cp.poll("five readings of the container that failed", || async {
            let failed =
                agent_counter(agent.admin, "nodewarden_agent_unreadable_containers_total", &[]).await?;
            Ok((failed >= 5.0).then_some(()))
        })
        .await?;
        let recs: Api<NodeRecommendation> = Api::all(env.client.clone());
        let entries = recs
            .get_opt(&node)
            .await?
            .map(|r| r.spec.recommendations)
            .unwrap_or_default();
        assert!(
            entries.is_empty(),
            "nothing is published for a container without a CPU sample: {entries:?}"
        );
        let pods = env.api::<Pod>();
        let find = || {
            let (pods, uid) = (pods.clone(), pod_uid.clone());
            async move {
                let list = pods.list(&Default::default()).await?;
                list.items
                    .into_iter()
                    .find(|p| p.uid().as_deref() == Some(uid.as_str()))
                    .ok_or_else(|| anyhow!("the DaemonSet pod is gone"))
            }
        };
        assert_eq!(
            requests_of(&find().await?),
            ("100m".to_string(), "64Mi".to_string()),
            "a pod never measured keeps its requests"
        );

        // its CPU becomes readable: figures, then the pod follows them
        cgroupfs::write_container(&agent.scope(&pod_uid, 0), 5_000_000, 300 * MIB)?;
        if !cp.kube_version().resize_by_default() {
            evicted_for_want_of_resize(&env, &pod_name).await?;
            stop.cancel();
            agent.task.await??;
            return Ok(());
        }
        let resized = cp
            .poll("the pod resized to its first figures", || async {
                let pod = find().await?;
                Ok((requests_of(&pod).0 != "100m").then_some(pod))
            })
            .await?;
        let rec = recs.get(&node).await?;
        let entry = &rec.spec.recommendations[0];
        assert!(entry.sample_count >= 1, "{entry:?}");
        let target = entry.target.clone().unwrap_or_default();
        assert_eq!(
            requests_of(&resized).0,
            target["cpu"].0,
            "resized to the node's target"
        );

        stop.cancel();
        agent.task.await??;
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn in_place_on_a_short_history_raises_memory_and_keeps_the_cpu_request() {
    e2e("agent-short-history", |env| async move {
        test_log();
        let cp = env.cp;
        let (node, token) = node_with_an_agent_token(&env).await?;
        let pod_uid = autoscaled_pod_with_mode(&env, &node, 1, "InPlace").await?;
        let pod_name = pod_name_of(&env, &pod_uid).await?;
        let stop = CancellationToken::new();
        let kube = cp.config_with_token(&token).await?;
        let agent = start_agent_with(&env, &node, &pod_uid, kube, &stop, "24h")?;
        if !cp.kube_version().resize_by_default() {
            evicted_for_want_of_resize(&env, &pod_name).await?;
            stop.cancel();
            agent.task.await??;
            return Ok(());
        }

        let pods = env.api::<Pod>();
        let resized = cp
            .poll("the pod resized in place", || {
                let pods = pods.clone();
                let uid = pod_uid.clone();
                async move {
                    let list = pods.list(&Default::default()).await?;
                    Ok(list
                        .items
                        .into_iter()
                        .find(|p| p.uid().as_deref() == Some(uid.as_str()))
                        .filter(|p| requests_of(p).1 != "64Mi"))
                }
            })
            .await?;
        let recs: Api<NodeRecommendation> = Api::all(env.client.clone());
        let rec = recs.get(&node).await?;
        let entry = &rec.spec.recommendations[0];
        let target = entry.target.clone().unwrap_or_default();
        assert_ne!(
            target["cpu"].0, "100m",
            "the node's target would lower the CPU request"
        );
        assert!(
            entry.first_sample_time.is_some() && entry.last_sample_time.is_some(),
            "the history's span is published: {entry:?}"
        );
        assert_eq!(
            requests_of(&resized),
            ("100m".to_string(), target["memory"].0.clone()),
            "memory raised to the node's target, the CPU request not lowered"
        );
        let note = env.wait_for_event("Pod", &resized.name_any(), "Resized").await?;
        assert!(note.contains("cpu 100m/200m"), "{note}");
        // from then on the pod is held by its short history (its CPU would be lowered), as the
        // agent's metric of pods left says
        cp.poll("the pod counted as left for its short history", || async {
            let held = agent_counter(
                agent.admin,
                "nodewarden_agent_update_pods_left",
                &["reason=\"short-history\""],
            )
            .await?;
            Ok((held == 1.0).then_some(()))
        })
        .await?;

        stop.cancel();
        agent.task.await??;
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn recreate_mode_evicts_one_pod_at_a_time_and_honours_a_pod_disruption_budget() {
    e2e("agent-recreate", |env| async move {
        test_log();
        let cp = env.cp;
        apply_crds(cp, &env.client, &read_crds(&chart_crd_files()?)?).await?;
        let nodes = env.create_nodes(2).await?;
        let (_, token_a) = agent_identity(&env, &nodes[0], agent_rules_with_leases().await?).await?;
        let token_b = agent_token_on(&env, &nodes[1], "nodewarden-agent-y").await?;
        // A PodDisruptionBudget that allows no eviction yet.
        let pdb: k8s_openapi::api::policy::v1::PodDisruptionBudget = serde_json::from_value(json!({
            "metadata": {"name": "workload"},
            "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "workload"}}}
        }))?;
        env.api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>()
            .create(&PostParams::default(), &pdb)
            .await?;
        let uid_a = autoscaled_pod_with_mode(&env, &nodes[0], 1, "Recreate").await?;
        let pods = env.api::<Pod>();
        let uid_b = {
            // the DaemonSet's second pod, bound and running like the first
            let pod = cp
                .poll("the DaemonSet pod for the second node", || {
                    let pods = pods.clone();
                    let first = uid_a.clone();
                    let second = nodes[1].clone();
                    async move {
                        let list = pods.list(&Default::default()).await?;
                        Ok(list.items.into_iter().find(|p| {
                            p.uid().as_deref() != Some(first.as_str())
                                && p.owner_references().iter().any(|o| o.name == "workload")
                                && daemonset_pod_target_node(p).as_deref() == Some(second.as_str())
                                && p.metadata.deletion_timestamp.is_none()
                        }))
                    }
                })
                .await?;
            let name = pod.name_any();
            pods.create_subresource::<_, serde_json::Value>(
                "binding",
                &name,
                &PostParams::default(),
                &json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                        "target": {"apiVersion": "v1", "kind": "Node", "name": nodes[1]}}),
            )
            .await?;
            pods.patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {
                    "phase": "Running", "startTime": "2026-11-21T07:00:00Z",
                    "containerStatuses": [{"name": "agent", "image": "i", "imageID": "", "ready": true,
                        "restartCount": 0, "state": {"running": {"startedAt": "2026-11-21T07:00:00Z"}},
                        "containerID": format!("containerd://{}", container_id(0))}],
                    "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-21T07:00:01Z"}]
                }})),
            )
            .await?;
            pod.uid().unwrap_or_default()
        };

        let stop = CancellationToken::new();
        let agent_a = start_agent(&env, &nodes[0], &uid_a, cp.config_with_token(&token_a).await?, &stop)?;
        let agent_b = start_agent(&env, &nodes[1], &uid_b, cp.config_with_token(&token_b).await?, &stop)?;

        // The budget allows nothing: each agent's eviction is answered 429, said in an Event.
        let blocked = cp
            .poll("an EvictionBlocked event", || {
                let events: Api<k8s_openapi::api::events::v1::Event> = env.api();
                async move {
                    let list = events.list(&Default::default()).await?;
                    Ok(list.items.into_iter().find(|e| e.reason.as_deref() == Some("EvictionBlocked")))
                }
            })
            .await?;
        assert!(blocked.note.unwrap_or_default().contains("PodDisruptionBudget"));
        let terminating = |list: &[Pod]| list.iter().filter(|p| p.metadata.deletion_timestamp.is_some()).count();
        assert_eq!(terminating(&pods.list(&Default::default()).await?.items), 0);

        // The budget opens: exactly one pod goes (maxUnavailable 1), the other agent waits.
        env.api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>()
            .delete("workload", &Default::default())
            .await?;
        cp.poll("one pod evicted", || {
            let pods = pods.clone();
            async move {
                let list = pods.list(&Default::default()).await?.items;
                Ok((terminating(&list) >= 1).then_some(()))
            }
        })
        .await?;
        // the agent whose pod is still there has since held back for the DaemonSet's budget
        let list = pods.list(&Default::default()).await?.items;
        let gone_node = list
            .iter()
            .find(|p| p.metadata.deletion_timestamp.is_some())
            .and_then(|p| p.spec.as_ref()?.node_name.clone())
            .unwrap_or_default();
        let other = if gone_node == nodes[0] { &agent_b } else { &agent_a };
        let budget = ["action=\"evict\"", "outcome=\"budget\""];
        cp.poll("the other agent held back for maxUnavailable", || async {
            let held = agent_counter(other.admin, "nodewarden_agent_pod_updates_total", &budget).await?;
            Ok((held >= 1.0).then_some(()))
        })
        .await?;
        let list = pods.list(&Default::default()).await?.items;
        assert_eq!(
            terminating(&list),
            1,
            "two agents, maxUnavailable 1: only one pod of the DaemonSet may be disrupted at once"
        );
        let evicted = list
            .iter()
            .find(|p| p.metadata.deletion_timestamp.is_some())
            .map(|p| p.name_any())
            .unwrap_or_default();
        let note = env.wait_for_event("Pod", &evicted, "Evicted").await?;
        assert!(note.contains("re-creates it with this node's figures"), "{note}");

        stop.cancel();
        agent_a.task.await??;
        agent_b.task.await??;
        Ok(())
    })
    .await;
}
