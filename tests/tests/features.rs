//! End-to-end: the feature lifecycle (KEP-3920) on the real control plane.
//!
//! The webhook runs in this process (`nodewarden_webhook::run`, real flags, a serving
//! certificate from the cluster CA); kube-apiserver calls `/validate/features` for Feature
//! objects, pods and a small test CRD in the test's namespace. NodeFeatureReports of two fake
//! nodes are written here directly, as the agents would. One Feature owns a field of the CRD
//! (`Clear`) and `spec.initContainers[*].restartPolicy` of pods (`Deny`); it goes On →
//! TurningOff → Off → TurningOn → On, and the test checks at each step what a user sees.
//! NodeFeatureReports are cluster-wide, so the scenario runs in one test (this binary has the
//! control plane to itself).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use nodewarden_api::features::{
    ComponentReport, Feature, FeatureState, GateState, NodeFeatureReport, NodeFeatureReportSpec, TaskState,
};
use nodewarden_tests::process::{free_ports, write_file};
use nodewarden_tests::{
    Hook, InProcessWebhook, LoopbackEndpoint, TestEnv, apply_crds, chart_crd_files, e2e, http_get, read_crds,
    register_validating_webhooks,
};
use serde_json::{Value, json};

const DENIED: &str = "admission webhook \"features.nodewarden.io\" denied the request: ";
const GATE: &str = "WidgetGlow";
const GROUP: &str = "e2e.nodewarden.io";

fn widgets_crd() -> Result<CustomResourceDefinition> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{GROUP}")},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {
                    "type": "object",
                    "properties": {
                        "size": {"type": "integer"},
                        "glow": {"type": "boolean"},
                        "shades": {"type": "array", "items": {"type": "object", "properties": {
                            "name": {"type": "string"},
                            "glow": {"type": "boolean"}
                        }}}
                    }
                }}}}
            }]
        }
    }))?)
}

fn widgets() -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: "v1".into(),
        api_version: format!("{GROUP}/v1"),
        kind: "Widget".into(),
        plural: "widgets".into(),
    }
}

fn widget(name: &str, spec: Value) -> Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": format!("{GROUP}/v1"),
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": spec,
    }))?)
}

fn sidecar_pod(name: &str) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "initContainers": [{"name": "shipper", "image": "registry.invalid/shipper:1", "restartPolicy": "Always"}],
            "containers": [{"name": "app", "image": "registry.invalid/app:1"}]
        }
    }))?)
}

/// The reports of `nodes`, each kubelet showing the gate `enabled`, observed now. Times in the
/// API have whole seconds and a report counts for a transition only from the next second on, so
/// this first waits a little over a second.
async fn report(client: &Client, nodes: &[String], enabled: bool) -> Result<()> {
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let api: Api<NodeFeatureReport> = Api::all(client.clone());
    for node in nodes {
        let mut r = NodeFeatureReport::new(
            node,
            NodeFeatureReportSpec {
                components: vec![ComponentReport {
                    name: "kubelet".into(),
                    observed_time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
                    error: None,
                    error_reason: None,
                    gates: vec![
                        GateState {
                            name: GATE.into(),
                            enabled,
                            stage: "ALPHA".into(),
                        },
                        GateState {
                            name: "SidecarContainers".into(),
                            enabled: true,
                            stage: String::new(),
                        },
                    ],
                }],
            },
        );
        r.metadata.managed_fields = None;
        api.patch(node, &PatchParams::apply("e2e-agent").force(), &Patch::Apply(&r))
            .await
            .with_context(|| format!("reporting for {node}"))?;
    }
    Ok(())
}

async fn wait_state(env: &TestEnv, name: &str, want: FeatureState) -> Result<Feature> {
    let api: Api<Feature> = env.api();
    env.cp
        .poll(&format!("Feature {name} to be {want:?}"), || {
            let api = api.clone();
            let name = name.to_string();
            async move {
                let f = api.get(&name).await?;
                Ok((f.status.as_ref().and_then(|s| s.state) == Some(want)).then_some(f))
            }
        })
        .await
}

