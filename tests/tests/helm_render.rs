//! The Helm chart `charts/nodewarden` rendered: it lints, renders what a platform team relies on for
//! default and non-default values, and refuses bad values with a message naming the problem. No
//! cluster is needed (`helm template`); `helm_install.rs` installs the chart into a real control plane.

use anyhow::{Context, Result, ensure};
use base64::Engine;
use nodewarden_tests::helm::{
    FIXTURES, Helm, NS, RELEASE, assert_hardened, chart_dir, container, env_entry, env_field_ref, env_value,
    helm_fixture, mount, ports_by_name, render_default, render_with_fixture, rules_for, volume, webhook,
};
use serde_json::{Value, json};

// ---- lint --------------------------------------------------------------------------------------

/// `helm lint --strict` passes with the default values and with each fixture values file (lint
/// knows no cluster's APIs and has no `--api-versions`: the fixtures are linted with
/// `checkApiVersions=false`).
#[tokio::test]
async fn lint_passes_strict_for_default_and_fixture_values() -> Result<()> {
    let helm = Helm::locate().await?;
    let chart = chart_dir().display().to_string();
    let mut runs: Vec<Vec<String>> = vec![vec![]];
    for f in FIXTURES {
        runs.push(vec![
            "-f".into(),
            helm_fixture(f).display().to_string(),
            "--set".into(),
            "checkApiVersions=false".into(),
        ]);
    }
    for extra in runs {
        let mut args = vec!["lint".to_string(), "--strict".into(), chart.clone()];
        args.extend(extra.iter().cloned());
        let out = helm
            .ok(&args)
            .await
            .with_context(|| format!("values {extra:?}"))?;
        ensure!(
            out.contains("0 chart(s) failed") && !out.contains("[ERROR]") && !out.contains("[WARNING]"),
            "helm lint --strict {extra:?} reported problems:\n{out}"
        );
    }
    Ok(())
}

/// The chart README documents every value of values.yaml (objects that hold settings are walked
/// into; maps of free-form content such as resources count as one value).
#[test]
fn readme_lists_every_value() -> Result<()> {
    let values: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(chart_dir().join("values.yaml"))?)?;
    let readme = std::fs::read_to_string(chart_dir().join("README.md"))?;
    let free_form = [
        "resources",
        "podSecurityContext",
        "securityContext",
        "nodeSelector",
    ];
    let mut keys = Vec::new();
    fn walk(v: &Value, path: &str, free_form: &[&str], out: &mut Vec<String>) {
        match v.as_object() {
            Some(map) if !map.is_empty() && !free_form.iter().any(|f| path.ends_with(&format!(".{f}"))) => {
                for (k, child) in map {
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    walk(child, &p, free_form, out);
                }
            }
            _ => out.push(path.to_string()),
        }
    }
    walk(&values, "", &free_form, &mut keys);
    ensure!(keys.len() > 50, "values.yaml walked to only {} keys", keys.len());
    let missing: Vec<&String> = keys
        .iter()
        .filter(|k| !readme.contains(&format!("| `{k}` |")))
        .collect();
    ensure!(
        missing.is_empty(),
        "charts/nodewarden/README.md does not list these values: {missing:?}"
    );
    Ok(())
}

// ---- default render ----------------------------------------------------------------------------

/// The mutating webhook: DaemonSet pods only (CEL matchCondition), fails open, short timeout,
/// no reinvocation, service client config with its path, no caBundle in managed mode.
#[tokio::test]
async fn default_mutating_webhook_fails_open_and_sees_only_daemonset_pods() -> Result<()> {
    let r = render_default().await?;
    let config = r.get("MutatingWebhookConfiguration", "nodewarden-mutating")?;
    let hooks = config["webhooks"].as_array().context("webhooks")?;
    ensure!(hooks.len() == 1, "one mutating webhook expected, got {hooks:#?}");
    let hook = &hooks[0];
    ensure!(
        hook["name"] == "pods.rightsizing.nodewarden.io",
        "name: {}",
        hook["name"]
    );
    ensure!(
        hook["failurePolicy"] == "Ignore",
        "failurePolicy: {}",
        hook["failurePolicy"]
    );
    let timeout = hook["timeoutSeconds"].as_i64().context("timeoutSeconds")?;
    ensure!(
        (1..=5).contains(&timeout),
        "timeoutSeconds {timeout} must be 1..=5"
    );
    ensure!(hook["reinvocationPolicy"] == "Never");
    ensure!(hook["sideEffects"] == "None");
    ensure!(hook["admissionReviewVersions"] == json!(["v1"]));
    ensure!(
        hook["rules"]
            == json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "scope": "Namespaced"}]),
        "rules: {}",
        hook["rules"]
    );
    ensure!(
        hook["clientConfig"]
            == json!({"service": {"name": "nodewarden-webhook", "namespace": NS, "path": "/mutate/pods", "port": 443}}),
        "clientConfig (no caBundle in managed mode): {}",
        hook["clientConfig"]
    );
    // kube-system is not excluded: node agents there are DaemonSets too.
    ensure!(
        hook.get("namespaceSelector").is_none(),
        "no namespaceSelector by default: {hook}"
    );

    let conditions = hook["matchConditions"].as_array().context("matchConditions")?;
    ensure!(conditions.len() == 1, "one matchCondition: {conditions:?}");
    let expr: String = conditions[0]["expression"]
        .as_str()
        .context("expression")?
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    for needle in [
        "has(object.metadata.ownerReferences)",
        "object.metadata.ownerReferences.exists(r,",
        "r.kind == 'DaemonSet'",
        "r.apiVersion == 'apps/v1'",
        "has(r.controller) && r.controller",
    ] {
        ensure!(expr.contains(needle), "matchCondition lacks `{needle}`: {expr}");
    }
    Ok(())
}

/// The validating webhooks: claims (CREATE/UPDATE/DELETE, Fail), autoscalers (CREATE/UPDATE, Fail),
/// node reports (CREATE/UPDATE, Fail), features (Feature objects only, with no owned resources
/// configured).
#[tokio::test]
async fn default_validating_webhooks_fail_closed_with_their_rules() -> Result<()> {
    let r = render_default().await?;
    let config = r.get("ValidatingWebhookConfiguration", "nodewarden-validating")?;
    let hooks = config["webhooks"].as_array().context("webhooks")?;
    let names: Vec<&str> = hooks.iter().filter_map(|h| h["name"].as_str()).collect();
    ensure!(
        names
            == [
                "claims.nodewarden.io",
                "autoscalers.nodewarden.io",
                "node-reports.nodewarden.io",
                "evictions.nodewarden.io",
                "features.nodewarden.io"
            ],
        "validating webhooks: {names:?}"
    );
    for hook in hooks {
        let name = &hook["name"];
        let timeout = hook["timeoutSeconds"].as_i64().context("timeoutSeconds")?;
        ensure!(
            (1..=5).contains(&timeout),
            "{name}: timeoutSeconds {timeout} must be 1..=5"
        );
        ensure!(
            hook["failurePolicy"] == "Fail",
            "{name}: failurePolicy {}",
            hook["failurePolicy"]
        );
        ensure!(hook["sideEffects"] == "None" && hook["admissionReviewVersions"] == json!(["v1"]));
        ensure!(hook["clientConfig"]["service"]["name"] == "nodewarden-webhook");
        ensure!(
            hook["clientConfig"].get("caBundle").is_none(),
            "{name}: caBundle rendered in managed mode"
        );
    }
    let claims = webhook(config, "claims.nodewarden.io")?;
    ensure!(claims["clientConfig"]["service"]["path"] == "/validate/claims");
    ensure!(
        claims["rules"]
            == json!([{"apiGroups": ["nodewarden.io"], "apiVersions": ["v1alpha1"],
                       "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["clusterclaims"], "scope": "Cluster"}]),
        "claims rules (foreign claim kinds are opt-in): {}",
        claims["rules"]
    );
    let autoscalers = webhook(config, "autoscalers.nodewarden.io")?;
    ensure!(autoscalers["clientConfig"]["service"]["path"] == "/validate/autoscalers");
    ensure!(
        autoscalers["rules"]
            == json!([{"apiGroups": ["nodewarden.io"], "apiVersions": ["v1alpha1"],
                       "operations": ["CREATE", "UPDATE"], "resources": ["daemonsetautoscalers"], "scope": "Namespaced"}]),
        "autoscalers rules: {}",
        autoscalers["rules"]
    );
    let reports = webhook(config, "node-reports.nodewarden.io")?;
    ensure!(reports["clientConfig"]["service"]["path"] == "/validate/node-reports");
    ensure!(reports["rules"][0]["operations"] == json!(["CREATE", "UPDATE"]));
    ensure!(reports["rules"][0]["resources"] == json!(["noderecommendations", "nodefeaturereports"]));
    // the agent's evictions: only the agent's requests are sent, and a down webhook stops them
    let evictions = webhook(config, "evictions.nodewarden.io")?;
    ensure!(evictions["clientConfig"]["service"]["path"] == "/validate/evictions");
    ensure!(
        evictions["rules"]
            == json!([{"apiGroups": [""], "apiVersions": ["v1"],
                       "operations": ["CREATE"], "resources": ["pods/eviction"], "scope": "Namespaced"}]),
        "evictions rules: {}",
        evictions["rules"]
    );
    ensure!(
        evictions["matchConditions"]
            == json!([{"name": "nodewarden-agent",
                       "expression": format!("request.userInfo.username == 'system:serviceaccount:{NS}:nodewarden-agent'")}]),
        "evictions matchConditions: {}",
        evictions["matchConditions"]
    );
    let features = webhook(config, "features.nodewarden.io")?;
    ensure!(features["clientConfig"]["service"]["path"] == "/validate/features");
    ensure!(
        features["rules"]
            == json!([{"apiGroups": ["nodewarden.io"], "apiVersions": ["v1alpha1"],
                       "operations": ["CREATE", "UPDATE"], "resources": ["features"], "scope": "Namespaced"}]),
        "features rules without ownedResources: {}",
        features["rules"]
    );
    // no self-lockout: the release's own namespace is left out of the fail-closed features webhook
    ensure!(
        features["namespaceSelector"]
            == json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [NS]}]}),
        "features namespaceSelector: {}",
        features["namespaceSelector"]
    );
    Ok(())
}

/// The release-namespace exemption of the features webhook goes with the release's namespace and
/// can be turned off.
#[tokio::test]
async fn the_features_webhook_exempts_the_release_namespace_unless_told_not_to() -> Result<()> {
    let helm = Helm::locate().await?;
    let r = helm.template::<&str>(RELEASE, "elsewhere", &[]).await?;
    let config = r.get("ValidatingWebhookConfiguration", "nodewarden-validating")?;
    let features = webhook(config, "features.nodewarden.io")?;
    ensure!(
        features["namespaceSelector"]["matchExpressions"][0]["values"] == json!(["elsewhere"]),
        "{}",
        features["namespaceSelector"]
    );
    let r = helm
        .template(RELEASE, NS, &["--set", "features.exemptReleaseNamespace=false"])
        .await?;
    let config = r.get("ValidatingWebhookConfiguration", "nodewarden-validating")?;
    let features = webhook(config, "features.nodewarden.io")?;
    ensure!(
        features.get("namespaceSelector").is_none(),
        "no selector when turned off: {}",
        features["namespaceSelector"]
    );
    Ok(())
}

