//! The Helm chart `charts/nodewarden` installed: into a real control plane (of its own: the validating
//! webhooks it installs have failurePolicy Fail and would break other tests sharing one), with the
//! CRD upgrade hook's command run as its service account, and uninstalled cleanly.

use std::collections::BTreeMap;

use anyhow::{Context, Result, anyhow, bail, ensure};
use base64::Engine;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use k8s_openapi::api::core::v1::{Node, Pod, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use nodewarden_tests::helm::{CRD_APIS, FIXTURES, Helm, NS, RELEASE, Rendered, chart_dir, helm_fixture};
use nodewarden_tests::{ControlPlane, create_ready_node, wait_for_daemonset_pods};
use serde_json::{Value, json};

/// The hook's command against a real API server, as the hook's service account with the chart's
/// RBAC: an older CRD (a field missing, a label of the operator's) is replaced by the shipped one
/// with the label kept, a missing CRD is created, a second run changes nothing, and the account
/// cannot touch another CRD.
#[tokio::test]
async fn crds_apply_upgrades_older_crds_as_the_hooks_service_account() {
    on_a_control_plane(crds_apply).await;
}

/// Runs `test` on a control plane of its own; a failure panics with the error and the control
/// plane's last log lines.
async fn on_a_control_plane(test: impl AsyncFnOnce(&ControlPlane) -> Result<()>) {
    let cp = match ControlPlane::start().await {
        Ok(cp) => cp,
        Err(e) => panic!("starting a control plane: {e:#}"),
    };
    if let Err(e) = test(&cp).await {
        panic!(
            "{e:#}\ncontrol plane logs ({}):\n{}",
            cp.dir().display(),
            cp.log_tails(40)
        );
    }
}

async fn crds_apply(cp: &ControlPlane) -> Result<()> {
    use nodewarden_webhook::crds::Applied;
    let admin = cp.admin_client().await?;
    let mut crds = nodewarden_tests::read_crds(&nodewarden_tests::chart_crd_files()?)?;
    // an older features CRD: no spec.description field, and a label an operator added
    let features = crds
        .iter_mut()
        .find(|c| c.metadata.name.as_deref() == Some("features.nodewarden.io"))
        .context("features CRD")?;
    let spec_schema = features.spec.versions[0]
        .schema
        .as_mut()
        .and_then(|s| s.open_api_v3_schema.as_mut())
        .and_then(|s| s.properties.as_mut())
        .and_then(|p| p.get_mut("spec"))
        .and_then(|s| s.properties.as_mut())
        .context("features spec schema")?;
    let dropped = spec_schema.keys().next().cloned().context("a spec field")?;
    spec_schema.remove(&dropped);
    features
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("team".to_string(), "platform".to_string());
    // and no noderecommendations CRD at all
    crds.retain(|c| c.metadata.name.as_deref() != Some("noderecommendations.nodewarden.io"));
    nodewarden_tests::apply_crds(cp, &admin, &crds).await?;

    // the hook's RBAC, as `helm upgrade` would create it
    nodewarden_tests::create_namespace(cp, &admin, NS).await?;
    let rendered = Helm::for_control_plane(cp)?
        .template(
            RELEASE,
            NS,
            &["--is-upgrade", "--show-only", "templates/crds-upgrade.yaml"],
        )
        .await?;
    for kind in ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"] {
        let o = rendered.get(kind, "nodewarden-crds")?;
        let (group, version) = match o["apiVersion"].as_str().context("apiVersion")?.split_once('/') {
            Some((g, v)) => (g.to_string(), v.to_string()),
            None => (
                String::new(),
                o["apiVersion"].as_str().unwrap_or_default().to_string(),
            ),
        };
        let ar = ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(&group, &version, kind));
        let api: Api<DynamicObject> = if kind == "ServiceAccount" {
            Api::namespaced_with(admin.clone(), NS, &ar)
        } else {
            Api::all_with(admin.clone(), &ar)
        };
        api.create(&PostParams::default(), &serde_json::from_value(o.clone())?)
            .await
            .with_context(|| format!("creating {kind}"))?;
    }
    let hook = cp
        .client_as(&nodewarden_tests::Impersonate::user(
            &format!("system:serviceaccount:{NS}:nodewarden-crds"),
            &["system:serviceaccounts", "system:authenticated"],
        ))
        .await?;

    let timeout = std::time::Duration::from_secs(60);
    let done = nodewarden_webhook::crds::apply(&hook, timeout).await?;
    let outcome = |name: &str| done.iter().find(|(n, _)| n == name).map(|(_, a)| a.clone());
    ensure!(done.len() == 5, "{done:?}");
    ensure!(
        outcome("features.nodewarden.io") == Some(Applied::Replaced { changed: true }),
        "{done:?}"
    );
    ensure!(
        outcome("noderecommendations.nodewarden.io") == Some(Applied::Created),
        "{done:?}"
    );
    ensure!(
        outcome("clusterclaims.nodewarden.io") == Some(Applied::Replaced { changed: false }),
        "{done:?}"
    );

    let api: Api<CustomResourceDefinition> = Api::all(admin.clone());
    let stored = api.get("features.nodewarden.io").await?;
    let stored_spec = stored.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| s.properties.as_ref())
        .and_then(|p| p.get("spec"))
        .and_then(|s| s.properties.as_ref())
        .context("stored spec schema")?;
    ensure!(
        stored_spec.contains_key(&dropped),
        "spec.{dropped} is back in the schema"
    );
    ensure!(
        stored
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("team"))
            .map(String::as_str)
            == Some("platform"),
        "the operator's label is kept"
    );

    let again = nodewarden_webhook::crds::apply(&hook, timeout).await?;
    ensure!(
        again
            .iter()
            .all(|(_, a)| *a == Applied::Replaced { changed: false }),
        "a second run changes nothing: {again:?}"
    );

    // another CRD is out of the account's reach
    let foreign: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Cluster",
                 "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                 "versions": [{"name": "v1", "served": true, "storage": true,
                               "schema": {"openAPIV3Schema": {"type": "object"}}}]}
    }))?;
    api.create(&PostParams::default(), &foreign).await?;
    let hook_api: Api<CustomResourceDefinition> = Api::all(hook.clone());
    match hook_api.get("widgets.example.com").await {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => bail!("the hook's account read another CRD: {other:?}"),
    }
    match hook_api
        .delete("features.nodewarden.io", &DeleteParams::default())
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => bail!("the hook's account may delete a CRD: {other:?}"),
    }
    Ok(())
}

