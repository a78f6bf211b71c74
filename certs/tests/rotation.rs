//! CA rotation: the bundle keeps the old CA until it expires, so no caller is ever cut off.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{WEBHOOK_NAME, handshake};
use nodewarden_certs::{
    Ca, CaConfig, CertError, IssuedCert, ServingSpec, ca_bundle, parse_certificate_info, service_dns_names,
};
use time::OffsetDateTime;

const DAY: Duration = Duration::from_secs(86_400);

fn new_ca(name: &str, validity: Duration) -> Ca {
    Ca::generate(&CaConfig {
        common_name: name.into(),
        validity,
    })
    .unwrap()
}

fn serving(ca: &Ca) -> IssuedCert {
    ca.issue_serving(&ServingSpec {
        dns_names: service_dns_names("nodewarden-webhook", "nodewarden"),
        ip_addresses: vec![],
        validity: DAY,
    })
    .unwrap()
}

/// Common names of the certificates of a bundle, in order.
fn names(bundle: &str) -> Vec<String> {
    bundle
        .split_inclusive("-----END CERTIFICATE-----\n")
        .map(|pem| parse_certificate_info(pem).unwrap().common_name.unwrap())
        .collect()
}

#[tokio::test]
async fn rotation_keeps_the_old_ca_and_both_generations_verify() {
    let now = OffsetDateTime::now_utc();
    let ca1 = new_ca("ca-1", 365 * DAY);
    let bundle1 = ca_bundle(&ca1.cert_pem, None, now).unwrap();
    assert_eq!(names(&bundle1), ["ca-1"]);

    let ca2 = new_ca("ca-2", 365 * DAY);
    let bundle2 = ca_bundle(&ca2.cert_pem, Some(&bundle1), now).unwrap();
    assert_eq!(names(&bundle2), ["ca-2", "ca-1"]);

    // A caller holding the new bundle accepts the old and the new serving certificate; one still holding
    // the old bundle keeps accepting the old serving certificate and refuses the new one.
    let old = serving(&ca1);
    let new = serving(&ca2);
    handshake(&old.cert_pem, &old.key_pem, &bundle2, WEBHOOK_NAME, None)
        .await
        .unwrap();
    handshake(&new.cert_pem, &new.key_pem, &bundle2, WEBHOOK_NAME, None)
        .await
        .unwrap();
    handshake(&old.cert_pem, &old.key_pem, &bundle1, WEBHOOK_NAME, None)
        .await
        .unwrap();
    let err = handshake(&new.cert_pem, &new.key_pem, &bundle1, WEBHOOK_NAME, None)
        .await
        .unwrap_err();
    assert!(err.contains("UnknownIssuer"), "{err}");

    // Re-running the same step changes nothing, and the same CA twice is listed once.
    assert_eq!(ca_bundle(&ca2.cert_pem, Some(&bundle2), now).unwrap(), bundle2);
    let doubled = format!("{bundle2}{bundle1}{}", ca2.cert_pem);
    assert_eq!(ca_bundle(&ca2.cert_pem, Some(&doubled), now).unwrap(), bundle2);
    let twice = format!("{}{}", ca2.cert_pem, ca2.cert_pem);
    assert_eq!(names(&ca_bundle(&twice, None, now).unwrap()), ["ca-2"]);

    // A third rotation keeps both older CAs, newest first.
    let ca3 = new_ca("ca-3", 365 * DAY);
    let bundle3 = ca_bundle(&ca3.cert_pem, Some(&bundle2), now).unwrap();
    assert_eq!(names(&bundle3), ["ca-3", "ca-2", "ca-1"]);
}

#[tokio::test]
async fn expired_ca_is_dropped_from_the_bundle() {
    let now = OffsetDateTime::now_utc();
    let short = new_ca("short-lived", 3600 * Duration::from_secs(1));
    let long = new_ca("long-lived", 365 * DAY);
    let bundle = ca_bundle(&short.cert_pem, None, now).unwrap();

    // Still valid: kept.
    let rotated = ca_bundle(&long.cert_pem, Some(&bundle), now).unwrap();
    assert_eq!(names(&rotated), ["long-lived", "short-lived"]);

    // Past its expiry: dropped, and the result still serves the new CA's certificates.
    let later = short.not_after() + time::Duration::seconds(1);
    let pruned = ca_bundle(&long.cert_pem, Some(&rotated), later).unwrap();
    assert_eq!(names(&pruned), ["long-lived"]);
    let cert = serving(&long);
    handshake(&cert.cert_pem, &cert.key_pem, &pruned, WEBHOOK_NAME, None)
        .await
        .unwrap();

    // Exactly at notAfter it is no longer valid either.
    let at = ca_bundle(&long.cert_pem, Some(&rotated), short.not_after()).unwrap();
    assert_eq!(names(&at), ["long-lived"]);

    // An expired CA cannot be the new one.
    let err = ca_bundle(&short.cert_pem, None, later).unwrap_err();
    assert!(matches!(err, CertError::CaExpired { .. }), "{err}");
}

#[test]
fn garbage_is_an_error_not_a_silent_reset() {
    let now = OffsetDateTime::now_utc();
    let ca = new_ca("ca", 365 * DAY);
    let bundle = ca_bundle(&ca.cert_pem, None, now).unwrap();

    for (previous, says) in [
        ("this is not PEM at all", "no '-----BEGIN CERTIFICATE-----' block"),
        (
            "-----BEGIN CERTIFICATE-----\nnot base64!!\n-----END CERTIFICATE-----\n",
            "base64",
        ),
        (
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            "not a valid X.509 certificate",
        ),
        ("-----BEGIN CERTIFICATE-----\nMIIB\n", "missing section end"),
    ] {
        let err = ca_bundle(&ca.cert_pem, Some(previous), now)
            .unwrap_err()
            .to_string();
        assert!(err.contains("previous CA bundle"), "{previous:?}: {err}");
        assert!(err.contains(says), "{previous:?}: {err}");
        assert!(err.contains("expected"), "{previous:?}: {err}");
        // A valid certificate next to the garbage does not make it acceptable.
        let mixed = format!("{bundle}{previous}");
        if previous.contains("BEGIN") {
            assert!(ca_bundle(&ca.cert_pem, Some(&mixed), now).is_err(), "{mixed}");
        }
    }

    let err = ca_bundle("garbage", None, now).unwrap_err().to_string();
    assert!(err.contains("new CA certificate"), "{err}");

    // A serving certificate is not a CA for the bundle.
    let leaf = serving(&ca);
    let err = ca_bundle(&leaf.cert_pem, None, now).unwrap_err();
    assert!(matches!(err, CertError::NotACa { .. }), "{err}");
}
