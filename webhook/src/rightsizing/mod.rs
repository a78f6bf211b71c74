//! Per-node right-sizing of DaemonSet pods (KEP-4943, VPA `scope: node`).
//!
//! * [`sizing::mutate`] (in the api crate, shared with the agent): the pure decision, (pod,
//!   autoscaler, node targets, fleet, LimitRanges) → JSON Patch + annotations.
//! * [`PodMutator`]: the `/mutate/pods` handler. Pod CREATE → controller owner DaemonSet →
//!   its autoscaler → the pod's node → that node's targets → [`sizing::mutate`]. Everything comes
//!   from the in-memory [`RightsizingIndex`]; no API call on the request path.
//! * [`AutoscalerValidator`]: the `/validate/autoscalers` handler: bounds and one autoscaler per
//!   DaemonSet.
//! * [`controller`]: the controller that keeps `DaemonSetAutoscaler.status`.
//!
//! Semantics, annotations and caps are described for users in docs/rightsizing.md.

pub mod cache;
pub mod controller;

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use nodewarden_api::domain::names::check_label_key;
use nodewarden_api::domain::rightsizing::{
    container_policies, controlling_daemonset, is_controlling_daemonset,
};
use nodewarden_api::domain::sizing::{self, Amounts, ContainerFacts, ResourceFacts};
use nodewarden_api::rightsizing::{DaemonSetAutoscaler, ResourceName, Scope};

pub use cache::{Prepared, RightsizingIndex};
pub use nodewarden_api::domain::sizing::{Decision, Reason, Source, Targets};

use crate::admission::{self, AdmissionRequest, AdmissionResponse, Handler, OnePass, Operation};

/// Path of the pod mutation webhook.
pub const MUTATE_ROUTE: &str = "/mutate/pods";
/// Path of the autoscaler validation webhook.
pub const VALIDATE_ROUTE: &str = "/validate/autoscalers";

/// Counts right-sizing decisions (bounded labels: reason and source).
pub trait RightsizingObserver: Send + Sync + 'static {
    /// One pod: why it came out as it did, and where each container's figures came from.
    fn decided(&self, reason: Reason, sources: &[(String, Source)]);
}

impl RightsizingObserver for () {
    fn decided(&self, _: Reason, _: &[(String, Source)]) {}
}

/// The `/mutate/pods` handler.
pub struct PodMutator {
    index: Arc<RightsizingIndex>,
    observer: Arc<dyn RightsizingObserver>,
}

impl PodMutator {
    /// A mutator reading `index`, counting nothing.
    pub fn new(index: Arc<RightsizingIndex>) -> Self {
        PodMutator {
            index,
            observer: Arc::new(()),
        }
    }

    /// Counts the decisions in `observer`.
    pub fn with_observer(mut self, observer: Arc<dyn RightsizingObserver>) -> Self {
        self.observer = observer;
        self
    }

    /// The decision for one pod of namespace `namespace`, or `None` when no autoscaler applies.
    pub fn decide(&self, namespace: &str, pod: &Pod) -> Option<Decision> {
        let daemonset = owner_daemonset(pod)?;
        let prepared = self.index.prepared_for(namespace, daemonset)?;
        let node = sizing::target_node(pod);
        let facts = sizing::PodFacts::of(pod);
        Some(decide_with(&self.index, namespace, &prepared, node, &facts))
    }

    /// [`PodMutator::decide`] for a pod read as its view.
    fn decide_view(&self, namespace: &str, metadata: &MetaView, spec: Option<SpecView>) -> Option<Decision> {
        let daemonset = metadata.daemonset.as_deref()?;
        let prepared = self.index.prepared_for(namespace, daemonset)?;
        let node = target_node(spec.as_ref());
        let facts = sizing::PodFacts {
            has_annotations: metadata.annotations.is_some(),
            containers: spec.map(|s| s.containers).unwrap_or_default(),
        };
        Some(decide_with(&self.index, namespace, &prepared, node, &facts))
    }
}

