//! The claims guard's rules: a pure function of the request, the [`ClaimsPolicy`] and a
//! [`ClaimView`] of the other claims of the same API shape. The table of rules is in the
//! [module doc](super).

use std::collections::BTreeSet;
use std::fmt;

use serde::Deserialize;

use nodewarden_api::domain::names::{ServiceAccountName, check_dns_label, check_dns_subdomain};

use super::presence::ClaimView;
use super::{
    AUDIT_RULE_KEY, CLUSTER_ID_CLAIM, CLUSTERSET_CLAIM, ID_CLAIM, ID_CLAIMS, MAX_SUBDOMAIN_ID_CHARS,
    MAX_VALUE_BYTES, QUOTE_CHARS, Shape,
};
use crate::admission::{AdmissionRequest, AdmissionResponse, Operation, UserInfo};

/// The rule behind a decision; its name is the audit annotation's value and the `rule` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rule {
    /// Denied: a reserved name written by a principal outside the allowed ones.
    ReservedName,
    /// Denied: an empty value, or one over 128 KiB.
    ValueSize,
    /// Denied: an ID that is not a DNS label (or subdomain).
    IdFormat,
    /// Denied: changing or deleting the ID while the cluster is in a ClusterSet.
    IdLifespan,
    /// Denied: joining a ClusterSet while no ID claim exists.
    ClustersetRequiresId,
    /// Denied: changing the ClusterSet's value.
    ClustersetImmutable,
    /// Allowed: a write to an ID claim that passed every ID rule.
    IdClaim,
    /// Allowed: a write to `clusterset.k8s.io` that passed every rule.
    ClustersetClaim,
    /// Allowed: a name outside the reserved suffixes.
    CustomName,
    /// Allowed: an operation that writes nothing (CONNECT).
    NotAWrite,
    /// Denied: the object could not be read.
    Malformed,
    /// Denied: the request is for a kind this guard does not know.
    UnsupportedKind,
    /// Denied: a cross-object rule applies and the claims of that shape are not watched (yet).
    CacheNotSynced,
}

impl Rule {
    /// Every rule, so the label set of the metric is known.
    pub const ALL: [Rule; 13] = [
        Rule::ReservedName,
        Rule::ValueSize,
        Rule::IdFormat,
        Rule::IdLifespan,
        Rule::ClustersetRequiresId,
        Rule::ClustersetImmutable,
        Rule::IdClaim,
        Rule::ClustersetClaim,
        Rule::CustomName,
        Rule::NotAWrite,
        Rule::Malformed,
        Rule::UnsupportedKind,
        Rule::CacheNotSynced,
    ];

    /// The rule's name: audit annotation value and metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::ReservedName => "reserved-name",
            Rule::ValueSize => "value-size",
            Rule::IdFormat => "id-format",
            Rule::IdLifespan => "id-lifespan",
            Rule::ClustersetRequiresId => "clusterset-requires-id",
            Rule::ClustersetImmutable => "clusterset-immutable",
            Rule::IdClaim => "id-claim",
            Rule::ClustersetClaim => "clusterset-claim",
            Rule::CustomName => "custom-name",
            Rule::NotAWrite => "not-a-write",
            Rule::Malformed => "malformed",
            Rule::UnsupportedKind => "unsupported-kind",
            Rule::CacheNotSynced => "cache-not-synced",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The outcome of [`decide`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The rule that decided.
    pub rule: Rule,
    /// Whether the write is admitted.
    pub allowed: bool,
    /// HTTP status code of a denial: 403 for policy, 400 for unreadable requests, 503 when the
    /// caches cannot answer yet.
    pub code: u16,
    /// Why it was denied (empty when allowed). Starts with the rule's name.
    pub message: String,
}

impl Decision {
    pub(super) fn allow(rule: Rule) -> Self {
        Decision {
            rule,
            allowed: true,
            code: 200,
            message: String::new(),
        }
    }