fn state(f: &Feature) -> Option<FeatureState> {
    f.status.as_ref().and_then(|s| s.state)
}

/// `kubectl get features` as the API server renders it: the Table's column names and the row of
/// `name`.
async fn table_row(client: &Client, namespace: &str, name: &str) -> Result<Vec<(String, String)>> {
    let request = http::Request::get(format!(
        "/apis/nodewarden.io/v1alpha1/namespaces/{namespace}/features"
    ))
    .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
    .body(Vec::new())?;
    let table: Value = client.request(request).await?;
    let columns: Vec<String> = table["columnDefinitions"]
        .as_array()
        .ok_or_else(|| anyhow!("not a Table: {table}"))?
        .iter()
        .map(|c| c["name"].as_str().unwrap_or_default().to_string())
        .collect();
    let row = table["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["cells"][0] == json!(name))
        .ok_or_else(|| anyhow!("no row for {name}: {table}"))?;
    let cells = row["cells"].as_array().cloned().unwrap_or_default();
    Ok(columns
        .into_iter()
        .zip(
            cells
                .iter()
                .map(|c| c.as_str().map(str::to_string).unwrap_or_else(|| c.to_string())),
        )
        .collect())
}

fn denial(err: kube::Error) -> String {
    err.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feature_lifecycle_end_to_end() {
    e2e("features", |env| async move {
        let client = env.client.clone();
        let mut crds = read_crds(&chart_crd_files()?)?;
        crds.push(widgets_crd()?);
        apply_crds(env.cp, &client, &crds).await?;

        let ports = free_ports(2)?;
        let (listen_port, admin_port) = (ports[0], ports[1]);
        let cert_dir = tempfile::tempdir()?;
        let cert = env.cp.issue_loopback_serving_cert()?;
        write_file(&cert_dir.path().join("tls.crt"), cert.cert_pem.as_bytes(), false)?;
        write_file(&cert_dir.path().join("tls.key"), cert.key_pem.as_bytes(), true)?;
        let args: Vec<String> = vec![
            format!("--listen-addr=127.0.0.1:{listen_port}"),
            format!("--admin-addr=127.0.0.1:{admin_port}"),
            format!("--tls-cert-file={}", cert_dir.path().join("tls.crt").display()),
            format!("--tls-key-file={}", cert_dir.path().join("tls.key").display()),
            format!("--kubeconfig={}", env.cp.kubeconfig_path().display()),
            format!("--namespace={}", env.namespace),
            "--pod-name=features-e2e".into(),
            "--log-format=text".into(),
            "--features-resync-interval=1s".into(),
            // small pages, to go through several continue tokens
            "--features-clear-page-size=2".into(),
            "--features-clear-rate=100".into(),
            "--shutdown-grace=2s".into(),
        ];
        let webhook = InProcessWebhook::start(&args, admin_port).await?;

        let mut hook = Hook::features().only_namespace(&env.namespace);
        for (group, resource) in [("", "pods"), (GROUP, "widgets")] {
            let mut rule = hook.rules[0].clone();
            rule.api_groups = Some(vec![group.into()]);
            rule.api_versions = Some(vec!["v1".into()]);
            rule.resources = Some(vec![resource.into()]);
            hook.rules.push(rule);
        }
        let endpoint = LoopbackEndpoint { port: listen_port, ca_pem: env.cp.ca_pem().to_string() };
        register_validating_webhooks(&client, &format!("nw-features-{}", env.id), &endpoint, &[hook]).await?;

        let features: Api<Feature> = env.api();
        let widget_api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &env.namespace, &widgets());
        let pods: Api<Pod> = env.api();
        let pp = PostParams::default();

        // a Feature with an invalid path is rejected with the reason (retried until the API
        // server has picked the webhook configuration up)
        let invalid: Feature = serde_json::from_value(json!({
            "apiVersion": "nodewarden.io/v1alpha1", "kind": "Feature",
            "metadata": {"name": "broken"},
            "spec": {"desired": "On", "fields": [{"version": "v1", "resource": "pods", "path": "spec.containers[0].image"}]}
        }))?;
        let message = env
            .cp
            .poll("the features webhook to reject an invalid Feature", || {
                let features = features.clone();
                let invalid = invalid.clone();
                async move {
                    match features.create(&PostParams::default(), &invalid).await {
                        Err(e) if e.to_string().contains("features.nodewarden.io") => Ok(Some(e.to_string())),
                        Err(e) => Err(e.into()),
                        Ok(_) => {
                            features.delete("broken", &Default::default()).await?;
                            Ok(None)
                        }
                    }
                }
            })
            .await?;
        assert!(message.contains(DENIED), "{message}");
        assert!(
            message.contains("spec.fields[0].path") && message.contains("only [*] (every element)"),
            "{message}"
        );

        // the nodes report the gate on; objects use the fields while the feature is on
        let nodes = vec![format!("{}-node-a", env.id), format!("{}-node-b", env.id)];
        report(&client, &nodes, true).await?;
        widget_api.create(&pp, &widget("kept", json!({"size": 1, "glow": true}))?).await?;
        for i in 0..5 {
            widget_api
                .create(&pp, &widget(&format!("bulk-{i}"), json!({"size": i, "shades": [{"name": "a", "glow": true}, {"name": "b"}, {"name": "c", "glow": false}]}))?)
                .await?;
        }
        widget_api.create(&pp, &widget("plain", json!({"size": 7}))?).await?;
        pods.create(&pp, &sidecar_pod("old-sidecar")?).await?;

        let feature: Feature = serde_json::from_value(json!({
            "apiVersion": "nodewarden.io/v1alpha1", "kind": "Feature",
            "metadata": {"name": "widget-glow"},
            "spec": {
                "desired": "On", "gate": GATE, "stage": "Alpha", "default": false,
                "components": ["kubelet"],
                "fields": [
                    {"group": GROUP, "version": "v1", "resource": "widgets", "path": "spec.glow", "onDisable": "Clear"},
                    {"group": GROUP, "version": "v1", "resource": "widgets", "path": "spec.shades[*].glow", "onDisable": "Clear"},
                    {"version": "v1", "resource": "pods", "path": "spec.initContainers[*].restartPolicy", "onDisable": "Deny"}
                ]
            }
        }))?;
        features.create(&pp, &feature).await?;
        let on = wait_state(&env, "widget-glow", FeatureState::On).await?;
        assert_eq!(on.status.as_ref().and_then(|s| s.uses_summary.as_deref()), Some("kubelet 2/2 on"));

        // desired Off: TurningOff, waiting for the nodes (whose reports are now older than the
        // transition)
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let started = Instant::now();
        features
            .patch("widget-glow", &PatchParams::default(), &Patch::Merge(json!({"spec": {"desired": "Off"}})))
            .await?;
        let turning = wait_state(&env, "widget-glow", FeatureState::TurningOff).await?;
        let status = turning.status.clone().unwrap_or_default();
        let names: Vec<&str> = status.tasks.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "WaitForReports",
                "ClearField widgets.e2e.nodewarden.io/spec.glow",
                "ClearField widgets.e2e.nodewarden.io/spec.shades[*].glow"
            ]
        );
        assert_eq!(status.uses_summary.as_deref(), Some("kubelet 0/2 off (2 stale)"));
        // the transition is an Event on the Feature (what `kubectl describe feature` lists)
        let note = env.wait_for_event("Feature", "widget-glow", "TurningOff").await?;
        assert_eq!(note, "On → TurningOff (desired Off)");

        // what `kubectl get features` shows
        let row = table_row(&client, &env.namespace, "widget-glow").await?;
        let cell = |name: &str| row.iter().find(|(c, _)| c == name).map(|(_, v)| v.clone());
        assert_eq!(cell("Name").as_deref(), Some("widget-glow"), "{row:?}");
        assert_eq!(cell("Desired").as_deref(), Some("Off"), "{row:?}");
        assert_eq!(cell("State").as_deref(), Some("TurningOff"), "{row:?}");
        assert_eq!(cell("Uses").as_deref(), Some("kubelet 0/2 off (2 stale)"), "{row:?}");

        // writes that set an owned field are denied, naming the Feature, the path and the value
        let err = widget_api
            .create(&pp, &widget("new", json!({"size": 2, "glow": true}))?)
            .await
            .err()
            .ok_or_else(|| anyhow!("a new widget with the field was admitted"))?;
        let m = denial(err);
        let key = format!("{}/widget-glow", env.namespace);
        assert!(m.contains(DENIED) && m.contains(&format!("feature {key} is TurningOff")), "{m}");
        assert!(m.contains("spec.glow = true"), "{m}");
        let err = pods
            .create(&pp, &sidecar_pod("new-sidecar")?)
            .await
            .err()
            .ok_or_else(|| anyhow!("a new sidecar pod was admitted"))?;
        let m = denial(err);
        assert!(m.contains(&key) && m.contains("spec.initContainers[0].restartPolicy = \"Always\""), "{m}");
        // a widget that adds the field to an existing object that did not use it: denied
        let err = widget_api
            .patch("plain", &PatchParams::default(), &Patch::Merge(json!({"spec": {"glow": true}})))
            .await
            .err()
            .ok_or_else(|| anyhow!("adding the field to an existing widget was admitted"))?;
        assert!(denial(err).contains(&key));
        // edits of existing objects that keep the field pass
        widget_api
            .patch("kept", &PatchParams::default(), &Patch::Merge(json!({"spec": {"size": 9}})))
            .await
            .context("editing a widget that keeps the field")?;
        pods.patch("old-sidecar", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"edited": "yes"}}})))
            .await
            .context("editing a pod that keeps the field")?;
        // objects without the fields are untouched by the guard
        widget_api.create(&pp, &widget("new-plain", json!({"size": 3}))?).await?;

        // one node reports off: still TurningOff, waiting for the other
        report(&client, &nodes[..1], false).await?;
        let api = features.clone();
        let half = env
            .cp
            .poll("the uses to show node-a off", || {
                let api = api.clone();
                async move {
                    let f = api.get("widget-glow").await?;
                    let summary = f.status.as_ref().and_then(|s| s.uses_summary.clone());
                    Ok((summary.as_deref() == Some("kubelet 1/2 off (1 stale)")).then_some(f))
                }
            })
            .await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let still = features.get("widget-glow").await?;
        assert_eq!(state(&still), Some(FeatureState::TurningOff));
        let waiting = half.status.as_ref().map(|s| s.tasks[0].clone()).ok_or_else(|| anyhow!("no tasks"))?;
        assert_eq!(waiting.state, TaskState::Running);
        assert!(
            waiting.message.as_deref().unwrap_or_default().contains(&format!("{} (kubelet no fresh report)", nodes[1])),
            "{waiting:?}"
        );
        let stored = widget_api.get("kept").await?;
        assert_eq!(stored.data["spec"]["glow"], json!(true), "nothing is cleared before every node is off");

        // the other node reports off: the fields are cleared, then Off
        report(&client, &nodes[1..], false).await?;
        let off = wait_state(&env, "widget-glow", FeatureState::Off).await?;
        let took = started.elapsed();
        let status = off.status.clone().unwrap_or_default();
        assert!(status.tasks.iter().all(|t| t.state == TaskState::Done), "{:?}", status.tasks);
        assert_eq!(status.uses_summary.as_deref(), Some("kubelet 2/2 off"));
        let settled = status.conditions.iter().find(|c| c.type_ == "Settled").ok_or_else(|| anyhow!("no condition"))?;
        assert_eq!(settled.status, "True");
        for w in widget_api.list(&Default::default()).await?.items {
            let name = w.metadata.name.clone().unwrap_or_default();
            ensure!(w.data["spec"].get("glow").is_none(), "{name} still has spec.glow: {}", w.data);
            for shade in w.data["spec"]["shades"].as_array().into_iter().flatten() {
                ensure!(shade.get("glow").is_none(), "{name} still has a shade glow: {}", w.data);
            }
        }
        let kept = widget_api.get("kept").await?;
        assert_eq!(kept.data["spec"]["size"], json!(9), "clearing keeps the rest of the object");
        let bulk = widget_api.get("bulk-3").await?;
        assert_eq!(bulk.data["spec"]["shades"], json!([{"name": "a"}, {"name": "b"}, {"name": "c"}]));
        // Deny does not clear: the old pod keeps its sidecar
        let old = pods.get("old-sidecar").await?;
        let policy = old.spec.and_then(|s| s.init_containers).and_then(|c| c[0].restart_policy.clone());
        assert_eq!(policy.as_deref(), Some("Always"));
        println!("On → TurningOff → Off took {took:?}");
        // settled: the controller keeps looking (every second here) but writes nothing
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let later = features.get("widget-glow").await?;
        assert_eq!(later.metadata.resource_version, off.metadata.resource_version, "no writes while settled");

        // back On: TurningOn until the nodes report the gate on
        features
            .patch("widget-glow", &PatchParams::default(), &Patch::Merge(json!({"spec": {"desired": "On"}})))
            .await?;
        let turning_on = wait_state(&env, "widget-glow", FeatureState::TurningOn).await?;
        assert_eq!(
            turning_on.status.as_ref().map(|s| s.tasks.len()),
            Some(1),
            "turning on only waits for reports"
        );
        report(&client, &nodes, true).await?;
        wait_state(&env, "widget-glow", FeatureState::On).await?;
        widget_api
            .create(&pp, &widget("after", json!({"glow": true}))?)
            .await
            .context("the field may be set again once the feature is On")?;

        // the decisions and transitions are in /metrics
        let (code, metrics) = http_get(admin_port, "/metrics").await?;
        ensure!(code == 200, "metrics: {code}");
        for want in [
            "nodewarden_features_decisions_total{outcome=\"denied\"}",
            "nodewarden_features_decisions_total{outcome=\"ratcheted\"}",
            "nodewarden_features_decisions_total{outcome=\"feature-rejected\"}",
            "nodewarden_features_transitions_total{state=\"Off\"}",
            "nodewarden_features_transitions_total{state=\"TurningOn\"}",
        ] {
            if !metrics.contains(want) {
                bail!("{want} missing from /metrics:\n{metrics}");
            }
        }
        // the lifecycle controller's reconciliations are counted and timed: at least one per
        // state the Feature went through
        let sample = |name: &str| {
            metrics
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let ok = sample("nodewarden_controller_reconciliations_total{controller=\"features\",result=\"ok\"}");
        let timed = sample("nodewarden_controller_reconcile_duration_seconds_count{controller=\"features\"}");
        ensure!(ok >= 4.0, "features reconciliations counted: {ok}\n{metrics}");
        ensure!(timed >= ok, "features reconciliations timed: {timed} of {ok}");
        webhook.stop().await?;
        Ok(())
    })
    .await;
}

