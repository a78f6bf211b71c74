//! Registering a webhook that the test process serves on loopback, so the real API server
//! calls it.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference, ValidatingWebhook,
    ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

use crate::cluster::FIELD_MANAGER;

/// Where the webhook under test listens: `https://127.0.0.1:<port>`, with a serving
/// certificate signed by the CA in `ca_pem` (e.g. from
/// [`crate::ControlPlane::issue_loopback_serving_cert`] and [`crate::ControlPlane::ca_pem`]).
#[derive(Clone, Debug)]
pub struct LoopbackEndpoint {
    pub port: u16,
    pub ca_pem: String,
}

/// Where the API server reaches a webhook: what a configuration's `clientConfig` says for each
/// handler path.
pub trait WebhookEndpoint {
    /// `clientConfig` for the handler at `path` (e.g. `/mutate/pods`).
    fn client_config(&self, path: &str) -> WebhookClientConfig;
}

/// A caBundle of `ca_pem`, or none when it is empty (the chart in managed mode registers none,
/// and the webhook injects its own).
fn ca_bundle(ca_pem: &str) -> Option<ByteString> {
    (!ca_pem.is_empty()).then(|| ByteString(ca_pem.as_bytes().to_vec()))
}

impl LoopbackEndpoint {
    /// `clientConfig` for the handler at `path` (e.g. `/mutate/pods`); no caBundle when
    /// `ca_pem` is empty.
    pub fn client_config(&self, path: &str) -> WebhookClientConfig {
        WebhookClientConfig {
            url: Some(format!("https://127.0.0.1:{}{path}", self.port)),
            ca_bundle: ca_bundle(&self.ca_pem),
            service: None,
        }
    }
}

impl WebhookEndpoint for LoopbackEndpoint {
    fn client_config(&self, path: &str) -> WebhookClientConfig {
        LoopbackEndpoint::client_config(self, path)
    }
}

/// A webhook behind a Service of the cluster (the API server resolves it through its
/// EndpointSlices), its serving certificate signed by the CA in `ca_pem` (none when empty).
#[derive(Clone, Debug)]
pub struct ServiceEndpoint {
    pub namespace: String,
    pub name: String,
    pub port: i32,
    pub ca_pem: String,
}

impl WebhookEndpoint for ServiceEndpoint {
    fn client_config(&self, path: &str) -> WebhookClientConfig {
        WebhookClientConfig {
            url: None,
            ca_bundle: ca_bundle(&self.ca_pem),
            service: Some(ServiceReference {
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                path: Some(path.to_string()),
                port: Some(self.port),
            }),
        }
    }
}

/// One webhook of a configuration.
#[derive(Clone, Debug)]
pub struct Hook {
    /// Fully qualified webhook name, e.g. `pods.nodewarden.io`.
    pub name: String,
    /// Path on the endpoint, e.g. `/mutate/pods`.
    pub path: String,
    pub rules: Vec<RuleWithOperations>,
    /// Limit the hook to some namespaces. In the shared control plane, scope hooks to the
    /// test's namespace ([`Hook::only_namespace`]) so they do not see other tests' objects.
    pub namespace_selector: Option<LabelSelector>,
    pub object_selector: Option<LabelSelector>,
    /// `Fail` (the default here: a test wants to see a broken webhook) or `Ignore`.
    pub failure_policy: String,
    pub timeout_seconds: i32,
}

impl Hook {
    /// A hook for `operations` on `resources` (e.g. `["pods"]`) of `group`/`version`.
    pub fn new(
        name: &str,
        path: &str,
        group: &str,
        version: &str,
        resources: &[&str],
        operations: &[&str],
    ) -> Self {
        Self {
            name: name.to_string(),
            path: path.to_string(),
            rules: vec![RuleWithOperations {
                api_groups: Some(vec![group.to_string()]),
                api_versions: Some(vec![version.to_string()]),
                resources: Some(resources.iter().map(|r| r.to_string()).collect()),
                operations: Some(operations.iter().map(|o| o.to_string()).collect()),
                scope: None,
            }],
            namespace_selector: None,
            object_selector: None,
            failure_policy: "Fail".to_string(),
            timeout_seconds: 10,
        }
    }

