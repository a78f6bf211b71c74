//! The I/O shell: scrape every interval, publish `NodeFeatureReport/<node>` when it changed or
//! the refresh interval has passed.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use nodewarden_api::features::{ComponentReport, NodeFeatureReport, NodeFeatureReportSpec, ReadFailure};
use tokio_util::sync::CancellationToken;

use super::parse::{agent_component, changed, component};
use super::scrape::{ScrapeError, Scraper};
use super::trust::KubeletReader;
use super::{FIELD_MANAGER, GatesArgs, KUBE_PROXY, KUBELET};
use crate::metrics::Metrics;

/// The report object, owned by the Node so that it goes when the node goes.
pub fn object(node: &str, node_uid: Option<&str>, spec: NodeFeatureReportSpec) -> NodeFeatureReport {
    let mut obj = NodeFeatureReport::new(node, spec);
    obj.metadata.owner_references = node_uid.map(|uid| {
        vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: node.into(),
            uid: uid.into(),
            ..Default::default()
        }]
    });
    obj
}

/// Scrapes and publishes until `stop`. Nothing here ends the agent: failures are reported in the
/// report, logged, counted, and retried on the next interval.
pub async fn run(
    args: GatesArgs,
    client: Client,
    node: String,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let mut kubelet = KubeletReader::new(args.clone());
    // made on first use, and again while it cannot be (e.g. the token file is not there yet)
    let mut proxy: Option<Scraper> = None;
    let reports: Api<NodeFeatureReport> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client);
    let mut node_uid: Option<String> = None;
    let mut last: Option<(NodeFeatureReportSpec, Instant)> = None;
    let mut ticker = tokio::time::interval(args.gates_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let now = Timestamp::now();
        let mut components = Vec::new();
        components.push(observe(&metrics, KUBELET, kubelet.scrape().await, now));
        if let Some(url) = &args.kube_proxy_metrics_url {
            if proxy.is_none() {
                proxy = Scraper::kube_proxy(url)
                    .await
                    .map_err(|why| components.push(observe(&metrics, KUBE_PROXY, Err(why.into()), now)))
                    .ok();
            }
            if let Some(scraper) = &proxy {
                components.push(observe(&metrics, KUBE_PROXY, scraper.scrape().await, now));
            }
        }
        components.push(agent_component(now));
        let spec = NodeFeatureReportSpec { components };
        let due = match &last {
            None => true,
            Some((old, at)) => changed(Some(old), &spec) || at.elapsed() >= args.gates_refresh_interval,
        };
        if !due {
            continue;
        }
        if node_uid.is_none() {
            match nodes.get(&node).await {
                Ok(n) => node_uid = n.metadata.uid,
                Err(err) => {
                    tracing::debug!(error = %err, "cannot read the Node; report written without an owner")
                }
            }
        }
        let obj = object(&node, node_uid.as_deref(), spec.clone());
        match reports
            .patch(
                &node,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&obj),
            )
            .await
        {
            Ok(_) => {
                metrics.feature_report_write(true);
                tracing::debug!(node = %node, "NodeFeatureReport written");
                last = Some((spec, Instant::now()));
            }
            Err(err) => {
                metrics.feature_report_write(false);
                tracing::warn!(error = %err, "writing NodeFeatureReport failed; retrying next interval");
            }
        }
    }
}

pub(super) fn observe(
    metrics: &Metrics,
    name: &'static str,
    scraped: Result<String, ScrapeError>,
    now: Timestamp,
) -> ComponentReport {
    let report = component(name, scraped, now);
    metrics.gate_scrape(name, report.error.is_none());
    if let Some(why) = &report.error {
        let reason = report.error_reason.map(|r| r.as_str()).unwrap_or_default();
        if report.error_reason == Some(ReadFailure::CertificateNotVerified) {
            tracing::warn!(component = name, %why, reason,
                "feature gates not readable: the serving certificate cannot be verified; give the agent \
                 the CA that signs it (--kubelet-ca-file, chart value agent.kubelet.caFile), or the \
                 kubelet's own certificate where it signs its own (--kubelet-serving-cert-file, chart \
                 value agent.kubelet.servingCertificate.hostPath), or have the kubelet serve a \
                 certificate of the cluster CA (serverTLSBootstrap: true)");
        } else {
            tracing::warn!(component = name, %why, reason, "feature gates not readable; reported as an error");
        }
    }
    report
}