/// A kubelet stand-in: HTTPS on loopback with a certificate from `ca`, `/metrics` for the bearer
/// `token` only (403 otherwise, as the kubelet answers without `nodes/metrics`).
async fn fake_kubelet(ca: &nodewarden_certs::Ca, token: &'static str) -> Result<u16> {
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let cert = ca.issue_serving(&nodewarden_certs::ServingSpec {
        dns_names: vec!["localhost".into()],
        ip_addresses: vec![std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)],
        validity: Duration::from_secs(600),
    })?;
    let chain = rustls_pemfile::certs(&mut cert.cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>()?;
    let key = rustls_pemfile::private_key(&mut cert.key_pem.as_bytes())?.ok_or_else(|| anyhow!("no key"))?;
    let tls = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut stream) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&request).to_lowercase();
                let authorized = text.contains(&format!("authorization: bearer {}", token.to_lowercase()));
                let on_metrics = text.starts_with("get /metrics ");
                let (status, body) = if authorized && on_metrics {
                    (
                        "200 OK",
                        include_str!("../../agent/tests/fixtures/gates/kubelet-metrics.txt").to_string(),
                    )
                } else {
                    (
                        "403 Forbidden",
                        "Forbidden (user=system:anonymous, verb=get, resource=nodes, subresource(s)=[metrics])".to_string(),
                    )
                };
                let answer = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    Ok(port)
}

