//! The eviction guard: the nodewarden agent may evict only pods bound to its own node.
//!
//! The API server sends `CREATE pods/eviction` here (the chart's registration sends only the
//! agent's requests, by a `matchCondition` on the user name). The admitted object is the
//! Eviction, which does not say where the pod runs, so the guard reads the pod: one GET, bounded
//! by [`POD_LOOKUP_TIMEOUT`]. A ValidatingAdmissionPolicy cannot do this; resizes (`pods/resize`,
//! whose object is the pod) are guarded by the chart's policy instead.
//!
//! An eviction is allowed when
//! * the requester is not the agent's service account (`--agent-service-account`; when that is
//!   unset the guard has no agent to recognise and allows every eviction), or
//! * the pod's `spec.nodeName` is the node in the agent's bound token
//!   (`userInfo.extra["authentication.kubernetes.io/node-name"]`), or
//! * the pod does not exist: the eviction itself answers 404, nothing is evicted.
//!
//! It is denied when the pod is on another node or on none, when the token names no node or
//! several, and when the pod cannot be read (the API server unreachable, the GET timed out, no
//! client yet): nothing is evicted by the agent that the guard could not check.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};

use super::{NODE_NAME_EXTRA, NodeReportsPolicy, token_nodes};
use crate::admission::{AdmissionRequest, AdmissionResponse, Handler, Kept, Operation};

/// Path of the eviction guard.
pub const ROUTE: &str = "/validate/evictions";
/// How long the guard waits for the evicted pod; then the eviction is denied. Below the
/// chart's `timeoutSeconds`, so the API server reads the guard's message, not its own timeout.
pub const POD_LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

/// What the guard must do with a request before it decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictionCheck {
    /// Allowed without reading the pod (not the agent, not an eviction).
    Allow,
    /// Denied from the request alone, with this message.
    Deny(String),
    /// The agent evicts `namespace/name` with a token bound to `token_node`: read the pod.
    ReadPod {
        /// The pod's namespace.
        namespace: String,
        /// The pod's name.
        name: String,
        /// The node the agent's service account token is bound to.
        token_node: String,
    },
}

/// What reading the evicted pod gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodNode {
    /// The pod exists and is bound to this node.
    Bound(String),
    /// The pod exists and is bound to no node.
    Unbound,
    /// There is no such pod.
    NotFound,
    /// The pod could not be read, for this reason.
    Unknown(String),
}

/// The Eviction's `metadata.name` when the request carries no name.
#[derive(serde::Deserialize)]
struct EvictionObject {
    #[serde(default)]
    metadata: Option<EvictionMeta>,
}

#[derive(serde::Deserialize)]
struct EvictionMeta {
    #[serde(default)]
    name: Option<String>,
}

/// The first step of the decision: from the request alone.
pub fn check(policy: &NodeReportsPolicy, request: &AdmissionRequest) -> EvictionCheck {
    if request.operation != Operation::Create
        || !request.resource.group.is_empty()
        || request.resource.resource != "pods"
        || request.sub_resource.as_deref() != Some("eviction")
    {
        return EvictionCheck::Allow;
    }
    let user = &request.user_info;
    match &policy.agent_user {
        Some(agent) if &user.username == agent => {}
        _ => return EvictionCheck::Allow,
    }
    let namespace = request.namespace.clone().unwrap_or_default();
    let name = request
        .name
        .as_deref()
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .or_else(|| request.object_as::<EvictionObject>().ok()?.metadata?.name)
        .unwrap_or_default();
    if namespace.is_empty() || name.is_empty() {
        return EvictionCheck::Deny(format!(
            "the nodewarden agent's eviction names no pod (namespace {namespace:?}, name {name:?}); it cannot be checked against the agent's node"
        ));
    }
    let token_nodes = token_nodes(user);
    match token_nodes {
        [one] if !one.is_empty() => EvictionCheck::ReadPod {
            namespace,
            name,
            token_node: one.clone(),
        },
        [] | [_] => EvictionCheck::Deny(format!(
            "pod {namespace}/{name} may be evicted by the nodewarden agent only from the pod's own node: the token of {} is not bound to a node (no {NODE_NAME_EXTRA} in userInfo.extra; use a projected service-account token of a pod on the node)",
            user.username
        )),
        many => EvictionCheck::Deny(format!(
            "pod {namespace}/{name} may be evicted by the nodewarden agent only from the pod's own node: the token of {} names several nodes {many:?}",
            user.username
        )),
    }
}