// ---- install into a control plane --------------------------------------------------------------

/// `helm install` into a control plane of its own: CRDs established; Deployment, DaemonSet,
/// Service, RBAC and webhook configurations in place; the DaemonSet controller creates an agent pod
/// on every node (a tainted one too); the API server sends new DaemonSet pods, and no Deployment
/// pod, to the mutating webhook and admits them while it is down; the fail-closed webhooks are
/// live (claim writes are refused while no webhook runs); the RBAC grants exactly what the
/// components need (asked of the real authorizer); the non-default renderings pass a server-side
/// dry run; `helm upgrade` keeps an injected caBundle; `helm uninstall` removes it all but the CRDs.
#[tokio::test]
async fn install_creates_working_objects_and_uninstall_removes_them() {
    on_a_control_plane(install_and_uninstall).await;
}

async fn install_and_uninstall(cp: &ControlPlane) -> Result<()> {
    let client = cp.admin_client().await?;
    let mut nodes = Vec::new();
    for i in 0..3 {
        let name = format!("helm-node-{i}");
        let labels = BTreeMap::from([("kubernetes.io/hostname".to_string(), name.clone())]);
        create_ready_node(cp, &client, &name, labels).await?;
        nodes.push(name);
    }
    // A node only dedicated pods tolerate: the agent must still run there.
    let node_api: Api<Node> = Api::all(client.clone());
    node_api
        .patch(
            "helm-node-2",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}}),
            ),
        )
        .await?;

    let helm = Helm::for_control_plane(cp)?;
    let chart = chart_dir().display().to_string();
    let notes = helm
        .ok(&[
            "install",
            RELEASE,
            &chart,
            "--namespace",
            NS,
            "--create-namespace",
        ])
        .await?;
    ensure!(
        notes.contains("Deployment nodewarden-webhook") && notes.contains("rollout status"),
        "install prints NOTES saying what was installed and how to check it:\n{notes}"
    );

    // CRDs from crds/ are installed and served.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for plural in [
        "clusterclaims",
        "daemonsetautoscalers",
        "features",
        "nodefeaturereports",
        "noderecommendations",
    ] {
        let name = format!("{plural}.nodewarden.io");
        cp.poll(&format!("CRD {name} Established"), || {
            let crds = crds.clone();
            let name = name.clone();
            async move {
                let crd = crds.get(&name).await?;
                let established = crd
                    .status
                    .and_then(|s| s.conditions)
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True"));
                Ok(established.then_some(()))
            }
        })
        .await?;
    }

    // The objects an operator looks for, by name.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let deployment = deployments.get("nodewarden-webhook").await?;
    ensure!(deployment.spec.as_ref().and_then(|s| s.replicas) == Some(2));
    Api::<DaemonSet>::namespaced(client.clone(), NS)
        .get("nodewarden-agent")
        .await?;
    Api::<Service>::namespaced(client.clone(), NS)
        .get("nodewarden-webhook")
        .await?;
    Api::<Service>::namespaced(client.clone(), NS)
        .get("nodewarden-agent-metrics")
        .await?;
    Api::<PodDisruptionBudget>::namespaced(client.clone(), NS)
        .get("nodewarden-webhook")
        .await?;
    for sa in ["nodewarden-webhook", "nodewarden-agent"] {
        Api::<ServiceAccount>::namespaced(client.clone(), NS)
            .get(sa)
            .await?;
        Api::<ClusterRole>::all(client.clone()).get(sa).await?;
        Api::<ClusterRoleBinding>::all(client.clone()).get(sa).await?;
    }
    Api::<Role>::namespaced(client.clone(), NS)
        .get("nodewarden-webhook")
        .await?;
    Api::<RoleBinding>::namespaced(client.clone(), NS)
        .get("nodewarden-webhook")
        .await?;
    // The API server compiled and kept the CEL matchCondition.
    let mutating = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get("nodewarden-mutating")
        .await?;
    let hook = mutating
        .webhooks
        .as_deref()
        .and_then(|w| w.first())
        .context("mutating webhook")?;
    ensure!(
        hook.match_conditions.as_ref().is_some_and(|m| m.len() == 1),
        "matchConditions stored"
    );
    let validating = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .get("nodewarden-validating")
        .await?;
    ensure!(validating.webhooks.as_ref().map(Vec::len) == Some(5));
    // the agent's resize policy is installed and bound (the API server compiled its CEL)
    let policy = Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .get("nodewarden-agent-own-node-resize")
        .await?;
    let problems = policy
        .status
        .and_then(|s| s.type_checking)
        .and_then(|t| t.expression_warnings)
        .unwrap_or_default();
    ensure!(
        problems.is_empty(),
        "resize policy type-checking warnings: {problems:?}"
    );
    Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .get("nodewarden-agent-own-node-resize")
        .await?;

    // The DaemonSet controller puts one agent on every node, the tainted one included; the pods
    // are admitted although the mutating webhook is not running (failurePolicy Ignore), with the
    // node-critical priority resolved and the node name wired from the downward API.
    let pods = wait_for_daemonset_pods(cp, &client, NS, "nodewarden-agent", &nodes).await?;
    for (node, pod) in &pods {
        let spec = pod.spec.as_ref().context("pod spec")?;
        ensure!(
            spec.priority == Some(2_000_001_000),
            "{node}: priority {:?}",
            spec.priority
        );
        let env = spec.containers[0].env.as_deref().unwrap_or_default();
        let node_name = env
            .iter()
            .find(|e| e.name == "NODEWARDEN_NODE_NAME")
            .context("NODEWARDEN_NODE_NAME")?;
        let field = node_name.value_from.as_ref().and_then(|v| v.field_ref.as_ref());
        ensure!(field.map(|f| f.field_path.as_str()) == Some("spec.nodeName"));
    }
    // The webhook replicas are created (they stay Pending: no kubelet, no scheduler).
    replace_pods(cp, &client, "webhook", 2, false).await?;

    // The mutating webhook sees DaemonSet pods and only those. Helm creates the webhook
    // configurations last, and the API server picks them up a moment later, so the first agent
    // pods may have been admitted before: recreate the agent pods until the API server calls the
    // webhook for each new one (and, finding no webhook, admits it: failurePolicy Ignore).
    let mut rounds = 0;
    loop {
        rounds += 1;
        let before = rightsizing_fail_open(&client).await?;
        replace_pods(cp, &client, "agent", nodes.len(), true).await?;
        let calls = rightsizing_fail_open(&client).await? - before;
        if calls == nodes.len() as f64 {
            break;
        }
        ensure!(
            rounds < 5 && calls < nodes.len() as f64,
            "round {rounds}: {calls} calls to pods.rightsizing.nodewarden.io for {} new agent pods",
            nodes.len()
        );
    }
    // Now that the configuration is in effect: new webhook (Deployment) pods are not sent to it.
    let before = rightsizing_fail_open(&client).await?;
    replace_pods(cp, &client, "webhook", 2, true).await?;
    let calls = rightsizing_fail_open(&client).await? - before;
    ensure!(
        calls == 0.0,
        "the DaemonSet matchCondition should keep Deployment pods away from the webhook; {calls} calls"
    );
    wait_for_daemonset_pods(cp, &client, NS, "nodewarden-agent", &nodes).await?;

    // The fail-closed webhooks are live: with no webhook serving, a claim write is refused by
    // the API server naming the webhook, instead of slipping through unchecked.
    let claims_api: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource {
            group: "nodewarden.io".into(),
            version: "v1alpha1".into(),
            api_version: "nodewarden.io/v1alpha1".into(),
            kind: "ClusterClaim".into(),
            plural: "clusterclaims".into(),
        },
    );
    let claim: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "nodewarden.io/v1alpha1", "kind": "ClusterClaim",
        "metadata": {"name": "region.example.com"}, "spec": {"value": "eu-west-1"},
    }))?;
    match claims_api.create(&PostParams::default(), &claim).await {
        Ok(_) => bail!(
            "a ClusterClaim was written although the claims webhook (failurePolicy Fail) is not running"
        ),
        Err(e) => ensure!(
            e.to_string().contains("claims.nodewarden.io"),
            "the refusal should name the webhook: {e}"
        ),
    }

    // Likewise a DaemonSetAutoscaler: the API server sends it to the autoscaler webhook.
    let autoscalers_api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        NS,
        &ApiResource {
            group: "nodewarden.io".into(),
            version: "v1alpha1".into(),
            api_version: "nodewarden.io/v1alpha1".into(),
            kind: "DaemonSetAutoscaler".into(),
            plural: "daemonsetautoscalers".into(),
        },
    );
    let autoscaler: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "nodewarden.io/v1alpha1", "kind": "DaemonSetAutoscaler",
        "metadata": {"name": "node-exporter", "namespace": NS},
        "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "node-exporter"}},
    }))?;
    match autoscalers_api.create(&PostParams::default(), &autoscaler).await {
        Ok(_) => bail!(
            "a DaemonSetAutoscaler was written although the autoscaler webhook (failurePolicy Fail) is not running"
        ),
        Err(e) => ensure!(
            e.to_string().contains("autoscalers.nodewarden.io"),
            "the refusal should name the webhook: {e}"
        ),
    }

    check_rbac(&client).await?;

    // The non-default renderings are valid objects too: the API server accepts every built-in
    // object of each fixture in a dry run (cert-manager and Prometheus Operator kinds are not
    // installed here and are left out).
    for fixture in FIXTURES {
        let path = helm_fixture(fixture).display().to_string();
        let mut args = vec!["-f", path.as_str()];
        args.extend(CRD_APIS);
        let rendered = helm.template("dryrun", NS, &args).await?;
        let checked = server_dry_run(&client, &rendered)
            .await
            .with_context(|| format!("values {fixture}"))?;
        ensure!(checked >= 15, "{fixture}: only {checked} objects dry-run");
    }

    // Managed certificates: the webhook injects the caBundle with a field manager of its own. A
    // `helm upgrade` must leave it alone (the chart never renders a caBundle), or every upgrade
    // would cut the API server off from the webhook until it re-injects.
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(cp.ca_pem());
    let validating_api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let mutating_api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let inject = PatchParams::apply("nodewarden-webhook");
    let entries: Vec<Value> = [
        "claims.nodewarden.io",
        "autoscalers.nodewarden.io",
        "node-reports.nodewarden.io",
        "evictions.nodewarden.io",
        "features.nodewarden.io",
    ]
    .iter()
    .map(|n| json!({"name": n, "clientConfig": {"caBundle": ca_bundle}}))
    .collect();
    validating_api
        .patch(
            "nodewarden-validating",
            &inject,
            &Patch::Apply(json!({
                "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": "nodewarden-validating"},
                "webhooks": entries,
            })),
        )
        .await
        .context("injecting the caBundle as the webhook would")?;
    mutating_api
        .patch(
            "nodewarden-mutating",
            &inject,
            &Patch::Apply(json!({
                "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                "metadata": {"name": "nodewarden-mutating"},
                "webhooks": [{"name": "pods.rightsizing.nodewarden.io", "clientConfig": {"caBundle": ca_bundle}}],
            })),
        )
        .await?;
    helm.ok(&[
        "upgrade",
        RELEASE,
        &chart,
        "--namespace",
        NS,
        "--set",
        "webhook.logLevel=debug,claims.timeoutSeconds=4",
        // no kubelet runs the CRD hook's Job here (crds_apply_* tests the command instead)
        "--set",
        "crds.upgrade.enabled=false",
    ])
    .await?;
    let upgraded = validating_api.get("nodewarden-validating").await?;
    let claims_hook = upgraded
        .webhooks
        .as_deref()
        .and_then(|ws| ws.iter().find(|w| w.name == "claims.nodewarden.io"))
        .context("claims webhook after upgrade")?;
    ensure!(
        claims_hook.timeout_seconds == Some(4),
        "the upgrade was applied: {:?}",
        claims_hook.timeout_seconds
    );
    let mut kept = vec![];
    for w in upgraded.webhooks.as_deref().unwrap_or_default() {
        kept.push((
            w.name.clone(),
            w.client_config.ca_bundle.as_ref().map(|b| b.0.clone()),
        ));
    }
    for w in mutating_api
        .get("nodewarden-mutating")
        .await?
        .webhooks
        .unwrap_or_default()
    {
        kept.push((
            w.name.clone(),
            w.client_config.ca_bundle.as_ref().map(|b| b.0.clone()),
        ));
    }
    let pem = cp.ca_pem().as_bytes().to_vec();
    for (name, bundle) in &kept {
        ensure!(
            bundle.as_ref() == Some(&pem),
            "helm upgrade dropped the injected caBundle of {name}"
        );
    }
    ensure!(kept.len() == 6, "webhooks after upgrade: {kept:?}");

    // Uninstall removes everything the chart created, except the CRDs (Helm never deletes those).
    helm.ok(&["uninstall", RELEASE, "--namespace", NS]).await?;
    let c = client.clone();
    cp.poll("the release's objects to be gone", || {
        let c = c.clone();
        async move {
            let left = leftovers(&c).await?;
            Ok(left.is_empty().then_some(()))
        }
    })
    .await
    .with_context(|| "after helm uninstall")?;
    crds.get("clusterclaims.nodewarden.io")
        .await
        .context("helm keeps CRDs on uninstall, as the NOTES say")?;
    Ok(())
}