/// [`sizing::mutate_on`] of a pod for `node` with its inputs taken from the index.
pub(crate) fn decide_with(
    index: &RightsizingIndex,
    namespace: &str,
    prepared: &Prepared,
    node: Result<String, String>,
    pod: &sizing::PodFacts,
) -> Decision {
    let autoscaler = &prepared.autoscaler;
    let name = autoscaler.metadata.name.as_deref().unwrap_or_default();
    let node_name = node.as_deref().ok();
    let node_targets = node_name.and_then(|node| index.node_targets(node, namespace, name));
    let group = match (node_name, autoscaler.spec.node_group_label.as_deref()) {
        (Some(node), Some(label)) if !prepared.figures.groups.is_empty() => index.node_label(node, label),
        _ => None,
    };
    let figures = prepared.figures.for_node(node_targets.as_ref(), group.as_deref());
    let limit_ranges = index.limit_ranges(namespace);
    sizing::mutate_on(
        pod,
        autoscaler,
        node.as_deref().map_err(String::as_str),
        figures,
        &limit_ranges,
    )
}

/// The name of the DaemonSet that controls the pod (controller ownerReference, apps/v1).
pub(crate) fn owner_daemonset(pod: &Pod) -> Option<&str> {
    controlling_daemonset(pod.metadata.owner_references.as_deref().unwrap_or_default())
}

/// Whether right-sizing looks at the request: the CREATE of a pod, not of a subresource.
fn is_pod_create(operation: Operation, kind: &str, sub_resource: Option<&str>) -> bool {
    operation == Operation::Create && kind == "Pod" && sub_resource.is_none_or(str::is_empty)
}

impl PodMutator {
    /// The answer to a pod CREATE whose object was read as `view`.
    fn review_pod(
        &self,
        uid: &str,
        request_namespace: Option<&str>,
        view: Result<PodView, String>,
    ) -> AdmissionResponse {
        let pod = match view {
            Ok(view) => view,
            Err(err) => {
                // right-sizing is best effort: a pod we cannot read is admitted as it is
                tracing::warn!(uid, error = %err, "pod not readable; admitted unchanged");
                let mut response = AdmissionResponse::allow(uid);
                response.warnings.push(short(
                    "nodewarden right-sizing skipped: the pod could not be read",
                ));
                return response;
            }
        };
        let PodView { metadata, spec } = pod;
        let namespace = request_namespace
            .or(metadata.namespace.as_deref())
            .unwrap_or_default();
        let Some(decision) = self.decide_view(namespace, &metadata, spec) else {
            return AdmissionResponse::allow(uid);
        };
        self.observer.decided(decision.reason, &decision.sources);
        tracing::debug!(
            uid,
            node = decision.node.as_deref().unwrap_or(""),
            reason = decision.reason.as_str(),
            "right-sizing decision"
        );
        AdmissionResponse::allow(uid).with_add_patch(decision.patch)
    }
}

impl Handler for PodMutator {
    fn review(&self, request: &AdmissionRequest) -> AdmissionResponse {
        if !is_pod_create(
            request.operation,
            &request.kind.kind,
            request.sub_resource.as_deref(),
        ) {
            return AdmissionResponse::allow(&request.uid);
        }
        self.review_pod(
            &request.uid,
            request.namespace.as_deref(),
            request.object_as::<PodView>(),
        )
    }

    /// The envelope and the pod's view read in one pass: the pod is most of a review's bytes,
    /// and scanning it raw before reading the view again cost 18 % of the pipeline's instructions
    /// (docs/benchmarks.md). Same answers as [`Handler::review`].
    fn review_one_pass(&self, body: &str) -> Option<OnePass> {
        admission::one_pass::<PodView>(body, |request| {
            if !is_pod_create(
                request.operation,
                &request.kind.kind,
                request.sub_resource.as_deref(),
            ) {
                return AdmissionResponse::allow(&request.uid);
            }
            let view = request
                .object
                .take()
                .ok_or_else(|| "request.object is missing".to_string());
            self.review_pod(&request.uid, request.namespace.as_deref(), view)
        })
    }

    /// The pod webhook is registered with `failurePolicy: Ignore`: a fault admits the pod unchanged.
    fn fails_open(&self) -> bool {
        true
    }
}

/// The fields of a pod the decision reads, kept as the decision reads them; everything else in
/// the review is skipped while parsing. No `Pod` is built: a container's requests and limits are
/// read as amounts as they are parsed, and the node affinity only as far as its `matchFields`
/// (reading `k8s_openapi`'s types, then dropping them, cost a quarter of a review's time as
/// deployed; docs/benchmarks.md). The fields the API server's types require (a container's
/// `name`, a node selector's `nodeSelectorTerms`, a requirement's `key` and `operator`) are
/// required here too, and a quantity must be a string.
#[derive(serde::Deserialize)]
struct PodView {
    #[serde(default)]
    metadata: MetaView,
    #[serde(default)]
    spec: Option<SpecView>,
}