/// The webhook Deployment: 2 hardened replicas spread over nodes, HTTPS 8443 behind Service port 443,
/// probes on the admin port, settings in env, the TLS Secret mounted optionally; a PDB.
#[tokio::test]
async fn default_webhook_deployment_is_hardened_and_configured_by_env() -> Result<()> {
    let r = render_default().await?;
    let d = r.get("Deployment", "nodewarden-webhook")?;
    ensure!(d["metadata"]["namespace"] == NS);
    ensure!(d["spec"]["replicas"] == 2, "replicas: {}", d["spec"]["replicas"]);
    let pod = &d["spec"]["template"]["spec"];
    ensure!(pod["serviceAccountName"] == "nodewarden-webhook");
    let anti = &pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0];
    ensure!(
        anti["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname",
        "anti-affinity: {}",
        pod["affinity"]
    );
    ensure!(
        anti["podAffinityTerm"]["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "webhook",
        "anti-affinity must select the webhook pods: {anti}"
    );
    ensure!(pod["securityContext"]["runAsNonRoot"] == true);
    ensure!(pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault");
    let c = container(d, "webhook")?;
    assert_hardened(c).context("webhook container")?;
    ensure!(c["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault");

    let ports = ports_by_name(c);
    ensure!(
        ports.get("https") == Some(&8443) && ports.get("admin") == Some(&8080),
        "ports: {ports:?}"
    );
    for (probe, path) in [("livenessProbe", "/livez"), ("readinessProbe", "/readyz")] {
        let get = &c[probe]["httpGet"];
        ensure!(get["path"] == path, "{probe} path: {get}");
        ensure!(
            get["port"] == "admin" || get["port"] == 8080,
            "{probe} must use the admin port 8080: {get}"
        );
    }
    ensure!(
        c["resources"]["requests"] == json!({"cpu": "100m", "memory": "128Mi"}),
        "requests: {}",
        c["resources"]
    );

    let expected_env = [
        ("NODEWARDEN_LISTEN_ADDR", "0.0.0.0:8443"),
        ("NODEWARDEN_ADMIN_ADDR", "0.0.0.0:8080"),
        ("NODEWARDEN_TLS_CERT_FILE", "/etc/nodewarden/tls/tls.crt"),
        ("NODEWARDEN_TLS_KEY_FILE", "/etc/nodewarden/tls/tls.key"),
        ("NODEWARDEN_LOG_FORMAT", "json"),
        ("NODEWARDEN_SHUTDOWN_DELAY", "5s"),
        ("NODEWARDEN_WORKER_THREADS", "1"),
        ("NODEWARDEN_CERT_MODE", "managed"),
        ("NODEWARDEN_CERT_SECRET", "nodewarden-webhook-tls"),
        (
            "NODEWARDEN_WEBHOOK_CONFIGURATIONS",
            "nodewarden-mutating,nodewarden-validating",
        ),
        ("NODEWARDEN_CLAIMS_ALLOWED_GROUPS", "system:masters"),
        (
            "NODEWARDEN_CLAIMS_ALLOWED_SERVICE_ACCOUNTS",
            "system:serviceaccount:nodewarden:nodewarden-webhook",
        ),
        ("NODEWARDEN_CLAIMS_INITIALIZE_ID", "false"),
        ("NODEWARDEN_AGENT_SERVICE_ACCOUNT", "nodewarden:nodewarden-agent"),
        ("NODEWARDEN_NODE_REPORTS_ALLOWED_GROUPS", "system:masters"),
        // Managed mode: the certificate timings, the binary's defaults spelled out.
        ("NODEWARDEN_CERT_CA_VALIDITY", "43800h"),
        ("NODEWARDEN_CERT_VALIDITY", "8760h"),
        ("NODEWARDEN_CERT_RENEW_BEFORE", "720h"),
        ("NODEWARDEN_CERT_CA_RENEW_BEFORE", "8760h"),
        ("NODEWARDEN_CERT_CA_PROPAGATION", "2m"),
        ("NODEWARDEN_CERT_CHECK_INTERVAL", "30s"),
        ("NODEWARDEN_FEATURES_CLEAR_PAGE_SIZE", "100"),
        ("NODEWARDEN_FEATURES_CLEAR_RATE", "50"),
    ];
    for (name, want) in expected_env {
        ensure!(
            env_value(c, name) == Some(want),
            "env {name}: {:?}, want {want}",
            env_value(c, name)
        );
    }
    ensure!(env_field_ref(c, "NODEWARDEN_POD_NAMESPACE") == Some("metadata.namespace"));
    ensure!(env_field_ref(c, "NODEWARDEN_POD_NAME") == Some("metadata.name"));
    ensure!(
        c["args"].is_null() && c["command"].is_null(),
        "settings go in env, not args: {c}"
    );

    let tls = volume(d, "tls")?;
    ensure!(
        tls["secret"] == json!({"secretName": "nodewarden-webhook-tls", "optional": true}),
        "managed mode mounts the Secret the webhook creates, optionally: {tls}"
    );
    ensure!(mount(c, "tls")?["mountPath"] == "/etc/nodewarden/tls" && mount(c, "tls")?["readOnly"] == true);

    let svc = r.get("Service", "nodewarden-webhook")?;
    let https = svc["spec"]["ports"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["port"] == 443))
        .context("Service port 443")?;
    ensure!(
        https["targetPort"] == "https" || https["targetPort"] == 8443,
        "443 -> 8443: {https}"
    );
    ensure!(
        svc["spec"]["selector"] == d["spec"]["selector"]["matchLabels"],
        "Service selects the webhook pods"
    );

    let pdb = r.get("PodDisruptionBudget", "nodewarden-webhook")?;
    ensure!(pdb["spec"]["selector"]["matchLabels"] == d["spec"]["selector"]["matchLabels"]);
    ensure!(
        pdb["spec"]["maxUnavailable"] == 1 || pdb["spec"]["minAvailable"] == 1,
        "PDB: {pdb}"
    );
    Ok(())
}

/// The agent DaemonSet: on every node (tolerates every taint), node-critical, non-root, cgroup
/// mounted read-only, checkpoint folder on the host, node name from the downward API.
#[tokio::test]
async fn default_agent_daemonset_runs_everywhere_and_reads_cgroups_read_only() -> Result<()> {
    let r = render_default().await?;
    let ds = r.get("DaemonSet", "nodewarden-agent")?;
    let pod = &ds["spec"]["template"]["spec"];
    ensure!(
        pod["tolerations"] == json!([{"operator": "Exists"}]),
        "tolerations: {}",
        pod["tolerations"]
    );
    ensure!(pod["priorityClassName"] == "system-node-critical");
    ensure!(pod["serviceAccountName"] == "nodewarden-agent");
    ensure!(pod["securityContext"]["runAsNonRoot"] == true);
    ensure!(ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == "10%");
    let c = container(ds, "agent")?;
    assert_hardened(c).context("agent container")?;
    ensure!(
        c["resources"]["requests"] == json!({"cpu": "10m", "memory": "32Mi"}),
        "requests: {}",
        c["resources"]
    );
    ensure!(c["resources"]["limits"]["memory"] == "64Mi");
    ensure!(
        ports_by_name(c).values().any(|p| *p == 8080),
        "admin/metrics port 8080"
    );

    let cgroup = volume(ds, "cgroup")?;
    ensure!(
        cgroup["hostPath"]["path"] == "/sys/fs/cgroup",
        "cgroup volume: {cgroup}"
    );
    let cg_mount = mount(c, "cgroup")?;
    ensure!(cg_mount["mountPath"] == "/host/sys/fs/cgroup");
    ensure!(
        cg_mount["readOnly"] == true,
        "the cgroup tree must be mounted read-only: {cg_mount}"
    );
    let checkpoint = volume(ds, "checkpoint")?;
    ensure!(
        checkpoint["hostPath"] == json!({"path": "/var/lib/nodewarden", "type": "DirectoryOrCreate"}),
        "checkpoint volume: {checkpoint}"
    );
    ensure!(mount(c, "checkpoint")?["mountPath"] == "/var/lib/nodewarden");

    ensure!(env_field_ref(c, "NODEWARDEN_NODE_NAME") == Some("spec.nodeName"));
    for (name, want) in [
        ("NODEWARDEN_CGROUP_ROOT", "/host/sys/fs/cgroup"),
        ("NODEWARDEN_CHECKPOINT_DIR", "/var/lib/nodewarden"),
        ("NODEWARDEN_ADMIN_ADDR", "0.0.0.0:8080"),
        ("NODEWARDEN_SAMPLE_INTERVAL", "10s"),
        ("NODEWARDEN_PUBLISH_BUDGET", "10m"),
        ("NODEWARDEN_LOG_FORMAT", "json"),
        ("NODEWARDEN_GATES_INTERVAL", "30s"),
    ] {
        ensure!(
            env_value(c, name) == Some(want),
            "env {name}: {:?}, want {want}",
            env_value(c, name)
        );
    }
    // The kubelet's certificate folder, read only: where the cluster CA does not verify the
    // kubelet, its own certificate does (kind's and kubeadm's self-signed kubelets).
    ensure!(
        volume(ds, "kubelet-pki")?["hostPath"]
            == json!({"path": "/var/lib/kubelet/pki", "type": "DirectoryOrCreate"}),
        "kubelet-pki volume: {}",
        volume(ds, "kubelet-pki")?
    );
    let pki = mount(c, "kubelet-pki")?;
    ensure!(
        pki["mountPath"] == "/host/kubelet-pki" && pki["readOnly"] == true,
        "{pki}"
    );
    ensure!(env_value(c, "NODEWARDEN_KUBELET_SERVING_CERT_FILE") == Some("/host/kubelet-pki/kubelet.crt"));
    // Other unset kubelet settings leave the binary's defaults: the kubelet's certificate is verified
    // against the service account's cluster CA first, and kube-proxy is not scraped.
    for name in [
        "NODEWARDEN_KUBELET_CA_FILE",
        "NODEWARDEN_KUBELET_INSECURE_SKIP_VERIFY",
        "NODEWARDEN_KUBE_PROXY_METRICS_URL",
        "NODEWARDEN_GATES",
    ] {
        ensure!(
            env_entry(c, name).is_none(),
            "{name} is rendered only when set: {:?}",
            env_entry(c, name)
        );
    }
    // The one root step hands the checkpoint folder to the agent's user, with two capabilities only.
    let init = &pod["initContainers"][0];
    ensure!(init["securityContext"]["capabilities"]["drop"] == json!(["ALL"]));
    ensure!(init["securityContext"]["capabilities"]["add"] == json!(["CHOWN", "FOWNER"]));
    ensure!(init["securityContext"]["allowPrivilegeEscalation"] == false);
    let script = init["command"]
        .as_array()
        .and_then(|c| c.last())
        .and_then(Value::as_str)
        .unwrap_or_default();
    ensure!(
        script.contains("owner=65532:65532"),
        "the folder goes to the agent's user 65532: {script}"
    );
    ensure!(mount(init, "checkpoint")?["mountPath"] == "/var/lib/nodewarden");
    ensure!(
        init["image"] == pod["containers"][0]["image"],
        "the init container runs from the agent's own image, so no other image is pulled: {}",
        init["image"]
    );
    ensure!(
        r.has("Service", "nodewarden-agent-metrics"),
        "agent metrics Service"
    );
    Ok(())
}

/// Managed certificates: nothing certificate-like is rendered (no Secret, no cert-manager objects, no
/// hook Jobs), and RBAC reaches only the release's own Secret and webhook configurations by name.
#[tokio::test]
async fn default_render_holds_no_certificate_and_least_privilege_rbac() -> Result<()> {
    let r = render_default().await?;
    ensure!(
        r.of_kind("Secret").is_empty(),
        "managed mode must not render a Secret: {:?}",
        r.names()
    );
    for kind in ["Certificate", "Issuer", "Job", "ServiceMonitor"] {
        ensure!(
            r.of_kind(kind).is_empty(),
            "no {kind} by default: {:?}",
            r.names()
        );
    }
    for o in &r.objects {
        let annotations = &o["metadata"]["annotations"];
        ensure!(annotations.get("helm.sh/hook").is_none(), "no helm hooks: {o}");
        if o["kind"] != "ClusterRole"
            && o["kind"] != "ClusterRoleBinding"
            && !o["kind"].as_str().unwrap_or("").ends_with("WebhookConfiguration")
            && !o["kind"]
                .as_str()
                .unwrap_or("")
                .starts_with("ValidatingAdmissionPolicy")
        {
            ensure!(
                o["metadata"]["namespace"] == NS,
                "namespaced objects go to the release namespace: {o}"
            );
        }
    }

    for role in r.of_kind("ClusterRole").into_iter().chain(r.of_kind("Role")) {
        let name = &role["metadata"]["name"];
        for rule in role["rules"].as_array().context("rules")? {
            for field in ["verbs", "resources", "apiGroups"] {
                ensure!(
                    !rule[field].as_array().is_some_and(|v| v.iter().any(|x| x == "*")),
                    "{name}: no wildcard {field}: {rule}"
                );
            }
            let resources = rule["resources"].as_array().context("resources")?;
            ensure!(
                !resources.iter().any(|x| x == "nodes/proxy"),
                "{name}: never nodes/proxy"
            );
            if role["kind"] == "ClusterRole" {
                ensure!(
                    !resources.iter().any(|x| x == "secrets"),
                    "{name}: no cluster-wide Secret access: {rule}"
                );
            }
        }
    }
    let webhook_cr = r.get("ClusterRole", "nodewarden-webhook")?;
    let configs = rules_for(webhook_cr, "validatingwebhookconfigurations");
    ensure!(
        configs.len() == 1,
        "one rule for webhook configurations: {configs:?}"
    );
    ensure!(configs[0]["resourceNames"] == json!(["nodewarden-mutating", "nodewarden-validating"]));
    ensure!(
        rules_for(webhook_cr, "pods")
            == [&json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]})],
        "the webhook only gets pods (the eviction guard reads the evicted pod): {:?}",
        rules_for(webhook_cr, "pods")
    );
    ensure!(
        rules_for(webhook_cr, "verticalpodautoscalers")
            == [
                &json!({"apiGroups": ["autoscaling.k8s.io"], "resources": ["verticalpodautoscalers"], "verbs": ["list"]})
            ],
        "the webhook only lists VerticalPodAutoscalers (condition VPAConflict): {:?}",
        rules_for(webhook_cr, "verticalpodautoscalers")
    );

    let webhook_role = r.get("Role", "nodewarden-webhook")?;
    for rule in rules_for(webhook_role, "secrets") {
        let verbs = rule["verbs"].as_array().context("verbs")?;
        if verbs != &vec![json!("create")] {
            ensure!(
                rule["resourceNames"] == json!(["nodewarden-webhook-tls"]),
                "Secret access beyond create is limited to the webhook's own Secret: {rule}"
            );
        }
    }
    let agent_cr = r.get("ClusterRole", "nodewarden-agent")?;
    ensure!(rules_for(agent_cr, "nodes/metrics")[0]["verbs"] == json!(["get"]));
    // acting on its node's pods: exactly these, nothing broader
    for (group, resource, verbs) in [
        ("", "pods/resize", json!(["patch"])),
        ("", "pods/eviction", json!(["create"])),
        ("apps", "daemonsets", json!(["get"])),
        ("apps", "controllerrevisions", json!(["get"])),
        ("", "limitranges", json!(["list", "watch"])),
        ("events.k8s.io", "events", json!(["create", "patch"])),
    ] {
        let rules = rules_for(agent_cr, resource);
        ensure!(
            rules.len() == 1 && rules[0]["apiGroups"] == json!([group]) && rules[0]["verbs"] == verbs,
            "agent {resource}: {rules:?}"
        );
    }
    ensure!(
        rules_for(agent_cr, "leases").is_empty(),
        "no cluster-wide leases for the agent"
    );
    let agent_role = r.get("Role", "nodewarden-agent")?;
    ensure!(
        agent_role["rules"]
            == json!([{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                       "verbs": ["get", "list", "create", "update", "delete"]}]),
        "agent Role: {}",
        agent_role["rules"]
    );
    // resizes: the policy matches only the agent's pods/resize and compares the nodes
    let policy = r.get("ValidatingAdmissionPolicy", "nodewarden-agent-own-node-resize")?;
    ensure!(
        policy["spec"]["matchConstraints"]["resourceRules"]
            == json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods/resize"]}])
            && policy["spec"]["failurePolicy"] == "Fail",
        "{policy}"
    );
    ensure!(
        policy["spec"]["matchConditions"][0]["expression"]
            == format!("request.userInfo.username == 'system:serviceaccount:{NS}:nodewarden-agent'"),
        "{policy}"
    );
    let binding = r.get(
        "ValidatingAdmissionPolicyBinding",
        "nodewarden-agent-own-node-resize",
    )?;
    ensure!(
        binding["spec"]
            == json!({"policyName": "nodewarden-agent-own-node-resize", "validationActions": ["Deny"]}),
        "{binding}"
    );
    for resource in ["noderecommendations", "nodefeaturereports"] {
        let verbs = &rules_for(agent_cr, resource)[0]["verbs"];
        for v in ["get", "create", "patch"] {
            ensure!(
                verbs.as_array().is_some_and(|vs| vs.iter().any(|x| x == v)),
                "agent {resource}: {v}"
            );
        }
    }
    Ok(())
}