/// Creates every object of `rendered` whose API the control plane serves as a server-side dry
/// run (validation and admission, nothing stored); returns how many were checked.
async fn server_dry_run(client: &Client, rendered: &Rendered) -> Result<usize> {
    let discovery = kube::Discovery::new(client.clone()).run().await?;
    let params = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let mut checked = 0;
    for object in &rendered.objects {
        let api_version = object["apiVersion"].as_str().context("apiVersion")?;
        if api_version.starts_with("cert-manager.io/") || api_version.starts_with("monitoring.coreos.com/") {
            continue;
        }
        let obj: DynamicObject = serde_json::from_value(object.clone())?;
        let types = obj.types.clone().context("apiVersion/kind")?;
        let gvk = kube::api::GroupVersionKind::try_from(&types)?;
        let (resource, caps) = discovery
            .resolve_gvk(&gvk)
            .ok_or_else(|| anyhow!("the API server does not serve {api_version} {}", types.kind))?;
        let api: Api<DynamicObject> = match (caps.scope, obj.metadata.namespace.as_deref()) {
            (kube::discovery::Scope::Namespaced, Some(ns)) => {
                Api::namespaced_with(client.clone(), ns, &resource)
            }
            (kube::discovery::Scope::Namespaced, None) => {
                bail!("{} {:?} has no namespace", types.kind, obj.metadata.name)
            }
            (kube::discovery::Scope::Cluster, _) => Api::all_with(client.clone(), &resource),
        };
        api.create(&params, &obj)
            .await
            .with_context(|| format!("the API server refuses {} {:?}", types.kind, obj.metadata.name))?;
        checked += 1;
    }
    Ok(checked)
}

