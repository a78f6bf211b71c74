//! End-to-end: the webhook requires the API server's client certificate (`--client-ca-file`).
//!
//! This binary starts a control plane of its own, whose kube-apiserver reads an
//! AdmissionConfiguration: its `WebhookAdmissionConfiguration` names a kubeconfig whose user
//! `127.0.0.1:<port>` holds a client certificate signed by a CA of the test's own. The API
//! server picks a kubeconfig user by the host (and port) of the webhook it calls, so the webhook
//! registered at `https://127.0.0.1:<port>` gets that certificate and one registered at
//! `https://localhost:<port>` (the same server) gets none.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail, ensure};
use base64::Engine;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use nodewarden_api::{ClusterClaim, ClusterClaimSpec};
use nodewarden_certs::{Ca, CaConfig, IssuedCert};
use nodewarden_tests::controlplane::StartOptions;
use nodewarden_tests::process::write_file;
use nodewarden_tests::{
    ControlPlane, Hook, InProcessWebhook, LoopbackEndpoint, apply_crds, chart_crd_files, read_crds,
    register_validating_webhooks,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CONFIGURATION: &str = "e2e-client-auth";
const DENIED: &str = "admission webhook \"claims.nodewarden.io\" denied the request: id-format: ";
/// The common name the webhook allows (`--client-names`), as Gatekeeper's default.
const CALLER: &str = "kube-apiserver";

fn ca(name: &str) -> Result<Ca> {
    Ok(Ca::generate(&CaConfig {
        common_name: name.to_string(),
        validity: std::time::Duration::from_secs(3600),
    })?)
}

fn client_cert(ca: &Ca, name: &str) -> Result<IssuedCert> {
    Ok(ca.issue_client(name, &[], std::time::Duration::from_secs(3600))?)
}

/// The kubeconfig the API server calls webhooks with: one user, named for the host and port of
/// the webhook's URL, presenting `cert`.
fn webhook_kubeconfig(user: &str, cert: &IssuedCert) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    format!(
        "apiVersion: v1\nkind: Config\nusers:\n- name: \"{user}\"\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n",
        b64(&cert.cert_pem),
        b64(&cert.key_pem)
    )
}

