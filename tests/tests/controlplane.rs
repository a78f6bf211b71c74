//! End-to-end: what nodewarden relies on from a real control plane (CRDs, the DaemonSet
//! controller, bound service-account tokens), checked against etcd, kube-apiserver and
//! kube-controller-manager built from their Go modules. All tests share one control plane.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail, ensure};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::authentication::v1::{SelfSubjectReview, UserInfo};
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, PostParams};
use kube::{Api, Client, ResourceExt};
use nodewarden_tests::{
    Hook, Impersonate, RecordingWebhook, Responder, TestEnv, allow_with_patch, apply_crds, chart_crd_files,
    daemonset_pod_target_node, e2e, read_crds, register_mutating_webhooks, simple_daemonset,
    wait_for_daemonset_pods,
};
use serde_json::{Value, json};

const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";
const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";
/// Annotation the test webhook adds: the node it read from the pod.
const SEEN_NODE: &str = "e2e.nodewarden.io/seen-node";

/// The five nodewarden CRDs from the chart are accepted, become Established, and each
/// stores a full example object unchanged, which the Rust API types read back.
#[tokio::test]
async fn chart_crds_are_established_and_store_objects() {
    e2e("crds", |env| async move {
        let files = chart_crd_files()?;
        let crds = read_crds(&files)?;
        let kinds: Vec<String> = crds.iter().map(|c| c.spec.names.kind.clone()).collect();
        ensure!(
            crds.len() == 5,
            "charts/nodewarden/crds should hold the 5 nodewarden CRDs, found {}: {kinds:?}",
            crds.len()
        );
        let established = apply_crds(env.cp, &env.client, &crds).await?;
        for crd in &established {
            round_trip_example(&env, crd)
                .await
                .with_context(|| format!("kind {}", crd.spec.names.kind))?;
        }
        Ok(())
    })
    .await;
}

/// Creates the fixture of the CRD's kind, reads it back, and checks that nothing the user
/// wrote was pruned or changed and that the typed API reads it with every field intact.
async fn round_trip_example(env: &TestEnv, crd: &CustomResourceDefinition) -> Result<()> {
    let kind = &crd.spec.names.kind;
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("fixtures/crs/{kind}.yaml"));
    let text = std::fs::read_to_string(&fixture)
        .with_context(|| format!("every CRD needs an example object in {}", fixture.display()))?;
    let mut object: DynamicObject = serde_yaml_ng::from_str(&text)?;
    let version = crd
        .spec
        .versions
        .iter()
        .find(|v| v.storage)
        .ok_or_else(|| anyhow!("CRD {} has no storage version", crd.name_any()))?;
    let resource = ApiResource {
        group: crd.spec.group.clone(),
        version: version.name.clone(),
        api_version: format!("{}/{}", crd.spec.group, version.name),
        kind: kind.clone(),
        plural: crd.spec.names.plural.clone(),
    };
    let namespaced = crd.spec.scope == "Namespaced";
    let api: Api<DynamicObject> = if namespaced {
        Api::namespaced_with(env.client.clone(), &env.namespace, &resource)
    } else {
        Api::all_with(env.client.clone(), &resource)
    };
    // Cluster-scoped names must not collide with other tests' objects.
    let name = match (namespaced, kind.as_str()) {
        (true, _) => object.name_any(),
        (false, "ClusterClaim") => format!("{}.example.com", env.id),
        // NodeRecommendation and NodeFeatureReport are named after a node.
        (false, _) => format!("{}-node", env.id),
    };
    object.metadata.name = Some(name.clone());
    object.metadata.namespace = namespaced.then(|| env.namespace.clone());

    api.create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("creating {kind} {name}"))?;
    let stored = api.get(&name).await?;
    let wrote = object.data.get("spec").cloned().unwrap_or(Value::Null);
    let read = stored.data.get("spec").cloned().unwrap_or(Value::Null);
    ensure!(wrote != Value::Null, "fixture {} has no spec", fixture.display());
    if let Some(diff) = missing_from(&wrote, &read, "spec") {
        bail!("the API server did not keep what was written: {diff}\nwrote: {wrote}\nread: {read}");
    }

    // The Rust types must read the stored object and keep every field the user wrote.
    let stored_json = serde_json::to_value(&stored)?;
    let typed_spec = match kind.as_str() {
        "DaemonSetAutoscaler" => typed_spec::<nodewarden_api::DaemonSetAutoscaler>(&stored_json)?,
        "NodeRecommendation" => typed_spec::<nodewarden_api::NodeRecommendation>(&stored_json)?,
        "Feature" => typed_spec::<nodewarden_api::Feature>(&stored_json)?,
        "NodeFeatureReport" => typed_spec::<nodewarden_api::NodeFeatureReport>(&stored_json)?,
        "ClusterClaim" => typed_spec::<nodewarden_api::ClusterClaim>(&stored_json)?,
        other => bail!("no Rust type known for kind {other}; add it to this test"),
    };
    if let Some(diff) = missing_from(&wrote, &typed_spec, "spec") {
        bail!("the Rust type lost a field on the way through: {diff}\nwrote: {wrote}\ntyped: {typed_spec}");
    }
    Ok(())
}