    fn deny(rule: Rule, code: u16, message: String) -> Self {
        Decision {
            rule,
            allowed: false,
            code,
            message: format!("{rule}: {message}"),
        }
    }

    fn forbid(rule: Rule, message: String) -> Self {
        Self::deny(rule, 403, message)
    }

    /// The admission response: `allowed: false` with the status code and message on a denial,
    /// and the audit annotation naming the rule either way.
    pub fn into_response(self, uid: &str) -> AdmissionResponse {
        let mut response = if self.allowed {
            AdmissionResponse::allow(uid)
        } else {
            let reason = match self.code {
                400 => "BadRequest",
                503 => "ServiceUnavailable",
                _ => "Forbidden",
            };
            AdmissionResponse::deny(uid, self.code, reason, self.message)
        };
        response
            .audit_annotations
            .insert(AUDIT_RULE_KEY.to_string(), self.rule.as_str().to_string());
        response
    }
}

/// Who may write reserved claims.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Principals {
    users: BTreeSet<String>,
    groups: BTreeSet<String>,
    /// Full user names, `system:serviceaccount:<namespace>:<name>`.
    service_accounts: BTreeSet<String>,
}

impl Principals {
    /// Empty entries are ignored (an empty environment variable means "none").
    pub fn new(
        users: impl IntoIterator<Item = String>,
        groups: impl IntoIterator<Item = String>,
        service_accounts: impl IntoIterator<Item = ServiceAccountName>,
    ) -> Self {
        let keep = |s: String| {
            let s = s.trim().to_string();
            (!s.is_empty()).then_some(s)
        };
        Principals {
            users: users.into_iter().filter_map(keep).collect(),
            groups: groups.into_iter().filter_map(keep).collect(),
            service_accounts: service_accounts.into_iter().map(|sa| sa.username()).collect(),
        }
    }

    /// Whether `user` is one of them, by name, service account or group.
    pub fn allows(&self, user: &UserInfo) -> bool {
        self.users.contains(&user.username)
            || self.service_accounts.contains(&user.username)
            || user.groups.iter().any(|g| self.groups.contains(g))
    }
}

/// The guard's settings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimsPolicy {
    /// Who may write reserved claims.
    pub principals: Principals,
    /// Accept a DNS subdomain (under 128 characters) for `cluster.clusterset.k8s.io`.
    pub id_subdomain: bool,
}

/// What the guard reads of a claim object: its name and `spec.value`.
#[derive(Deserialize, Debug, Default)]
struct ClaimObject {
    #[serde(default)]
    metadata: ClaimMeta,
    #[serde(default)]
    spec: Option<ClaimSpec>,
}

#[derive(Deserialize, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct ClaimMeta {
    #[serde(default)]
    name: Option<String>,
}

#[derive(Deserialize, Debug, Default)]
struct ClaimSpec {
    #[serde(default)]
    value: Option<ClaimValue>,
}

