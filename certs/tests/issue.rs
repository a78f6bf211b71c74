//! What issued certificates contain, when they are due for renewal, and the Secret that stores them.
#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use nodewarden_certs::{
    Ca, CaConfig, CertError, ServingSpec, needs_renewal, parse_certificate_info, read_tls_secret,
    service_dns_names, tls_secret,
};
use time::OffsetDateTime;

const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(86_400);

fn new_ca(validity: Duration) -> Ca {
    Ca::generate(&CaConfig {
        common_name: "nodewarden-ca".into(),
        validity,
    })
    .unwrap()
}

fn close(a: OffsetDateTime, b: OffsetDateTime) -> bool {
    (a - b).abs() <= time::Duration::minutes(1)
}

#[test]
fn ca_is_a_ca_with_the_configured_name_and_validity() {
    let before = OffsetDateTime::now_utc();
    let ca = new_ca(365 * DAY);
    let info = parse_certificate_info(&ca.cert_pem).unwrap();
    assert!(info.is_ca);
    assert_eq!(info.common_name.as_deref(), Some("nodewarden-ca"));
    assert_eq!(info.subject, info.issuer, "self-signed");
    assert!(
        close(info.not_after, before + time::Duration::days(365)),
        "{info:?}"
    );
    assert_eq!(ca.not_after(), info.not_after);
    // Tolerates clocks a few minutes behind.
    assert!(info.not_before <= before - time::Duration::minutes(4), "{info:?}");
}

#[test]
fn serving_certificate_has_service_names_extras_and_ips() {
    let ca = new_ca(365 * DAY);
    let mut dns_names = service_dns_names("nodewarden-webhook", "nodewarden");
    dns_names.push("webhook.example.com".into());
    dns_names.push("Nodewarden-Webhook.nodewarden.svc".into()); // duplicate in another case
    let ips = vec![
        IpAddr::V4(Ipv4Addr::new(10, 96, 0, 10)),
        IpAddr::V6(Ipv6Addr::LOCALHOST),
        IpAddr::V4(Ipv4Addr::new(10, 96, 0, 10)),
    ];
    let before = OffsetDateTime::now_utc();
    let serving = ca
        .issue_serving(&ServingSpec {
            dns_names,
            ip_addresses: ips,
            validity: 90 * DAY,
        })
        .unwrap();
    let info = parse_certificate_info(&serving.cert_pem).unwrap();
    assert_eq!(
        info.dns_names,
        [
            "nodewarden-webhook",
            "nodewarden-webhook.nodewarden",
            "nodewarden-webhook.nodewarden.svc",
            "nodewarden-webhook.nodewarden.svc.cluster.local",
            "webhook.example.com",
        ]
    );
    assert_eq!(
        info.ip_addresses,
        [
            IpAddr::V4(Ipv4Addr::new(10, 96, 0, 10)),
            IpAddr::V6(Ipv6Addr::LOCALHOST)
        ]
    );
    assert_eq!(info.common_name.as_deref(), Some("nodewarden-webhook"));
    assert!(info.server_auth && !info.client_auth && !info.is_ca);
    assert_eq!(info.issuer, "CN=nodewarden-ca");
    assert!(
        close(info.not_after, before + time::Duration::days(90)),
        "{info:?}"
    );
    assert_eq!(serving.not_after, info.not_after);
    assert!(serving.key_pem.contains("BEGIN PRIVATE KEY"));
}

#[test]
fn serving_certificate_never_outlives_its_ca() {
    let ca = new_ca(DAY);
    let serving = ca
        .issue_serving(&ServingSpec {
            dns_names: vec!["a.b".into()],
            ip_addresses: vec![],
            validity: 90 * DAY,
        })
        .unwrap();
    assert_eq!(serving.not_after, ca.not_after());
}

#[test]
fn needs_renewal_flips_at_the_threshold() {
    let ca = new_ca(365 * DAY);
    let serving = ca
        .issue_serving(&ServingSpec {
            dns_names: vec!["nodewarden-webhook".into()],
            ip_addresses: vec![],
            validity: 10 * DAY,
        })
        .unwrap();
    let pem = &serving.cert_pem;
    let now = OffsetDateTime::now_utc();
    let renew_before = 5 * DAY;
    let threshold = serving.not_after - time::Duration::days(5);
    let minute = time::Duration::minutes(1);

    assert!(!needs_renewal(pem, renew_before, now).unwrap());
    assert!(!needs_renewal(pem, renew_before, threshold - minute).unwrap());
    assert!(needs_renewal(pem, renew_before, threshold).unwrap());
    assert!(needs_renewal(pem, renew_before, threshold + minute).unwrap());
    assert!(
        needs_renewal(pem, Duration::ZERO, serving.not_after + minute).unwrap(),
        "expired"
    );
    assert!(!needs_renewal(pem, Duration::ZERO, now).unwrap());
    assert!(
        needs_renewal(pem, 11 * DAY, now).unwrap(),
        "window longer than the validity"
    );
    assert!(needs_renewal(pem, Duration::MAX, now).unwrap(), "huge window");
    assert!(needs_renewal("garbage", renew_before, now).is_err());
}