/// How often kube-apiserver failed open on the right-sizing webhook (it cannot reach it here).
async fn rightsizing_fail_open(client: &Client) -> Result<f64> {
    apiserver_metric_sum(
        client,
        "apiserver_admission_webhook_fail_open_count",
        "name=\"pods.rightsizing.nodewarden.io\"",
    )
    .await
}

/// Waits for `count` pods of the release's `component` (webhook or agent) and, when `replace`,
/// deletes them first and waits for their controller to create new ones (unscheduled pods are
/// deleted at once, no kubelet needed).
async fn replace_pods(
    cp: &ControlPlane,
    client: &Client,
    component: &str,
    count: usize,
    replace: bool,
) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let selector = format!("app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}");
    let params = ListParams::default().labels(&selector);
    let mut old = std::collections::BTreeSet::new();
    if replace {
        for p in pods.list(&params).await?.items {
            old.insert(p.metadata.uid.unwrap_or_default());
        }
        pods.delete_collection(&DeleteParams::default().grace_period(0), &params)
            .await?;
    }
    cp.poll(&format!("{count} new {component} pods"), || {
        let (pods, params, old) = (pods.clone(), params.clone(), old.clone());
        async move {
            let items = pods.list(&params).await?.items;
            let fresh = items
                .iter()
                .filter(|p| !old.contains(p.metadata.uid.as_deref().unwrap_or_default()))
                .count();
            Ok((items.len() == count && fresh == count).then_some(()))
        }
    })
    .await
}

/// The sum of a kube-apiserver metric over the series whose labels contain `label`.
async fn apiserver_metric_sum(client: &Client, metric: &str, label: &str) -> Result<f64> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = client
        .request_text(request)
        .await
        .context("reading kube-apiserver /metrics")?;
    let mut sum = 0.0;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(metric) else {
            continue;
        };
        if !rest.starts_with('{') || !rest.contains(label) {
            continue;
        }
        let value = rest.rsplit(' ').next().unwrap_or_default();
        sum += value
            .parse::<f64>()
            .with_context(|| format!("metric line {line:?}"))?;
    }
    Ok(sum)
}