    /// Restricts the hook to the namespace `name` (by its `kubernetes.io/metadata.name` label).
    pub fn only_namespace(mut self, name: &str) -> Self {
        self.namespace_selector = Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                "kubernetes.io/metadata.name".to_string(),
                name.to_string(),
            )])),
            match_expressions: None,
        });
        self
    }

    /// Restricts the hook to objects labelled `key`=`value` (its `objectSelector`).
    pub fn only_labelled(mut self, key: &str, value: &str) -> Self {
        self.object_selector = Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(key.to_string(), value.to_string())])),
            match_expressions: None,
        });
        self
    }

    /// Keeps only the rules of API group `group` (e.g. one of the claims hook's three APIs).
    pub fn only_group(mut self, group: &str) -> Self {
        self.rules.retain(|r| {
            r.api_groups
                .as_deref()
                .is_some_and(|g| g.iter().any(|g| g == group))
        });
        self
    }

    /// The hook for `operations` only, on every rule (e.g. without `DELETE`).
    pub fn operations(mut self, operations: &[&str]) -> Self {
        for rule in &mut self.rules {
            rule.operations = Some(operations.iter().map(|o| o.to_string()).collect());
        }
        self
    }

    /// `failurePolicy`: `Fail` or `Ignore`.
    pub fn failure_policy(mut self, policy: &str) -> Self {
        self.failure_policy = policy.to_string();
        self
    }

    /// `timeoutSeconds`.
    pub fn timeout_seconds(mut self, seconds: i32) -> Self {
        self.timeout_seconds = seconds;
        self
    }

    /// The right-sizing pod mutator, `/mutate/pods` on pod CREATE, as the chart registers it:
    /// `Ignore` (a pod is never refused for want of the webhook), 5 s.
    pub fn pods() -> Self {
        Self::new(
            "pods.rightsizing.nodewarden.io",
            "/mutate/pods",
            "",
            "v1",
            &["pods"],
            &["CREATE"],
        )
        .failure_policy("Ignore")
        .timeout_seconds(5)
    }

    /// The autoscalers' validation, `/validate/autoscalers` on CREATE and UPDATE, 5 s.
    pub fn autoscalers() -> Self {
        Self::new(
            "autoscalers.rightsizing.nodewarden.io",
            "/validate/autoscalers",
            "nodewarden.io",
            "v1alpha1",
            &["daemonsetautoscalers"],
            &["CREATE", "UPDATE"],
        )
        .timeout_seconds(5)
    }

    /// The node reports' guard, `/validate/node-reports` on CREATE and UPDATE of
    /// NodeRecommendations and NodeFeatureReports.
    pub fn node_reports() -> Self {
        Self::new(
            "node-reports.nodewarden.io",
            "/validate/node-reports",
            "nodewarden.io",
            "v1alpha1",
            &["noderecommendations", "nodefeaturereports"],
            &["CREATE", "UPDATE"],
        )
    }

    /// The claims guard, `/validate/claims` on CREATE, UPDATE and DELETE of nodewarden's
    /// ClusterClaims, about.k8s.io's ClusterProperties and Open Cluster Management's ClusterClaims
    /// (registered before its CRD exists, as the chart may be).
    pub fn claims() -> Self {
        let operations = ["CREATE", "UPDATE", "DELETE"];
        let path = "/validate/claims";
        let mut hook = Self::new(
            "claims.nodewarden.io",
            path,
            "nodewarden.io",
            "v1alpha1",
            &["clusterclaims"],
            &operations,
        );
        for (group, version, resource) in [
            ("about.k8s.io", "*", "clusterproperties"),
            ("cluster.open-cluster-management.io", "v1alpha1", "clusterclaims"),
        ] {
            let more = Self::new(&hook.name, path, group, version, &[resource], &operations);
            hook.rules.extend(more.rules);
        }
        hook
    }

    /// The Features' validation, `/validate/features` on CREATE and UPDATE of Features (a test
    /// adds the rules of the fields it guards).
    pub fn features() -> Self {
        Self::new(
            "features.nodewarden.io",
            "/validate/features",
            "nodewarden.io",
            "v1alpha1",
            &["features"],
            &["CREATE", "UPDATE"],
        )
    }
}

/// A kind of webhook configuration [`register_webhooks`] applies: mutating or validating.
pub trait WebhookConfiguration:
    kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned
{
    /// The configuration `name` of `hooks`, each calling `endpoint`.
    fn of(name: &str, endpoint: &dyn WebhookEndpoint, hooks: &[Hook]) -> Self;
}

impl WebhookConfiguration for MutatingWebhookConfiguration {
    fn of(name: &str, endpoint: &dyn WebhookEndpoint, hooks: &[Hook]) -> Self {
        MutatingWebhookConfiguration {
            metadata: meta(name),
            webhooks: Some(
                hooks
                    .iter()
                    .map(|h| MutatingWebhook {
                        name: h.name.clone(),
                        client_config: endpoint.client_config(&h.path),
                        rules: Some(h.rules.clone()),
                        namespace_selector: h.namespace_selector.clone(),
                        object_selector: h.object_selector.clone(),
                        failure_policy: Some(h.failure_policy.clone()),
                        timeout_seconds: Some(h.timeout_seconds),
                        side_effects: "None".to_string(),
                        admission_review_versions: vec!["v1".to_string()],
                        reinvocation_policy: Some("IfNeeded".to_string()),
                        match_policy: Some("Equivalent".to_string()),
                        match_conditions: None,
                    })
                    .collect(),
            ),
        }
    }
}