// ---- other values ------------------------------------------------------------------------------

/// certManager mode: a self-signed CA chain and a serving Certificate for the Service's DNS names; both
/// webhook configurations carry the cainjector annotation; the webhook gets no Secret or webhook
/// configuration rights.
#[tokio::test]
async fn cert_manager_mode_renders_issuer_chain_and_injection_annotation() -> Result<()> {
    let r = render_with_fixture("cert-manager.yaml").await?;
    let cert = r.get("Certificate", "nodewarden-webhook-tls")?;
    ensure!(cert["spec"]["secretName"] == "nodewarden-webhook-tls");
    let dns = cert["spec"]["dnsNames"].as_array().context("dnsNames")?;
    ensure!(
        dns.iter().any(|d| d == "nodewarden-webhook.nodewarden.svc"),
        "dnsNames: {dns:?}"
    );
    ensure!(cert["spec"]["issuerRef"]["name"] == "nodewarden-ca");
    ensure!(r.get("Certificate", "nodewarden-ca")?["spec"]["isCA"] == true);
    ensure!(r.get("Issuer", "nodewarden-selfsigned")?["spec"]["selfSigned"] == json!({}));
    ensure!(r.get("Issuer", "nodewarden-ca")?["spec"]["ca"]["secretName"] == "nodewarden-ca");
    for (kind, name) in [
        ("MutatingWebhookConfiguration", "nodewarden-mutating"),
        ("ValidatingWebhookConfiguration", "nodewarden-validating"),
    ] {
        let c = r.get(kind, name)?;
        ensure!(
            c["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
                == "nodewarden/nodewarden-webhook-tls",
            "{name} annotations: {}",
            c["metadata"]["annotations"]
        );
    }
    ensure!(r.of_kind("Secret").is_empty());
    let d = r.get("Deployment", "nodewarden-webhook")?;
    ensure!(volume(d, "tls")?["secret"] == json!({"secretName": "nodewarden-webhook-tls"}));
    let c = container(d, "webhook")?;
    ensure!(env_value(c, "NODEWARDEN_CERT_MODE") == Some("certManager"));
    ensure!(
        env_entry(c, "NODEWARDEN_CERT_RENEW_BEFORE").is_none(),
        "managed-certificate timings are rendered in managed mode only"
    );
    let cr = r.get("ClusterRole", "nodewarden-webhook")?;
    ensure!(
        rules_for(cr, "validatingwebhookconfigurations").is_empty(),
        "cainjector patches, not the webhook"
    );
    ensure!(rules_for(r.get("Role", "nodewarden-webhook")?, "secrets").is_empty());
    // guardAboutApi in this fixture: ClusterProperties are guarded and watched.
    let claims = webhook(
        r.get("ValidatingWebhookConfiguration", "nodewarden-validating")?,
        "claims.nodewarden.io",
    )?;
    ensure!(
        claims["rules"].as_array().is_some_and(|rs| rs
            .iter()
            .any(|x| x["apiGroups"] == json!(["about.k8s.io"])
                && x["apiVersions"] == json!(["v1alpha1", "v1beta1"])
                && x["resources"] == json!(["clusterproperties"]))),
        "claims rules: {}",
        claims["rules"]
    );
    ensure!(!rules_for(cr, "clusterproperties").is_empty());
    Ok(())
}

/// secret mode: the given CA (PEM in the values) becomes the base64 caBundle of every webhook; the
/// Deployment mounts the given Secret; nothing certificate-like is rendered.
#[tokio::test]
async fn secret_mode_puts_the_given_ca_in_every_webhook() -> Result<()> {
    let r = render_with_fixture("secret-mode.yaml").await?;
    let values: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(helm_fixture("secret-mode.yaml"))?)?;
    let pem = values["certificates"]["secret"]["caBundle"]
        .as_str()
        .context("caBundle in fixture")?;
    let want = base64::engine::general_purpose::STANDARD.encode(pem.trim());
    let mut seen = 0;
    for kind in ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"] {
        for c in r.of_kind(kind) {
            for hook in c["webhooks"].as_array().context("webhooks")? {
                ensure!(
                    hook["clientConfig"]["caBundle"] == want.as_str(),
                    "{}: caBundle",
                    hook["name"]
                );
                seen += 1;
            }
        }
    }
    ensure!(seen == 6, "6 webhooks with a caBundle, saw {seen}");
    ensure!(r.of_kind("Secret").is_empty() && r.of_kind("Certificate").is_empty());
    let d = r.get("Deployment", "nodewarden-webhook")?;
    ensure!(volume(d, "tls")?["secret"] == json!({"secretName": "my-webhook-tls"}));
    let c = container(d, "webhook")?;
    ensure!(env_value(c, "NODEWARDEN_CERT_SECRET") == Some("my-webhook-tls"));
    ensure!(
        env_entry(c, "NODEWARDEN_CERT_VALIDITY").is_none()
            && env_entry(c, "NODEWARDEN_CERT_CHECK_INTERVAL").is_none(),
        "managed-certificate timings are rendered in managed mode only"
    );
    Ok(())
}