#[test]
fn bad_requests_are_refused_with_clear_errors() {
    let ca = new_ca(DAY);
    let spec = |dns: &[&str], validity| ServingSpec {
        dns_names: dns.iter().map(|s| (*s).to_owned()).collect(),
        ip_addresses: vec![],
        validity,
    };
    let err = ca.issue_serving(&spec(&[], DAY)).unwrap_err();
    assert!(matches!(err, CertError::NoSubjectNames), "{err}");
    let err = ca
        .issue_serving(&spec(&["ok.svc", "bad_name.svc"], DAY))
        .unwrap_err();
    assert!(err.to_string().contains("\"bad_name.svc\""), "{err}");
    let err = ca.issue_serving(&spec(&["10.0.0.1"], DAY)).unwrap_err();
    assert!(err.to_string().contains("IP address"), "{err}");
    let err = ca.issue_serving(&spec(&["ok.svc"], Duration::ZERO)).unwrap_err();
    assert!(matches!(err, CertError::Validity { .. }), "{err}");

    let err = ca.issue_client("admin", &["a", "b"], HOUR).unwrap_err();
    assert!(
        matches!(err, CertError::TooManyOrganizations { count: 2 }),
        "{err}"
    );
    let err = ca.issue_client("", &[], HOUR).unwrap_err();
    assert!(err.to_string().contains("expected 1 to 64 characters"), "{err}");

    let err = Ca::generate(&CaConfig {
        common_name: "x".repeat(65),
        validity: DAY,
    })
    .unwrap_err();
    assert!(err.to_string().contains("CA common name"), "{err}");
}

#[test]
fn tls_secret_has_type_and_keys_and_reads_back() {
    let ca = new_ca(365 * DAY);
    let serving = ca
        .issue_serving(&ServingSpec {
            dns_names: service_dns_names("nodewarden-webhook", "nodewarden"),
            ip_addresses: vec![],
            validity: 90 * DAY,
        })
        .unwrap();
    let bundle = nodewarden_certs::ca_bundle(&ca.cert_pem, None, OffsetDateTime::now_utc()).unwrap();
    let secret = tls_secret("nodewarden-webhook-tls", "nodewarden", &serving, &ca, &bundle);

    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    assert_eq!(secret.metadata.name.as_deref(), Some("nodewarden-webhook-tls"));
    assert_eq!(secret.metadata.namespace.as_deref(), Some("nodewarden"));
    let data = secret.data.as_ref().unwrap();
    assert_eq!(
        data.keys().map(String::as_str).collect::<Vec<_>>(),
        ["ca.crt", "ca.key", "tls.crt", "tls.key"]
    );
    let text = |k: &str| String::from_utf8(data[k].0.clone()).unwrap();
    assert_eq!(text("tls.crt"), serving.cert_pem);
    assert_eq!(text("tls.key"), serving.key_pem);
    assert_eq!(text("ca.crt"), bundle);
    assert_eq!(text("ca.key"), ca.key_pem);

    let read = read_tls_secret(&secret).unwrap();
    assert_eq!(read.serving, serving);
    assert_eq!(read.ca, ca);
    assert_eq!(read.ca_bundle, bundle);

    // A Secret whose tls.key belongs to another certificate is refused.
    let other = ca
        .issue_serving(&ServingSpec {
            dns_names: vec!["other".into()],
            ip_addresses: vec![],
            validity: DAY,
        })
        .unwrap();
    let mut broken = secret.clone();
    broken.data.as_mut().unwrap().insert(
        "tls.key".into(),
        k8s_openapi::ByteString(other.key_pem.into_bytes()),
    );
    let err = read_tls_secret(&broken).unwrap_err().to_string();
    assert!(
        err.contains("nodewarden/nodewarden-webhook-tls") && err.contains("does not belong"),
        "{err}"
    );
    let mut missing = secret;
    missing.data.as_mut().unwrap().remove("ca.key");
    let err = read_tls_secret(&missing).unwrap_err().to_string();
    assert!(err.contains("ca.key is missing"), "{err}");
}