#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct MetaView {
    #[serde(default)]
    namespace: Option<String>,
    /// Whether there are annotations (the decision reads none of them).
    #[serde(default)]
    annotations: Option<serde::de::IgnoredAny>,
    /// The controlling DaemonSet's name, from `ownerReferences`.
    #[serde(
        default,
        rename = "ownerReferences",
        deserialize_with = "controlling_daemonset_of"
    )]
    daemonset: Option<String>,
}

/// The name in the first controller ownerReference of kind DaemonSet (see
/// `controlling_daemonset`); the other references are read and dropped.
fn controlling_daemonset_of<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Owner {
        #[serde(default)]
        api_version: String,
        #[serde(default)]
        kind: String,
        #[serde(default)]
        name: String,
        #[serde(default)]
        controller: Option<bool>,
    }
    struct First;
    impl<'de> serde::de::Visitor<'de> for First {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list of owner references")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut found = None;
            while let Some(owner) = seq.next_element::<Owner>()? {
                if found.is_none()
                    && is_controlling_daemonset(owner.controller, &owner.kind, &owner.api_version)
                {
                    found = Some(owner.name);
                }
            }
            Ok(found)
        }
    }
    d.deserialize_any(First)
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpecView {
    #[serde(default)]
    node_name: Option<String>,
    #[serde(default)]
    affinity: Option<AffinityView>,
    #[serde(default, deserialize_with = "at_most_max_containers")]
    containers: Vec<ContainerFacts>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct AffinityView {
    #[serde(default)]
    node_affinity: Option<NodeAffinityView>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodeAffinityView {
    #[serde(default)]
    required_during_scheduling_ignored_during_execution: Option<NodeSelectorView>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodeSelectorView {
    node_selector_terms: Vec<TermView>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct TermView {
    #[serde(default)]
    match_fields: Option<Vec<FieldView>>,
}

#[derive(serde::Deserialize)]
struct FieldView {
    key: String,
    operator: String,
    #[serde(default)]
    values: Option<Vec<String>>,
}

/// The node a pod with `spec` is for ([`sizing::target_node`]).
fn target_node(spec: Option<&SpecView>) -> Result<String, String> {
    let spec = spec.ok_or(sizing::NO_SPEC)?;
    let terms = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref())
        .map(|s| s.node_selector_terms.as_slice())
        .unwrap_or_default();
    sizing::node_of(
        spec.node_name.as_deref(),
        terms.iter().map(|term| {
            term.match_fields.iter().flatten().map(|f| {
                (
                    f.key.as_str(),
                    f.operator.as_str(),
                    f.values.as_deref().unwrap_or_default(),
                )
            })
        }),
    )
}

/// Most containers of a pod right-sizing reads. Kubernetes sets no number, real pods have a
/// handful; a pod with more is admitted unchanged with a warning (the pod webhook fails open),
/// and reading stops at the first container past it. Each container read costs about 2.5 KB
/// while the pod is decided, so one review costs at most about 2.5 MB however it is built
/// (a pod of 40,000 minimal containers fits in 1.1 MB and cost 95 MB before this limit).
pub const MAX_POD_CONTAINERS: usize = 1000;

fn at_most_max_containers<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<ContainerFacts>, D::Error> {
    struct Bounded;
    impl<'de> serde::de::Visitor<'de> for Bounded {
        type Value = Vec<ContainerFacts>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "a list of at most {MAX_POD_CONTAINERS} containers")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(16));
            while let Some(ContainerView(c)) = seq.next_element()? {
                if out.len() == MAX_POD_CONTAINERS {
                    return Err(serde::de::Error::custom(format!(
                        "more than {MAX_POD_CONTAINERS} containers"
                    )));
                }
                out.push(c);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(Bounded)
}

/// A container read as [`ContainerFacts`].
struct ContainerView(ContainerFacts);

impl<'de> serde::Deserialize<'de> for ContainerView {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        struct Container {
            name: String,
            #[serde(default)]
            resources: Option<Resources>,
        }
        #[derive(serde::Deserialize)]
        struct Resources {
            #[serde(default)]
            requests: Option<AmountsView>,
            #[serde(default)]
            limits: Option<AmountsView>,
        }
        let c = Container::deserialize(d)?;
        Ok(ContainerView(ContainerFacts {
            name: c.name,
            resources: c.resources.map(|r| ResourceFacts {
                requests: r.requests.map(|a| a.0),
                limits: r.limits.map(|a| a.0),
            }),
        }))
    }
}

/// A resource list read as [`Amounts`]: `cpu` and `memory` as amounts as they are parsed (a
/// quantity that cannot be read counts as absent, as in [`Amounts::from_list`]), the other
/// resources skipped. Of a resource named twice the last counts, as in a map.
struct AmountsView(Amounts);

impl<'de> serde::Deserialize<'de> for AmountsView {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::{IgnoredAny, MapAccess, Visitor};
        /// A resource's name, read without keeping it.
        struct Key(Option<ResourceName>);
        impl<'de> serde::Deserialize<'de> for Key {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct Name;
                impl Visitor<'_> for Name {
                    type Value = Key;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        f.write_str("a resource name")
                    }
                    fn visit_str<E>(self, name: &str) -> Result<Key, E> {
                        Ok(Key(match name {
                            "cpu" => Some(ResourceName::Cpu),
                            "memory" => Some(ResourceName::Memory),
                            _ => None,
                        }))
                    }
                }
                d.deserialize_str(Name)
            }
        }
        /// A quantity's text, read as the amount of `0`.
        struct Value(ResourceName);
        impl<'de> serde::de::DeserializeSeed<'de> for Value {
            type Value = Option<u64>;
            fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Option<u64>, D::Error> {
                d.deserialize_str(self)
            }
        }
        impl Visitor<'_> for Value {
            type Value = Option<u64>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a quantity")
            }
            fn visit_str<E>(self, text: &str) -> Result<Option<u64>, E> {
                Ok(sizing::amount_of(self.0, text))
            }
        }
        struct List;
        impl<'de> Visitor<'de> for List {
            type Value = AmountsView;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map of resource names to quantities")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<AmountsView, A::Error> {
                let mut out = Amounts::default();
                while let Some(Key(resource)) = map.next_key()? {
                    match resource {
                        Some(resource) => out.set(resource, map.next_value_seed(Value(resource))?),
                        None => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(AmountsView(out))
            }
        }
        d.deserialize_map(List)
    }
}