/// Everything switched on: owned resources reach the features webhook and RBAC, foreign claim kinds
/// are guarded, monitoring and network policies appear, names follow fullnameOverride.
#[tokio::test]
async fn everything_on_renders_every_optional_part() -> Result<()> {
    let r = render_with_fixture("everything-on.yaml").await?;
    let config = r.get("ValidatingWebhookConfiguration", "nw-validating")?;
    let features = webhook(config, "features.nodewarden.io")?;
    ensure!(features["failurePolicy"] == "Ignore");
    let rules = features["rules"].as_array().context("rules")?;
    ensure!(rules.len() == 3, "features + 2 owned resource groups: {rules:?}");
    ensure!(
        rules[1]["resources"] == json!(["deployments", "statefulsets"])
            && rules[1]["apiGroups"] == json!(["apps"])
    );
    ensure!(
        features["namespaceSelector"]["matchExpressions"][0]["values"] == json!(["kube-system"]),
        "namespaceSelector passed through: {}",
        features["namespaceSelector"]
    );
    ensure!(
        features["namespaceSelector"]["matchExpressions"][1]["operator"] == "NotIn"
            && features["namespaceSelector"]["matchExpressions"][1]["key"] == "kubernetes.io/metadata.name",
        "the release namespace exemption follows the user's expressions: {}",
        features["namespaceSelector"]
    );
    let cr = r.get("ClusterRole", "nw-webhook")?;
    let deploy_rules = rules_for(cr, "deployments");
    ensure!(
        deploy_rules.len() == 1
            && deploy_rules[0]["verbs"]
                .as_array()
                .is_some_and(|v| v.iter().any(|x| x == "patch")),
        "the Clear task may patch owned resources: {deploy_rules:?}"
    );
    let cronjobs = rules_for(cr, "cronjobs");
    ensure!(
        cronjobs.len() == 1 && cronjobs[0]["verbs"] == json!(["list"]),
        "waitForAbsence resources may be listed, nothing more: {cronjobs:?}"
    );
    let claims = webhook(config, "claims.nodewarden.io")?;
    let groups: Vec<&Value> = claims["rules"]
        .as_array()
        .context("rules")?
        .iter()
        .map(|x| &x["apiGroups"][0])
        .collect();
    ensure!(
        groups
            == [
                &json!("nodewarden.io"),
                &json!("about.k8s.io"),
                &json!("cluster.open-cluster-management.io")
            ],
        "claims rule groups: {groups:?}"
    );
    ensure!(
        rules_for(cr, "clusterclaims")
            .iter()
            .any(|x| x["verbs"] == json!(["create"])),
        "initializeId needs create on clusterclaims"
    );
    let mutating = webhook(
        r.get("MutatingWebhookConfiguration", "nw-mutating")?,
        "pods.rightsizing.nodewarden.io",
    )?;
    ensure!(mutating["timeoutSeconds"] == 2 && mutating["namespaceSelector"]["matchExpressions"].is_array());
    ensure!(
        r.of_kind("ServiceMonitor").len() == 2,
        "ServiceMonitors: {:?}",
        r.names()
    );
    ensure!(
        r.of_kind("NetworkPolicy").len() == 2,
        "NetworkPolicies: {:?}",
        r.names()
    );

    let d = r.get("Deployment", "nw-webhook")?;
    ensure!(d["spec"]["replicas"] == 3);
    let c = container(d, "webhook")?;
    ensure!(c["image"].as_str().is_some_and(|i| {
        i.ends_with("@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
    }));
    ensure!(
        env_value(c, "NODEWARDEN_MAX_BODY_BYTES") == Some("8388608"),
        "extraEnv"
    );
    ensure!(env_value(c, "NODEWARDEN_CLAIMS_ALLOWED_USERS") == Some("alice"));
    ensure!(
        env_value(c, "NODEWARDEN_CLAIMS_ALLOWED_SERVICE_ACCOUNTS")
            == Some("system:serviceaccount:nodewarden:nw-webhook,system:serviceaccount:mcs:controller"),
        "own service account first, then the configured ones: {:?}",
        env_value(c, "NODEWARDEN_CLAIMS_ALLOWED_SERVICE_ACCOUNTS")
    );
    ensure!(
        d["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            .is_array()
    );
    let ds = r.get("DaemonSet", "nw-agent")?;
    ensure!(
        ds["spec"]["template"]["spec"]["priorityClassName"].is_null(),
        "empty priorityClassName is left out"
    );
    ensure!(ds["spec"]["template"]["spec"]["initContainers"].is_null());
    ensure!(volume(ds, "checkpoint")?["hostPath"]["path"] == "/var/lib/nodewarden-alt");
    let agent = container(ds, "agent")?;
    ensure!(
        agent["image"] == "mirror.invalid:5000/nodewarden/nodewarden-agent:0.1.0-rc1",
        "registry (its trailing / dropped) + repository + tag: {}",
        agent["image"]
    );
    // The kubelet's own CA, mounted from a ConfigMap, verifies its serving certificate; kube-proxy's
    // URL reaches the agent with the node IP left for the kubelet to expand.
    for (name, want) in [
        ("NODEWARDEN_KUBELET_CA_FILE", "/etc/nodewarden/kubelet-ca/ca.crt"),
        (
            "NODEWARDEN_KUBE_PROXY_METRICS_URL",
            "http://$(NODEWARDEN_NODE_IP):10249/metrics",
        ),
        ("NODEWARDEN_GATES_INTERVAL", "1m"),
    ] {
        ensure!(
            env_value(agent, name) == Some(want),
            "env {name}: {:?}, want {want}",
            env_value(agent, name)
        );
    }
    ensure!(env_entry(agent, "NODEWARDEN_KUBELET_INSECURE_SKIP_VERIFY").is_none());
    let env_names: Vec<&str> = agent["env"]
        .as_array()
        .context("env")?
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    let node_ip = env_names.iter().position(|n| *n == "NODEWARDEN_NODE_IP");
    let url = env_names
        .iter()
        .position(|n| *n == "NODEWARDEN_KUBE_PROXY_METRICS_URL");
    ensure!(
        node_ip.is_some() && node_ip < url,
        "$(NODEWARDEN_NODE_IP) expands only when defined earlier: {env_names:?}"
    );
    ensure!(volume(ds, "kubelet-ca")?["configMap"]["name"] == "kubelet-serving-ca");
    let ca_mount = mount(agent, "kubelet-ca")?;
    ensure!(ca_mount["mountPath"] == "/etc/nodewarden/kubelet-ca" && ca_mount["readOnly"] == true);
    ensure!(
        mount(agent, "cgroup").is_ok() && volume(ds, "checkpoint").is_ok(),
        "extra volumes come on top of the chart's"
    );
    ensure!(webhook(config, "autoscalers.nodewarden.io")?["timeoutSeconds"] == 3);
    for (name, want) in [
        ("NODEWARDEN_FEATURES_CLEAR_PAGE_SIZE", "500"),
        ("NODEWARDEN_FEATURES_CLEAR_RATE", "20"),
    ] {
        ensure!(
            env_value(c, name) == Some(want),
            "env {name}: {:?}",
            env_value(c, name)
        );
    }
    ensure!(ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == "25%");
    for o in &r.objects {
        ensure!(
            o["metadata"]["labels"]["team"] == "platform",
            "commonLabels on {}",
            o["metadata"]["name"]
        );
    }
    Ok(())
}

/// Each webhook entry (and the agent) can be switched off, and the webhook is told which
/// configurations remain for it to keep current.
#[tokio::test]
async fn webhooks_and_agent_can_be_switched_off() -> Result<()> {
    let helm = Helm::locate().await?;
    let r = helm
        .template(
            RELEASE,
            NS,
            &[
                "--set",
                "rightsizing.enabled=false,claims.enabled=false,agent.enabled=false",
            ],
        )
        .await?;
    ensure!(
        r.of_kind("MutatingWebhookConfiguration").is_empty(),
        "{:?}",
        r.names()
    );
    ensure!(r.of_kind("DaemonSet").is_empty() && !r.has("ClusterRole", "nodewarden-agent"));
    ensure!(
        r.of_kind("ValidatingAdmissionPolicy").is_empty()
            && r.of_kind("ValidatingAdmissionPolicyBinding").is_empty(),
        "no resize policy without the agent: {:?}",
        r.names()
    );
    let config = r.get("ValidatingWebhookConfiguration", "nodewarden-validating")?;
    let names: Vec<&str> = config["webhooks"]
        .as_array()
        .context("webhooks")?
        .iter()
        .filter_map(|h| h["name"].as_str())
        .collect();
    ensure!(
        names
            == [
                "autoscalers.nodewarden.io",
                "node-reports.nodewarden.io",
                "features.nodewarden.io"
            ],
        "{names:?}"
    );
    let c = container(r.get("Deployment", "nodewarden-webhook")?, "webhook")?;
    ensure!(env_value(c, "NODEWARDEN_WEBHOOK_CONFIGURATIONS") == Some("nodewarden-validating"));
    ensure!(
        env_entry(c, "NODEWARDEN_AGENT_SERVICE_ACCOUNT").is_none(),
        "without the chart's agent, no agent service account is pinned"
    );
    let cr = r.get("ClusterRole", "nodewarden-webhook")?;
    ensure!(
        rules_for(cr, "pods").is_empty(),
        "no pod reads without the agent's evictions to check"
    );
    ensure!(
        rules_for(cr, "validatingwebhookconfigurations")[0]["resourceNames"]
            == json!(["nodewarden-validating"])
    );

    let r = helm
        .template(
            RELEASE,
            NS,
            &[
                "--set",
                "nodeReports.enabled=false,claims.enabled=false,features.enabled=false",
            ],
        )
        .await?;
    let config = r.get("ValidatingWebhookConfiguration", "nodewarden-validating")?;
    ensure!(
        config["webhooks"].as_array().map(Vec::len) == Some(1)
            && webhook(config, "autoscalers.nodewarden.io").is_ok(),
        "the autoscaler entry alone keeps the validating configuration: {config}"
    );

    let r = helm
        .template(
            RELEASE,
            NS,
            &[
                "--set",
                "nodeReports.enabled=false,claims.enabled=false,features.enabled=false,autoscalers.enabled=false",
            ],
        )
        .await?;
    ensure!(
        r.of_kind("ValidatingWebhookConfiguration").is_empty(),
        "{:?}",
        r.names()
    );
    ensure!(r.has("MutatingWebhookConfiguration", "nodewarden-mutating"));
    let c = container(r.get("Deployment", "nodewarden-webhook")?, "webhook")?;
    ensure!(env_value(c, "NODEWARDEN_WEBHOOK_CONFIGURATIONS") == Some("nodewarden-mutating"));

    // Gate reports off: the agent is told so, gets none of their settings, and loses the
    // nodes/metrics rule it no longer needs.
    let r = helm
        .template(
            RELEASE,
            NS,
            &[
                "--set",
                "agent.gates.enabled=false,agent.kubeProxyMetricsUrl=http://10.0.0.1:10249/metrics",
            ],
        )
        .await?;
    let c = container(r.get("DaemonSet", "nodewarden-agent")?, "agent")?;
    ensure!(env_value(c, "NODEWARDEN_GATES") == Some("false"));
    ensure!(
        env_entry(c, "NODEWARDEN_GATES_INTERVAL").is_none()
            && env_entry(c, "NODEWARDEN_KUBE_PROXY_METRICS_URL").is_none(),
        "no gate settings when gates are off: {}",
        c["env"]
    );
    ensure!(
        rules_for(r.get("ClusterRole", "nodewarden-agent")?, "nodes/metrics").is_empty(),
        "no nodes/metrics access without gate reports"
    );
    Ok(())
}

/// Managed-certificate timings and the kubelet opt-out reach the binaries as given.
#[tokio::test]
async fn managed_certificate_timings_and_kubelet_opt_out_reach_the_env() -> Result<()> {
    let r = Helm::locate()
        .await?
        .template(
            RELEASE,
            NS,
            &[
                "--set",
                "certificates.managed.caValidity=87600h,certificates.managed.certValidity=2160h,\
                 certificates.managed.renewBefore=360h,certificates.managed.caRenewBefore=4380h,\
                 certificates.managed.caPropagation=5m,certificates.managed.checkInterval=1m,\
                 agent.kubelet.insecureSkipVerify=true",
            ],
        )
        .await?;
    let c = container(r.get("Deployment", "nodewarden-webhook")?, "webhook")?;
    for (name, want) in [
        ("NODEWARDEN_CERT_CA_VALIDITY", "87600h"),
        ("NODEWARDEN_CERT_VALIDITY", "2160h"),
        ("NODEWARDEN_CERT_RENEW_BEFORE", "360h"),
        ("NODEWARDEN_CERT_CA_RENEW_BEFORE", "4380h"),
        ("NODEWARDEN_CERT_CA_PROPAGATION", "5m"),
        ("NODEWARDEN_CERT_CHECK_INTERVAL", "1m"),
    ] {
        ensure!(
            env_value(c, name) == Some(want),
            "env {name}: {:?}, want {want}",
            env_value(c, name)
        );
    }
    let agent = container(r.get("DaemonSet", "nodewarden-agent")?, "agent")?;
    ensure!(env_value(agent, "NODEWARDEN_KUBELET_INSECURE_SKIP_VERIFY") == Some("true"));
    ensure!(env_entry(agent, "NODEWARDEN_KUBELET_CA_FILE").is_none());
    // nothing is verified, so the kubelet's certificate folder is not mounted either
    ensure!(env_entry(agent, "NODEWARDEN_KUBELET_SERVING_CERT_FILE").is_none());
    ensure!(mount(agent, "kubelet-pki").is_err());
    ensure!(volume(r.get("DaemonSet", "nodewarden-agent")?, "kubelet-pki").is_err());
    Ok(())
}

/// The admission server's limits and timeouts: unset (the default), no variable is rendered and the
/// binary's own defaults apply; set, each reaches the variable the binary reads (checked against
/// `webhook/src/config.rs`), and out-of-range numbers are refused by the schema.
#[tokio::test]
async fn webhook_limits_and_timeouts_reach_the_env_only_when_set() -> Result<()> {
    let vars = [
        ("limits.maxBodyBytes", "8388608", "NODEWARDEN_MAX_BODY_BYTES"),
        ("limits.maxConnections", "2048", "NODEWARDEN_MAX_CONNECTIONS"),
        (
            "limits.maxConnectionsPerSource",
            "300",
            "NODEWARDEN_MAX_CONNECTIONS_PER_SOURCE",
        ),
        (
            "limits.maxConnectionRatePerSource",
            "1000",
            "NODEWARDEN_MAX_CONNECTION_RATE_PER_SOURCE",
        ),
        (
            "limits.maxRequestsInFlight",
            "1000",
            "NODEWARDEN_MAX_REQUESTS_IN_FLIGHT",
        ),
        (
            "limits.maxStreamsPerConnection",
            "64",
            "NODEWARDEN_MAX_STREAMS_PER_CONNECTION",
        ),
        ("timeouts.tlsHandshake", "5s", "NODEWARDEN_TLS_HANDSHAKE_TIMEOUT"),
        ("timeouts.headerRead", "6s", "NODEWARDEN_HEADER_READ_TIMEOUT"),
        ("timeouts.request", "7s", "NODEWARDEN_REQUEST_TIMEOUT"),
        ("timeouts.write", "3s", "NODEWARDEN_WRITE_TIMEOUT"),
        ("timeouts.idle", "90s", "NODEWARDEN_IDLE_TIMEOUT"),
        (
            "timeouts.http2KeepAliveInterval",
            "20s",
            "NODEWARDEN_HTTP2_KEEP_ALIVE_INTERVAL",
        ),
        (
            "timeouts.http2KeepAliveTimeout",
            "4s",
            "NODEWARDEN_HTTP2_KEEP_ALIVE_TIMEOUT",
        ),
    ];
    let reads = env_names::<nodewarden_webhook::config::Config>();
    let default = render_default().await?;
    let c = container(default.get("Deployment", "nodewarden-webhook")?, "webhook")?;
    for (_, _, var) in vars {
        ensure!(reads.contains(var), "the webhook reads no {var}");
        ensure!(env_entry(c, var).is_none(), "{var} rendered by default");
    }
    let set: Vec<String> = vars
        .iter()
        .map(|(key, value, _)| format!("webhook.{key}={value}"))
        .collect();
    let r = Helm::locate()
        .await?
        .template(RELEASE, NS, &["--set", set.join(",").as_str()])
        .await?;
    let c = container(r.get("Deployment", "nodewarden-webhook")?, "webhook")?;
    for (_, want, var) in vars {
        ensure!(
            env_value(c, var) == Some(want),
            "env {var}: {:?}, want {want}",
            env_value(c, var)
        );
    }
    Ok(())
}

/// What a cluster whose API server cannot reach pod IPs (EKS with an overlay CNI) or that pulls
/// through a mirror needs: host network with cluster DNS, ports of its own wherever the webhook's
/// ports appear (listen addresses, container ports, NetworkPolicy; Service and probes by name), one
/// registry for every image, and extra arguments, volumes and mounts in the containers.
#[tokio::test]
async fn host_network_ports_registry_and_extras_reach_the_pods() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let values = dir.path().join("values.yaml");
    std::fs::write(
        &values,
        r#"
global:
  imageRegistry: mirror.example:5000
webhook:
  image:
    tag: t1
  hostNetwork: true
  port: 9443
  adminPort: 9080
  extraArgs: ["--cert-reload-interval=1m"]
  extraVolumes:
    - name: extra-ca
      configMap: {name: extra-ca}
  extraVolumeMounts:
    - {name: extra-ca, mountPath: /etc/nodewarden/extra-ca, readOnly: true}
agent:
  image:
    registry: own.example
    tag: t2
  extraArgs: ["--sample-interval=5s"]
"#,
    )?;
    let values = values.display().to_string();
    let helm = Helm::locate().await?;
    let r = helm
        .template(RELEASE, NS, &["--is-upgrade", "-f", values.as_str()])
        .await?;
    let deployment = r.get("Deployment", "nodewarden-webhook")?;
    let pod = &deployment["spec"]["template"]["spec"];
    ensure!(
        pod["hostNetwork"] == json!(true) && pod["dnsPolicy"] == "ClusterFirstWithHostNet",
        "host network with cluster DNS: {pod}"
    );
    let c = container(deployment, "webhook")?;
    ensure!(
        c["image"] == "mirror.example:5000/nodewarden/nodewarden-webhook:t1",
        "{}",
        c["image"]
    );
    ensure!(
        c["args"] == json!(["--cert-reload-interval=1m"]),
        "args: {}",
        c["args"]
    );
    ensure!(env_value(c, "NODEWARDEN_LISTEN_ADDR") == Some("0.0.0.0:9443"));
    ensure!(env_value(c, "NODEWARDEN_ADMIN_ADDR") == Some("0.0.0.0:9080"));
    let ports = ports_by_name(c);
    ensure!(
        ports.get("https") == Some(&9443) && ports.get("admin") == Some(&9080),
        "container ports: {ports:?}"
    );
    ensure!(
        c["livenessProbe"]["httpGet"]["port"] == "admin" && c["readinessProbe"]["httpGet"]["port"] == "admin"
    );
    ensure!(mount(c, "extra-ca")?["mountPath"] == "/etc/nodewarden/extra-ca");
    ensure!(volume(deployment, "extra-ca")?["configMap"]["name"] == "extra-ca");
    ensure!(
        mount(c, "tls").is_ok() && volume(deployment, "tls").is_ok(),
        "the chart's own volumes stay"
    );
    let service = r.get("Service", "nodewarden-webhook")?;
    let targets: Vec<&Value> = service["spec"]["ports"]
        .as_array()
        .context("service ports")?
        .iter()
        .map(|p| &p["targetPort"])
        .collect();
    ensure!(
        targets == [&json!("https"), &json!("admin")],
        "Service targets the named ports: {targets:?}"
    );
    let policy = r.get("NetworkPolicy", "nodewarden-webhook")?;
    let policy_ports: Vec<&Value> = policy["spec"]["ingress"]
        .as_array()
        .context("ingress")?
        .iter()
        .map(|r| &r["ports"][0]["port"])
        .collect();
    ensure!(
        policy_ports == [&json!(9443), &json!(9080)],
        "NetworkPolicy ports: {policy_ports:?}"
    );
    let agent = container(r.get("DaemonSet", "nodewarden-agent")?, "agent")?;
    ensure!(
        agent["image"] == "own.example/nodewarden/nodewarden-agent:t2",
        "an image's own registry wins over global.imageRegistry: {}",
        agent["image"]
    );
    ensure!(
        agent["args"] == json!(["--sample-interval=5s"]),
        "agent args: {}",
        agent["args"]
    );
    let hook = r.of_kind("Job").into_iter().next().context("the CRD hook Job")?;
    let hook_image = &hook["spec"]["template"]["spec"]["containers"][0]["image"];
    ensure!(
        hook_image == "mirror.example:5000/nodewarden/nodewarden-webhook:t1",
        "{hook_image}"
    );

    // the defaults: no host network, no args, 8443/8080
    let d = render_default().await?;
    let deployment = d.get("Deployment", "nodewarden-webhook")?;
    ensure!(
        deployment["spec"]["template"]["spec"]
            .get("hostNetwork")
            .is_none()
    );
    ensure!(deployment["spec"]["template"]["spec"].get("dnsPolicy").is_none());
    let c = container(deployment, "webhook")?;
    ensure!(c.get("args").is_none() && env_value(c, "NODEWARDEN_LISTEN_ADDR") == Some("0.0.0.0:8443"));
    Ok(())
}

/// ServiceMonitors, the PrometheusRule and cert-manager's objects need CRDs the cluster may not
/// have: asked for where the API is not served, rendering fails naming the value to turn off, the
/// missing API and `--api-versions`; with the API (or `checkApiVersions=false`) they render. The
/// ServiceMonitors go to `serviceMonitor.namespace` and carry the user's relabelings after the
/// chart's own.
#[tokio::test]
async fn monitoring_and_cert_manager_objects_need_their_apis_and_take_relabelings() -> Result<()> {
    let helm = Helm::locate().await?;
    let cases: &[(&str, &str, &str)] = &[
        (
            "serviceMonitor.enabled=true",
            "serviceMonitor.enabled=false",
            "monitoring.coreos.com/v1",
        ),
        (
            "prometheusRule.enabled=true",
            "prometheusRule.enabled=false",
            "monitoring.coreos.com/v1",
        ),
        (
            "certificates.mode=certManager",
            "certificates.mode=managed",
            "cert-manager.io/v1",
        ),
    ];
    for &(set, off, api) in cases {
        let out = helm.template_raw(RELEASE, NS, &["--set", set]).await?;
        ensure!(!out.success, "{set} rendered without {api}");
        for needle in [
            off,
            api,
            &format!("--api-versions {api}"),
            "checkApiVersions=false",
        ] {
            ensure!(
                out.stderr.contains(needle),
                "{set}: the error should name `{needle}`:\n{}",
                out.stderr
            );
        }
        helm.template(RELEASE, NS, &["--set", set, "--api-versions", api])
            .await
            .with_context(|| format!("{set} with {api}"))?;
        helm.template(RELEASE, NS, &["--set", set, "--set", "checkApiVersions=false"])
            .await
            .with_context(|| format!("{set} with checkApiVersions=false"))?;
    }

    let r = helm
        .template(
            RELEASE,
            NS,
            &[
                "--api-versions",
                "monitoring.coreos.com/v1",
                "--set",
                "serviceMonitor.enabled=true,serviceMonitor.namespace=monitoring,\
                 serviceMonitor.relabelings[0].targetLabel=cluster,serviceMonitor.relabelings[0].replacement=c1,\
                 serviceMonitor.metricRelabelings[0].action=drop,serviceMonitor.metricRelabelings[0].regex=go_.*",
            ],
        )
        .await?;
    let monitors = r.of_kind("ServiceMonitor");
    ensure!(monitors.len() == 2, "two ServiceMonitors: {}", monitors.len());
    let cluster = json!({"targetLabel": "cluster", "replacement": "c1"});
    let drop = json!([{"action": "drop", "regex": "go_.*"}]);
    for m in &monitors {
        ensure!(m["metadata"]["namespace"] == "monitoring", "{}", m["metadata"]);
        ensure!(
            m["spec"]["namespaceSelector"]["matchNames"] == json!([NS]),
            "still selects the release namespace's Services: {}",
            m["spec"]
        );
        let endpoint = &m["spec"]["endpoints"][0];
        ensure!(endpoint["metricRelabelings"] == drop, "{endpoint}");
        let relabelings = endpoint["relabelings"].as_array().context("relabelings")?;
        ensure!(relabelings.last() == Some(&cluster), "{endpoint}");
    }
    let agent = r.get("ServiceMonitor", "nodewarden-agent")?;
    ensure!(
        agent["spec"]["endpoints"][0]["relabelings"][0]["targetLabel"] == "node",
        "the chart's node label comes first: {agent}"
    );
    // the autoscaler's `namespace` label of the per-container series is kept, not moved to
    // `exported_namespace` (the dashboard's and the OOM alert's namespace is the autoscaler's)
    ensure!(
        agent["spec"]["endpoints"][0]["honorLabels"] == true,
        "the agent's series keep their namespace label: {agent}"
    );
    Ok(())
}

/// Valid resources and tolerations of every shape Kubernetes takes render as given, and a grace
/// period just long enough for the shutdown delay and grace is accepted.
#[tokio::test]
async fn kubernetes_shaped_resources_tolerations_and_grace_periods_render() -> Result<()> {
    let r = Helm::locate()
        .await?
        .template(
            RELEASE,
            NS,
            &[
                "--set",
                "webhook.resources.requests.cpu=1.5,webhook.resources.requests.memory=0.5Gi,\
                 webhook.resources.limits.memory=1e9,webhook.resources.claims[0].name=gpu,\
                 webhook.tolerations[0].key=dedicated,webhook.tolerations[0].operator=Equal,\
                 webhook.tolerations[0].value=infra,webhook.tolerations[0].effect=NoExecute,\
                 webhook.tolerations[0].tolerationSeconds=30,\
                 webhook.shutdownGrace=1m30.5s,webhook.shutdownDelay=500ms,\
                 webhook.terminationGracePeriodSeconds=93",
            ],
        )
        .await?;
    let deployment = r.get("Deployment", "nodewarden-webhook")?;
    let pod = &deployment["spec"]["template"]["spec"];
    ensure!(
        pod["terminationGracePeriodSeconds"] == 93,
        "{}",
        pod["terminationGracePeriodSeconds"]
    );
    ensure!(
        pod["tolerations"]
            == json!([{"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoExecute", "tolerationSeconds": 30}]),
        "{}",
        pod["tolerations"]
    );
    let c = container(deployment, "webhook")?;
    ensure!(
        c["resources"]["requests"]["memory"] == "0.5Gi"
            && c["resources"]["limits"]["memory"] == "1e9"
            && c["resources"]["claims"] == json!([{"name": "gpu"}]),
        "{}",
        c["resources"]
    );
    Ok(())
}

/// Bad values make `helm template` fail, and the message names the value and what is accepted.
#[tokio::test]
async fn bad_values_fail_rendering_with_a_message_naming_the_problem() -> Result<()> {
    let helm = Helm::locate().await?;
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["--set", "certificates.mode=bogus"],
            &["certificates/mode", "managed", "certManager", "secret"],
        ),
        (
            &["--set", "rightsizing.timeoutSeconds=30"],
            &["rightsizing/timeoutSeconds", "5"],
        ),
        (
            &["--set", "claims.timeoutSeconds=0"],
            &["claims/timeoutSeconds", "1"],
        ),
        (
            &["--set", "features.failurePolicy=Maybe"],
            &["features/failurePolicy", "Fail", "Ignore"],
        ),
        (
            &[
                "--set",
                "certificates.mode=secret,certificates.secret.name=my-tls",
            ],
            &["certificates.secret.caBundle", "empty"],
        ),
        (
            &["--set", "certificates.mode=secret"],
            &["certificates.secret.name", "empty"],
        ),
        (&["--set", "webhook.replica=3"], &["replica", "not allowed"]),
        (
            &["--set", "autoscalers.timeoutSeconds=10"],
            &["autoscalers/timeoutSeconds", "5"],
        ),
        (
            &["--set", "certificates.managed.renewBefore=30 days"],
            &["certificates/managed/renewBefore", "ms|s|m|h"],
        ),
        (&["--set", "features.clearRate=0"], &["features/clearRate", "1"]),
        (
            &["--set", "agent.history.rateWindow=2 minutes"],
            &["agent/history/rateWindow", "ms|s|m|h"],
        ),
        (
            &["--set", "agent.kubeProxyMetricsUrl=127.0.0.1:10249"],
            &["agent/kubeProxyMetricsUrl", "https?://"],
        ),
        (
            &[
                "--set",
                "agent.kubelet.caFile=/etc/ca.crt,agent.kubelet.insecureSkipVerify=true",
            ],
            &["agent.kubelet.caFile", "insecureSkipVerify"],
        ),
        // matchConditions are GA from 1.30: older clusters are refused up front.
        (&["--kube-version", "1.29.9"], &[">=1.30.0-0"]),
        (
            &["--set", "webhook.clientAuth.enabled=true"],
            &["webhook.clientAuth.caSecret", "webhook.clientAuth.caConfigMap"],
        ),
        (
            &[
                "--set",
                "webhook.clientAuth.enabled=true,webhook.clientAuth.caSecret=a,webhook.clientAuth.caConfigMap=b",
            ],
            &["both set"],
        ),
        (
            &["--set", r"webhook.clientAuth.allowedNames={a\,b}"],
            &["webhook/clientAuth/allowedNames"],
        ),
        (
            &["--set", "criticalPodsQuota.pods=0"],
            &["criticalPodsQuota/pods"],
        ),
        (
            &["--set", "webhook.limits.maxStreamsPerConnection=0"],
            &["webhook/limits/maxStreamsPerConnection", "minimum"],
        ),
        (
            &["--set", "webhook.limits.maxBodyBytes=100"],
            &["webhook/limits/maxBodyBytes", "minimum"],
        ),
        (
            &["--set", "webhook.port=8080"],
            &["webhook.port and webhook.adminPort are both 8080"],
        ),
        (&["--set", "webhook.port=70000"], &["webhook/port", "maximum"]),
        // resources and tolerations have the shape of the Kubernetes types
        (
            &["--set", "webhook.resources.request.cpu=100m"],
            &["webhook/resources", "'request' not allowed"],
        ),
        (
            &["--set", "agent.resources.requests.cpu=-100m"],
            &["agent/resources/requests/cpu", "-100m"],
        ),
        (
            &["--set", "webhook.resources.limits.memory=lots"],
            &["webhook/resources/limits/memory", "lots"],
        ),
        (
            &["--set", "webhook.tolerations[0].operator=Exist"],
            &["webhook/tolerations/0/operator", "Exists", "Equal"],
        ),
        (
            &["--set", "agent.tolerations[0].effect=NoSchedul"],
            &["agent/tolerations/0/effect", "NoSchedule"],
        ),
        (
            &[
                "--set",
                "webhook.tolerations[0].operator=Exists,webhook.tolerations[0].value=x",
            ],
            &["webhook/tolerations/0/value"],
        ),
        (
            &["--set", "webhook.tolerations[0].keys=a"],
            &["webhook/tolerations/0", "'keys' not allowed"],
        ),
        // the kubelet would kill the webhook before its own shutdown is done
        (
            &["--set", "webhook.terminationGracePeriodSeconds=26"],
            &[
                "webhook.terminationGracePeriodSeconds is 26",
                "webhook.shutdownDelay (5s) + webhook.shutdownGrace (20s) take up to 25s",
                "at least 27",
            ],
        ),
        (
            &[
                "--set",
                "webhook.shutdownGrace=1m30.5s,webhook.shutdownDelay=500ms,webhook.terminationGracePeriodSeconds=92",
            ],
            &["take up to 91s", "at least 93"],
        ),
        (
            &["--set", "webhook.timeouts.write=50ms"],
            &["webhook.timeouts.write is 50ms", "100ms"],
        ),
        (
            &["--set", "webhook.timeouts.write=forever"],
            &["webhook/timeouts/write", "ms|s|m|h"],
        ),
    ];
    for &(args, needles) in cases {
        let out = helm.template_raw(RELEASE, NS, args).await?;
        ensure!(!out.success, "helm template {args:?} should fail, it rendered");
        for needle in needles {
            ensure!(
                out.stderr.contains(needle),
                "helm template {args:?}: the error should name `{needle}`:\n{}",
                out.stderr
            );
        }
    }
    Ok(())
}