#[tokio::test]
async fn agent_reads_the_kubelet_over_tls_with_its_token() -> Result<()> {
    use nodewarden_agent::features::{GatesArgs, KUBELET, KubeletReader, component};
    let ca = nodewarden_certs::Ca::generate(&nodewarden_certs::CaConfig {
        common_name: "kubelet-ca".into(),
        validity: Duration::from_secs(600),
    })?;
    let other = nodewarden_certs::Ca::generate(&nodewarden_certs::CaConfig {
        common_name: "someone-else".into(),
        validity: Duration::from_secs(600),
    })?;
    let port = fake_kubelet(&ca, "node-token").await?;
    let dir = tempfile::tempdir()?;
    let file = |name: &str, text: &str| -> Result<std::path::PathBuf> {
        let path = dir.path().join(name);
        std::fs::write(&path, text)?;
        Ok(path)
    };
    let args = |ca_pem: &str, token: &str, insecure: bool| -> Result<GatesArgs> {
        Ok(GatesArgs {
            kubelet_url: Some(format!("https://127.0.0.1:{port}")),
            node_ip: None,
            kubelet_ca_file: file("ca.crt", ca_pem)?,
            kubelet_serving_cert_file: None,
            kubelet_insecure_skip_verify: insecure,
            kubelet_token_file: file("token", token)?,
            kube_proxy_metrics_url: None,
            gates_interval: Duration::from_secs(1),
            gates_refresh_interval: Duration::from_secs(60),
            gates: true,
        })
    };
    let now = k8s_openapi::jiff::Timestamp::now();

    // the kubelet's CA and the token: the gates
    let mut scraper = KubeletReader::new(args(&ca.cert_pem, "node-token", false)?);
    let report = component(KUBELET, scraper.scrape().await, now);
    ensure!(report.error.is_none(), "{report:?}");
    let sidecars = report
        .gates
        .iter()
        .find(|g| g.name == "SidecarContainers")
        .ok_or_else(|| anyhow!("no gate"))?;
    assert!(sidecars.enabled && sidecars.stage == "GA");

    // a kubelet certificate from another CA is refused, unless verification is explicitly off
    let mut scraper = KubeletReader::new(args(&other.cert_pem, "node-token", false)?);
    let report = component(KUBELET, scraper.scrape().await, now);
    let error = report.error.clone().unwrap_or_default();
    assert!(
        error.starts_with("GET /metrics") && report.gates.is_empty(),
        "{report:?}"
    );
    // ... and the report says it is a certificate the agent could not verify
    assert_eq!(
        report.error_reason,
        Some(nodewarden_api::features::ReadFailure::CertificateNotVerified),
        "{report:?}"
    );
    let mut scraper = KubeletReader::new(args(&other.cert_pem, "node-token", true)?);
    ensure!(
        component(KUBELET, scraper.scrape().await, now).error.is_none(),
        "insecure-skip-verify"
    );

    // without nodes/metrics (here: a wrong token) the kubelet says 403, and that is the error
    let mut scraper = KubeletReader::new(args(&ca.cert_pem, "stolen", false)?);
    let report = component(KUBELET, scraper.scrape().await, now);
    assert_eq!(
        report.error_reason,
        Some(nodewarden_api::features::ReadFailure::Forbidden),
        "{report:?}"
    );
    let error = report.error.unwrap_or_default();
    assert!(error.contains("Forbidden") || error.contains("403"), "{error}");
    Ok(())
}