fn typed_spec<K>(stored: &Value) -> Result<Value>
where
    K: serde::de::DeserializeOwned + serde::Serialize,
{
    let typed: K =
        serde_json::from_value(stored.clone()).context("the stored object does not deserialize")?;
    Ok(serde_json::to_value(typed)?
        .get("spec")
        .cloned()
        .unwrap_or(Value::Null))
}

/// Where `want` has something `have` lacks or holds differently (`have` may hold more:
/// defaults). Lists must have the same length and match element by element.
fn missing_from(want: &Value, have: &Value, path: &str) -> Option<String> {
    match (want, have) {
        (Value::Object(w), Value::Object(h)) => w.iter().find_map(|(k, wv)| match h.get(k) {
            None => Some(format!("{path}.{k} is missing")),
            Some(hv) => missing_from(wv, hv, &format!("{path}.{k}")),
        }),
        (Value::Array(w), Value::Array(h)) if w.len() == h.len() => w
            .iter()
            .zip(h)
            .enumerate()
            .find_map(|(i, (wv, hv))| missing_from(wv, hv, &format!("{path}[{i}]"))),
        _ if want == have => None,
        _ => Some(format!("{path}: wrote {want}, read {have}")),
    }
}

/// The real DaemonSet controller creates one pod per matching node, each pinned to its node
/// by a single `matchFields metadata.name In [<node>]` term and not yet bound (nodewarden's
/// pod webhook reads the node from exactly this).
#[tokio::test]
async fn daemonset_controller_pins_one_pod_to_each_node() {
    e2e("daemonset", |env| async move {
        let nodes = env.create_nodes(3).await?;
        let ds = simple_daemonset("node-agent", &env.node_selector())?;
        // Webhook tests register the pod webhook for env.namespace here, before the
        // DaemonSet exists, and then assert on the pods' resources below.
        env.api::<DaemonSet>().create(&PostParams::default(), &ds).await?;

        let pods = wait_for_daemonset_pods(env.cp, &env.client, &env.namespace, "node-agent", &nodes).await?;
        ensure!(pods.len() == 3, "expected 3 pods, got {}", pods.len());
        for (node, pod) in &pods {
            let spec = pod.spec.as_ref().ok_or_else(|| anyhow!("pod without spec"))?;
            ensure!(
                spec.node_name.is_none(),
                "pod {} is already bound: {:?}",
                pod.name_any(),
                spec.node_name
            );
            let affinity = serde_json::to_value(&spec.affinity)?;
            let expected = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}
                ]}]
            }}});
            ensure!(
                affinity == expected,
                "pod {} for node {node}: affinity {affinity}",
                pod.name_any()
            );
            let owner = pod
                .owner_references()
                .iter()
                .find(|o| o.controller == Some(true))
                .ok_or_else(|| anyhow!("pod {} has no controller", pod.name_any()))?;
            ensure!(
                owner.kind == "DaemonSet" && owner.api_version == "apps/v1" && owner.name == "node-agent",
                "pod {} controller is {} {} {}",
                pod.name_any(),
                owner.api_version,
                owner.kind,
                owner.name
            );
        }

        // What `kubectl get ds` shows a user: three desired, three scheduled.
        let daemonsets = env.api::<DaemonSet>();
        env.cp
            .poll("DaemonSet status to count 3 nodes", || {
                let daemonsets = daemonsets.clone();
                async move {
                    let status = daemonsets.get("node-agent").await?.status.unwrap_or_default();
                    Ok(
                        (status.desired_number_scheduled == 3 && status.current_number_scheduled == 3)
                            .then_some(()),
                    )
                }
            })
            .await
    })
    .await;
}