/// On by default and harmless: the NetworkPolicies admit the admission port 8443 and the metrics
/// port 8080 from anywhere and leave egress alone, so no install breaks, and a namespace-wide
/// default-deny policy added later does not cut the API server off from the webhook.
#[tokio::test]
async fn default_network_policies_admit_8443_and_8080_from_anywhere() -> Result<()> {
    let r = render_default().await?;
    let webhook = r.get("NetworkPolicy", "nodewarden-webhook")?;
    ensure!(
        webhook["spec"]["policyTypes"] == json!(["Ingress"]),
        "egress is not restricted: {webhook}"
    );
    let rules = webhook["spec"]["ingress"].as_array().context("ingress")?;
    let ports: Vec<&Value> = rules.iter().map(|r| &r["ports"][0]["port"]).collect();
    ensure!(ports == [&json!(8443), &json!(8080)], "ports: {ports:?}");
    ensure!(
        rules.iter().all(|r| r.get("from").is_none()),
        "no `from`: every source may reach both ports: {rules:?}"
    );
    let agent = r.get("NetworkPolicy", "nodewarden-agent")?;
    ensure!(
        agent["spec"]["ingress"][0].get("from").is_none()
            && agent["spec"]["policyTypes"] == json!(["Ingress"])
    );
    let off = Helm::locate()
        .await?
        .template(RELEASE, NS, &["--set", "networkPolicy.enabled=false"])
        .await?;
    ensure!(off.of_kind("NetworkPolicy").is_empty());
    Ok(())
}

