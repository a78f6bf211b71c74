//! Reads what the report needs; nothing else is done here.

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use nodewarden_api::{DaemonSetAutoscaler, NodeRecommendation};

use super::Snapshot;
use crate::error::{Error, classify};

/// Lists the autoscalers (in `namespace`, or all), their DaemonSets and pods, and every
/// `NodeRecommendation`.
pub async fn snapshot(client: &Client, namespace: Option<&str>) -> Result<Snapshot, Error> {
    let autoscalers: Api<DaemonSetAutoscaler> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let autoscalers = autoscalers
        .list(&ListParams::default())
        .await
        .map_err(|e| classify("daemonsetautoscalers.nodewarden.io", e))?
        .items;
    let recommendations = Api::<NodeRecommendation>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| classify("noderecommendations.nodewarden.io", e))?
        .items;

    let targets: BTreeSet<(String, String)> = autoscalers
        .iter()
        .map(|a| (a.namespace().unwrap_or_default(), a.spec.target_ref.name.clone()))
        .collect();
    let mut daemonsets = Vec::new();
    let mut pods = Vec::new();
    for (ns, name) in targets {
        let api: Api<DaemonSet> = Api::namespaced(client.clone(), &ns);
        let Some(ds) = api
            .get_opt(&name)
            .await
            .map_err(|e| classify("daemonsets.apps", e))?
        else {
            continue;
        };
        let selector = ds
            .spec
            .as_ref()
            .and_then(|s| s.selector.match_labels.as_ref())
            .map(|labels| {
                labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        let mut params = ListParams::default();
        if !selector.is_empty() {
            params = params.labels(&selector);
        }
        let listed = Api::<Pod>::namespaced(client.clone(), &ns)
            .list(&params)
            .await
            .map_err(|e| classify("pods", e))?;
        pods.extend(listed.items);
        daemonsets.push(ds);
    }
    Ok(Snapshot {
        autoscalers,
        daemonsets,
        pods,
        recommendations,
    })
}