/// `spec.value` as read: the string, or only the JSON type of anything else (never built as a
/// tree, so a huge array or object costs no memory beyond the request itself).
#[derive(Debug, PartialEq, Eq)]
enum ClaimValue {
    Null,
    Text(String),
    Other(&'static str),
}

impl<'de> Deserialize<'de> for ClaimValue {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Kind;
        impl<'de> serde::de::Visitor<'de> for Kind {
            type Value = ClaimValue;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_unit<E>(self) -> Result<ClaimValue, E> {
                Ok(ClaimValue::Null)
            }
            fn visit_none<E>(self) -> Result<ClaimValue, E> {
                Ok(ClaimValue::Null)
            }
            fn visit_bool<E>(self, _: bool) -> Result<ClaimValue, E> {
                Ok(ClaimValue::Other("a boolean"))
            }
            fn visit_i64<E>(self, _: i64) -> Result<ClaimValue, E> {
                Ok(ClaimValue::Other("a number"))
            }
            fn visit_u64<E>(self, _: u64) -> Result<ClaimValue, E> {
                Ok(ClaimValue::Other("a number"))
            }
            fn visit_f64<E>(self, _: f64) -> Result<ClaimValue, E> {
                Ok(ClaimValue::Other("a number"))
            }
            fn visit_str<E>(self, v: &str) -> Result<ClaimValue, E> {
                Ok(ClaimValue::Text(v.to_string()))
            }
            fn visit_string<E>(self, v: String) -> Result<ClaimValue, E> {
                Ok(ClaimValue::Text(v))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<ClaimValue, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(ClaimValue::Other("an array"))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<ClaimValue, A::Error> {
                while map
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(ClaimValue::Other("an object"))
            }
        }
        deserializer.deserialize_any(Kind)
    }
}

impl ClaimObject {
    /// `spec.value`; missing counts as empty; a non-string is an error.
    fn value(&self, field: &str) -> Result<String, String> {
        match self.spec.as_ref().and_then(|s| s.value.as_ref()) {
            None | Some(ClaimValue::Null) => Ok(String::new()),
            Some(ClaimValue::Text(s)) => Ok(s.clone()),
            Some(ClaimValue::Other(kind)) => Err(format!("{field}.spec.value must be a string, got {kind}")),
        }
    }
}

/// What kind of claim a name is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameClass {
    /// `id.k8s.io` or `cluster.clusterset.k8s.io`.
    Id,
    /// `clusterset.k8s.io`.
    Clusterset,
    /// Another name under `k8s.io` or `kubernetes.io`.
    OtherReserved,
    /// Any other name.
    Custom,
}

/// Classifies a claim name.
pub fn classify(name: &str) -> NameClass {
    if ID_CLAIMS.contains(&name) {
        NameClass::Id
    } else if name == CLUSTERSET_CLAIM {
        NameClass::Clusterset
    } else if is_reserved(name) {
        NameClass::OtherReserved
    } else {
        NameClass::Custom
    }
}

/// Names reserved for Kubernetes and related projects: `k8s.io`, `kubernetes.io`, and any name
/// ending in `.k8s.io` or `.kubernetes.io` (which covers `sigs.k8s.io`).
pub fn is_reserved(name: &str) -> bool {
    ["k8s.io", "kubernetes.io"]
        .iter()
        .any(|domain| name == *domain || name.strip_suffix(domain).is_some_and(|head| head.ends_with('.')))
}

/// A value as messages quote it: at most 64 characters, escaped, with its length when cut.
pub fn quote(value: &str) -> String {
    let count = value.chars().count();
    if count <= QUOTE_CHARS {
        format!("{value:?}")
    } else {
        let head: String = value.chars().take(QUOTE_CHARS).collect();
        format!("{head:?}… ({} bytes)", value.len())
    }
}

/// The decision for one request: pure.
pub fn decide(request: &AdmissionRequest, policy: &ClaimsPolicy, view: &dyn ClaimView) -> Decision {
    let Some(shape) = Shape::from_group(&request.kind.group) else {
        let known: Vec<String> = Shape::ALL.iter().map(|s| s.to_string()).collect();
        return Decision::deny(
            Rule::UnsupportedKind,
            400,
            format!(
                "this webhook guards {}; got {}/{} {}",
                known.join(", "),
                request.kind.group,
                request.kind.version,
                request.kind.kind
            ),
        );
    };
    let op = request.operation;
    if op == Operation::Connect {
        return Decision::allow(Rule::NotAWrite);
    }
    let parsed = read_objects(request, op);
    let (new, old) = match parsed {
        Ok(objects) => objects,
        Err(why) => return Decision::deny(Rule::Malformed, 400, why),
    };
    let name = request
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .or_else(|| new.as_ref().and_then(|o| o.metadata.name.clone()))
        .or_else(|| old.as_ref().and_then(|o| o.metadata.name.clone()))
        .unwrap_or_default();
    let new_value = match new.as_ref().map(|o| o.value("object")).transpose() {
        Ok(v) => v,
        Err(why) => return Decision::deny(Rule::Malformed, 400, why),
    };
    // an old value that cannot be read is treated as different from any new one
    let old_value = old.as_ref().and_then(|o| o.value("oldObject").ok());
    let claim = Claim {
        shape,
        name: &name,
        op,
        new_value: new_value.as_deref(),
        old_value: old_value.as_deref(),
    };
    claim.decide(&request.user_info, policy, view)
}

