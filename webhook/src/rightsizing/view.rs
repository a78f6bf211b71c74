//! The fields of a pod the `/mutate/pods` handler reads, decoded straight from the review's
//! bytes (in the same pass as the AdmissionReview envelope: the handler declares [`PodView`] as
//! its [`Handler::Object`]), and the count of an autoscaler's container policies the
//! `/validate/autoscalers` handler takes before reading the autoscaler whole.
//!
//! [`Handler::Object`]: crate::admission::Handler::Object

use nodewarden_api::domain::rightsizing::is_controlling_daemonset;
use nodewarden_api::domain::sizing::{self, Amounts, ContainerFacts, ResourceFacts};
use nodewarden_api::rightsizing::ResourceName;

/// The fields of a pod the decision reads, kept as the decision reads them; everything else in
/// the review is skipped while parsing. No `Pod` is built: a container's requests and limits are
/// read as amounts as they are parsed, and the node affinity only as far as its `matchFields`,
/// so no `k8s_openapi` value is built and dropped per review. The fields the API server's types
/// require (a container's `name`, a node selector's `nodeSelectorTerms`, a requirement's `key`
/// and `operator`) are required here too, and a quantity must be a string.
#[derive(serde::Deserialize)]
#[serde(from = "PodRead")]
pub struct PodView {
    pub(super) metadata: MetaView,
    /// Where the pod goes (`nodeName`, the node affinity); `None` when it has no `spec`.
    pub(super) placement: Option<Placement>,
    /// What the decision reads of the pod, borrowed by it.
    pub(super) facts: sizing::PodFacts,
}

/// A pod as read, before its facts are gathered into [`PodView`].
#[derive(serde::Deserialize)]
struct PodRead {
    #[serde(default)]
    metadata: MetaView,
    #[serde(default)]
    spec: Option<SpecView>,
}

impl From<PodRead> for PodView {
    fn from(PodRead { metadata, spec }: PodRead) -> Self {
        let (placement, containers) = match spec {
            Some(SpecView {
                node_name,
                affinity,
                mut containers,
                init_containers,
            }) => {
                // the native sidecars, after the containers (as `PodFacts::of` has them)
                containers.extend(init_containers.into_iter().flatten());
                (Some(Placement { node_name, affinity }), containers)
            }
            None => (None, Vec::new()),
        };
        PodView {
            facts: sizing::PodFacts {
                has_annotations: metadata.annotations.is_some(),
                containers,
            },
            metadata,
            placement,
        }
    }
}

/// Where a pod goes: the fields of its `spec` [`target_node`] reads.
pub(super) struct Placement {
    node_name: Option<String>,
    affinity: Option<AffinityView>,
}

#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct MetaView {
    #[serde(default)]
    pub(super) namespace: Option<String>,
    /// Whether there are annotations (the decision reads none of them).
    #[serde(default)]
    pub(super) annotations: Option<serde::de::IgnoredAny>,
    /// The controlling DaemonSet's name, from `ownerReferences`.
    #[serde(
        default,
        rename = "ownerReferences",
        deserialize_with = "controlling_daemonset_of"
    )]
    pub(super) daemonset: Option<String>,
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
    /// The native sidecars of `initContainers` (`restartPolicy: Always`), each with its index
    /// there; the run-to-completion ones are read and dropped.
    #[serde(default, deserialize_with = "sidecars_of")]
    init_containers: Option<Vec<ContainerFacts>>,
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

/// The node a pod placed so is for ([`sizing::target_node`]).
pub(super) fn target_node(spec: Option<&Placement>) -> Result<String, String> {
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
/// while the pod is decided, so one review costs at most about 2.5 MB however it is built (a
/// request body may hold tens of thousands of minimal containers; docs/server.md).
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
            while let Some(ContainerView(mut c)) = seq.next_element()? {
                // a regular container's `restartPolicy` (container restart rules) makes no sidecar
                c.sidecar = None;
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

/// The native sidecars among `initContainers`, at most [`MAX_POD_CONTAINERS`] init containers
/// read (as for `containers`).
fn sidecars_of<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<ContainerFacts>>, D::Error> {
    struct Sidecars;
    impl<'de> serde::de::Visitor<'de> for Sidecars {
        type Value = Option<Vec<ContainerFacts>>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "a list of at most {MAX_POD_CONTAINERS} init containers")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            let mut index = 0;
            while let Some(ContainerView(mut c)) = seq.next_element()? {
                if index == MAX_POD_CONTAINERS {
                    return Err(serde::de::Error::custom(format!(
                        "more than {MAX_POD_CONTAINERS} init containers"
                    )));
                }
                if c.sidecar.is_some() {
                    c.sidecar = Some(index);
                    out.push(c);
                }
                index += 1;
            }
            Ok(Some(out))
        }
    }
    d.deserialize_any(Sidecars)
}

/// A container read as [`ContainerFacts`]; for an init container `sidecar` is `Some` (its
/// index set by the caller) when its `restartPolicy` is `Always`.
struct ContainerView(ContainerFacts);

