//! Managed certificates on a real control plane: the webhook creates its CA and serving
//! certificate in a Secret, injects the CA bundle into a webhook configuration that was
//! registered without one, and the API server can then call it; a bundle changed behind its
//! back is put right again.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, anyhow};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use nodewarden_api::{ClusterClaim, ClusterClaimSpec};
use nodewarden_certs::{Ca, CaConfig};
use nodewarden_tests::{
    Hook, InProcessWebhook, LoopbackEndpoint, apply_crds, chart_crd_files, e2e, process, read_crds,
    register_validating_webhooks,
};
use serde_json::json;

const TEST_LABEL: &str = "e2e.nodewarden.io/test";

fn bundle_of(config: &ValidatingWebhookConfiguration) -> Vec<Vec<u8>> {
    config
        .webhooks
        .iter()
        .flatten()
        .map(|h| h.client_config.ca_bundle.clone().map(|b| b.0).unwrap_or_default())
        .collect()
}

#[tokio::test]
async fn managed_certificates_are_created_injected_and_kept_current() {
    e2e("managed-certs", |env| async move {
        let client = env.client.clone();
        apply_crds(env.cp, &client, &read_crds(&chart_crd_files()?)?).await?;
        let ports = process::free_ports(2)?;
        let config_name = format!("nw-certs-{}", env.id);

        // registered as the chart does in managed mode: no caBundle
        let hook = Hook::claims()
            .only_group("nodewarden.io")
            .operations(&["CREATE", "UPDATE"])
            .only_labelled(TEST_LABEL, &env.id);
        let endpoint = LoopbackEndpoint { port: ports[0], ca_pem: String::new() };
        register_validating_webhooks(&client, &config_name, &endpoint, &[hook]).await?;

        let missing = env.cp.dir().join(format!("no-files-{}", env.id));
        let args: Vec<String> = vec![
            format!("--listen-addr=127.0.0.1:{}", ports[0]),
            format!("--admin-addr=127.0.0.1:{}", ports[1]),
            format!("--tls-cert-file={}", missing.join("tls.crt").display()),
            format!("--tls-key-file={}", missing.join("tls.key").display()),
            format!("--kubeconfig={}", env.cp.kubeconfig_path().display()),
            format!("--namespace={}", env.namespace),
            "--pod-name=certs-e2e".to_string(),
            "--cert-mode=managed".to_string(),
            "--cert-secret=nodewarden-webhook-tls".to_string(),
            "--cert-service=nodewarden-webhook".to_string(),
            "--cert-ip-addresses=127.0.0.1".to_string(),
            format!("--webhook-configurations={config_name}"),
            "--cert-check-interval=1s".to_string(),
            "--shutdown-grace=2s".to_string(),
        ];
        let webhook = InProcessWebhook::start(&args, ports[1]).await?;

        // the Secret is the source of truth
        let secret = Api::<Secret>::namespaced(client.clone(), &env.namespace).get("nodewarden-webhook-tls").await?;
        assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
        let contents = nodewarden_certs::read_tls_secret(&secret)?;
        let info = nodewarden_certs::parse_certificate_info(&contents.serving.cert_pem)?;
        assert!(info.dns_names.iter().any(|n| n == &format!("nodewarden-webhook.{}.svc", env.namespace)));
        assert!(info.ip_addresses.iter().any(|ip| ip.to_string() == "127.0.0.1"));

        // the bundle is injected into every webhook of the configuration
        let configs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
        let injected = env
            .cp
            .poll("the caBundle to be injected", || {
                let configs = configs.clone();
                let name = config_name.clone();
                let want = contents.ca_bundle.clone().into_bytes();
                async move {
                    let config = configs.get(&name).await?;
                    Ok(bundle_of(&config).iter().all(|b| *b == want).then_some(config))
                }
            })
            .await?;
        assert!(
            injected.managed_fields().iter().any(|f| f.manager.as_deref() == Some("nodewarden-cert-injector")),
            "the caBundle belongs to a field manager of its own"
        );

        // and the API server, trusting it, reaches the webhook: a bad ID claim is denied by it
        let claims: Api<ClusterClaim> = Api::all(client.clone());
        let labelled = |name: &str, value: &str| {
            let mut c = ClusterClaim::new(name, ClusterClaimSpec { value: value.to_string() });
            c.metadata.labels = Some(BTreeMap::from([(TEST_LABEL.to_string(), env.id.clone())]));
            c
        };
        let denied = claims
            .create(&PostParams::default(), &labelled("cluster.clusterset.k8s.io", "Not_A_Label"))
            .await
            .err()
            .ok_or_else(|| anyhow!("an invalid cluster ID was admitted"))?;
        let message = denied.to_string();
        assert!(message.contains("claims.nodewarden.io") && message.contains("RFC 1123"), "{message}");
        claims.create(&PostParams::default(), &labelled(&format!("zone.{}.example", env.id), "eu-1")).await?;

        // someone replaces the bundle with another CA: nodewarden puts its own back
        let other = Ca::generate(&CaConfig { common_name: "someone-else".into(), validity: Duration::from_secs(600) })?;
        let names: Vec<String> =
            injected.webhooks.iter().flatten().map(|h| h.name.clone()).collect();
        let wrong = json!({"webhooks": names.iter().map(|n| json!({"name": n, "clientConfig": {"caBundle":
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &other.cert_pem)}})).collect::<Vec<_>>()});
        configs
            .patch(&config_name, &PatchParams::apply("someone-else").force(), &Patch::Apply(json!({
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": config_name},
                "webhooks": wrong["webhooks"],
            })))
            .await
            .context("replacing the caBundle")?;
        env.cp
            .poll("the caBundle to be restored", || {
                let configs = configs.clone();
                let name = config_name.clone();
                let want = contents.ca_bundle.clone().into_bytes();
                async move { Ok(bundle_of(&configs.get(&name).await?).iter().all(|b| *b == want).then_some(())) }
            })
            .await?;
        let again = claims.create(&PostParams::default(), &labelled("cluster.clusterset.k8s.io", "Also_Bad")).await;
        assert!(matches!(again, Err(kube::Error::Api(ref s)) if s.message.contains("RFC 1123")), "{again:?}");

        webhook.stop().await?;
        Ok(())
    })
    .await;
}
