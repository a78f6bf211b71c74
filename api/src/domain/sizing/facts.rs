//! What the decision reads of a pod: its containers' names, requests and limits, as integer
//! [`Amounts`].

use std::collections::BTreeMap;

use crate::quantity::amount;
use crate::rightsizing::ResourceName;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
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
/// requests and limits, native sidecars included (init containers with `restartPolicy:
/// Always`, sized as containers; run-to-completion init containers are not read). The webhook reads it straight from a review, without building a `Pod`;
/// [`PodFacts::of`] takes it from one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodFacts {
    /// Whether `metadata.annotations` is there (the patch creates it when it is not).
    pub has_annotations: bool,
    /// `spec.containers` in pod order, then the native sidecars of `spec.initContainers` in
    /// pod order.
    pub containers: Vec<ContainerFacts>,
}

/// What the decision reads of one container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerFacts {
    /// The container's name.
    pub name: String,
    /// Its `resources`; `None` when the container has none.
    pub resources: Option<ResourceFacts>,
    /// `Some(i)`: a native sidecar, `spec.initContainers[i]`; `None`: in `spec.containers`.
    pub sidecar: Option<usize>,
}

/// Whether an init container is a native sidecar: `restartPolicy: Always` (the only value
/// Kubernetes allows there).
pub fn is_sidecar(restart_policy: Option<&str>) -> bool {
    restart_policy == Some("Always")
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
                .map(|s| {
                    let sidecars = s
                        .init_containers
                        .iter()
                        .flatten()
                        .enumerate()
                        .filter(|(_, c)| is_sidecar(c.restart_policy.as_deref()))
                        .map(|(i, c)| ContainerFacts {
                            sidecar: Some(i),
                            ..ContainerFacts::of(c)
                        });
                    s.containers
                        .iter()
                        .map(ContainerFacts::of)
                        .chain(sidecars)
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}

impl ContainerFacts {
    /// The facts of `container`, one of `spec.containers` (for a sidecar, set [`Self::sidecar`]).
    pub fn of(container: &Container) -> Self {
        ContainerFacts {
            sidecar: None,
            name: container.name.clone(),
            resources: container.resources.as_ref().map(|r| ResourceFacts {
                requests: r.requests.as_ref().map(|l| Amounts::from_list(Some(l))),
                limits: r.limits.as_ref().map(|l| Amounts::from_list(Some(l))),
            }),
        }
    }

    /// Where it is in the pod: `("containers", i)` or, for a sidecar, `("initContainers", i)`,
    /// `index` being its place in [`PodFacts::containers`].
    pub fn place(&self, index: usize) -> (&'static str, usize) {
        match self.sidecar {
            Some(i) => ("initContainers", i),
            None => ("containers", index),
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

/// The pod's requests as the scheduler counts them (KEP-753, native sidecars): the regular
/// containers and the sidecars summed, or more when a run-to-completion init container needs
/// more while it runs (its request plus the sidecars started before it, which run beside it),
/// plus the pod's `overhead`. A request not given counts as 0. Pod-level `resources` (KEP-2837)
/// are not looked at: right-sizing leaves pods that set them to those figures.
pub fn effective_requests(spec: &PodSpec) -> Amounts {
    let requests = |c: &Container| Amounts::from_list(c.resources.as_ref().and_then(|r| r.requests.as_ref()));
    let mut out = Amounts::default();
    for resource in RESOURCES {
        let get = |a: Amounts| a.get(resource).unwrap_or(0);
        let mut running = spec
            .containers
            .iter()
            .map(|c| get(requests(c)))
            .fold(0u64, u64::saturating_add);
        let mut sidecars_so_far = 0u64;
        let mut init_peak = 0u64;
        for c in spec.init_containers.iter().flatten() {
            let own = get(requests(c));
            if is_sidecar(c.restart_policy.as_deref()) {
                running = running.saturating_add(own);
                sidecars_so_far = sidecars_so_far.saturating_add(own);
                init_peak = init_peak.max(sidecars_so_far);
            } else {
                init_peak = init_peak.max(own.saturating_add(sidecars_so_far));
            }
        }
        let overhead = get(Amounts::from_list(spec.overhead.as_ref()));
        out.set(resource, Some(running.max(init_peak).saturating_add(overhead)));
    }
    out
}