/// What is still there of the release (pods included: the garbage collector removes them).
async fn leftovers(client: &Client) -> Result<Vec<String>> {
    let mut left = Vec::new();
    let ns_params = ListParams::default().labels("app.kubernetes.io/instance=nodewarden");
    macro_rules! check {
        ($kind:ty, $api:expr) => {
            let api: Api<$kind> = $api;
            for o in api.list(&ns_params).await?.items {
                left.push(format!(
                    "{} {}",
                    std::any::type_name::<$kind>()
                        .rsplit("::")
                        .next()
                        .unwrap_or("?"),
                    kube::ResourceExt::name_any(&o)
                ));
            }
        };
    }
    check!(Deployment, Api::namespaced(client.clone(), NS));
    check!(DaemonSet, Api::namespaced(client.clone(), NS));
    check!(Service, Api::namespaced(client.clone(), NS));
    check!(ServiceAccount, Api::namespaced(client.clone(), NS));
    check!(Role, Api::namespaced(client.clone(), NS));
    check!(RoleBinding, Api::namespaced(client.clone(), NS));
    check!(PodDisruptionBudget, Api::namespaced(client.clone(), NS));
    check!(Pod, Api::namespaced(client.clone(), NS));
    check!(ClusterRole, Api::all(client.clone()));
    check!(ClusterRoleBinding, Api::all(client.clone()));
    check!(MutatingWebhookConfiguration, Api::all(client.clone()));
    check!(ValidatingWebhookConfiguration, Api::all(client.clone()));
    check!(ValidatingAdmissionPolicy, Api::all(client.clone()));
    check!(ValidatingAdmissionPolicyBinding, Api::all(client.clone()));
    Ok(left)
}

/// What each component's service account may and may not do, one case per line:
/// `<webhook|agent> <verb> <group>/<resource>[/<subresource>] <namespace|-> <name|-> <yes|no>`
/// (the core group is written `core`).
const RBAC_CASES: &[&str] = &[
    "webhook patch admissionregistration.k8s.io/validatingwebhookconfigurations - nodewarden-validating yes",
    "webhook patch admissionregistration.k8s.io/mutatingwebhookconfigurations - nodewarden-mutating yes",
    "webhook patch admissionregistration.k8s.io/validatingwebhookconfigurations - someone-elses no",
    "webhook get admissionregistration.k8s.io/mutatingwebhookconfigurations - nodewarden-validating yes",
    "webhook get core/secrets nodewarden nodewarden-webhook-tls yes",
    "webhook update core/secrets nodewarden nodewarden-webhook-tls yes",
    "webhook create core/secrets nodewarden - yes",
    "webhook get core/secrets nodewarden another-secret no",
    "webhook get core/secrets kube-system nodewarden-webhook-tls no",
    "webhook create coordination.k8s.io/leases nodewarden - yes",
    "webhook update coordination.k8s.io/leases nodewarden nodewarden-controllers yes",
    "webhook update coordination.k8s.io/leases kube-system nodewarden-controllers no",
    "webhook watch nodewarden.io/daemonsetautoscalers - - yes",
    "webhook patch nodewarden.io/features/status default x yes",
    "webhook patch nodewarden.io/features default x no",
    "webhook list core/limitranges - - yes",
    "webhook watch core/nodes - - yes",
    "webhook update core/nodes - x no",
    "webhook get core/namespaces - kube-system yes",
    "webhook get core/namespaces - default no",
    "webhook list core/pods - - no",
    "webhook get core/pods default x yes",
    "webhook delete core/pods default x no",
    "webhook create nodewarden.io/clusterclaims - - no",
    "webhook watch about.k8s.io/clusterproperties - - yes",
    "webhook update about.k8s.io/clusterproperties - x no",
    "webhook list cluster.open-cluster-management.io/clusterclaims - - yes",
    "agent watch core/pods - - yes",
    "agent get core/nodes/metrics - helm-node-0 yes",
    "agent get core/nodes - helm-node-0 yes",
    "agent patch core/nodes - helm-node-0 no",
    "agent get core/nodes/proxy - helm-node-0 no",
    "agent create nodewarden.io/noderecommendations - - yes",
    "agent patch nodewarden.io/nodefeaturereports - helm-node-0 yes",
    "agent list nodewarden.io/daemonsetautoscalers - - yes",
    "agent update nodewarden.io/daemonsetautoscalers default x no",
    "agent get core/secrets nodewarden nodewarden-webhook-tls no",
    "agent delete core/pods nodewarden x no",
    "agent patch core/pods/resize default x yes",
    "agent update core/pods/resize default x no",
    "agent patch core/pods default x no",
    "agent create core/pods/eviction default x yes",
    "agent get apps/daemonsets default x yes",
    "agent list apps/daemonsets - - no",
    "agent get apps/controllerrevisions default x-1 yes",
    "agent list apps/controllerrevisions - - no",
    "agent list coordination.k8s.io/leases nodewarden - yes",
    "agent watch core/limitranges - - yes",
    "agent create events.k8s.io/events default - yes",
    "agent delete events.k8s.io/events default x no",
    "agent create coordination.k8s.io/leases nodewarden - yes",
    "agent delete coordination.k8s.io/leases nodewarden x yes",
    "agent get coordination.k8s.io/leases kube-system x no",
];

/// Asks the real authorizer (SubjectAccessReview) about each of [`RBAC_CASES`].
async fn check_rbac(client: &Client) -> Result<()> {
    let api: Api<SubjectAccessReview> = Api::all(client.clone());
    let mut wrong = Vec::new();
    for case in RBAC_CASES {
        let [who, verb, resource, ns, name, want] = case.split_whitespace().collect::<Vec<_>>()[..] else {
            bail!("malformed RBAC case {case:?}");
        };
        let user = format!("system:serviceaccount:{NS}:nodewarden-{who}");
        let mut parts = resource.splitn(3, '/');
        let group = parts
            .next()
            .map(|g| if g == "core" { "" } else { g })
            .unwrap_or_default();
        let resource = parts.next().context("resource")?;
        let subresource = parts.next();
        let some = |s: &str| (s != "-").then(|| s.to_string());
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user),
                groups: Some(vec![
                    "system:serviceaccounts".to_string(),
                    format!("system:serviceaccounts:{NS}"),
                    "system:authenticated".to_string(),
                ]),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.to_string()),
                    group: Some(group.to_string()),
                    resource: Some(resource.to_string()),
                    subresource: subresource.map(str::to_string),
                    namespace: some(ns),
                    name: some(name),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let got = api.create(&PostParams::default(), &review).await?;
        let allowed = got.status.map(|s| s.allowed).unwrap_or(false);
        if allowed != (want == "yes") {
            wrong.push(format!("{case}: allowed={allowed}"));
        }
    }
    if !wrong.is_empty() {
        return Err(anyhow!(
            "RBAC differs from what the components need:\n{}",
            wrong.join("\n")
        ));
    }
    Ok(())
}