fn short(text: &str) -> String {
    text.chars().take(119).collect()
}

/// Most container policies an autoscaler may have: one per container a pod may have, and the
/// `*` default. More are denied before the autoscaler is read whole (60,000 policies cost 60 MB
/// to read).
pub const MAX_CONTAINER_POLICIES: usize = MAX_POD_CONTAINERS + 1;

/// Counts `spec.resourcePolicy.containerPolicies` without keeping any of them.
#[derive(serde::Deserialize, Default)]
struct PoliciesCount {
    #[serde(default)]
    spec: PoliciesCountSpec,
}

#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct PoliciesCountSpec {
    #[serde(default)]
    resource_policy: PoliciesCountPolicy,
}

#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct PoliciesCountPolicy {
    #[serde(default)]
    container_policies: Count,
}

/// The length of a JSON list, its items skipped; 0 for anything else.
#[derive(Default)]
struct Count(usize);

impl<'de> serde::Deserialize<'de> for Count {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Counting;
        impl<'de> serde::de::Visitor<'de> for Counting {
            type Value = Count;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Count, A::Error> {
                let mut n = 0usize;
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    n += 1;
                }
                Ok(Count(n))
            }
            fn visit_unit<E>(self) -> Result<Count, E> {
                Ok(Count(0))
            }
        }
        d.deserialize_any(Counting)
    }
}

/// The `/validate/autoscalers` handler: rules the schema cannot express.
pub struct AutoscalerValidator {
    index: Arc<RightsizingIndex>,
}

impl AutoscalerValidator {
    /// A validator reading `index` (one autoscaler per DaemonSet).
    pub fn new(index: Arc<RightsizingIndex>) -> Self {
        AutoscalerValidator { index }
    }
}

/// Most problems a denial names; the rest are counted (a message stays short however many
/// policies are wrong).
pub const MAX_PROBLEMS_NAMED: usize = 10;

/// The denial's message: the first [`MAX_PROBLEMS_NAMED`] problems, then how many more there are.
fn denial(problems: &[String]) -> String {
    let mut message = problems
        .iter()
        .take(MAX_PROBLEMS_NAMED)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join("; ");
    if problems.len() > MAX_PROBLEMS_NAMED {
        message.push_str(&format!(
            "; and {} more problems",
            problems.len() - MAX_PROBLEMS_NAMED
        ));
    }
    message
}