/// The chart README's NetworkPolicy recipes ("Network policy": the API server on control-plane
/// nodes, managed control planes) render as written: each narrows only the admission port, to
/// exactly the peers it lists, and leaves the metrics port (the kubelet's probes) open.
#[tokio::test]
async fn the_readmes_network_policy_recipes_narrow_only_the_admission_port() -> Result<()> {
    let readme = std::fs::read_to_string(chart_dir().join("README.md"))?;
    let section = readme
        .split("\n## Network policy\n")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .context("the README has a \"Network policy\" section")?;
    let recipes: Vec<&str> = section
        .split("```yaml\n")
        .skip(1)
        .filter_map(|block| block.split("```").next())
        .collect();
    ensure!(recipes.len() >= 3, "recipes: {recipes:?}");
    let dir = tempfile::tempdir()?;
    for (i, recipe) in recipes.iter().enumerate() {
        let values: Value = serde_yaml_ng::from_str(recipe)?;
        let want = &values["networkPolicy"]["admissionFrom"];
        ensure!(
            want.as_array().is_some_and(|a| !a.is_empty()),
            "recipe {i}: {recipe}"
        );
        let file = dir.path().join(format!("recipe-{i}.yaml"));
        std::fs::write(&file, recipe)?;
        let r = Helm::locate()
            .await?
            .template(RELEASE, NS, &["-f", file.to_str().context("path")?])
            .await?;
        let policy = r.get("NetworkPolicy", "nodewarden-webhook")?;
        let rules = policy["spec"]["ingress"].as_array().context("ingress")?;
        ensure!(
            rules[0]["ports"][0]["port"] == json!(8443) && &rules[0]["from"] == want,
            "recipe {i}: admission rule {}",
            rules[0]
        );
        ensure!(
            rules[1]["ports"][0]["port"] == json!(8080) && rules[1].get("from").is_none(),
            "recipe {i}: metrics rule {}",
            rules[1]
        );
    }
    Ok(())
}

/// The agent is `system-node-critical`, so a ResourceQuota scoped to that class admits its pods in
/// the release namespace (GKE refuses them outside kube-system without one); it counts pods only.
#[tokio::test]
async fn a_quota_admits_the_critical_priority_pods() -> Result<()> {
    let r = render_default().await?;
    let quota = r.get("ResourceQuota", "nodewarden-critical-pods")?;
    ensure!(quota["metadata"]["namespace"] == NS);
    ensure!(
        quota["spec"]["hard"] == json!({"pods": "100000"}),
        "pods only: {quota}"
    );
    ensure!(
        quota["spec"]["scopeSelector"]["matchExpressions"]
            == json!([{"scopeName": "PriorityClass", "operator": "In", "values": ["system-node-critical"]}]),
        "{quota}"
    );
    let helm = Helm::locate().await?;
    let both = helm
        .template(
            RELEASE,
            NS,
            &["--set", "webhook.priorityClassName=system-cluster-critical"],
        )
        .await?;
    ensure!(
        both.get("ResourceQuota", "nodewarden-critical-pods")?["spec"]["scopeSelector"]["matchExpressions"]
            [0]["values"]
            == json!(["system-node-critical", "system-cluster-critical"])
    );
    for args in [
        "agent.priorityClassName=",
        "agent.enabled=false",
        "criticalPodsQuota.enabled=false",
        "agent.priorityClassName=my-high",
    ] {
        let r = helm.template(RELEASE, NS, &["--set", args]).await?;
        ensure!(r.of_kind("ResourceQuota").is_empty(), "{args}: no quota");
    }
    Ok(())
}

