//! The admission handlers: [`PodMutator`] at `/mutate/pods` and [`AutoscalerValidator`] at
//! `/validate/autoscalers`.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use nodewarden_api::domain::rightsizing::controlling_daemonset;
use nodewarden_api::domain::sizing::{self, Decision, Reason, Source};
use nodewarden_api::rightsizing::DaemonSetAutoscaler;

use super::cache::{Prepared, RightsizingCache};
use super::rules::{denial, validate_autoscaler};
use super::view::{MAX_CONTAINER_POLICIES, MAX_POD_CONTAINERS, PodView, PoliciesCount, target_node};
use crate::admission::{AdmissionRequest, AdmissionResponse, Handler, Kept, Operation, Request, Skipped};

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
    index: Arc<RightsizingCache>,
    observer: Arc<dyn RightsizingObserver>,
}

impl PodMutator {
    /// A mutator reading `index`, counting nothing.
    pub fn new(index: Arc<RightsizingCache>) -> Self {
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
    fn decide_view(&self, namespace: &str, pod: &PodView) -> Option<Decision> {
        let daemonset = pod.metadata.daemonset.as_deref()?;
        let prepared = self.index.prepared_for(namespace, daemonset)?;
        let node = target_node(pod.placement.as_ref());
        Some(decide_with(&self.index, namespace, &prepared, node, &pod.facts))
    }
}

/// [`sizing::mutate_on`] of a pod for `node` with its inputs taken from the index.
pub(crate) fn decide_with(
    index: &RightsizingCache,
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
        view: Result<&PodView, String>,
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
        let namespace = request_namespace
            .or(pod.metadata.namespace.as_deref())
            .unwrap_or_default();
        let Some(decision) = self.decide_view(namespace, pod) else {
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

    /// The answer to a pod review decoded with its object raw: the pod's view read from it in a
    /// second pass. The pipeline answers so a review whose pod does not read as [`PodView`]
    /// ([`Handler::review_unreadable`]); for any other it gives the answer [`Handler::review`]
    /// gives the review read in one pass (the tests and the fuzzer compare the two).
    pub fn review_raw(&self, request: &AdmissionRequest) -> AdmissionResponse {
        if !is_pod_create(
            request.operation,
            &request.kind.kind,
            request.sub_resource.as_deref(),
        ) {
            return AdmissionResponse::allow(&request.uid);
        }
        let uid = &request.uid;
        let namespace = request.namespace.as_deref();
        match request.object_as::<PodView>() {
            Ok(view) => self.review_pod(uid, namespace, Ok(&view)),
            Err(err) => self.review_pod(uid, namespace, Err(err)),
        }
    }
}

/// The pod is read in the same pass as the envelope, as its view ([`PodView`]): the pod is most
/// of a review's bytes, and it is read once instead of skipped raw and then read again. The
/// request's other fields (`userInfo`, `oldObject`, …) are checked and not kept.
impl Handler for PodMutator {
    type Object = PodView;
    type Extras = Skipped;

    fn review(&self, request: &Request<Self>) -> AdmissionResponse {
        if !is_pod_create(
            request.operation,
            &request.kind.kind,
            request.sub_resource.as_deref(),
        ) {
            return AdmissionResponse::allow(&request.uid);
        }
        let view = request
            .object
            .as_ref()
            .ok_or_else(|| "request.object is missing".to_string());
        self.review_pod(&request.uid, request.namespace.as_deref(), view)
    }

    /// A pod that does not read as its view: admitted unchanged, with a warning.
    fn review_unreadable(&self, request: &AdmissionRequest) -> AdmissionResponse {
        self.review_raw(request)
    }

    /// The pod webhook is registered with `failurePolicy: Ignore`: a fault admits the pod unchanged.
    fn fails_open(&self) -> bool {
        true
    }
}

fn short(text: &str) -> String {
    text.chars().take(119).collect()
}

/// The `/validate/autoscalers` handler: rules the schema cannot express.
pub struct AutoscalerValidator {
    index: Arc<RightsizingCache>,
}

impl AutoscalerValidator {
    /// A validator reading `index` (one autoscaler per DaemonSet).
    pub fn new(index: Arc<RightsizingCache>) -> Self {
        AutoscalerValidator { index }
    }
}

impl Handler for AutoscalerValidator {
    type Object = Box<serde_json::value::RawValue>;
    type Extras = Kept;

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
