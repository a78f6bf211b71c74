//! End-to-end: the nodewarden agent resizes and evicts only pods on its own node.
//!
//! Two Ready fake Nodes A and B, a workload pod bound to each (nothing runs them; the API server
//! still admits resizes and evictions). The chart is rendered for the test's namespace and its
//! agent ServiceAccount, RBAC (ClusterRole and Role), ValidatingAdmissionPolicy and binding are
//! created as rendered; the chart's `evictions.nodewarden.io` registration is applied with its
//! clientConfig pointed at the webhook running in this process. The agent's client holds a token
//! bound to a pod on node A, as the real agent's projected token is.
//!
//! Then, as the agent: resizing A's pod is accepted and reads back, resizing B's pod is refused by
//! the policy naming both nodes; evicting B's pod is refused by the webhook naming both nodes,
//! evicting A's pod deletes it. As an admin: B's pod can be resized and evicted. With the webhook
//! stopped, the agent evicts nothing (failurePolicy Fail).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding, ValidatingWebhook,
    ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, EvictParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use nodewarden_tests::helm::Helm;
use nodewarden_tests::process::{free_ports, write_file};
use nodewarden_tests::{
    InProcessWebhook, LoopbackEndpoint, TestEnv, apply_crds, chart_crd_files, e2e, read_crds,
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

const RELEASE: &str = "nw";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_resizes_and_evicts_only_pods_on_its_own_node() {
    e2e("own-node", |env| async move {
        apply_crds(env.cp, &env.client, &read_crds(&chart_crd_files()?)?).await?;
        let nodes = env.create_nodes(2).await?;
        let (a, b) = (nodes[0].clone(), nodes[1].clone());

        // the chart as rendered for this namespace; `<id>-agent` is the agent's service account
        let fullname = env.id.clone();
        let agent_sa = format!("{fullname}-agent");
        let rendered = Helm::locate()
            .await?
            .template(RELEASE, &env.namespace, &["--set", &format!("fullnameOverride={fullname}")])
            .await?;
        let client = env.client.clone();
        create(&env.api::<ServiceAccount>(), rendered.get("ServiceAccount", &agent_sa)?).await?;
        create(&Api::<ClusterRole>::all(client.clone()), rendered.get("ClusterRole", &agent_sa)?).await?;
        create(
            &Api::<ClusterRoleBinding>::all(client.clone()),
            rendered.get("ClusterRoleBinding", &agent_sa)?,
        )
        .await?;
        create(&env.api::<Role>(), rendered.get("Role", &agent_sa)?).await?;
        create(&env.api::<RoleBinding>(), rendered.get("RoleBinding", &agent_sa)?).await?;
        let policy_name = format!("{agent_sa}-own-node-resize");
        create(
            &Api::<ValidatingAdmissionPolicy>::all(client.clone()),
            rendered.get("ValidatingAdmissionPolicy", &policy_name)?,
        )
        .await?;
        create(
            &Api::<ValidatingAdmissionPolicyBinding>::all(client.clone()),
            rendered.get("ValidatingAdmissionPolicyBinding", &policy_name)?,
        )
        .await?;

        // the webhook in this process, pinned to the chart's agent
        let ports = free_ports(2)?;
        let cert_dir = tempfile::tempdir()?;
        let cert = env.cp.issue_loopback_serving_cert()?;
        write_file(&cert_dir.path().join("tls.crt"), cert.cert_pem.as_bytes(), false)?;
        write_file(&cert_dir.path().join("tls.key"), cert.key_pem.as_bytes(), true)?;
        let args: Vec<String> = vec![
            format!("--listen-addr=127.0.0.1:{}", ports[0]),
            format!("--admin-addr=127.0.0.1:{}", ports[1]),
            format!("--tls-cert-file={}", cert_dir.path().join("tls.crt").display()),
            format!("--tls-key-file={}", cert_dir.path().join("tls.key").display()),
            format!("--kubeconfig={}", env.cp.kubeconfig_path().display()),
            format!("--namespace={}", env.namespace),
            format!("--agent-service-account={}:{agent_sa}", env.namespace),
            "--pod-name=own-node-e2e".into(),
            "--log-format=text".into(),
            "--shutdown-grace=2s".into(),
        ];
        let webhook = InProcessWebhook::start(&args, ports[1]).await?;
        // the chart's registration (rules, matchConditions, failurePolicy), served here
        let config = rendered.get("ValidatingWebhookConfiguration", &format!("{fullname}-validating"))?;
        let hook = config["webhooks"]
            .as_array()
            .context("webhooks")?
            .iter()
            .find(|h| h["name"] == "evictions.nodewarden.io")
            .context("the chart registers evictions.nodewarden.io")?;
        ensure!(hook["clientConfig"]["service"]["path"] == "/validate/evictions", "{hook}");
        let mut hook: ValidatingWebhook = serde_json::from_value(hook.clone())?;
        let endpoint = LoopbackEndpoint { port: ports[0], ca_pem: env.cp.ca_pem().to_string() };
        hook.client_config = endpoint.client_config("/validate/evictions");
        let hooks_name = format!("{fullname}-evictions");
        let configs = Api::<ValidatingWebhookConfiguration>::all(client.clone());
        configs
            .create(
                &PostParams::default(),
                &ValidatingWebhookConfiguration {
                    metadata: ObjectMeta { name: Some(hooks_name.clone()), ..Default::default() },
                    webhooks: Some(vec![hook]),
                },
            )
            .await?;

        let pods = env.api::<Pod>();
        for (name, node) in [("web-a", &a), ("web-a2", &a), ("web-b", &b), ("probe-b", &b)] {
            pods.create(&PostParams::default(), &workload(name, Some(node))?).await?;
        }
        let agent = agent_client(&env, &agent_sa, &a).await?;
        let agent_pods: Api<Pod> = Api::namespaced(agent.clone(), &env.namespace);

        // resize: the policy (once the API server has loaded it) refuses B's pod, naming both nodes
        let probe_cpu = std::sync::atomic::AtomicU32::new(100);
        let refused = wait_until_refused("the resize policy", "ValidatingAdmissionPolicy", || {
            let cpu = probe_cpu.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            let agent_pods = agent_pods.clone();
            async move { resize(&agent_pods, "probe-b", &format!("{cpu}m")).await.map(drop) }
        })
        .await?;
        ensure!(refused.contains(&policy_name), "the refusal names the policy: {refused}");
        let err = resize(&agent_pods, "web-b", "200m").await.err();
        let (code, message) = api_error(err)?;
        ensure!(code == 403, "resize of B's pod: HTTP {code}: {message}");
        ensure!(
            message.ends_with(&format!(
                "pod {}/web-b is on node {b}; the nodewarden agent on node {a} may resize only pods on its own node",
                env.namespace
            )) && message.contains(&format!("ValidatingAdmissionPolicy '{policy_name}'")),
            "resize refusal: {message}"
        );
        ensure!(cpu_request(&pods, "web-b").await? == "100m", "B's pod keeps its request");

        // ... and accepts A's pod; the new request reads back
        resize(&agent_pods, "web-a", "200m").await.context("the agent resizes its own node's pod")?;
        ensure!(cpu_request(&pods, "web-a").await? == "200m");

        // evict: the webhook (once the API server calls it) refuses a pod bound to no node ...
        let refused = wait_until_refused("the eviction webhook", "evictions.nodewarden.io", || {
            let (pods, agent_pods) = (pods.clone(), agent_pods.clone());
            async move {
                if pods.get_opt("probe-unbound").await?.is_none() {
                    pods.create(&PostParams::default(), &workload("probe-unbound", None)?).await?;
                }
                agent_pods.evict("probe-unbound", &EvictParams::default()).await?;
                Ok(())
            }
        })
        .await?;
        ensure!(
            refused.contains("admission webhook \"evictions.nodewarden.io\" denied the request")
                && refused.contains("is not bound to a node"),
            "{refused}"
        );
        // ... and B's pod, naming both nodes
        let err = agent_pods.evict("web-b", &EvictParams::default()).await.err().map(anyhow::Error::from);
        let (code, message) = api_error(err)?;
        ensure!(code == 403, "eviction of B's pod: HTTP {code}: {message}");
        ensure!(
            message
                == format!(
                    "admission webhook \"evictions.nodewarden.io\" denied the request: pod {}/web-b is on node {b}; \
                     the nodewarden agent on node {a} may evict only pods on node {a}",
                    env.namespace
                ),
            "eviction refusal: {message}"
        );
        ensure!(!deleting(&pods, "web-b").await?, "B's pod is untouched");

        // A's pod is evicted: gone or terminating
        agent_pods
            .evict("web-a", &EvictParams::default())
            .await
            .context("the agent evicts its own node's pod")?;
        ensure!(deleting(&pods, "web-a").await?, "A's pod is being deleted");

        // an admin still resizes and evicts anything
        resize(&pods, "web-b", "300m").await.context("admin resizes B's pod")?;
        ensure!(cpu_request(&pods, "web-b").await? == "300m");
        pods.evict("web-b", &EvictParams::default()).await.context("admin evicts B's pod")?;
        ensure!(deleting(&pods, "web-b").await?);

        // the webhook down: the agent evicts nothing, even on its own node
        webhook.stop().await?;
        let err = agent_pods.evict("web-a2", &EvictParams::default()).await.err().map(anyhow::Error::from);
        let (code, message) = api_error(err)?;
        ensure!(
            code == 500 && message.contains("failed calling webhook \"evictions.nodewarden.io\""),
            "with the webhook down: HTTP {code}: {message}"
        );
        ensure!(!deleting(&pods, "web-a2").await?, "nothing evicted while the webhook is down");
        // ... while an admin's evictions are not even sent to it
        pods.evict("web-a2", &EvictParams::default()).await.context("admin evicts with the webhook down")?;

        // cluster-scoped leftovers
        let dp = DeleteParams::default();
        configs.delete(&hooks_name, &dp).await?;
        Api::<ValidatingAdmissionPolicyBinding>::all(client.clone()).delete(&policy_name, &dp).await?;
        Api::<ValidatingAdmissionPolicy>::all(client.clone()).delete(&policy_name, &dp).await?;
        Api::<ClusterRoleBinding>::all(client.clone()).delete(&agent_sa, &dp).await?;
        Api::<ClusterRole>::all(client.clone()).delete(&agent_sa, &dp).await?;
        Ok(())
    })
    .await;
}

/// Creates the rendered object `value` through `api`.
async fn create<K>(api: &Api<K>, value: &Value) -> Result<K>
where
    K: kube::Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(value.clone())
        .with_context(|| format!("reading rendered {}", value["kind"]))?;
    api.create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("creating {} {}", value["kind"], value["metadata"]["name"]))
}