fn admission_configuration(kubeconfig: &Path) -> String {
    let plugin = |name: &str| {
        format!(
            "- name: {name}\n  configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    kind: WebhookAdmissionConfiguration\n    kubeConfigFile: \"{}\"\n",
            kubeconfig.display()
        )
    };
    format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n{}{}",
        plugin("ValidatingAdmissionWebhook"),
        plugin("MutatingAdmissionWebhook")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_answers_only_the_api_server_with_its_client_certificate() {
    let files = tempfile::tempdir().expect("folder");
    // held until the webhook starts, so the control plane's own processes cannot take them
    let reserved = [reserve_port(), reserve_port()];
    let (listen_port, admin_port) = (port_of(&reserved[0]), port_of(&reserved[1]));
    let callers = ca("e2e-webhook-callers").expect("CA");
    let kubeconfig = files.path().join("webhook-clients.kubeconfig");
    let admission = files.path().join("admission.yaml");
    let setup = || -> Result<()> {
        let apiserver = client_cert(&callers, CALLER)?;
        write_file(
            &kubeconfig,
            webhook_kubeconfig(&format!("127.0.0.1:{listen_port}"), &apiserver).as_bytes(),
            true,
        )?;
        write_file(&admission, admission_configuration(&kubeconfig).as_bytes(), false)?;
        write_file(
            &files.path().join("client-ca.crt"),
            callers.cert_pem.as_bytes(),
            false,
        )?;
        Ok(())
    };
    setup().expect("files");
    let cp = ControlPlane::start_with_options(StartOptions {
        admission_config_file: Some(admission.clone()),
    })
    .await
    .expect("control plane");
    drop(reserved);
    if let Err(e) = scenario(&cp, files.path(), &callers, listen_port, admin_port).await {
        panic!(
            "client auth: {e:#}\ncontrol plane logs ({}):\n{}",
            cp.dir().display(),
            cp.log_tails(40)
        );
    }
}

async fn scenario(
    cp: &ControlPlane,
    dir: &Path,
    callers: &Ca,
    listen_port: u16,
    admin_port: u16,
) -> Result<()> {
    let admin = cp.admin_client().await?;
    apply_crds(cp, &admin, &read_crds(&chart_crd_files()?)?).await?;
    let serving = cp.issue_loopback_serving_cert()?;
    write_file(&dir.join("tls.crt"), serving.cert_pem.as_bytes(), false)?;
    write_file(&dir.join("tls.key"), serving.key_pem.as_bytes(), true)?;
    let webhook = InProcessWebhook::start(
        &[
            format!("--listen-addr=127.0.0.1:{listen_port}"),
            format!("--admin-addr=127.0.0.1:{admin_port}"),
            format!("--tls-cert-file={}", dir.join("tls.crt").display()),
            format!("--tls-key-file={}", dir.join("tls.key").display()),
            format!("--client-ca-file={}", dir.join("client-ca.crt").display()),
            format!("--client-names={CALLER}"),
            format!("--kubeconfig={}", cp.kubeconfig_path().display()),
            "--namespace=default".to_string(),
            "--pod-name=e2e-client-auth".to_string(),
            "--shutdown-grace=2s".to_string(),
        ],
        admin_port,
    )
    .await?;

    // through the API server, with the kubeconfig user named 127.0.0.1:<port>: the webhook answers
    let hook = Hook::claims()
        .only_group("nodewarden.io")
        .operations(&["CREATE", "UPDATE"]);
    let endpoint = LoopbackEndpoint {
        port: listen_port,
        ca_pem: cp.ca_pem().to_string(),
    };
    register_validating_webhooks(&admin, CONFIGURATION, &endpoint, std::slice::from_ref(&hook)).await?;
    let denial = cp
        .poll("the webhook's denial through the API server", || async {
            match create_id_claim(&admin).await {
                Err(kube::Error::Api(s)) if s.message.starts_with(DENIED) => Ok(Some(s.message)),
                Ok(_) => bail!("a bad id.k8s.io claim was stored: the webhook was not called"),
                // the API server has not seen the configuration yet
                Err(_) => Ok(None),
            }
        })
        .await?;
    ensure!(
        denial.contains("\"Cluster_A\" contains 'C'"),
        "unexpected denial: {denial}"
    );

    // directly, without the API server's certificate: no answer
    let trust = cp.ca_pem().to_string();
    let no_cert = direct_review(listen_port, &trust, None).await;
    let stranger = direct_review(
        listen_port,
        &trust,
        Some(&client_cert(&ca("e2e-strangers")?, CALLER)?),
    )
    .await;
    let wrong_name = direct_review(listen_port, &trust, Some(&client_cert(callers, "someone-else")?)).await;
    let right = direct_review(listen_port, &trust, Some(&client_cert(callers, CALLER)?)).await;
    eprintln!(
        "nodewarden-tests: direct callers: no certificate: {no_cert:?}; another CA: {stranger:?}; \
         another name: {wrong_name:?}; the API server's: {:?}",
        right
            .as_ref()
            .map(|s| s.lines().next().unwrap_or_default().to_string())
    );
    ensure!(
        matches!(&no_cert, Err(e) if e.contains("CertificateRequired")),
        "a client without a certificate: {no_cert:?}"
    );
    ensure!(
        matches!(&stranger, Err(e) if e.contains("UnknownCA")),
        "a client with a certificate from another CA: {stranger:?}"
    );
    ensure!(
        matches!(&wrong_name, Err(e) if e.contains("AccessDenied")),
        "a client with a certificate of another name: {wrong_name:?}"
    );
    ensure!(
        matches!(&right, Ok(answer) if answer.starts_with("HTTP/1.1 ")),
        "a client with the API server's certificate: {right:?}"
    );

    // the same webhook at https://localhost:<port>: no kubeconfig user matches, the API server
    // presents no certificate, the handshake is refused and the write fails (failurePolicy Fail)
    let mut config = ValidatingWebhookConfiguration::default();
    config.metadata.name = Some(CONFIGURATION.to_string());
    let mut client_config = endpoint.client_config("/validate/claims");
    client_config.url = Some(format!("https://localhost:{listen_port}/validate/claims"));
    let api: Api<ValidatingWebhookConfiguration> = Api::all(admin.clone());
    let mut current = api.get(CONFIGURATION).await?;
    for w in current.webhooks.iter_mut().flatten() {
        w.client_config = client_config.clone();
    }
    config.webhooks = current.webhooks;
    api.patch(
        CONFIGURATION,
        &PatchParams::apply("nodewarden-e2e").force(),
        &Patch::Apply(&config),
    )
    .await?;
    let failure = cp
        .poll("the call without a client certificate to fail", || async {
            match create_id_claim(&admin).await {
                Err(kube::Error::Api(s)) if s.message.contains("failed calling webhook") => {
                    Ok(Some(s.message))
                }
                Ok(_) => bail!("a bad id.k8s.io claim was stored: the webhook was not called"),
                Err(_) => Ok(None),
            }
        })
        .await?;
    eprintln!("nodewarden-tests: the API server without a client certificate: {failure}");
    // TLS 1.3 ends the client's handshake before the server has checked it: the API server then
    // reads the server's alert, or, when the server has already closed, fails writing its request
    // (a reset, or a broken pipe when the close arrived before the write)
    ensure!(
        failure.contains(&format!("https://localhost:{listen_port}/validate/claims"))
            && (failure.contains("tls: certificate required")
                || failure.contains("connection reset by peer")
                || failure.contains("broken pipe")),
        "unexpected failure: {failure}"
    );

    webhook.stop().await?;
    Ok(())
}

fn reserve_port() -> std::net::TcpListener {
    std::net::TcpListener::bind("127.0.0.1:0").expect("a free port")
}

fn port_of(listener: &std::net::TcpListener) -> u16 {
    listener.local_addr().expect("bound").port()
}

/// Creates `id.k8s.io` with a value the guard refuses (`Cluster_A`: capital letters).
async fn create_id_claim(client: &Client) -> kube::Result<ClusterClaim> {
    let claims: Api<ClusterClaim> = Api::all(client.clone());
    let claim = ClusterClaim::new(
        "id.k8s.io",
        ClusterClaimSpec {
            value: "Cluster_A".to_string(),
        },
    );
    claims.create(&PostParams::default(), &claim).await
}

/// Posts an empty review to the webhook over TLS (HTTP/1.1), presenting `identity` if given;
/// the answer's head, or the error of whichever step failed.
async fn direct_review(port: u16, trust: &str, identity: Option<&IssuedCert>) -> Result<String, String> {
    let attempt = async {
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_pemfile::certs(&mut trust.as_bytes()) {
            roots.add(cert?)?;
        }
        let builder =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_protocol_versions(&[&rustls::version::TLS13])?
                .with_root_certificates(roots);
        let config = match identity {
            Some(id) => builder.with_client_auth_cert(
                rustls_pemfile::certs(&mut id.cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>()?,
                rustls_pemfile::private_key(&mut id.key_pem.as_bytes())?.ok_or_else(|| anyhow!("no key"))?,
            )?,
            None => builder.with_no_client_auth(),
        };
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        let mut tls = connector
            .connect(rustls::pki_types::ServerName::try_from("localhost")?, tcp)
            .await
            .context("handshake")?;
        // with TLS 1.3 the server checks the certificate after the client's handshake is over:
        // wait for its alert before sending anything, as a request it never reads could make the
        // close a reset that loses the alert
        let mut first = [0u8; 1];
        if let Ok(read) = tokio::time::timeout(std::time::Duration::from_secs(1), tls.read(&mut first)).await
        {
            match read.context("reading the answer")? {
                0 => bail!("closed without an alert"),
                _ => bail!("the server spoke first"),
            }
        }
        let body = "{}";
        tls.write_all(
            format!(
                "POST /validate/claims HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .context("sending")?;
        let mut answer = Vec::new();
        tls.read_to_end(&mut answer).await.context("reading the answer")?;
        anyhow::Ok(String::from_utf8_lossy(&answer).into_owned())
    };
    attempt.await.map_err(|e| format!("{e:#}"))
}