/// A token bound to a pod that is bound to a node carries the node's name in the user's
/// extra values (what the validating webhook checks before an agent writes its node's
/// objects); a token that is not bound to a pod does not.
#[tokio::test]
async fn pod_bound_token_names_the_node() {
    e2e("token", |env| async move {
        let nodes = env.create_nodes(1).await?;
        let node = &nodes[0];
        let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "agent"}}))?;
        env.api::<ServiceAccount>()
            .create(&PostParams::default(), &sa)
            .await?;
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "agent-on-node"},
            "spec": {
                "serviceAccountName": "agent",
                "nodeName": node,
                "containers": [{"name": "agent", "image": "nodewarden-e2e/pause:never-pulled"}],
            },
        }))?;
        let pod = env.api::<Pod>().create(&PostParams::default(), &pod).await?;
        let pod_uid = pod.uid().ok_or_else(|| anyhow!("pod without uid"))?;
        let node_uid = Api::<Node>::all(env.client.clone()).get(node).await?.uid();

        let token = env
            .cp
            .service_account_token(&env.namespace, "agent", Some(("agent-on-node", &pod_uid)))
            .await?;
        let user = self_subject(&env.cp.client_with_token(&token).await?).await?;
        let extra = user.extra.clone().unwrap_or_default();
        ensure!(
            user.username.as_deref() == Some(&format!("system:serviceaccount:{}:agent", env.namespace)),
            "username {:?}",
            user.username
        );
        ensure!(
            extra.get(NODE_NAME_EXTRA) == Some(&vec![node.clone()]),
            "extra {extra:?}"
        );
        ensure!(
            extra.get(POD_NAME_EXTRA) == Some(&vec!["agent-on-node".to_string()]),
            "extra {extra:?}"
        );
        ensure!(
            extra.get("authentication.kubernetes.io/node-uid").cloned() == node_uid.map(|u| vec![u]),
            "extra {extra:?}"
        );

        let unbound = env
            .cp
            .service_account_token(&env.namespace, "agent", None)
            .await?;
        let user = self_subject(&env.cp.client_with_token(&unbound).await?).await?;
        let extra = user.extra.unwrap_or_default();
        ensure!(
            !extra.contains_key(NODE_NAME_EXTRA),
            "an unbound token names a node: {extra:?}"
        );
        Ok(())
    })
    .await;
}

/// Impersonating clients (how tests act as an agent of some node, or as a plain user) are
/// seen by the API server with exactly the user, groups and extra values asked for.
#[tokio::test]
async fn impersonated_client_is_seen_as_that_user() {
    e2e("impersonate", |env| async move {
        let node = format!("{}-node", env.id);
        let who = Impersonate::user(
            "system:serviceaccount:nodewarden:agent",
            &["system:serviceaccounts"],
        )
        .with_extra(NODE_NAME_EXTRA, &[&node]);
        let user = self_subject(&env.cp.client_as(&who).await?).await?;
        ensure!(
            user.username.as_deref() == Some(who.user.as_str()),
            "username {:?}",
            user.username
        );
        let groups = user.groups.unwrap_or_default();
        ensure!(
            groups.contains(&"system:serviceaccounts".to_string()),
            "groups {groups:?}"
        );
        ensure!(
            !groups.contains(&"system:masters".to_string()),
            "kept the admin's groups: {groups:?}"
        );
        let extra = user.extra.unwrap_or_default();
        ensure!(extra.get(NODE_NAME_EXTRA) == Some(&vec![node]), "extra {extra:?}");

        // The impersonated user has none of the admin's rights.
        let alice = env.cp.client_as_user("alice", &[]).await?;
        match Api::<Pod>::namespaced(alice, &env.namespace)
            .list(&Default::default())
            .await
        {
            Err(kube::Error::Api(s)) if s.code == 403 => Ok(()),
            other => Err(anyhow!(
                "alice listing pods: expected 403 Forbidden, got {other:?}"
            )),
        }
    })
    .await;
}

