//! Reads what the report needs; nothing else is done here.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{LimitRange, Node, Pod};
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use nodewarden_api::{DaemonSetAutoscaler, NodeRecommendation};

use super::Snapshot;
use crate::error::{Error, classify};

/// Lists the autoscalers (in `namespace`, or all; with the labels `selector` asks for), their DaemonSets and pods, every
/// `NodeRecommendation`, the LimitRanges of the autoscalers' namespaces, and the nodes' labels
/// when an autoscaler uses node groups: what the webhook reads to size a new pod.
pub async fn snapshot(
    client: &Client,
    namespace: Option<&str>,
    selector: Option<&str>,
) -> Result<Snapshot, Error> {
    let autoscalers: Api<DaemonSetAutoscaler> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let mut params = ListParams::default();
    if let Some(selector) = selector.filter(|s| !s.is_empty()) {
        params = params.labels(selector);
    }
    let autoscalers = autoscalers
        .list(&params)
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
    let namespaces: BTreeSet<String> = targets.iter().map(|(ns, _)| ns.clone()).collect();
    let limit_ranges = limit_ranges(client, namespaces).await?;
    let node_labels = node_labels(client, &autoscalers).await?;
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
        pods.extend(pods_of(client, &ds).await?);
        daemonsets.push(ds);
    }
    Ok(Snapshot {
        autoscalers,
        daemonsets,
        pods,
        recommendations,
        node_labels,
        limit_ranges,
    })
}

/// The pods of `daemonsets`, the LimitRanges of their namespaces, and the nodes' labels when
/// one of `autoscalers` uses node groups: what the webhook reads beside the recommendations.
pub async fn around(
    client: &Client,
    daemonsets: &[DaemonSet],
    autoscalers: &[DaemonSetAutoscaler],
) -> Result<
    (
        Vec<Pod>,
        Vec<LimitRange>,
        BTreeMap<String, BTreeMap<String, String>>,
    ),
    Error,
> {
    let namespaces: BTreeSet<String> = daemonsets.iter().filter_map(|d| d.namespace()).collect();
    let limit_ranges = limit_ranges(client, namespaces).await?;
    let node_labels = node_labels(client, autoscalers).await?;
    let mut pods = Vec::new();
    for ds in daemonsets {
        pods.extend(pods_of(client, ds).await?);
    }
    Ok((pods, limit_ranges, node_labels))
}

async fn limit_ranges(client: &Client, namespaces: BTreeSet<String>) -> Result<Vec<LimitRange>, Error> {
    let mut limit_ranges = Vec::new();
    for ns in namespaces {
        let listed = Api::<LimitRange>::namespaced(client.clone(), &ns)
            .list(&ListParams::default())
            .await
            .map_err(|e| classify("limitranges", e))?;
        limit_ranges.extend(listed.items);
    }
    Ok(limit_ranges)
}

async fn node_labels(
    client: &Client,
    autoscalers: &[DaemonSetAutoscaler],
) -> Result<BTreeMap<String, BTreeMap<String, String>>, Error> {
    let mut node_labels = BTreeMap::new();
    if autoscalers.iter().any(|a| a.spec.uses_groups()) {
        // labels only: metadata, in pages
        let nodes: Api<Node> = Api::all(client.clone());
        let mut params = ListParams::default().limit(500);
        loop {
            let page = nodes
                .list_metadata(&params)
                .await
                .map_err(|e| classify("nodes", e))?;
            for node in &page.items {
                node_labels.insert(node.name_any(), node.labels().clone());
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
    }
    Ok(node_labels)
}

/// The pods of `ds`, by its selector's `matchLabels`.
async fn pods_of(client: &Client, ds: &DaemonSet) -> Result<Vec<Pod>, Error> {
    let ns = ds.namespace().unwrap_or_default();
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
    Ok(listed.items)
}