impl WebhookConfiguration for ValidatingWebhookConfiguration {
    fn of(name: &str, endpoint: &dyn WebhookEndpoint, hooks: &[Hook]) -> Self {
        ValidatingWebhookConfiguration {
            metadata: meta(name),
            webhooks: Some(
                hooks
                    .iter()
                    .map(|h| ValidatingWebhook {
                        name: h.name.clone(),
                        client_config: endpoint.client_config(&h.path),
                        rules: Some(h.rules.clone()),
                        namespace_selector: h.namespace_selector.clone(),
                        object_selector: h.object_selector.clone(),
                        failure_policy: Some(h.failure_policy.clone()),
                        timeout_seconds: Some(h.timeout_seconds),
                        side_effects: "None".to_string(),
                        admission_review_versions: vec!["v1".to_string()],
                        match_policy: Some("Equivalent".to_string()),
                        match_conditions: None,
                    })
                    .collect(),
            ),
        }
    }
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        ..Default::default()
    }
}

/// Server-side applies the webhook configuration `name` of kind `C` (mutating or validating)
/// calling `endpoint` (a [`LoopbackEndpoint`] or a [`ServiceEndpoint`]).
///
/// The API server picks a new configuration up from its watch within about a second; a
/// test should retry its first request (or probe) until the webhook has seen it.
pub async fn register_webhooks<C: WebhookConfiguration>(
    client: &Client,
    name: &str,
    endpoint: &dyn WebhookEndpoint,
    hooks: &[Hook],
) -> Result<C> {
    let config = C::of(name, endpoint, hooks);
    let api: Api<C> = Api::all(client.clone());
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&config),
    )
    .await
    .with_context(|| format!("applying {} {name}", C::kind(&())))
}

/// [`register_webhooks`] of a MutatingWebhookConfiguration.
pub async fn register_mutating_webhooks(
    client: &Client,
    name: &str,
    endpoint: &dyn WebhookEndpoint,
    hooks: &[Hook],
) -> Result<MutatingWebhookConfiguration> {
    register_webhooks(client, name, endpoint, hooks).await
}

/// [`register_webhooks`] of a ValidatingWebhookConfiguration.
pub async fn register_validating_webhooks(
    client: &Client,
    name: &str,
    endpoint: &dyn WebhookEndpoint,
    hooks: &[Hook],
) -> Result<ValidatingWebhookConfiguration> {
    register_webhooks(client, name, endpoint, hooks).await
}

/// `nodewarden_webhook::run` in the test process, with real flags.
pub struct InProcessWebhook {
    shutdown: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    /// Plain-HTTP admin port (`/readyz`, `/metrics`).
    pub admin_port: u16,
}

impl InProcessWebhook {
    /// Starts the webhook with `args` (without the program name; must include
    /// `--admin-addr=127.0.0.1:<admin_port>`) and waits up to 60 s for `/readyz`.
    pub async fn start(args: &[String], admin_port: u16) -> Result<Self> {
        let mut argv = vec!["nodewarden-webhook".to_string()];
        argv.extend(args.iter().cloned());
        let config = nodewarden_webhook::config::Config::from_args(&argv)
            .map_err(|e| anyhow::anyhow!("webhook flags: {e}"))?;
        let shutdown = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(nodewarden_webhook::run(config, shutdown.clone()));
        let webhook = InProcessWebhook {
            shutdown,
            task,
            admin_port,
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            if webhook.task.is_finished() {
                anyhow::bail!("the webhook exited while starting");
            }
            match http_get(admin_port, "/readyz").await {
                Ok((200, _)) => return Ok(webhook),
                Ok((_, body)) if std::time::Instant::now() > deadline => {
                    anyhow::bail!("webhook not ready after 60 s: {body}")
                }
                Err(e) if std::time::Instant::now() > deadline => return Err(e.context("webhook admin port")),
                _ => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
            }
        }
    }

    /// Cancels it as SIGTERM would and waits for a clean exit.
    pub async fn stop(self) -> Result<()> {
        self.shutdown.cancel();
        self.task.await.context("webhook task")?.context("webhook run")
    }
}

/// Status and body of a plain-HTTP GET on 127.0.0.1:`port`.
pub async fn http_get(port: u16, path: &str) -> Result<(u16, String)> {
    http_get_at(std::net::SocketAddr::from(([127, 0, 0, 1], port)), path).await
}

/// [`http_get`] of a server listening on `addr`.
pub async fn http_get_at(addr: std::net::SocketAddr, path: &str) -> Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("not an HTTP answer: {answer:?}"))?;
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
    Ok((status, body))
}