/// Problems of an autoscaler on its own: each names the field path and the offending values.
pub fn validate_autoscaler(autoscaler: &DaemonSetAutoscaler) -> Vec<String> {
    let mut problems = Vec::new();
    let spec = &autoscaler.spec;
    match spec.node_group_label.as_deref() {
        None if spec.uses_groups() => problems.push(format!(
            "spec.nodeGroupLabel: required with {}: name the node label whose value groups the nodes, \
             e.g. node.kubernetes.io/instance-type",
            if spec.scope == Scope::NodeGroup {
                "scope NodeGroup"
            } else {
                "coldStart Group"
            }
        )),
        Some(key) => {
            if let Err(why) = check_label_key(key) {
                problems.push(format!(
                    "spec.nodeGroupLabel: {key:?} is not a label key: it {why}"
                ));
            }
        }
        None => {}
    }
    let policies = container_policies(autoscaler);
    // names seen so far: one lookup per policy, so many policies cost their number, not its square
    let mut seen = std::collections::HashSet::with_capacity(policies.len());
    for (i, policy) in policies.iter().enumerate() {
        let path = format!("spec.resourcePolicy.containerPolicies[{i}]");
        if !seen.insert(policy.container_name.as_str()) {
            problems.push(format!(
                "{path}.containerName: {:?} has a policy already; give each container (and `*`) one policy",
                policy.container_name
            ));
        }
        for resource in [ResourceName::Cpu, ResourceName::Memory] {
            let r = resource.as_str();
            let min = policy.min_allowed.as_ref().and_then(|l| l.get(r));
            let max = policy.max_allowed.as_ref().and_then(|l| l.get(r));
            if let (Some(min), Some(max)) = (min, max) {
                match (sizing::amount(resource, min), sizing::amount(resource, max)) {
                    (Some(lo), Some(hi)) if lo > hi => problems.push(format!(
                        "{path}: minAllowed.{r} {} is above maxAllowed.{r} {}; minAllowed must be at most maxAllowed",
                        min.0, max.0
                    )),
                    _ => {}
                }
            }
        }
    }
    problems
}

impl Handler for AutoscalerValidator {
    fn review(&self, request: &AdmissionRequest) -> AdmissionResponse {
        let uid = request.uid.as_str();
        if !matches!(request.operation, Operation::Create | Operation::Update) {
            return AdmissionResponse::allow(uid);
        }
        // counted before the object is read: each policy read costs about 1 KB
        if let Ok(PoliciesCount { spec }) = request.object_as::<PoliciesCount>()
            && spec.resource_policy.container_policies.0 > MAX_CONTAINER_POLICIES
        {
            return AdmissionResponse::deny(
                uid,
                422,
                "Invalid",
                format!(
                    "spec.resourcePolicy.containerPolicies: more than {MAX_CONTAINER_POLICIES} entries \
                     (a pod has at most {MAX_POD_CONTAINERS} containers right-sizing reads)"
                ),
            );
        }
        let autoscaler: DaemonSetAutoscaler = match request.object_as() {
            Ok(a) => a,
            Err(err) => {
                return AdmissionResponse::deny(
                    uid,
                    400,
                    "BadRequest",
                    format!("not a DaemonSetAutoscaler: {err}"),
                );
            }
        };
        let mut problems = validate_autoscaler(&autoscaler);
        let namespace = request
            .namespace
            .as_deref()
            .or(autoscaler.metadata.namespace.as_deref())
            .unwrap_or_default();
        let name = autoscaler
            .metadata
            .name
            .as_deref()
            .or(request.name.as_deref())
            .unwrap_or_default();
        let target = &autoscaler.spec.target_ref.name;
        // an update that keeps the target is not held to the one-per-DaemonSet rule, so two
        // autoscalers stored before the webhook was installed stay editable
        let keeps_target = request
            .old_object_as::<DaemonSetAutoscaler>()
            .ok()
            .flatten()
            .is_some_and(|old| old.spec.target_ref.name == autoscaler.spec.target_ref.name);
        let others: Vec<String> = self
            .index
            .autoscalers_for(namespace, target)
            .iter()
            .filter_map(|a| a.metadata.name.clone())
            .filter(|n| n != name)
            .collect();
        if let Some(other) = others.first().filter(|_| !keeps_target) {
            problems.push(format!(
                "spec.targetRef.name: DaemonSet {namespace}/{target} is already right-sized by DaemonSetAutoscaler {other}; one autoscaler per DaemonSet"
            ));
        }
        if problems.is_empty() {
            AdmissionResponse::allow(uid)
        } else {
            AdmissionResponse::deny(uid, 422, "Invalid", denial(&problems))
        }
    }
}
