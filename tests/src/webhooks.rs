//! Registering a webhook that the test process serves on loopback, so the real API server
//! calls it.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ValidatingWebhook,
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

impl LoopbackEndpoint {
    /// `clientConfig` for the handler at `path` (e.g. `/mutate/pods`).
    pub fn client_config(&self, path: &str) -> WebhookClientConfig {
        WebhookClientConfig {
            url: Some(format!("https://127.0.0.1:{}{path}", self.port)),
            ca_bundle: Some(ByteString(self.ca_pem.as_bytes().to_vec())),
            service: None,
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
}

/// Server-side applies a MutatingWebhookConfiguration `name` calling `endpoint`.
///
/// The API server picks a new configuration up from its watch within about a second; a
/// test should retry its first request (or probe) until the webhook has seen it.
pub async fn register_mutating_webhooks(
    client: &Client,
    name: &str,
    endpoint: &LoopbackEndpoint,
    hooks: &[Hook],
) -> Result<MutatingWebhookConfiguration> {
    let config = MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
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
    };
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&config),
    )
    .await
    .with_context(|| format!("applying MutatingWebhookConfiguration {name}"))
}

/// Server-side applies a ValidatingWebhookConfiguration `name` calling `endpoint`.
pub async fn register_validating_webhooks(
    client: &Client,
    name: &str,
    endpoint: &LoopbackEndpoint,
    hooks: &[Hook],
) -> Result<ValidatingWebhookConfiguration> {
    let config = ValidatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
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
    };
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&config),
    )
    .await
    .with_context(|| format!("applying ValidatingWebhookConfiguration {name}"))
}