impl<'de> serde::Deserialize<'de> for ContainerView {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Container {
            name: String,
            #[serde(default)]
            resources: Option<Resources>,
            #[serde(default)]
            restart_policy: Option<String>,
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
            sidecar: sizing::is_sidecar(c.restart_policy.as_deref()).then_some(0),
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

/// Most container policies an autoscaler may have: one per container a pod may have, and the
/// `*` default. More are denied before the autoscaler is read whole, so a large body cannot
/// make the webhook hold every policy (docs/server.md).
pub const MAX_CONTAINER_POLICIES: usize = MAX_POD_CONTAINERS + 1;

/// Counts `spec.resourcePolicy.containerPolicies` without keeping any of them.
#[derive(serde::Deserialize, Default)]
pub(super) struct PoliciesCount {
    #[serde(default)]
    pub(super) spec: PoliciesCountSpec,
}

#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct PoliciesCountSpec {
    #[serde(default)]
    pub(super) resource_policy: PoliciesCountPolicy,
}

#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct PoliciesCountPolicy {
    #[serde(default)]
    pub(super) container_policies: Count,
}

/// The length of a JSON list, its items skipped; 0 for anything else.
#[derive(Default)]
pub(super) struct Count(pub(super) usize);

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

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::{Value, json};

    use super::*;
    use crate::admission::{ReviewIn, Skipped};

    /// A DaemonSet pod's CREATE as the API server sent it (managed fields, tolerations, probes
    /// and all).
    const REVIEW: &str = include_str!("../../../tests/fixtures/admission/daemonset-pod-create.json");

    /// The pod of [`REVIEW`].
    fn recorded_pod() -> Value {
        let review: Value = serde_json::from_str(REVIEW).expect("fixture");
        review["request"]["object"].clone()
    }

    fn view_of(pod: &Value) -> Result<PodView, String> {
        serde_json::from_str(&pod.to_string()).map_err(|e| e.to_string())
    }

    /// A change that breaks the recorded pod.
    type Change = fn(&mut Value);

    fn amounts(cpu: &str, memory: &str) -> Amounts {
        let mut a = Amounts::default();
        a.set(ResourceName::Cpu, sizing::amount_of(ResourceName::Cpu, cpu));
        a.set(
            ResourceName::Memory,
            sizing::amount_of(ResourceName::Memory, memory),
        );
        a
    }

    #[test]
    fn the_recorded_pod_is_read_as_the_fields_the_decision_keeps() {
        let view = view_of(&recorded_pod()).expect("the recorded pod is read");
        assert_eq!(view.metadata.namespace.as_deref(), Some("webhook-b8hcd8g"));
        assert!(
            view.metadata.annotations.is_none(),
            "the recorded pod has no annotations"
        );
        assert_eq!(view.metadata.daemonset.as_deref(), Some("node-agent"));
        assert_eq!(
            target_node(view.placement.as_ref()).as_deref(),
            Ok("webhook-b8hcd8g-node-1")
        );
        assert!(!view.facts.has_annotations);
        assert_eq!(
            view.facts.containers,
            vec![ContainerFacts {
                name: "agent".to_string(),
                sidecar: None,
                resources: Some(ResourceFacts {
                    requests: Some(amounts("100m", "64Mi")),
                    limits: Some(amounts("200m", "128Mi")),
                }),
            }]
        );
    }

    #[test]
    fn the_one_pass_read_of_the_review_keeps_the_same_fields() {
        // as the pipeline reads it for the pod handler: envelope and view together
        let review: ReviewIn<PodView, Skipped> =
            serde_json::from_str(REVIEW).expect("the recorded review is read in one pass");
        let view = review
            .request
            .and_then(|r| r.object)
            .expect("the pod is read as its view");
        assert_eq!(view.metadata.daemonset.as_deref(), Some("node-agent"));
        assert_eq!(
            target_node(view.placement.as_ref()).as_deref(),
            Ok("webhook-b8hcd8g-node-1")
        );
        assert_eq!(view.facts.containers.len(), 1);
    }

    #[test]
    fn the_view_finds_the_node_and_the_containers_a_pod_finds() {
        let mut pods = vec![recorded_pod()];
        let mut by_name = recorded_pod();
        by_name["spec"]["nodeName"] = json!("node-by-name");
        pods.push(by_name);
        let mut two_terms = recorded_pod();
        let term = two_terms["spec"]["affinity"]["nodeAffinity"]
            ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
            .clone();
        two_terms["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] =
            json!([term.clone(), term]);
        pods.push(two_terms);
        let mut sidecars = recorded_pod();
        sidecars["spec"]["initContainers"] = json!([
            {"name": "setup", "resources": {"requests": {"cpu": "1"}}},
            {"name": "log", "restartPolicy": "Always", "resources": {"requests": {"cpu": "50m"}}},
            {"name": "mesh", "restartPolicy": "Always"}
        ]);
        // a regular container's restartPolicy (container restart rules) makes no sidecar
        sidecars["spec"]["containers"][0]["restartPolicy"] = json!("Always");
        pods.push(sidecars.clone());
        let facts = view_of(&sidecars).expect("view").facts;
        let read: Vec<(&str, Option<usize>)> = facts
            .containers
            .iter()
            .map(|c| (c.name.as_str(), c.sidecar))
            .collect();
        assert_eq!(read, [("agent", None), ("log", Some(1)), ("mesh", Some(2))]);
        let mut no_spec = recorded_pod();
        no_spec.as_object_mut().expect("object").remove("spec");
        pods.push(no_spec);
        for pod in pods {
            let view = view_of(&pod).expect("view");
            let typed: Pod = serde_json::from_value(pod.clone()).expect("pod");
            assert_eq!(
                target_node(view.placement.as_ref()),
                sizing::target_node(&typed),
                "{pod}"
            );
            assert_eq!(view.facts, sizing::PodFacts::of(&typed), "{pod}");
        }
    }

    #[test]
    fn only_the_controlling_daemonset_is_kept() {
        let mut pod = recorded_pod();
        pod["metadata"]["ownerReferences"] = json!([
            {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "not-controller", "uid": "1"},
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "replicas", "uid": "2", "controller": true},
            {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "controller", "uid": "3", "controller": true}
        ]);
        pod["metadata"]["annotations"] = json!({"any": "thing"});
        let view = view_of(&pod).expect("view");
        assert_eq!(view.metadata.daemonset.as_deref(), Some("controller"));
        assert!(view.metadata.annotations.is_some());
        assert!(view.facts.has_annotations);

        pod["metadata"]["ownerReferences"] = Value::Null;
        assert_eq!(view_of(&pod).expect("view").metadata.daemonset, None);
        pod["metadata"]
            .as_object_mut()
            .expect("object")
            .remove("ownerReferences");
        assert_eq!(view_of(&pod).expect("view").metadata.daemonset, None);
    }

    #[test]
    fn other_resources_are_skipped_and_an_unreadable_quantity_is_absent() {
        let mut pod = recorded_pod();
        pod["spec"]["containers"][0]["resources"] = json!({
            "requests": {"cpu": "not a quantity", "memory": "64Mi", "nvidia.com/gpu": "1"},
            "limits": {"ephemeral-storage": "1Gi"}
        });
        let facts = view_of(&pod).expect("view").facts;
        let mut requests = Amounts::default();
        requests.set(
            ResourceName::Memory,
            sizing::amount_of(ResourceName::Memory, "64Mi"),
        );
        assert_eq!(
            facts.containers[0].resources,
            Some(ResourceFacts {
                requests: Some(requests),
                limits: Some(Amounts::default()),
            })
        );
    }

    #[test]
    fn a_malformed_pod_is_refused_with_a_clear_error() {
        let cases: [(&str, Change, &str); 5] = [
            (
                "a container without a name",
                |pod| {
                    pod["spec"]["containers"][0]
                        .as_object_mut()
                        .expect("object")
                        .remove("name");
                },
                "missing field `name`",
            ),
            (
                "a quantity that is a number",
                |pod| pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = json!(1),
                "expected a quantity",
            ),
            (
                "containers that are not a list",
                |pod| pod["spec"]["containers"] = json!({"agent": {}}),
                "expected a list of at most 1000 containers",
            ),
            (
                "a node selector without its terms",
                |pod| {
                    pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] =
                        json!({})
                },
                "missing field `nodeSelectorTerms`",
            ),
            (
                "a field requirement without its operator",
                |pod| {
                    pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                        ["nodeSelectorTerms"][0]["matchFields"][0]
                        .as_object_mut()
                        .expect("object")
                        .remove("operator");
                },
                "missing field `operator`",
            ),
        ];
        for (what, change, expected) in cases {
            let mut pod = recorded_pod();
            change(&mut pod);
            let Err(err) = view_of(&pod) else {
                panic!("{what}: read");
            };
            assert!(err.contains(expected), "{what}: {err}");
        }
    }

    #[test]
    fn a_pod_with_more_containers_than_read_is_refused() {
        let mut pod = recorded_pod();
        let container = pod["spec"]["containers"][0].clone();
        pod["spec"]["containers"] = Value::Array(vec![container; MAX_POD_CONTAINERS + 1]);
        let Err(err) = view_of(&pod) else {
            panic!("read");
        };
        assert!(err.contains("more than 1000 containers"), "{err}");
        pod["spec"]["containers"].as_array_mut().expect("list").pop();
        assert_eq!(
            view_of(&pod).expect("view").facts.containers.len(),
            MAX_POD_CONTAINERS
        );
    }

    #[test]
    fn container_policies_are_counted_without_being_read() {
        let count = |autoscaler: Value| {
            serde_json::from_value::<PoliciesCount>(autoscaler)
                .expect("count")
                .spec
                .resource_policy
                .container_policies
                .0
        };
        let policies = json!([{"containerName": "*"}, {"containerName": "a"}, {"not": "a policy"}]);
        assert_eq!(
            count(json!({"spec": {"resourcePolicy": {"containerPolicies": policies}}})),
            3
        );
        assert_eq!(
            count(json!({"spec": {"resourcePolicy": {"containerPolicies": null}}})),
            0
        );
        assert_eq!(count(json!({"spec": {"targetRef": {"name": "ds"}}})), 0);
        assert_eq!(count(json!({})), 0);
    }
}
