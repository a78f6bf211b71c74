//! What the decision reads of a pod: its containers' names, requests and limits, as integer
//! [`Amounts`].

use std::collections::BTreeMap;

use crate::quantity::amount;
use crate::rightsizing::ResourceName;
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The resources the decision covers, in the order it covers them.
pub(super) const RESOURCES: [ResourceName; 2] = [ResourceName::Cpu, ResourceName::Memory];

/// CPU in millicores and memory in bytes; `None` when there is no figure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Amounts {
    /// Millicores.
    pub cpu: Option<u64>,
    /// Bytes.
    pub memory: Option<u64>,
}

impl Amounts {
    /// The amount of `resource`.
    pub fn get(&self, resource: ResourceName) -> Option<u64> {
        match resource {
            ResourceName::Cpu => self.cpu,
            ResourceName::Memory => self.memory,
        }
    }

    /// Sets the amount of `resource`.
    pub fn set(&mut self, resource: ResourceName, value: Option<u64>) {
        match resource {
            ResourceName::Cpu => self.cpu = value,
            ResourceName::Memory => self.memory = value,
        }
    }

    /// Whether neither resource has a figure.
    pub fn is_empty(&self) -> bool {
        self.cpu.is_none() && self.memory.is_none()
    }

    /// Reads `cpu` and `memory` from a resource list; unreadable quantities count as absent.
    pub fn from_list(list: Option<&BTreeMap<String, Quantity>>) -> Self {
        let mut out = Amounts::default();
        if let Some(list) = list {
            for resource in RESOURCES {
                out.set(
                    resource,
                    list.get(resource.as_str()).and_then(|q| amount(resource, q)),
                );
            }
        }
        out
    }
}

/// Targets by container name.
pub type Targets = BTreeMap<String, Amounts>;

/// What the decision reads of a pod: whether it has annotations, and each container's name,
/// requests and limits. The webhook reads it straight from a review, without building a `Pod`;
/// [`PodFacts::of`] takes it from one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodFacts {
    /// Whether `metadata.annotations` is there (the patch creates it when it is not).
    pub has_annotations: bool,
    /// `spec.containers`, in pod order.
    pub containers: Vec<ContainerFacts>,
}

/// What the decision reads of one container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerFacts {
    /// The container's name.
    pub name: String,
    /// Its `resources`; `None` when the container has none.
    pub resources: Option<ResourceFacts>,
}

/// A container's `resources`: `None` for a map it does not have. A quantity that cannot be
/// read counts as absent, as in [`Amounts::from_list`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResourceFacts {
    /// `resources.requests`.
    pub requests: Option<Amounts>,
    /// `resources.limits`.
    pub limits: Option<Amounts>,
}

impl PodFacts {
    /// The facts of `pod`.
    pub fn of(pod: &Pod) -> Self {
        PodFacts {
            has_annotations: pod.metadata.annotations.is_some(),
            containers: pod
                .spec
                .as_ref()
                .map(|s| s.containers.iter().map(ContainerFacts::of).collect())
                .unwrap_or_default(),
        }
    }
}

impl ContainerFacts {
    /// The facts of `container`.
    pub fn of(container: &Container) -> Self {
        ContainerFacts {
            name: container.name.clone(),
            resources: container.resources.as_ref().map(|r| ResourceFacts {
                requests: r.requests.as_ref().map(|l| Amounts::from_list(Some(l))),
                limits: r.limits.as_ref().map(|l| Amounts::from_list(Some(l))),
            }),
        }
    }

    /// Its requests (none when it has no `requests`).
    pub fn requests(&self) -> Amounts {
        self.resources.and_then(|r| r.requests).unwrap_or_default()
    }

    /// Its limits (none when it has no `limits`).
    pub fn limits(&self) -> Amounts {
        self.resources.and_then(|r| r.limits).unwrap_or_default()
    }
}
