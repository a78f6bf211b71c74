//! The node-reports guard: `NodeRecommendation/<n>` and `NodeFeatureReport/<n>` may be created or
//! updated only by the nodewarden agent on node `<n>`, so one compromised node cannot steer the
//! pods of another.
//!
//! A write is allowed when
//! * the requester is in one of the allowed groups (`--node-reports-allowed-groups`, default
//!   `system:masters`), or
//! * the requester is the agent's service account (`--agent-service-account ns:name`, the same
//!   syntax as every service-account flag; when unset,
//!   any service account) and its token is bound to a pod on node `<n>`:
//!   `userInfo.extra["authentication.kubernetes.io/node-name"] == ["<n>"]`.
//!
//! Everything else is denied with a message that names the node in the token and the node in
//! the object. DELETE is not guarded (the chart does not send it): removing a report only makes
//! that node's pods fall back to the cold-start choice.
//!
//! The same agent setting guards the agent's evictions: [`evictions`] (`/validate/evictions`)
//! lets the agent on node N evict only pods bound to node N.

pub mod evictions;

use clap::Args;
use nodewarden_api::domain::names::{ServiceAccountError, ServiceAccountName};

use crate::admission::{AdmissionRequest, AdmissionResponse, Handler, Kept, Operation};

/// Path of the node-reports webhook.
pub const ROUTE: &str = "/validate/node-reports";
/// The `userInfo.extra` key of a bound token's node name.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";
/// The nodes a bound token names (`userInfo.extra[NODE_NAME_EXTRA]`); empty when unbound.
pub(crate) fn token_nodes(user: &crate::admission::UserInfo) -> &[String] {
    user.extra
        .get(NODE_NAME_EXTRA)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// The kinds the guard covers.
pub const KINDS: [&str; 2] = ["NodeRecommendation", "NodeFeatureReport"];

/// Flags of the guard.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct NodeReportsArgs {
    /// The agent's service account as `namespace:name` (or `system:serviceaccount:namespace:name`);
    /// only it (with a token bound to node N) may write node N's reports, and its evictions
    /// (`/validate/evictions`) must be of pods on node N. Unset: any service account whose token
    /// is bound to node N writes N's reports, and evictions are not checked.
    #[arg(long, env = "NODEWARDEN_AGENT_SERVICE_ACCOUNT", value_parser = parse_service_account)]
    pub agent_service_account: Option<String>,

    /// Groups whose members may write any node's reports (comma-separated).
    #[arg(
        long,
        env = "NODEWARDEN_NODE_REPORTS_ALLOWED_GROUPS",
        value_delimiter = ',',
        default_value = "system:masters"
    )]
    pub node_reports_allowed_groups: Vec<String>,
}

/// The agent's service account (`ns:name` or `system:serviceaccount:ns:name`, as every
/// service-account flag reads it) → its user name, `system:serviceaccount:ns:name`.
pub fn parse_service_account(text: &str) -> Result<String, String> {
    match ServiceAccountName::parse(text) {
        Ok(account) => Ok(account.username()),
        Err(ServiceAccountError::NoNamespace(_)) => Err(format!(
            "{text:?} is not a service account: expected namespace:name, e.g. nodewarden:nodewarden-agent"
        )),
        Err(ServiceAccountError::Invalid(why)) => Err(why),
    }
}

/// The guard's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeReportsPolicy {
    /// Full user name of the agent (`system:serviceaccount:ns:name`), if pinned.
    pub agent_user: Option<String>,
    /// Groups whose members may write any node's reports.
    pub allowed_groups: Vec<String>,
}

impl From<&NodeReportsArgs> for NodeReportsPolicy {
    fn from(args: &NodeReportsArgs) -> Self {
        NodeReportsPolicy {
            agent_user: args.agent_service_account.clone(),
            allowed_groups: args
                .node_reports_allowed_groups
                .iter()
                .map(|g| g.trim().to_string())
                .filter(|g| !g.is_empty())
                .collect(),
        }
    }
}

impl Default for NodeReportsPolicy {
    fn default() -> Self {
        NodeReportsPolicy {
            agent_user: None,
            allowed_groups: vec!["system:masters".to_string()],
        }
    }
}

/// What the guard reads of a report object when the request carries no name.
#[derive(serde::Deserialize)]
struct NamedObject {
    #[serde(default)]
    metadata: Option<NamedMeta>,
}

#[derive(serde::Deserialize)]
struct NamedMeta {
    #[serde(default)]
    name: Option<String>,
}

/// The `/validate/node-reports` handler.
pub struct NodeReportsGuard {
    policy: NodeReportsPolicy,
}

impl NodeReportsGuard {
    /// A guard deciding by `policy`.
    pub fn new(policy: NodeReportsPolicy) -> Self {
        NodeReportsGuard { policy }
    }
}

/// Allowed, or denied with the message.
pub fn decide(policy: &NodeReportsPolicy, request: &AdmissionRequest) -> Result<(), String> {
    if !matches!(request.operation, Operation::Create | Operation::Update) {
        return Ok(());
    }
    let kind = request.kind.kind.as_str();
    if !KINDS.contains(&kind) {
        return Ok(());
    }
    let user = &request.user_info;
    if user.groups.iter().any(|g| policy.allowed_groups.contains(g)) {
        return Ok(());
    }
    let object_name = request
        .name
        .as_deref()
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .or_else(|| {
            // only the name is kept; the rest of the object is skipped, never built as a tree
            request.object_as::<NamedObject>().ok()?.metadata?.name
        });
    let Some(node) = object_name else {
        return Err(format!(
            "{kind} has no name; its name must be the name of the node whose agent writes it"
        ));
    };
    let groups = if policy.allowed_groups.is_empty() {
        "no group".to_string()
    } else {
        policy.allowed_groups.join(", ")
    };
    let is_agent = match &policy.agent_user {
        Some(agent) => &user.username == agent,
        None => user.username.starts_with("system:serviceaccount:"),
    };
    if !is_agent {
        let who = policy.agent_user.as_deref().unwrap_or("a service account");
        return Err(format!(
            "{kind}/{node} can only be written by the nodewarden agent on node {node} ({who} with a token bound to that node) or by a member of {groups}; user {:?} is neither",
            user.username
        ));
    }
    let token_nodes = token_nodes(user);
    match token_nodes {
        [one] if one == &node => Ok(()),
        [one] => Err(format!(
            "{kind}/{node} can only be written by the nodewarden agent on node {node}: the token of {} is bound to node {one}, not {node}",
            user.username
        )),
        [] => Err(format!(
            "{kind}/{node} can only be written by the nodewarden agent on node {node}: the token of {} is not bound to a node (no {NODE_NAME_EXTRA} in userInfo.extra; use a projected service-account token of a pod on the node)",
            user.username
        )),
        many => Err(format!(
            "{kind}/{node} can only be written by the nodewarden agent on node {node}: the token of {} names several nodes {many:?}",
            user.username
        )),
    }
}

impl Handler for NodeReportsGuard {
    /// The object is read as raw JSON, every other field kept.
    type Object = Box<serde_json::value::RawValue>;
    type Extras = Kept;

    fn review(&self, request: &AdmissionRequest) -> AdmissionResponse {
        match decide(&self.policy, request) {
            Ok(()) => AdmissionResponse::allow(&request.uid),
            Err(message) => AdmissionResponse::deny(&request.uid, 403, "Forbidden", message),
        }
    }
}
