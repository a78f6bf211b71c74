//! `nodewarden-webhook crds apply`: brings nodewarden's CRDs in a cluster to the ones this binary
//! was built with (the chart's `crds/` files are generated from the same types), for the chart's
//! pre-upgrade hook: Helm installs `crds/` on the first install only and never upgrades them.
//!
//! Each CRD is replaced whole (read, then written back with its resource version), so a field the
//! new version dropped is dropped in the cluster too, whoever wrote it; a CRD that does not exist
//! yet is created. Labels and annotations others put on a CRD are kept. The API server refuses a
//! CRD that no longer serves a version the cluster has stored objects in (`status.storedVersions`):
//! that error stops the upgrade, as it should. Then each CRD must be `Established` within the
//! timeout.

use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};

/// What `crds apply` did to one CRD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// It did not exist and was created.
    Created,
    /// It existed and was replaced by the built-in one; `changed` when its generation moved (the
    /// spec differed).
    Replaced {
        /// Whether the spec differed (the generation moved).
        changed: bool,
    },
}

/// Why `crds apply` stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CrdsError {
    /// The API server refused a read or write (RBAC, validation, a version still stored).
    #[error("{action} CustomResourceDefinition {name}: {source}")]
    Api {
        /// What was being done, e.g. `reading`.
        action: &'static str,
        /// The CRD's name.
        name: String,
        /// The client's error.
        source: kube::Error,
    },
    /// Another writer kept changing the CRD between our read and write.
    #[error("CustomResourceDefinition {name} kept changing under us ({attempts} attempts); run it again")]
    Conflict {
        /// The CRD's name.
        name: String,
        /// How many read-and-write rounds were tried.
        attempts: u32,
    },
    /// The CRD did not become Established in time.
    #[error("CustomResourceDefinition {name} is not Established after {waited:?}: {why}")]
    NotEstablished {
        /// The CRD's name.
        name: String,
        /// How long it was waited for.
        waited: Duration,
        /// Its `Established` condition's message, or why it could not be read.
        why: String,
    },
}

/// The names of the CRDs this binary carries, e.g. for RBAC `resourceNames`.
pub fn names() -> Vec<String> {
    nodewarden_api::crdgen::crds()
        .into_iter()
        .map(|c| c.name_any())
        .collect()
}

/// Creates or replaces every nodewarden CRD with the built-in one, then waits up to `timeout`
/// for each to be Established. Returns each CRD's name and what was done.
pub async fn apply(client: &Client, timeout: Duration) -> Result<Vec<(String, Applied)>, CrdsError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut done = Vec::new();
    for crd in nodewarden_api::crdgen::crds() {
        let name = crd.name_any();
        let applied = apply_one(&api, crd).await?;
        tracing::info!(crd = %name, outcome = ?applied, "CustomResourceDefinition applied");
        done.push((name, applied));
    }
    let began = Instant::now();
    for (name, _) in &done {
        wait_established(&api, name, began, timeout).await?;
    }
    Ok(done)
}

const ATTEMPTS: u32 = 5;

async fn apply_one(
    api: &Api<CustomResourceDefinition>,
    shipped: CustomResourceDefinition,
) -> Result<Applied, CrdsError> {
    let name = shipped.name_any();
    let err = |action: &'static str, name: &str| {
        let name = name.to_string();
        move |source| CrdsError::Api { action, name, source }
    };
    for _ in 0..ATTEMPTS {
        let Some(current) = api.get_opt(&name).await.map_err(err("reading", &name))? else {
            api.create(&PostParams::default(), &shipped)
                .await
                .map_err(err("creating", &name))?;
            return Ok(Applied::Created);
        };
        let mut next = shipped.clone();
        next.metadata.resource_version = current.metadata.resource_version.clone();
        // keep what others added to the metadata; the built-in labels and annotations win
        let mut labels = current.metadata.labels.clone().unwrap_or_default();
        labels.extend(next.metadata.labels.take().unwrap_or_default());
        next.metadata.labels = (!labels.is_empty()).then_some(labels);
        let mut annotations = current.metadata.annotations.clone().unwrap_or_default();
        annotations.extend(next.metadata.annotations.take().unwrap_or_default());
        next.metadata.annotations = (!annotations.is_empty()).then_some(annotations);
        match api.replace(&name, &PostParams::default(), &next).await {
            Ok(written) => {
                return Ok(Applied::Replaced {
                    changed: written.metadata.generation != current.metadata.generation,
                });
            }
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(source) => {
                return Err(CrdsError::Api {
                    action: "replacing",
                    name,
                    source,
                });
            }
        }
    }
    Err(CrdsError::Conflict {
        name,
        attempts: ATTEMPTS,
    })
}

async fn wait_established(
    api: &Api<CustomResourceDefinition>,
    name: &str,
    began: Instant,
    timeout: Duration,
) -> Result<(), CrdsError> {
    loop {
        let crd = api.get(name).await.map_err(|source| CrdsError::Api {
            action: "reading",
            name: name.to_string(),
            source,
        })?;
        let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
        let established = conditions.iter().find(|c| c.type_ == "Established");
        if established.is_some_and(|c| c.status == "True") {
            return Ok(());
        }
        if began.elapsed() >= timeout {
            let why = conditions
                .iter()
                .filter(|c| c.status != "True")
                .map(|c| format!("{}: {}", c.type_, c.message.clone().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join("; ");
            return Err(CrdsError::NotEstablished {
                name: name.to_string(),
                waited: began.elapsed(),
                why: if why.is_empty() {
                    "no Established condition yet".to_string()
                } else {
                    why
                },
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