// ---- upgrade from the previous chart, and rollback ---------------------------------------------

/// The chart a user upgrades from, as `(commit, why)`: the last commit at the previous `version`
/// of `Chart.yaml`; while the history has no earlier version (the chart has been 0.1.0 since it
/// was written), the chart just before its CRDs last changed, so that the upgrade carries a CRD
/// schema change as a real one would.
fn previous_chart() -> Result<(String, String)> {
    let git = |args: &[&str]| -> Result<String> {
        let out = std::process::Command::new("git")
            .args(args)
            .current_dir(chart_dir())
            .output()
            .context("running git")?;
        ensure!(
            out.status.success(),
            "git {} failed (the test needs the repository's history: a clone that is not shallow): {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let version_of = |chart_yaml: &str| {
        chart_yaml
            .lines()
            .find_map(|l| l.strip_prefix("version:"))
            .map(|v| v.trim().trim_matches('"').to_string())
    };
    let current = version_of(&std::fs::read_to_string(chart_dir().join("Chart.yaml"))?)
        .context("Chart.yaml has no version")?;
    for commit in git(&["log", "--format=%H", "--", "Chart.yaml"])?.lines() {
        let Ok(before) = git(&["show", &format!("{commit}^:charts/nodewarden/Chart.yaml")]) else {
            continue;
        };
        if let Some(v) = version_of(&before).filter(|v| *v != current) {
            return Ok((
                git(&["rev-parse", &format!("{commit}^")])?,
                format!("the last commit at the previous chart version {v} (before {current})"),
            ));
        }
    }
    let crds = git(&["log", "-1", "--format=%H", "--", "crds"])?;
    ensure!(!crds.is_empty(), "no commit changed the chart's CRDs");
    Ok((
        git(&["rev-parse", &format!("{crds}^")])?,
        format!(
            "no earlier chart version than {current} in the history: the chart just before its CRDs last \
             changed ({}), so the upgrade carries a CRD schema change",
            &crds[..12]
        ),
    ))
}

/// The chart folder of `commit`, extracted into `dir` (`git archive`).
fn extract_chart(commit: &str, dir: &std::path::Path) -> Result<std::path::PathBuf> {
    let tar = dir.join("chart.tar");
    let status = std::process::Command::new("git")
        .args(["archive", "--format=tar", "-o"])
        .arg(&tar)
        .arg(commit)
        .arg("charts/nodewarden")
        .current_dir(chart_dir().join("../.."))
        .status()?;
    ensure!(status.success(), "git archive {commit} failed");
    let status = std::process::Command::new("tar")
        .arg("-xf")
        .arg(&tar)
        .arg("-C")
        .arg(dir)
        .status()?;
    ensure!(status.success(), "tar -xf failed");
    Ok(dir.join("charts/nodewarden"))
}

/// `helm upgrade` from the previous chart to this one, then `helm rollback`, with nodewarden in
/// use, on a control plane of its own: the webhook (this tree's, in the test process, behind the
/// chart's Service through an EndpointSlice, as the API server reaches a pod) keeps answering
/// (a DaemonSet pod gets its node's figures, a ClusterClaim passes the fail-closed guard) after
/// each step; the CRD upgrade (the hook's command; no kubelet runs the hook's Job here) brings
/// the new schema, whose new field then sticks; no DaemonSetAutoscaler is lost, none changes
/// its uid; rollback leaves the CRDs as they are (Helm never touches CRDs, and neither does the
/// hook on rollback) and the objects too.
#[tokio::test]
async fn upgrade_from_the_previous_chart_and_rollback_keep_nodewarden_working() {
    on_a_control_plane(upgrade_and_rollback).await;
}

const APPS: &str = "apps";

fn autoscalers(client: &Client) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        APPS,
        &ApiResource {
            group: "nodewarden.io".into(),
            version: "v1alpha1".into(),
            api_version: "nodewarden.io/v1alpha1".into(),
            kind: "DaemonSetAutoscaler".into(),
            plural: "daemonsetautoscalers".into(),
        },
    )
}

/// Name → uid of the DaemonSetAutoscalers in `apps`.
async fn autoscaler_uids(client: &Client) -> Result<BTreeMap<String, String>> {
    Ok(autoscalers(client)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|o| {
            (
                o.metadata.name.unwrap_or_default(),
                o.metadata.uid.unwrap_or_default(),
            )
        })
        .collect())
}

/// What a user notices of nodewarden at `step`: a new pod of the autoscaled DaemonSet gets the
/// node's memory figure, and a ClusterClaim write is answered by the claims guard.
async fn nodewarden_answers(cp: &ControlPlane, client: &Client, ds_uid: &str, step: &str) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), APPS);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": format!("shipper-{step}"), "ownerReferences": [{"apiVersion": "apps/v1",
            "kind": "DaemonSet", "name": "shipper", "uid": ds_uid, "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"nodeName": "helm-upgrade-node", "containers": [{"name": "agent", "image": "nodewarden-e2e/pause:never-pulled",
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}}}]}
    }))?;
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    cp.poll(
        &format!("{step}: a DaemonSet pod gets its node's 300Mi"),
        || async {
            let got = pods.create(&dry_run, &pod).await?;
            let memory = got
                .spec
                .as_ref()
                .and_then(|s| s.containers.first())
                .and_then(|c| c.resources.as_ref())
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("memory"))
                .map(|q| q.0.clone());
            Ok((memory.as_deref() == Some("300Mi")).then_some(()))
        },
    )
    .await?;
    let claims: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource {
            group: "nodewarden.io".into(),
            version: "v1alpha1".into(),
            api_version: "nodewarden.io/v1alpha1".into(),
            kind: "ClusterClaim".into(),
            plural: "clusterclaims".into(),
        },
    );
    let claim: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "nodewarden.io/v1alpha1", "kind": "ClusterClaim",
        "metadata": {"name": format!("{step}.example.com")}, "spec": {"value": step},
    }))?;
    claims
        .create(&PostParams::default(), &claim)
        .await
        .with_context(|| format!("{step}: a ClusterClaim through the claims guard"))?;
    Ok(())
}