fn read_objects(
    request: &AdmissionRequest,
    op: Operation,
) -> Result<(Option<ClaimObject>, Option<ClaimObject>), String> {
    let old: Option<ClaimObject> = request.old_object_as()?;
    let new: Option<ClaimObject> = match op {
        Operation::Create | Operation::Update => Some(request.object_as()?),
        // DELETE: the API server sends oldObject and a null object
        _ => None,
    };
    Ok((new, old))
}

/// One write, read out of a request.
struct Claim<'a> {
    shape: Shape,
    name: &'a str,
    op: Operation,
    /// CREATE and UPDATE.
    new_value: Option<&'a str>,
    /// UPDATE and DELETE, when the API server sent the old object.
    old_value: Option<&'a str>,
}

impl Claim<'_> {
    fn what(&self) -> String {
        format!("{} {:?}", self.shape.kind(), self.name)
    }

    /// UPDATE with the same value as before.
    fn keeps_value(&self) -> bool {
        self.op == Operation::Update && self.old_value.is_some() && self.old_value == self.new_value
    }

    fn changes_value(&self) -> bool {
        self.op == Operation::Update && self.old_value != self.new_value
    }

    fn decide(&self, user: &UserInfo, policy: &ClaimsPolicy, view: &dyn ClaimView) -> Decision {
        let class = classify(self.name);
        if class != NameClass::Custom && !policy.principals.allows(user) {
            return Decision::forbid(
                Rule::ReservedName,
                format!(
                    "{} is reserved (names ending in .k8s.io or .kubernetes.io); {:?} may not {} it: \
                     only the users, groups and service accounts allowed by the nodewarden configuration may",
                    self.what(),
                    user.username,
                    verb(self.op),
                ),
            );
        }
        if let Some(value) = self.new_value
            && !self.keeps_value()
            && let Some(denied) = self.check_size(value)
        {
            return denied;
        }
        match class {
            NameClass::Id => self.decide_id(policy, view),
            NameClass::Clusterset => self.decide_clusterset(view),
            NameClass::OtherReserved => Decision::allow(Rule::ReservedName),
            NameClass::Custom => Decision::allow(Rule::CustomName),
        }
    }

    fn check_size(&self, value: &str) -> Option<Decision> {
        if value.is_empty() {
            return Some(Decision::forbid(
                Rule::ValueSize,
                format!(
                    "{}: spec.value is empty; a claim value must be 1 to {MAX_VALUE_BYTES} bytes",
                    self.what()
                ),
            ));
        }
        if value.len() > MAX_VALUE_BYTES {
            return Some(Decision::forbid(
                Rule::ValueSize,
                format!(
                    "{}: spec.value {} is too long; a claim value must be 1 to {MAX_VALUE_BYTES} bytes",
                    self.what(),
                    quote(value)
                ),
            ));
        }
        None
    }

    fn decide_id(&self, policy: &ClaimsPolicy, view: &dyn ClaimView) -> Decision {
        if let Some(value) = self.new_value
            && !self.keeps_value()
        {
            let subdomain = policy.id_subdomain && self.name == CLUSTER_ID_CLAIM;
            let (checked, expected) = if subdomain {
                (
                    check_dns_subdomain(value, MAX_SUBDOMAIN_ID_CHARS),
                    "an RFC 1123 DNS subdomain of at most 127 characters (lowercase letters, digits, '-' and '.')",
                )
            } else {
                (
                    check_dns_label(value),
                    "an RFC 1123 DNS label: at most 63 lowercase letters, digits or '-', starting and ending with a letter or digit",
                )
            };
            if let Err(why) = checked {
                return Decision::forbid(
                    Rule::IdFormat,
                    format!(
                        "{}: spec.value {} {why}; the cluster ID must be {expected}",
                        self.what(),
                        quote(value)
                    ),
                );
            }
        }
        let guarded = self.op == Operation::Delete || self.changes_value();
        if guarded {
            let Some(clusterset) = view.presence(self.shape, CLUSTERSET_CLAIM) else {
                return self.not_synced();
            };
            if clusterset.may_exist {
                let change = match self.op {
                    Operation::Delete => "cannot be deleted".to_string(),
                    _ => format!(
                        "cannot change from {} to {}",
                        self.old_value
                            .map(quote)
                            .unwrap_or_else(|| "its stored value".to_string()),
                        self.new_value.map(quote).unwrap_or_default()
                    ),
                };
                return Decision::forbid(
                    Rule::IdLifespan,
                    format!(
                        "{} {change} while {} {CLUSTERSET_CLAIM:?} exists (the cluster is a ClusterSet member); \
                         delete {CLUSTERSET_CLAIM} first to leave the ClusterSet",
                        self.what(),
                        self.shape.kind()
                    ),
                );
            }
        }
        Decision::allow(Rule::IdClaim)
    }

    fn decide_clusterset(&self, view: &dyn ClaimView) -> Decision {
        match self.op {
            Operation::Create => {
                let mut any_id = false;
                let mut in_flux = None;
                for id in ID_CLAIMS {
                    let Some(presence) = view.presence(self.shape, id) else {
                        return self.not_synced();
                    };
                    any_id |= presence.surely_exists;
                    if presence.may_exist && !presence.surely_exists {
                        in_flux.get_or_insert(id);
                    }
                }
                if let (false, Some(id)) = (any_id, in_flux) {
                    return Decision::forbid(
                        Rule::ClustersetRequiresId,
                        format!(
                            "{} (value {}) cannot be created yet: {} {id:?} was written moments ago or is being \
                             deleted, and nodewarden has not seen it settle; retry shortly",
                            self.what(),
                            self.new_value.map(quote).unwrap_or_default(),
                            self.shape.kind()
                        ),
                    );
                }
                if !any_id {
                    return Decision::forbid(
                        Rule::ClustersetRequiresId,
                        format!(
                            "{} (value {}) cannot be created while no ID claim exists; create {} {ID_CLAIM:?} \
                             or {CLUSTER_ID_CLAIM:?} first",
                            self.what(),
                            self.new_value.map(quote).unwrap_or_default(),
                            self.shape.kind()
                        ),
                    );
                }
                Decision::allow(Rule::ClustersetClaim)
            }
            Operation::Update if self.changes_value() => Decision::forbid(
                Rule::ClustersetImmutable,
                format!(
                    "{} cannot change from {} to {}; to move to another ClusterSet, delete it and create it again",
                    self.what(),
                    self.old_value
                        .map(quote)
                        .unwrap_or_else(|| "its stored value".to_string()),
                    self.new_value.map(quote).unwrap_or_default()
                ),
            ),
            _ => Decision::allow(Rule::ClustersetClaim),
        }
    }

    fn not_synced(&self) -> Decision {
        Decision::deny(
            Rule::CacheNotSynced,
            503,
            format!(
                "{}: nodewarden has not finished reading the existing {} objects, which this rule needs; retry shortly",
                self.what(),
                self.shape
            ),
        )
    }
}

fn verb(op: Operation) -> &'static str {
    match op {
        Operation::Create => "create",
        Operation::Update => "update",
        Operation::Delete => "delete",
        Operation::Connect => "connect to",
    }
}