/// The helm binary built with the control plane reaches it through `kubeconfig_path()`.
#[tokio::test]
async fn helm_reaches_the_control_plane() {
    e2e("helm", |env| async move {
        let out = tokio::process::Command::new(env.cp.helm_path())
            .args(["list", "--all-namespaces", "--output", "json", "--kubeconfig"])
            .arg(env.cp.kubeconfig_path())
            .env("HELM_CACHE_HOME", env.cp.dir().join("helm/cache"))
            .env("HELM_CONFIG_HOME", env.cp.dir().join("helm/config"))
            .env("HELM_DATA_HOME", env.cp.dir().join("helm/data"))
            .output()
            .await?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        ensure!(
            out.status.success(),
            "helm list failed ({}): {}{}",
            out.status,
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
        let releases: Value = serde_json::from_str(stdout.trim()).context("helm list --output json")?;
        ensure!(releases.is_array(), "helm list printed {stdout}");
        Ok(())
    })
    .await;
}

async fn self_subject(client: &Client) -> Result<UserInfo> {
    let review = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .context("creating a SelfSubjectReview")?;
    review
        .status
        .and_then(|s| s.user_info)
        .ok_or_else(|| anyhow!("SelfSubjectReview without userInfo"))
}

/// The real API server sends the pods the DaemonSet controller creates to a webhook
/// registered with a loopback `url` and `caBundle`, before they are bound, with the node in
/// the `matchFields` term, and applies the JSON Patch the webhook answers with.
#[tokio::test]
async fn api_server_sends_daemonset_pods_to_the_webhook_and_applies_its_patch() {
    e2e("webhook", |env| async move {
        let nodes = env.create_nodes(2).await?;
        let responder: Responder = Arc::new(|request: &Value| {
            let node = request
                .get("object")
                .and_then(|o| serde_json::from_value::<Pod>(o.clone()).ok())
                .and_then(|p| daemonset_pod_target_node(&p));
            match node {
                Some(node) => allow_with_patch(&json!([
                    {"op": "add", "path": "/metadata/annotations", "value": {SEEN_NODE: node}}
                ])),
                None => json!({"allowed": true}),
            }
        });
        let hook = RecordingWebhook::start(env.cp, responder).await?;
        let config = format!("{}-pods", env.id);
        register_mutating_webhooks(
            &env.client,
            &config,
            &hook.endpoint,
            &[Hook::new(
                "pods.e2e.nodewarden.io",
                "/mutate/pods",
                "",
                "v1",
                &["pods"],
                &["CREATE"],
            )
            .only_namespace(&env.namespace)],
        )
        .await?;
        hook.wait_until_called(env.cp, &env.client, &env.namespace)
            .await?;

        let ds = simple_daemonset("node-agent", &env.node_selector())?;
        env.api::<DaemonSet>().create(&PostParams::default(), &ds).await?;
        let pods = wait_for_daemonset_pods(env.cp, &env.client, &env.namespace, "node-agent", &nodes).await?;
        for (node, pod) in &pods {
            let seen = pod.annotations().get(SEEN_NODE);
            ensure!(
                seen == Some(node),
                "pod {} for {node} carries {SEEN_NODE}={seen:?}",
                pod.name_any()
            );
        }

        let requests = hook.requests_where(|r| {
            r.pointer("/object/metadata/ownerReferences/0/kind")
                .and_then(Value::as_str)
                == Some("DaemonSet")
        });
        ensure!(
            requests.len() >= nodes.len(),
            "the webhook saw {} DaemonSet pods",
            requests.len()
        );
        for r in &requests {
            let user = r.pointer("/userInfo/username").and_then(Value::as_str);
            ensure!(
                user == Some("system:serviceaccount:kube-system:daemon-set-controller"),
                "created by {user:?}"
            );
            ensure!(
                r.pointer("/object/spec/nodeName").is_none(),
                "pod already bound at admission: {r}"
            );
            ensure!(
                r.get("operation") == Some(&json!("CREATE")),
                "operation {:?}",
                r.get("operation")
            );
        }

        Api::<MutatingWebhookConfiguration>::all(env.client.clone())
            .delete(&config, &Default::default())
            .await?;
        Ok(())
    })
    .await;
}