/// A pod of one container requesting 100m CPU and 64Mi, bound to `node` (never run).
fn workload(name: &str, node: Option<&String>) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "containers": [{
                "name": "app",
                "image": "nodewarden-e2e/pause:never-pulled",
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
            }],
        },
    }))?)
}

/// A client with the agent's token bound to a pod of the agent's on `node`.
async fn agent_client(env: &TestEnv, service_account: &str, node: &str) -> Result<Client> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": format!("agent-{node}")},
        "spec": {
            "nodeName": node,
            "serviceAccountName": service_account,
            "containers": [{"name": "agent", "image": "nodewarden-e2e/pause:never-pulled"}],
        },
    }))?;
    let pod = env.api::<Pod>().create(&PostParams::default(), &pod).await?;
    let uid = pod.uid().ok_or_else(|| anyhow!("pod without uid"))?;
    let token = env
        .cp
        .service_account_token(&env.namespace, service_account, Some((&pod.name_any(), &uid)))
        .await?;
    env.cp.client_with_token(&token).await
}

/// PATCH pods/resize raising the cpu request of container `app`.
async fn resize(pods: &Api<Pod>, name: &str, cpu: &str) -> Result<Pod> {
    let patch = json!({"spec": {"containers": [{"name": "app", "resources": {"requests": {"cpu": cpu}}}]}});
    Ok(pods
        .patch_subresource("resize", name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await?)
}

async fn cpu_request(pods: &Api<Pod>, name: &str) -> Result<String> {
    let pod = pods.get(name).await?;
    pod.spec
        .and_then(|s| s.containers.into_iter().next())
        .and_then(|c| c.resources?.requests?.get("cpu").cloned())
        .map(|q| q.0)
        .ok_or_else(|| anyhow!("pod {name} has no cpu request"))
}

/// Whether the pod is gone or has a deletionTimestamp.
async fn deleting(pods: &Api<Pod>, name: &str) -> Result<bool> {
    Ok(pods
        .get_opt(name)
        .await?
        .is_none_or(|p| p.metadata.deletion_timestamp.is_some()))
}

/// HTTP code and message of a refused request.
fn api_error(err: Option<anyhow::Error>) -> Result<(u16, String)> {
    let err = err.ok_or_else(|| anyhow!("expected a refusal, but the API server accepted the request"))?;
    match err.downcast_ref::<kube::Error>() {
        Some(kube::Error::Api(status)) => Ok((status.code, status.message.clone())),
        _ => Err(err.context("expected an API error")),
    }
}

/// Runs `attempt` until the API server refuses it with a message containing `marker` (a new
/// policy, webhook configuration or RBAC binding takes effect a moment after it is written) and
/// returns the refusal; at most 30 s.
async fn wait_until_refused<F, Fut>(what: &str, marker: &str, mut attempt: F) -> Result<String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match attempt().await {
            Err(err) => match err.downcast_ref::<kube::Error>() {
                Some(kube::Error::Api(status)) if status.code == 403 && status.message.contains(marker) => {
                    return Ok(status.message.clone());
                }
                Some(kube::Error::Api(status)) if status.code == 403 && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await
                }
                _ => bail!("waiting for {what}: {err:#}"),
            },
            Ok(()) if Instant::now() > deadline => bail!("{what} never refused the agent within 30 s"),
            Ok(()) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}