/// Whether the DaemonSetAutoscaler CRD's stored schema has `spec.<field>`.
async fn autoscaler_spec_has(client: &Client, field: &str) -> Result<bool> {
    let crd = Api::<CustomResourceDefinition>::all(client.clone())
        .get("daemonsetautoscalers.nodewarden.io")
        .await?;
    Ok(crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| s.properties.as_ref())
        .and_then(|p| p.get("spec"))
        .and_then(|s| s.properties.as_ref())
        .is_some_and(|p| p.contains_key(field)))
}

/// The caBundle the webhook injects (file certificates here: the test does it as the webhook's
/// field manager would), into both configurations.
async fn inject_ca_bundle(cp: &ControlPlane, client: &Client) -> Result<()> {
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(cp.ca_pem());
    let inject = PatchParams::apply("nodewarden-webhook");
    let validating = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .get("nodewarden-validating")
        .await?;
    let entries: Vec<Value> = validating
        .webhooks
        .unwrap_or_default()
        .iter()
        .map(|w| json!({"name": w.name, "clientConfig": {"caBundle": ca_bundle}}))
        .collect();
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .patch(
            "nodewarden-validating",
            &inject,
            &Patch::Apply(json!({
                "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": "nodewarden-validating"}, "webhooks": entries,
            })),
        )
        .await?;
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .patch(
            "nodewarden-mutating",
            &inject,
            &Patch::Apply(json!({
                "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                "metadata": {"name": "nodewarden-mutating"},
                "webhooks": [{"name": "pods.rightsizing.nodewarden.io", "clientConfig": {"caBundle": ca_bundle}}],
            })),
        )
        .await?;
    Ok(())
}

