//! A DaemonSet's ControllerRevision, decoded as the updater needs it: its template's containers
//! (names and resources), from which [`template_pod`] makes the pod the template would make.

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use nodewarden_api::domain::sizing::is_sidecar;
use serde::Deserialize;

/// A ControllerRevision of a DaemonSet as the updater reads it: the names and resources of its
/// template's containers, decoded straight from the API server's answer (everything else in it
/// is skipped, never built).
#[derive(Resource, Clone, Debug, Default, Deserialize)]
#[resource(inherit = "ControllerRevision")]
pub struct TemplateRevision {
    /// The revision's metadata (without managed fields).
    #[serde(deserialize_with = "crate::rightsizing::pods::slim_metadata")]
    pub metadata: ObjectMeta,
    /// The DaemonSet's patch this revision records (`spec.template`).
    #[serde(default)]
    pub data: Option<RevisionData>,
}

impl TemplateRevision {
    /// The template's containers as the webhook sizes them (native sidecars among them); `None`
    /// when the revision holds no pod template.
    pub fn sized_containers(self) -> Option<Vec<TemplateContainer>> {
        self.data
            .and_then(|d| d.spec)
            .and_then(|s| s.template)
            .and_then(|t| t.spec)
            .map(RevisionPodSpec::sized)
    }
}

/// `data` of a DaemonSet's ControllerRevision: `{"spec": {"template": {"spec": {"containers": ...}}}}`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct RevisionData {
    #[serde(default)]
    spec: Option<RevisionSpec>,
}

#[derive(Clone, Debug, Default, Deserialize)]
struct RevisionSpec {
    #[serde(default)]
    template: Option<RevisionTemplate>,
}

#[derive(Clone, Debug, Default, Deserialize)]
struct RevisionTemplate {
    #[serde(default)]
    spec: Option<RevisionPodSpec>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RevisionPodSpec {
    #[serde(default)]
    containers: Vec<TemplateContainer>,
    #[serde(default)]
    init_containers: Vec<TemplateContainer>,
}

impl RevisionPodSpec {
    /// The containers, then the native sidecars (marked so); the other init containers dropped.
    fn sized(self) -> Vec<TemplateContainer> {
        let sidecars = self
            .init_containers
            .into_iter()
            .filter(|c| is_sidecar(c.restart_policy.as_deref()))
            .map(|c| TemplateContainer { sidecar: true, ..c });
        self.containers
            .into_iter()
            .map(|c| TemplateContainer { sidecar: false, ..c })
            .chain(sidecars)
            .collect()
    }
}

/// A container of a DaemonSet's pod template as the updater keeps it: what [`sizing_on`] reads
/// (about 100 bytes, where a full `Container` takes over 2 KB even when empty).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateContainer {
    /// Container name.
    pub name: String,
    /// Requests and limits of the template.
    #[serde(default)]
    pub resources: Option<ResourceRequirements>,
    /// `Always` for a native sidecar among the init containers.
    #[serde(default)]
    pub restart_policy: Option<String>,
    /// Whether it is a native sidecar (set from where it was read, not from the text).
    #[serde(skip)]
    pub sidecar: bool,
}

/// A pod holding only `containers` (the sidecars among them as init containers with
/// `restartPolicy: Always`), for [`sizing_on`] (built for the call, dropped after it).
pub fn template_pod(containers: &[TemplateContainer]) -> Pod {
    let of = |sidecar: bool| -> Vec<Container> {
        containers
            .iter()
            .filter(|c| c.sidecar == sidecar)
            .map(|c| Container {
                name: c.name.clone(),
                resources: c.resources.clone(),
                restart_policy: sidecar.then(|| "Always".to_string()),
                ..Container::default()
            })
            .collect()
    };
    let sidecars = of(true);
    Pod {
        spec: Some(PodSpec {
            containers: of(false),
            init_containers: (!sidecars.is_empty()).then_some(sidecars),
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_revision_is_read_as_its_template_containers_names_and_resources() {
        let rev: TemplateRevision = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "ControllerRevision",
            "metadata": {"name": "ds-5d8f", "namespace": "ns", "managedFields": [{"manager": "m"}]},
            "revision": 1,
            "data": {"spec": {"template": {"$patch": "replace", "metadata": {"labels": {"app": "a"}},
                "spec": {"containers": [
                    {"name": "app", "image": "app:1", "args": ["--x"],
                     "resources": {"requests": {"cpu": "100m"}, "limits": {"memory": "64Mi"}}},
                    {"name": "side", "image": "side:1"}
                ]}}}}
        }))
        .expect("revision");
        let containers = rev
            .data
            .and_then(|d| d.spec)
            .and_then(|s| s.template)
            .and_then(|t| t.spec)
            .map(|s| s.containers)
            .expect("containers");
        let pod = template_pod(&containers);
        let spec = pod.spec.expect("spec");
        assert_eq!(spec.containers.len(), 2);
        assert_eq!(spec.containers[0].name, "app");
        let resources = spec.containers[0].resources.as_ref().expect("resources");
        assert_eq!(resources.requests.as_ref().expect("requests")["cpu"].0, "100m");
        assert_eq!(resources.limits.as_ref().expect("limits")["memory"].0, "64Mi");
        assert_eq!(
            spec.containers[0].image, None,
            "only names and resources are kept"
        );
        assert!(spec.containers[1].resources.is_none());
    }

    #[test]
    fn a_revision_keeps_its_sidecars_and_drops_its_init_containers() {
        let rev: TemplateRevision = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "ControllerRevision",
            "metadata": {"name": "ds-5d8f", "namespace": "ns"},
            "revision": 1,
            "data": {"spec": {"template": {"spec": {
                "initContainers": [
                    {"name": "setup", "image": "i", "resources": {"requests": {"cpu": "1"}}},
                    {"name": "log", "image": "i", "restartPolicy": "Always",
                     "resources": {"requests": {"cpu": "50m"}}}
                ],
                "containers": [{"name": "app", "image": "i", "restartPolicy": "Always"}]
            }}}}
        }))
        .expect("revision");
        let containers = rev.sized_containers().expect("containers");
        let names: Vec<(&str, bool)> = containers.iter().map(|c| (c.name.as_str(), c.sidecar)).collect();
        assert_eq!(names, [("app", false), ("log", true)]);
        let pod = template_pod(&containers);
        let facts = nodewarden_api::domain::sizing::PodFacts::of(&pod);
        let read: Vec<(&str, Option<usize>)> = facts
            .containers
            .iter()
            .map(|c| (c.name.as_str(), c.sidecar))
            .collect();
        assert_eq!(
            read,
            [("app", None), ("log", Some(0))],
            "the sizing rule sees the sidecar"
        );
    }
}