/// Client authentication is off by default; on, the CA from a Secret or a ConfigMap is mounted
/// as a whole folder (so a new CA reaches the pod) and named in the flags with the allowed names.
#[tokio::test]
async fn client_auth_mounts_the_ca_and_sets_the_flags() -> Result<()> {
    let r = render_default().await?;
    let c = container(r.get("Deployment", "nodewarden-webhook")?, "webhook")?;
    ensure!(
        env_value(c, "NODEWARDEN_CLIENT_CA_FILE").is_none()
            && env_value(c, "NODEWARDEN_CLIENT_NAMES").is_none()
    );

    let helm = Helm::locate().await?;
    let r = helm
        .template(
            RELEASE,
            NS,
            &[
                "--set",
                "webhook.clientAuth.enabled=true,webhook.clientAuth.caSecret=apiserver-client-ca",
                "--set",
                "webhook.clientAuth.allowedNames={kube-apiserver,apiserver.example.com}",
            ],
        )
        .await?;
    let d = r.get("Deployment", "nodewarden-webhook")?;
    let c = container(d, "webhook")?;
    ensure!(env_value(c, "NODEWARDEN_CLIENT_CA_FILE") == Some("/etc/nodewarden/client-ca/ca.crt"));
    ensure!(env_value(c, "NODEWARDEN_CLIENT_NAMES") == Some("kube-apiserver,apiserver.example.com"));
    let m = mount(c, "client-ca")?;
    ensure!(
        m["mountPath"] == "/etc/nodewarden/client-ca" && m["readOnly"] == true && m.get("subPath").is_none()
    );
    ensure!(
        volume(d, "client-ca")?["secret"]
            == json!({"secretName": "apiserver-client-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]})
    );

    let r = helm
        .template(
            RELEASE,
            NS,
            &[
                "--set",
                "webhook.clientAuth.enabled=true,webhook.clientAuth.caConfigMap=front-proxy,webhook.clientAuth.caKey=client-ca.pem",
            ],
        )
        .await?;
    let d = r.get("Deployment", "nodewarden-webhook")?;
    let c = container(d, "webhook")?;
    ensure!(env_value(c, "NODEWARDEN_CLIENT_CA_FILE") == Some("/etc/nodewarden/client-ca/client-ca.pem"));
    ensure!(
        env_value(c, "NODEWARDEN_CLIENT_NAMES").is_none(),
        "any name by default"
    );
    ensure!(
        volume(d, "client-ca")?["configMap"]
            == json!({"name": "front-proxy", "items": [{"key": "client-ca.pem", "path": "client-ca.pem"}]})
    );
    Ok(())
}

/// `helm upgrade` renders a pre-upgrade hook that runs `nodewarden-webhook crds apply` from the
/// webhook's image, with RBAC that reaches the chart's CRDs by name; `helm install` (crds/ does
/// the work) and `crds.upgrade.enabled=false` render none of it.
#[tokio::test]
async fn upgrades_run_a_hook_that_replaces_the_crds() -> Result<()> {
    let helm = Helm::locate().await?;
    let r = helm.template(RELEASE, NS, &["--is-upgrade"]).await?;
    let job = r.get("Job", "nodewarden-crds")?;
    for o in [
        job,
        r.get("ServiceAccount", "nodewarden-crds")?,
        r.get("ClusterRole", "nodewarden-crds")?,
        r.get("ClusterRoleBinding", "nodewarden-crds")?,
    ] {
        ensure!(
            o["metadata"]["annotations"]["helm.sh/hook"] == "pre-upgrade"
                && o["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
                    == "before-hook-creation,hook-succeeded",
            "{o}"
        );
    }
    let pod = &job["spec"]["template"]["spec"];
    ensure!(pod["serviceAccountName"] == "nodewarden-crds" && pod["restartPolicy"] == "Never");
    let c = container(job, "crds")?;
    let webhook_image = &container(r.get("Deployment", "nodewarden-webhook")?, "webhook")?["image"];
    ensure!(c["image"] == *webhook_image, "the webhook's own image");
    ensure!(c["args"] == json!(["crds", "apply"]));
    assert_hardened(c)?;

    let role = r.get("ClusterRole", "nodewarden-crds")?;
    let crd_names: Vec<String> = nodewarden_tests::chart_crd_files()?
        .iter()
        .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .collect();
    ensure!(crd_names.len() == 5, "{crd_names:?}");
    ensure!(
        nodewarden_webhook::crds::names() == crd_names,
        "the binary carries the chart's CRDs"
    );
    let rules = role["rules"].as_array().context("rules")?;
    ensure!(
        rules[0]["verbs"] == json!(["get", "update"]) && rules[0]["resourceNames"] == json!(crd_names),
        "read and replace by name only: {}",
        rules[0]
    );
    ensure!(
        rules.len() == 2 && rules[1]["verbs"] == json!(["create"]),
        "create (not limitable by name) only: {rules:?}"
    );

    for args in [
        &[][..],
        &["--is-upgrade", "--set", "crds.upgrade.enabled=false"][..],
    ] {
        let r = helm.template(RELEASE, NS, args).await?;
        ensure!(
            r.of_kind("Job").is_empty() && !r.has("ClusterRole", "nodewarden-crds"),
            "{args:?}: no hook"
        );
    }
    Ok(())
}

/// Seeding from Prometheus (issue 32) is off by default: no `NODEWARDEN_HISTORY_*` variable at all;
/// with `agent.history.prometheus.url` set, the URL and every other value reach the agent's env,
/// each a variable the agent reads.
#[tokio::test]
async fn agent_history_values_reach_the_env_only_with_a_url() -> Result<()> {
    let vars = [
        (
            "prometheus.url",
            "http://prometheus.monitoring:9090",
            "NODEWARDEN_HISTORY_PROMETHEUS_URL",
        ),
        (
            "prometheus.tokenFile",
            "/etc/prometheus-token/token",
            "NODEWARDEN_HISTORY_PROMETHEUS_TOKEN_FILE",
        ),
        (
            "prometheus.caFile",
            "/etc/prometheus-ca/ca.crt",
            "NODEWARDEN_HISTORY_PROMETHEUS_CA_FILE",
        ),
        (
            "prometheus.timeout",
            "20s",
            "NODEWARDEN_HISTORY_PROMETHEUS_TIMEOUT",
        ),
        ("window", "14d", "NODEWARDEN_HISTORY_WINDOW"),
        ("rateWindow", "30s", "NODEWARDEN_HISTORY_RATE_WINDOW"),
        ("budget", "90s", "NODEWARDEN_HISTORY_BUDGET"),
        ("maxSeries", "48", "NODEWARDEN_HISTORY_MAX_SERIES"),
        ("maxAnswerSize", "8Mi", "NODEWARDEN_HISTORY_MAX_ANSWER_SIZE"),
    ];
    // the agent's flags: the common ones and each capability's, flattened in (seeding among them)
    let reads = env_names::<nodewarden_agent::config::Config>();
    let default = render_default().await?;
    let c = container(default.get("DaemonSet", "nodewarden-agent")?, "agent")?;
    for (_, _, var) in vars {
        ensure!(reads.contains(var), "the agent reads no {var}");
        ensure!(env_entry(c, var).is_none(), "{var} rendered by default");
    }
    let set: Vec<String> = vars
        .iter()
        .map(|(key, value, _)| format!("agent.history.{key}={value}"))
        .collect();
    let r = Helm::locate()
        .await?
        .template(RELEASE, NS, &["--set", set.join(",").as_str()])
        .await?;
    let c = container(r.get("DaemonSet", "nodewarden-agent")?, "agent")?;
    for (_, want, var) in vars {
        ensure!(
            env_value(c, var) == Some(want),
            "env {var}: {:?}, want {want}",
            env_value(c, var)
        );
    }
    // not a URL: refused by the schema
    let err = Helm::locate()
        .await?
        .template(
            RELEASE,
            NS,
            &["--set", "agent.history.prometheus.url=prometheus:9090"],
        )
        .await
        .err()
        .context("a URL without a scheme must be refused")?;
    ensure!(err.to_string().contains("url"), "{err}");
    // the agent's limits of a read: a number of series, a size
    for (set, key) in [
        ("agent.history.maxSeries=0", "maxSeries"),
        ("agent.history.maxAnswerSize=4 MiB", "maxAnswerSize"),
    ] {
        let err = Helm::locate()
            .await?
            .template(RELEASE, NS, &["--set", set])
            .await
            .err()
            .with_context(|| format!("{set} must be refused"))?;
        ensure!(err.to_string().contains(key), "{set}: {err}");
    }
    Ok(())
}

/// The chart's default images are those a release publishes and `cargo xtask image` names
/// (`ghcr.io/nodewarden/nodewarden-*`, tagged with the appVersion), the ones Chart.yaml's
/// Artifact Hub annotation lists; a digest pins them; a mirror moves them all.
#[tokio::test]
async fn default_images_are_the_released_ones_and_a_digest_pins_them() -> Result<()> {
    let chart: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(chart_dir().join("Chart.yaml"))?)?;
    let app_version = chart["appVersion"].as_str().context("appVersion")?;
    let webhook_image = format!("{}:{app_version}", xtask::image::WEBHOOK.image_name());
    let agent_image = format!("{}:{app_version}", xtask::image::AGENT.image_name());
    ensure!(
        webhook_image == format!("ghcr.io/nodewarden/nodewarden-webhook:{app_version}"),
        "{webhook_image}"
    );

    let r = render_default().await?;
    let ds = r.get("DaemonSet", "nodewarden-agent")?;
    let init = &ds["spec"]["template"]["spec"]["initContainers"][0];
    for (what, image, want) in [
        (
            "webhook",
            &container(r.get("Deployment", "nodewarden-webhook")?, "webhook")?["image"],
            &webhook_image,
        ),
        ("agent", &container(ds, "agent")?["image"], &agent_image),
        ("agent's init container", &init["image"], &agent_image),
    ] {
        ensure!(image == want.as_str(), "{what}: {image}, want {want}");
    }
    let hook = Helm::locate()
        .await?
        .template(RELEASE, NS, &["--is-upgrade"])
        .await?;
    let hook_image = &container(hook.get("Job", "nodewarden-crds")?, "crds")?["image"];
    ensure!(hook_image == webhook_image.as_str(), "CRD hook: {hook_image}");

    // Artifact Hub lists exactly these images
    let listed: Value = serde_yaml_ng::from_str(
        chart["annotations"]["artifacthub.io/images"]
            .as_str()
            .context("artifacthub.io/images")?,
    )?;
    let listed: Vec<&str> = listed
        .as_array()
        .context("a list")?
        .iter()
        .filter_map(|i| i["image"].as_str())
        .collect();
    ensure!(
        listed == [webhook_image.as_str(), agent_image.as_str()],
        "{listed:?}"
    );
    let crds: Value = serde_yaml_ng::from_str(
        chart["annotations"]["artifacthub.io/crds"]
            .as_str()
            .context("crds")?,
    )?;
    let mut names: Vec<String> = crds
        .as_array()
        .context("a list")?
        .iter()
        .filter_map(|c| c["name"].as_str().map(str::to_string))
        .collect();
    names.sort();
    let mut files: Vec<String> = nodewarden_tests::chart_crd_files()?
        .iter()
        .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .collect();
    files.sort();
    ensure!(
        names == files,
        "artifacthub.io/crds {names:?} against crds/ {files:?}"
    );
    ensure!(
        chart["maintainers"][0]["name"]
            .as_str()
            .is_some_and(|n| !n.is_empty()),
        "maintainers"
    );

    let digest = "sha256:00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    let r = Helm::locate()
        .await?
        .template(
            RELEASE,
            NS,
            &[
                "--set",
                &format!("webhook.image.digest={digest},agent.image.digest={digest}"),
            ],
        )
        .await?;
    ensure!(
        container(r.get("Deployment", "nodewarden-webhook")?, "webhook")?["image"]
            == format!("ghcr.io/nodewarden/nodewarden-webhook@{digest}"),
        "pinned webhook"
    );
    ensure!(
        container(r.get("DaemonSet", "nodewarden-agent")?, "agent")?["image"]
            == format!("ghcr.io/nodewarden/nodewarden-agent@{digest}"),
        "pinned agent"
    );
    let r = Helm::locate()
        .await?
        .template(RELEASE, NS, &["--set", "global.imageRegistry="])
        .await?;
    ensure!(
        container(r.get("Deployment", "nodewarden-webhook")?, "webhook")?["image"]
            == format!("nodewarden/nodewarden-webhook:{app_version}"),
        "no registry: the repository alone"
    );
    // a repository that names its host keeps it; the default registry is not put before it
    let r = Helm::locate()
        .await?
        .template(
            RELEASE,
            NS,
            &[
                "--set",
                "webhook.image.repository=registry.example/team/webhook,agent.image.repository=localhost/agent",
            ],
        )
        .await?;
    ensure!(
        container(r.get("Deployment", "nodewarden-webhook")?, "webhook")?["image"]
            == format!("registry.example/team/webhook:{app_version}"),
        "a repository with its own host"
    );
    ensure!(
        container(r.get("DaemonSet", "nodewarden-agent")?, "agent")?["image"]
            == format!("localhost/agent:{app_version}"),
        "localhost"
    );
    Ok(())
}

/// What the templates used to fix are values: their defaults render as before (revision
/// history 5, the webhook's surge-first rollout, the agent without surge, probes 10 s / 3 s /
/// 3 and 2 failures, the CRD hook's resources, no annotations or pull secrets), and each set
/// value reaches its place.
#[tokio::test]
async fn rollout_probes_pull_secrets_hook_resources_and_annotations_are_values() -> Result<()> {
    let helm = Helm::locate().await?;
    let r = helm.template(RELEASE, NS, &["--is-upgrade"]).await?;
    let d = r.get("Deployment", "nodewarden-webhook")?;
    let ds = r.get("DaemonSet", "nodewarden-agent")?;
    ensure!(d["spec"]["revisionHistoryLimit"] == 5 && ds["spec"]["revisionHistoryLimit"] == 5);
    ensure!(
        d["spec"]["strategy"]
            == json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}),
        "{}",
        d["spec"]["strategy"]
    );
    ensure!(
        ds["spec"]["updateStrategy"]
            == json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}}),
        "{}",
        ds["spec"]["updateStrategy"]
    );
    let probes = |c: &Value, probe: &str| {
        (
            c[probe]["periodSeconds"].clone(),
            c[probe]["timeoutSeconds"].clone(),
            c[probe]["failureThreshold"].clone(),
            c[probe].get("initialDelaySeconds").cloned(),
        )
    };
    let w = container(d, "webhook")?;
    let a = container(ds, "agent")?;
    ensure!(probes(w, "livenessProbe") == (json!(10), json!(3), json!(3), None));
    ensure!(probes(w, "readinessProbe") == (json!(10), json!(3), json!(2), None));
    ensure!(probes(a, "livenessProbe") == (json!(10), json!(3), json!(3), None));
    ensure!(probes(a, "readinessProbe") == (json!(10), json!(3), json!(3), None));
    let job = r.get("Job", "nodewarden-crds")?;
    ensure!(
        container(job, "crds")?["resources"]
            == json!({"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}}),
        "hook resources"
    );
    for o in [d, ds, job] {
        ensure!(
            o["spec"]["template"]["spec"].get("imagePullSecrets").is_none(),
            "no pull secrets by default: {}",
            o["metadata"]["name"]
        );
    }
    for (kind, name) in [
        ("MutatingWebhookConfiguration", "nodewarden-mutating"),
        ("ValidatingWebhookConfiguration", "nodewarden-validating"),
    ] {
        ensure!(
            r.get(kind, name)?["metadata"].get("annotations").is_none(),
            "{name}"
        );
    }

    let dir = tempfile::tempdir()?;
    let values = dir.path().join("values.yaml");
    std::fs::write(
        &values,
        r#"
imagePullSecrets: [{name: shared}]
webhookConfigurations:
  annotations: {example.com/owner: platform}
webhook:
  revisionHistoryLimit: 2
  updateStrategy: {type: Recreate}
  imagePullSecrets: [{name: webhook-only}]
  livenessProbe: {timeoutSeconds: 5, failureThreshold: 6, initialDelaySeconds: 7}
  readinessProbe: {timeoutSeconds: 4, failureThreshold: 1}
agent:
  revisionHistoryLimit: 0
  imagePullSecrets: [{name: agent-only}, {name: shared}]
  updateStrategy: {maxUnavailable: 0, maxSurge: 25%}
  readinessProbe: {timeoutSeconds: 2, failureThreshold: 9}
crds:
  upgrade:
    resources:
      requests: {cpu: 50m, memory: 64Mi}
      limits: {memory: 256Mi}
"#,
    )?;
    let values = values.display().to_string();
    let r = helm
        .template(RELEASE, NS, &["--is-upgrade", "-f", values.as_str()])
        .await?;
    let d = r.get("Deployment", "nodewarden-webhook")?;
    let ds = r.get("DaemonSet", "nodewarden-agent")?;
    let job = r.get("Job", "nodewarden-crds")?;
    ensure!(d["spec"]["revisionHistoryLimit"] == 2 && ds["spec"]["revisionHistoryLimit"] == 0);
    ensure!(
        d["spec"]["strategy"] == json!({"type": "Recreate"}),
        "{}",
        d["spec"]["strategy"]
    );
    ensure!(
        ds["spec"]["updateStrategy"]["rollingUpdate"] == json!({"maxUnavailable": 0, "maxSurge": "25%"}),
        "{}",
        ds["spec"]["updateStrategy"]
    );
    let w = container(d, "webhook")?;
    let a = container(ds, "agent")?;
    ensure!(probes(w, "livenessProbe") == (json!(10), json!(5), json!(6), Some(json!(7))));
    ensure!(probes(w, "readinessProbe") == (json!(10), json!(4), json!(1), None));
    ensure!(probes(a, "readinessProbe") == (json!(10), json!(2), json!(9), None));
    ensure!(probes(a, "livenessProbe") == (json!(10), json!(3), json!(3), None));
    let secrets = |o: &Value| o["spec"]["template"]["spec"]["imagePullSecrets"].clone();
    ensure!(
        secrets(d) == json!([{"name": "shared"}, {"name": "webhook-only"}]),
        "{}",
        secrets(d)
    );
    ensure!(
        secrets(job) == json!([{"name": "shared"}, {"name": "webhook-only"}]),
        "{}",
        secrets(job)
    );
    ensure!(
        secrets(ds) == json!([{"name": "shared"}, {"name": "agent-only"}]),
        "{}",
        secrets(ds)
    );
    ensure!(
        container(job, "crds")?["resources"]
            == json!({"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}),
        "hook resources"
    );
    for (kind, name) in [
        ("MutatingWebhookConfiguration", "nodewarden-mutating"),
        ("ValidatingWebhookConfiguration", "nodewarden-validating"),
    ] {
        ensure!(
            r.get(kind, name)?["metadata"]["annotations"] == json!({"example.com/owner": "platform"}),
            "{name}"
        );
    }

    // in certManager mode the injection annotation joins the user's, and wins over the same key
    let r = helm
        .template(
            RELEASE,
            NS,
            &[
                "--set",
                "certificates.mode=certManager,checkApiVersions=false",
                "--set-string",
                "webhookConfigurations.annotations.example\\.com/owner=platform",
                "--set-string",
                "webhookConfigurations.annotations.cert-manager\\.io/inject-ca-from=elsewhere/x",
            ],
        )
        .await?;
    ensure!(
        r.get("ValidatingWebhookConfiguration", "nodewarden-validating")?["metadata"]["annotations"]
            == json!({"example.com/owner": "platform", "cert-manager.io/inject-ca-from": "nodewarden/nodewarden-webhook-tls"}),
        "cert-manager's annotation and the user's"
    );

    // a DaemonSet takes maxSurge or maxUnavailable, one of them not 0; probes and hook resources are checked
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["--set", "agent.updateStrategy.maxSurge=1"],
            &[
                "agent.updateStrategy.maxSurge is 1",
                "maxUnavailable is 10%",
                "maxUnavailable=0",
            ],
        ),
        (
            &["--set", "agent.updateStrategy.maxUnavailable=0"],
            &["both 0", "maxUnavailable=10%"],
        ),
        (
            &["--set", "webhook.livenessProbe.timeoutSeconds=0"],
            &["webhook/livenessProbe/timeoutSeconds"],
        ),
        (
            &["--set", "agent.readinessProbe.periodSeconds=5"],
            &["agent/readinessProbe", "'periodSeconds' not allowed"],
        ),
        (
            &["--set", "crds.upgrade.resources.request.cpu=1"],
            &["crds/upgrade/resources", "'request' not allowed"],
        ),
        (
            &["--set", "webhook.updateStrategy.type=Sometimes"],
            &["webhook/updateStrategy/type", "RollingUpdate", "Recreate"],
        ),
    ];
    for &(args, needles) in cases {
        let out = helm.template_raw(RELEASE, NS, args).await?;
        ensure!(!out.success, "helm template {args:?} should fail, it rendered");
        for needle in needles {
            ensure!(
                out.stderr.contains(needle),
                "helm template {args:?}: the error should name `{needle}`:\n{}",
                out.stderr
            );
        }
    }
    Ok(())
}

/// `securityContext`, `podSecurityContext` and `affinity` of both components are checked by the
/// Kubernetes API's own schemas (k8s-openapi's, strict: `cargo xtask crdgen` writes them into
/// values.schema.json, and this fails when the file differs), as `resources` is: a wrong type or
/// an unknown field fails at `helm template`, naming the value's path.
#[tokio::test]
async fn security_contexts_and_affinity_are_checked_by_the_kubernetes_schemas() -> Result<()> {
    let text = std::fs::read_to_string(chart_dir().join("values.schema.json"))?;
    let schema: Value = serde_json::from_str(&text)?;
    for (name, want) in xtask::chart_schema::kubernetes_defs()? {
        ensure!(
            schema["$defs"][name] == want,
            "values.schema.json's $defs/{name} is not the Kubernetes schema: run `cargo xtask crdgen`"
        );
    }
    for component in ["webhook", "agent"] {
        for (value, def) in [
            ("securityContext", "securityContext"),
            ("podSecurityContext", "podSecurityContext"),
            ("affinity", "affinity"),
        ] {
            ensure!(
                schema["properties"][component]["properties"][value]["$ref"] == format!("#/$defs/{def}"),
                "{component}.{value} is not checked by $defs/{def}"
            );
        }
    }

    let helm = Helm::locate().await?;
    // what a platform team sets renders
    let r = helm
        .template(
            RELEASE,
            NS,
            &[
                "--set",
                "webhook.securityContext.capabilities.drop[0]=ALL,webhook.securityContext.runAsUser=1000,\
                 agent.podSecurityContext.fsGroup=2000,agent.podSecurityContext.supplementalGroups[0]=3000,\
                 webhook.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=pool,\
                 webhook.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=In,\
                 webhook.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].values[0]=infra",
            ],
        )
        .await?;
    let d = r.get("Deployment", "nodewarden-webhook")?;
    ensure!(
        d["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0]["matchExpressions"][0]
            == json!({"key": "pool", "operator": "In", "values": ["infra"]}),
        "{}",
        d["spec"]["template"]["spec"]["affinity"]
    );
    ensure!(container(d, "webhook")?["securityContext"]["runAsUser"] == 1000);
    ensure!(
        r.get("DaemonSet", "nodewarden-agent")?["spec"]["template"]["spec"]["securityContext"]["fsGroup"]
            == 2000
    );

    let cases: &[(&[&str], &[&str])] = &[
        (
            &["--set", "webhook.securityContext.runAsUser=root"],
            &["webhook/securityContext/runAsUser", "integer"],
        ),
        (
            &["--set", "agent.podSecurityContext.runAsNonroot=true"],
            &["agent/podSecurityContext", "'runAsNonroot' not allowed"],
        ),
        (
            &["--set", "agent.securityContext.capabilities.remove[0]=ALL"],
            &["agent/securityContext/capabilities", "'remove' not allowed"],
        ),
        (
            &["--set", "webhook.affinity.podAntiAffinity.preferred[0].weight=1"],
            &["webhook/affinity/podAntiAffinity", "'preferred' not allowed"],
        ),
        (
            &["--set", "agent.affinity.nodeAfinity.x=1"],
            &["agent/affinity", "'nodeAfinity' not allowed"],
        ),
    ];
    for &(args, needles) in cases {
        let out = helm.template_raw(RELEASE, NS, args).await?;
        ensure!(!out.success, "helm template {args:?} should fail, it rendered");
        for needle in needles {
            ensure!(
                out.stderr.contains(needle),
                "helm template {args:?}: the error should name `{needle}`:\n{}",
                out.stderr
            );
        }
    }
    Ok(())
}

/// The environment variables a program's flags read, from its clap definition (`env = …` of
/// each argument, flattened structs included).
fn env_names<C: clap::CommandFactory>() -> std::collections::BTreeSet<String> {
    C::command()
        .get_arguments()
        .filter_map(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned())
        .collect()
}