async fn upgrade_and_rollback(cp: &ControlPlane) -> Result<()> {
    use nodewarden_tests::process::{free_ports, host_address, write_file};

    let (commit, why) = previous_chart()?;
    eprintln!("upgrading from the chart of {}: {why}", &commit[..12]);
    let work = tempfile::tempdir()?;
    let previous = extract_chart(&commit, work.path())?;

    // The API server calls a webhook Service at its endpoints only with aggregator routing (a
    // real cluster's reaches the pod network; this one has none): start it again with the flag.
    let mut args = cp.kill_apiserver()?;
    args.push("--enable-aggregator-routing=true".to_string());
    cp.start_apiserver(&args).await?;
    let client = cp.admin_client().await?;
    let helm = Helm::for_control_plane(cp)?;
    let started = std::time::Instant::now();

    // 1. the previous chart, as a user installed it
    helm.ok(&[
        "install",
        RELEASE,
        &previous.display().to_string(),
        "--namespace",
        NS,
        "--create-namespace",
    ])
    .await
    .context("helm install of the previous chart")?;
    // The chart before node groups (the baseline while the chart has had one version) has no
    // `nodeGroupLabel`: then a user's autoscaler takes the new fields only after the upgrade.
    // A later baseline may have it; the generic checks below hold for any.
    let node_groups_are_new = !autoscaler_spec_has(&client, "nodeGroupLabel").await?;
    let crds_differ = {
        let files = |dir: std::path::PathBuf| -> Result<BTreeMap<String, Vec<u8>>> {
            let mut out = BTreeMap::new();
            for e in std::fs::read_dir(&dir).with_context(|| dir.display().to_string())? {
                let e = e?;
                out.insert(
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path())?,
                );
            }
            Ok(out)
        };
        files(previous.join("crds"))? != files(chart_dir().join("crds"))?
    };

    // This tree's webhook behind the chart's Service (its pods stay Pending: no kubelet).
    let address = host_address()?;
    let [port, admin]: [u16; 2] = free_ports(2)?.try_into().map_err(|_| anyhow!("two ports"))?;
    let cert = cp.ca().issue_serving(&nodewarden_certs::ServingSpec {
        dns_names: vec![format!("nodewarden-webhook.{NS}.svc")],
        ip_addresses: vec![],
        validity: std::time::Duration::from_secs(3600),
    })?;
    write_file(&work.path().join("tls.crt"), cert.cert_pem.as_bytes(), false)?;
    write_file(&work.path().join("tls.key"), cert.key_pem.as_bytes(), true)?;
    let webhook = nodewarden_tests::InProcessWebhook::start(
        &[
            format!("--listen-addr={address}:{port}"),
            format!("--admin-addr=127.0.0.1:{admin}"),
            format!("--tls-cert-file={}", work.path().join("tls.crt").display()),
            format!("--tls-key-file={}", work.path().join("tls.key").display()),
            format!("--kubeconfig={}", cp.kubeconfig_path().display()),
            format!("--namespace={NS}"),
            "--pod-name=nodewarden-webhook-upgrade".to_string(),
            "--log-format=text".to_string(),
            "--log-level=warn".to_string(),
            "--shutdown-grace=1s".to_string(),
        ],
        admin,
    )
    .await?;
    let slice: k8s_openapi::api::discovery::v1::EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": "nodewarden-webhook-test", "namespace": NS, "labels": {
            "kubernetes.io/service-name": "nodewarden-webhook",
            "endpointslice.kubernetes.io/managed-by": "e2e.nodewarden.io"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {"ready": true}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    }))?;
    Api::<k8s_openapi::api::discovery::v1::EndpointSlice>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &slice)
        .await?;
    // Older API servers (v1.30's) resolve a webhook Service through its core/v1 Endpoints, which
    // the endpoints controller keeps equal to the Service's ready pods (none here): it is turned
    // off and the Endpoints written as the slice says (newer API servers read the slice).
    cp.restart_controller_manager_without(&["endpoints-controller"])
        .await?;
    let endpoints: k8s_openapi::api::core::v1::Endpoints = serde_json::from_value(json!({
        "metadata": {"name": "nodewarden-webhook", "namespace": NS},
        "subsets": [{"addresses": [{"ip": address}], "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}],
    }))?;
    Api::<k8s_openapi::api::core::v1::Endpoints>::namespaced(client.clone(), NS)
        .patch(
            "nodewarden-webhook",
            &PatchParams::apply("e2e.nodewarden.io").force(),
            &Patch::Apply(&endpoints),
        )
        .await?;
    inject_ca_bundle(cp, &client).await?;

    // What a user has in place: an autoscaled DaemonSet (no node matches it: its pods are made
    // by the test), its node's figures, two autoscalers.
    nodewarden_tests::create_namespace(cp, &client, APPS).await?;
    let nowhere = BTreeMap::from([("nodewarden.io/e2e-nowhere".to_string(), "true".to_string())]);
    let ds = Api::<DaemonSet>::namespaced(client.clone(), APPS)
        .create(
            &PostParams::default(),
            &nodewarden_tests::simple_daemonset("shipper", &nowhere)?,
        )
        .await?;
    let ds_uid = ds.metadata.uid.clone().context("DaemonSet uid")?;
    for (name, target) in [("shipper", "shipper"), ("exporter", "exporter")] {
        let dsa: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "nodewarden.io/v1alpha1", "kind": "DaemonSetAutoscaler",
            "metadata": {"name": name, "namespace": APPS},
            "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": target}},
        }))?;
        let api = autoscalers(&client);
        cp.poll(&format!("DaemonSetAutoscaler {name} admitted"), || async {
            Ok(api.create(&PostParams::default(), &dsa).await.ok().map(|_| ()))
        })
        .await?;
    }
    let rec: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "nodewarden.io/v1alpha1", "kind": "NodeRecommendation",
        "metadata": {"name": "helm-upgrade-node"},
        "spec": {"recommendations": [{"autoscaler": {"namespace": APPS, "name": "shipper"}, "containerName": "agent",
                 "target": {"cpu": "250m", "memory": "300Mi"}, "sampleCount": 1440}]}
    }))?;
    Api::<DynamicObject>::all_with(
        client.clone(),
        &ApiResource {
            group: "nodewarden.io".into(),
            version: "v1alpha1".into(),
            api_version: "nodewarden.io/v1alpha1".into(),
            kind: "NodeRecommendation".into(),
            plural: "noderecommendations".into(),
        },
    )
    .create(&PostParams::default(), &rec)
    .await?;
    nodewarden_answers(cp, &client, &ds_uid, "installed").await?;
    // the previous schema knows only `scope: Node`
    let scoped = json!({"spec": {"scope": "NodeGroup", "nodeGroupLabel": "topology.kubernetes.io/zone"}});
    if node_groups_are_new {
        match autoscalers(&client)
            .patch("exporter", &PatchParams::default(), &Patch::Merge(&scoped))
            .await
        {
            Err(kube::Error::Api(s)) if s.code == 422 => {}
            other => bail!("the previous CRD took scope: NodeGroup: {other:?}"),
        }
    } else {
        eprintln!("the previous chart has node groups already: the new-field steps are left out");
    }
    let before = autoscaler_uids(&client).await?;
    ensure!(before.len() == 2, "autoscalers: {before:?}");
    let installed = started.elapsed();

    // 2. upgrade: the pre-upgrade hook's command first (as the hook's Job runs it), then helm
    let applied = nodewarden_webhook::crds::apply(&client, std::time::Duration::from_secs(60)).await?;
    use nodewarden_webhook::crds::Applied;
    ensure!(applied.len() == 5, "{applied:?}");
    ensure!(
        !crds_differ
            || applied
                .iter()
                .any(|(_, a)| matches!(a, Applied::Created | Applied::Replaced { changed: true })),
        "the chart's CRDs changed since the previous chart, but the CRD upgrade changed none: {applied:?}"
    );
    ensure!(
        autoscaler_spec_has(&client, "nodeGroupLabel").await?,
        "the CRD upgrade did not bring spec.nodeGroupLabel"
    );
    let chart = chart_dir().display().to_string();
    helm.ok(&[
        "upgrade",
        RELEASE,
        &chart,
        "--namespace",
        NS,
        // no kubelet runs the hook's Job here: its command ran above
        "--set",
        "crds.upgrade.enabled=false",
    ])
    .await
    .context("helm upgrade to this chart")?;
    nodewarden_answers(cp, &client, &ds_uid, "upgraded").await?;
    ensure!(
        autoscaler_uids(&client).await? == before,
        "after the upgrade the autoscalers are not the same objects: {:?}",
        autoscaler_uids(&client).await?
    );
    let grouped = autoscalers(&client)
        .patch("exporter", &PatchParams::default(), &Patch::Merge(&scoped))
        .await
        .context("scope: NodeGroup after the upgrade")?;
    ensure!(
        grouped.data["spec"]["scope"] == "NodeGroup"
            && grouped.data["spec"]["nodeGroupLabel"] == "topology.kubernetes.io/zone",
        "the upgraded CRD does not keep scope: NodeGroup and nodeGroupLabel: {}",
        grouped.data
    );
    let upgraded = started.elapsed();

    // 3. rollback to the previous chart's revision
    helm.ok(&["rollback", RELEASE, "1", "--namespace", NS])
        .await
        .context("helm rollback")?;
    let history = helm
        .ok(&["history", RELEASE, "--namespace", NS, "-o", "json"])
        .await?;
    let history: Value = serde_json::from_str(&history)?;
    let last = history
        .as_array()
        .and_then(|h| h.last())
        .context("helm history")?;
    ensure!(
        last["revision"] == 3 && last["status"] == "deployed",
        "after rollback: {history}"
    );
    nodewarden_answers(cp, &client, &ds_uid, "rolled-back").await?;
    ensure!(
        autoscaler_uids(&client).await? == before,
        "after the rollback the autoscalers are not the same objects"
    );
    ensure!(
        autoscaler_spec_has(&client, "nodeGroupLabel").await?,
        "the rollback took the CRD back (Helm does not touch CRDs)"
    );
    let kept = autoscalers(&client).get("exporter").await?;
    ensure!(
        kept.data["spec"]["scope"] == "NodeGroup"
            && kept.data["spec"]["nodeGroupLabel"] == "topology.kubernetes.io/zone",
        "the rollback lost the upgraded fields: {}",
        kept.data
    );
    eprintln!(
        "previous chart installed and in use after {:.1} s, upgraded after {:.1} s, rolled back after {:.1} s",
        installed.as_secs_f64(),
        upgraded.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    webhook.stop().await?;
    Ok(())
}
