//! Certificates from this crate work in a real rustls handshake, and fail where they must.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use common::{ClientAuth, WEBHOOK_NAME, handshake};
use nodewarden_certs::{Ca, CaConfig, CertError, ServingSpec, service_dns_names};

const HOUR: Duration = Duration::from_secs(3600);

fn new_ca(name: &str) -> Ca {
    Ca::generate(&CaConfig {
        common_name: name.into(),
        validity: 24 * HOUR,
    })
    .unwrap()
}

fn webhook_spec() -> ServingSpec {
    ServingSpec {
        dns_names: service_dns_names("nodewarden-webhook", "nodewarden"),
        ip_addresses: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
        validity: HOUR,
    }
}

#[tokio::test]
async fn client_trusting_the_ca_connects_by_service_name_and_ip() {
    let ca = new_ca("nodewarden-ca");
    let serving = ca.issue_serving(&webhook_spec()).unwrap();
    for name in [
        WEBHOOK_NAME,
        "nodewarden-webhook.nodewarden.svc.cluster.local",
        "127.0.0.1",
    ] {
        handshake(&serving.cert_pem, &serving.key_pem, &ca.cert_pem, name, None)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[tokio::test]
async fn client_trusting_another_ca_is_refused() {
    let ca = new_ca("nodewarden-ca");
    let other = new_ca("someone-else");
    let serving = ca.issue_serving(&webhook_spec()).unwrap();
    let err = handshake(
        &serving.cert_pem,
        &serving.key_pem,
        &other.cert_pem,
        WEBHOOK_NAME,
        None,
    )
    .await
    .unwrap_err();
    assert!(
        err.contains("client handshake") && err.contains("UnknownIssuer"),
        "{err}"
    );
}

#[tokio::test]
async fn name_outside_the_sans_is_refused() {
    let ca = new_ca("nodewarden-ca");
    let serving = ca.issue_serving(&webhook_spec()).unwrap();
    for name in ["nodewarden-webhook.other.svc", "evil.example.com", "127.0.0.2"] {
        let err = handshake(&serving.cert_pem, &serving.key_pem, &ca.cert_pem, name, None)
            .await
            .unwrap_err();
        assert!(
            err.contains("client handshake") && err.contains("not valid for name"),
            "{name}: {err}"
        );
    }
}

#[tokio::test]
async fn ca_reloaded_from_pem_issues_certificates_the_original_ca_verifies() {
    let original = new_ca("nodewarden-ca");
    let reloaded = Ca::from_pem(&original.cert_pem, &original.key_pem).unwrap();
    assert_eq!(reloaded.not_after(), original.not_after());
    let serving = reloaded.issue_serving(&webhook_spec()).unwrap();
    handshake(
        &serving.cert_pem,
        &serving.key_pem,
        &original.cert_pem,
        WEBHOOK_NAME,
        None,
    )
    .await
    .unwrap();
}

#[test]
fn ca_from_pem_refuses_wrong_key_non_ca_and_garbage() {
    let a = new_ca("a");
    let b = new_ca("b");
    let err = Ca::from_pem(&a.cert_pem, &b.key_pem).unwrap_err();
    assert!(matches!(err, CertError::KeyMismatch { .. }), "{err}");

    let leaf = a.issue_serving(&webhook_spec()).unwrap();
    let err = Ca::from_pem(&leaf.cert_pem, &leaf.key_pem).unwrap_err();
    assert!(matches!(err, CertError::NotACa { .. }), "{err}");

    let err = Ca::from_pem("not a certificate", &a.key_pem).unwrap_err();
    assert!(err.to_string().contains("BEGIN CERTIFICATE"), "{err}");
    let err = Ca::from_pem(&a.cert_pem, "not a key").unwrap_err();
    assert!(err.to_string().contains("PKCS#8"), "{err}");
    // A key in the legacy SEC1 form is named as such, with the way out.
    let sec1 = "-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n";
    let err = Ca::from_pem(&a.cert_pem, sec1).unwrap_err();
    assert!(err.to_string().contains("openssl pkcs8 -topk8"), "{err}");
}

#[tokio::test]
async fn client_certificate_passes_mutual_tls_with_the_ca() {
    let ca = new_ca("nodewarden-ca");
    let serving = ca.issue_serving(&webhook_spec()).unwrap();
    let admin = ca.issue_client("admin", &["system:masters"], HOUR).unwrap();
    let info = nodewarden_certs::parse_certificate_info(&admin.cert_pem).unwrap();
    assert_eq!(info.common_name.as_deref(), Some("admin"));
    assert_eq!(info.organizations, ["system:masters"]);
    assert!(info.client_auth && !info.server_auth && !info.is_ca);

    let client = ClientAuth {
        cert_pem: &admin.cert_pem,
        key_pem: &admin.key_pem,
        server_trusts_pem: &ca.cert_pem,
    };
    handshake(
        &serving.cert_pem,
        &serving.key_pem,
        &ca.cert_pem,
        WEBHOOK_NAME,
        Some(client),
    )
    .await
    .unwrap();

    // A server that trusts another CA for clients turns the same certificate away.
    let other = new_ca("other");
    let client = ClientAuth {
        cert_pem: &admin.cert_pem,
        key_pem: &admin.key_pem,
        server_trusts_pem: &other.cert_pem,
    };
    let err = handshake(
        &serving.cert_pem,
        &serving.key_pem,
        &ca.cert_pem,
        WEBHOOK_NAME,
        Some(client),
    )
    .await
    .unwrap_err();
    assert!(
        err.contains("server handshake") && err.contains("UnknownIssuer"),
        "{err}"
    );

    // A serving certificate is not a client certificate.
    let client = ClientAuth {
        cert_pem: &serving.cert_pem,
        key_pem: &serving.key_pem,
        server_trusts_pem: &ca.cert_pem,
    };
    let err = handshake(
        &serving.cert_pem,
        &serving.key_pem,
        &ca.cert_pem,
        WEBHOOK_NAME,
        Some(client),
    )
    .await
    .unwrap_err();
    assert!(
        err.contains("server handshake") && err.contains("client authentication"),
        "{err}"
    );
}