/// The second step: the agent on `token_node` evicts `namespace/name`, whose node is `pod`.
pub fn decide(namespace: &str, name: &str, token_node: &str, pod: &PodNode) -> Result<(), String> {
    match pod {
        PodNode::Bound(node) if node == token_node => Ok(()),
        PodNode::Bound(node) => Err(format!(
            "pod {namespace}/{name} is on node {node}; the nodewarden agent on node {token_node} may evict only pods on node {token_node}"
        )),
        PodNode::Unbound => Err(format!(
            "pod {namespace}/{name} is not bound to a node; the nodewarden agent on node {token_node} may evict only pods on node {token_node}"
        )),
        // the eviction answers 404 by itself: there is nothing to protect
        PodNode::NotFound => Ok(()),
        PodNode::Unknown(why) => Err(format!(
            "nodewarden could not read pod {namespace}/{name} to check that it is on node {token_node} ({why}); the nodewarden agent evicts nothing that cannot be checked"
        )),
    }
}

/// Where the guard reads pods from.
pub trait PodNodes: Send + Sync + 'static {
    /// The node of pod `namespace/name`.
    fn node_of<'a>(&'a self, namespace: &'a str, name: &'a str) -> BoxFuture<'a, PodNode>;
}

/// Reads pods from the API server with the webhook's client, once that client exists (it is
/// built after start-up, see [`ApiServerPods::client_slot`]); every read is bounded by a timeout.
pub struct ApiServerPods {
    client: Arc<OnceLock<Client>>,
    timeout: Duration,
}

impl ApiServerPods {
    /// No client yet; reads answer [`PodNode::Unknown`] until one is set.
    pub fn new(timeout: Duration) -> Self {
        ApiServerPods {
            client: Arc::new(OnceLock::new()),
            timeout,
        }
    }

    /// Where the webhook puts its client once it has one.
    pub fn client_slot(&self) -> Arc<OnceLock<Client>> {
        self.client.clone()
    }
}

impl PodNodes for ApiServerPods {
    fn node_of<'a>(&'a self, namespace: &'a str, name: &'a str) -> BoxFuture<'a, PodNode> {
        Box::pin(async move {
            let Some(client) = self.client.get() else {
                return PodNode::Unknown("the webhook has no API server client yet".to_string());
            };
            let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
            match tokio::time::timeout(self.timeout, pods.get_opt(name)).await {
                Err(_) => {
                    PodNode::Unknown(format!("the API server did not answer within {:?}", self.timeout))
                }
                Ok(Err(err)) => PodNode::Unknown(format!("reading the pod failed: {err}")),
                Ok(Ok(None)) => PodNode::NotFound,
                Ok(Ok(Some(pod))) => match pod.spec.and_then(|s| s.node_name).filter(|n| !n.is_empty()) {
                    Some(node) => PodNode::Bound(node),
                    None => PodNode::Unbound,
                },
            }
        })
    }
}

/// The `/validate/evictions` handler.
pub struct EvictionGuard {
    policy: NodeReportsPolicy,
    pods: Arc<dyn PodNodes>,
}

impl EvictionGuard {
    /// A guard deciding by `policy`, reading pods from `pods`.
    pub fn new(policy: NodeReportsPolicy, pods: Arc<dyn PodNodes>) -> Self {
        EvictionGuard { policy, pods }
    }

    fn answer(request: &AdmissionRequest, decision: Result<(), String>) -> AdmissionResponse {
        match decision {
            Ok(()) => AdmissionResponse::allow(&request.uid),
            Err(message) => AdmissionResponse::deny(&request.uid, 403, "Forbidden", message),
        }
    }
}

impl Handler for EvictionGuard {
    /// The object is read as raw JSON, every other field kept.
    type Object = Box<serde_json::value::RawValue>;
    type Extras = Kept;

    /// Without the API server: what the request alone decides; an eviction that needs the pod is
    /// denied (the router always calls [`Handler::review_async`], which reads it).
    fn review(&self, request: &AdmissionRequest) -> AdmissionResponse {
        let decision = match check(&self.policy, request) {
            EvictionCheck::Allow => Ok(()),
            EvictionCheck::Deny(message) => Err(message),
            EvictionCheck::ReadPod {
                namespace,
                name,
                token_node,
            } => decide(
                &namespace,
                &name,
                &token_node,
                &PodNode::Unknown("the pod was not read".to_string()),
            ),
        };
        Self::answer(request, decision)
    }

    fn review_async<'a>(&'a self, request: &'a AdmissionRequest) -> BoxFuture<'a, AdmissionResponse> {
        Box::pin(async move {
            let decision = match check(&self.policy, request) {
                EvictionCheck::Allow => Ok(()),
                EvictionCheck::Deny(message) => Err(message),
                EvictionCheck::ReadPod {
                    namespace,
                    name,
                    token_node,
                } => {
                    let pod = self.pods.node_of(&namespace, &name).await;
                    decide(&namespace, &name, &token_node, &pod)
                }
            };
            Self::answer(request, decision)
        })
    }
}
