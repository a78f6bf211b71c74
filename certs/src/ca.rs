//! The CA and the certificates it issues.

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use rcgen::string::Ia5String;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose, PublicKeyData, SanType,
};
use time::OffsetDateTime;
use x509_parser::certificate::X509Certificate;

use crate::{CertError, pem};

/// How far in the past `notBefore` is set, so that nodes whose clocks run a little behind accept new
/// certificates at once.
pub const CLOCK_SKEW_ALLOWANCE: Duration = Duration::from_secs(5 * 60);

/// Longest validity accepted anywhere (100 years).
pub const MAX_VALIDITY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Longest common name or organization X.509 allows (RFC 5280 upper bound `ub-common-name`).
const MAX_ATTRIBUTE_CHARS: usize = 64;

/// What a new CA looks like.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaConfig {
    /// Subject common name, e.g. `nodewarden-ca`.
    pub common_name: String,
    /// How long the CA is valid from now.
    pub validity: Duration,
}

/// A CA certificate with its private key.
///
/// Build it with [`Ca::generate`] or [`Ca::from_pem`]; the public fields are for storing it (e.g. in a
/// Secret), not for editing. `Debug` never prints the key.
#[derive(Clone, PartialEq, Eq)]
pub struct Ca {
    /// The CA certificate, PEM.
    pub cert_pem: String,
    /// The CA private key, PKCS#8 PEM.
    pub key_pem: String,
    not_after: OffsetDateTime,
    subject: String,
}

impl fmt::Debug for Ca {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ca")
            .field("subject", &self.subject)
            .field("not_after", &self.not_after)
            .field("key_pem", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// What a serving certificate covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServingSpec {
    /// DNS names; the first one (if at most 64 characters) is also the common name. Lower-cased and
    /// de-duplicated when issued.
    pub dns_names: Vec<String>,
    /// IP addresses.
    pub ip_addresses: Vec<IpAddr>,
    /// How long the certificate is valid from now (cut at the CA's own expiry).
    pub validity: Duration,
}

/// A certificate issued by a [`Ca`], with its new private key. `Debug` never prints the key.
#[derive(Clone, PartialEq, Eq)]
pub struct IssuedCert {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// Its private key, PKCS#8 PEM.
    pub key_pem: String,
    /// End of validity, as written in the certificate.
    pub not_after: OffsetDateTime,
}

impl fmt::Debug for IssuedCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IssuedCert")
            .field("not_after", &self.not_after)
            .field("key_pem", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// The names a Service is reached by inside the cluster: `svc`, `svc.ns`, `svc.ns.svc`,
/// `svc.ns.svc.cluster.local`.
pub fn service_dns_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        service.to_owned(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ]
}

/// Checks a DNS name for a subject alternative name and returns it lower-cased.
///
/// Accepts RFC 1123 host names (single labels such as a bare Service name included) and a leading `*.`
/// wildcard label. Rejects IP addresses (they belong in [`ServingSpec::ip_addresses`]) and a trailing dot.
pub fn validate_dns_name(name: &str) -> Result<String, CertError> {
    let fail = |reason: &str| CertError::DnsName {
        name: name.to_owned(),
        reason: reason.to_owned(),
    };
    if name.is_empty() {
        return Err(fail("it is empty"));
    }
    if name.len() > 253 {
        return Err(fail("it is longer than 253 characters"));
    }
    if name.parse::<IpAddr>().is_ok() {
        return Err(fail("it is an IP address, give it as an IP address instead"));
    }
    if name.ends_with('.') {
        return Err(fail("it ends with '.'"));
    }
    let lower = name.to_ascii_lowercase();
    let labels: Vec<&str> = lower.split('.').collect();
    for (i, label) in labels.iter().enumerate() {
        if i == 0 && *label == "*" {
            if labels.len() < 3 {
                return Err(fail("a wildcard needs at least two labels after '*.'"));
            }
            continue;
        }
        if label.is_empty() {
            return Err(fail("it has an empty label ('..' or a leading '.')"));
        }
        if label.len() > 63 {
            return Err(fail(&format!("label {label:?} is longer than 63 characters")));
        }
        if let Some(c) = label.chars().find(|c| !(c.is_ascii_alphanumeric() || *c == '-')) {
            return Err(fail(&format!("label {label:?} contains {c:?}")));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(fail(&format!("label {label:?} starts or ends with '-'")));
        }
    }
    Ok(lower)
}

fn validate_attribute(what: &str, value: &str) -> Result<(), CertError> {
    let fail = |reason| CertError::SubjectAttribute {
        what: what.to_owned(),
        value: value.to_owned(),
        reason,
    };
    if value.trim().is_empty() {
        return Err(fail("it is empty"));
    }
    if value.chars().count() > MAX_ATTRIBUTE_CHARS {
        return Err(fail("it is longer than 64 characters"));
    }
    if value.chars().any(char::is_control) {
        return Err(fail("it contains a control character"));
    }
    Ok(())
}

fn validity(what: &str, value: Duration) -> Result<time::Duration, CertError> {
    let fail = |detail| CertError::Validity {
        what: what.to_owned(),
        value,
        detail,
    };
    if value < Duration::from_secs(1) {
        return Err(fail("it is shorter than one second"));
    }
    if value > MAX_VALIDITY {
        return Err(fail("it is longer than 100 years"));
    }
    time::Duration::try_from(value).map_err(|_| fail("it cannot be represented"))
}

fn skew() -> time::Duration {
    // A constant of five minutes always converts.
    time::Duration::seconds(CLOCK_SKEW_ALLOWANCE.as_secs().cast_signed())
}

fn generate_err(what: &str) -> impl Fn(rcgen::Error) -> CertError + '_ {
    move |e| CertError::Generate {
        what: what.to_owned(),
        detail: e.to_string(),
    }
}

fn new_key(what: &str) -> Result<KeyPair, CertError> {
    KeyPair::generate().map_err(generate_err(what))
}

fn load_key(key_pem: &str, what: &str) -> Result<KeyPair, CertError> {
    let der = pem::pkcs8_key(key_pem, what)?;
    KeyPair::try_from(der.secret_pkcs8_der()).map_err(|e| CertError::PrivateKey {
        what: what.to_owned(),
        detail: format!("the key could not be loaded ({e})"),
    })
}

/// True when `key` holds the private half of `cert`'s public key.
fn key_matches(key: &KeyPair, cert: &X509Certificate<'_>) -> bool {
    key.der_bytes() == cert.public_key().subject_public_key.data.as_ref()
}

/// Checks that `key_pem` is the private key of the first certificate in `cert_pem`.
pub(crate) fn check_key_pair(cert_pem: &str, key_pem: &str, what: &str) -> Result<(), CertError> {
    let der = pem::first_certificate(cert_pem, &format!("{what} certificate"))?;
    let cert = pem::parse_x509(&der, &format!("{what} certificate"))?;
    let key = load_key(key_pem, &format!("{what} private key"))?;
    if !key_matches(&key, &cert) {
        return Err(CertError::KeyMismatch {
            what: what.to_owned(),
        });
    }
    Ok(())
}

impl Ca {
    /// Generates a new self-signed CA: ECDSA P-256 key, basicConstraints CA:TRUE with path length 0,
    /// keyCertSign + cRLSign + digitalSignature, valid from [`CLOCK_SKEW_ALLOWANCE`] ago for `cfg.validity`.
    pub fn generate(cfg: &CaConfig) -> Result<Ca, CertError> {
        validate_attribute("CA common name", &cfg.common_name)?;
        let validity = validity("CA", cfg.validity)?;
        let now = OffsetDateTime::now_utc();
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cfg.common_name.as_str());
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_before = now - skew();
        params.not_after = now + validity;
        let key = new_key("CA key")?;
        let cert = params.self_signed(&key).map_err(generate_err("CA certificate"))?;
        Ca::from_pem(&cert.pem(), &key.serialize_pem())
    }

    /// Loads an existing CA (e.g. from the Secret or from files) to issue more certificates from it.
    ///
    /// `cert_pem` must hold the CA certificate first (further certificates are ignored); `key_pem` its
    /// PKCS#8 private key. An expired CA loads (so it can still be inspected) but refuses to issue.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Ca, CertError> {
        let der = pem::first_certificate(cert_pem, "CA certificate")?;
        let cert = pem::parse_x509(&der, "CA certificate")?;
        let info = crate::info::info_of(&cert, "CA certificate")?;
        if !info.is_ca {
            return Err(CertError::NotACa {
                subject: info.subject,
            });
        }
        let key = load_key(key_pem, "CA private key")?;
        if !key_matches(&key, &cert) {
            return Err(CertError::KeyMismatch {
                what: "CA".to_owned(),
            });
        }
        Ok(Ca {
            cert_pem: pem::encode("CERTIFICATE", &der),
            key_pem: key.serialize_pem(),
            not_after: info.not_after,
            subject: info.subject,
        })
    }

    /// End of the CA's validity.
    pub fn not_after(&self) -> OffsetDateTime {
        self.not_after
    }

    /// Issues a TLS serving certificate: new ECDSA P-256 key, extendedKeyUsage serverAuth, keyUsage
    /// digitalSignature + keyEncipherment, SANs = all DNS names then all IPs, CN = first DNS name.
    ///
    /// The validity starts [`CLOCK_SKEW_ALLOWANCE`] ago and never runs past the CA's own expiry.
    pub fn issue_serving(&self, spec: &ServingSpec) -> Result<IssuedCert, CertError> {
        let mut dns_names: Vec<String> = Vec::with_capacity(spec.dns_names.len());
        for name in &spec.dns_names {
            let name = validate_dns_name(name)?;
            if !dns_names.contains(&name) {
                dns_names.push(name);
            }
        }
        let mut ips: Vec<IpAddr> = Vec::with_capacity(spec.ip_addresses.len());
        for ip in &spec.ip_addresses {
            if !ips.contains(ip) {
                ips.push(*ip);
            }
        }
        if dns_names.is_empty() && ips.is_empty() {
            return Err(CertError::NoSubjectNames);
        }
        let what = "serving certificate";
        let mut params = self.leaf_params(what, spec.validity)?;
        // CN is informational for TLS (clients check SANs); X.509 caps it at 64 characters.
        let common_name = dns_names
            .iter()
            .find(|n| n.len() <= MAX_ATTRIBUTE_CHARS)
            .cloned()
            .or_else(|| ips.first().map(IpAddr::to_string));
        if let Some(cn) = common_name {
            params.distinguished_name.push(DnType::CommonName, cn);
        }
        for name in dns_names {
            let ia5 = Ia5String::try_from(name.clone()).map_err(|e| CertError::DnsName {
                name,
                reason: e.to_string(),
            })?;
            params.subject_alt_names.push(SanType::DnsName(ia5));
        }
        params
            .subject_alt_names
            .extend(ips.into_iter().map(SanType::IpAddress));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(&params, what)
    }

    /// Issues a TLS client certificate (extendedKeyUsage clientAuth) for `common_name`, with at most one
    /// organization. Kubernetes reads CN as the user name and O as a group, e.g. `O=system:masters`.
    pub fn issue_client(
        &self,
        common_name: &str,
        organizations: &[&str],
        validity: Duration,
    ) -> Result<IssuedCert, CertError> {
        validate_attribute("client certificate common name", common_name)?;
        if organizations.len() > 1 {
            return Err(CertError::TooManyOrganizations {
                count: organizations.len(),
            });
        }
        let what = "client certificate";
        let mut params = self.leaf_params(what, validity)?;
        params.distinguished_name.push(DnType::CommonName, common_name);
        if let Some(org) = organizations.first() {
            validate_attribute("client certificate organization", org)?;
            params.distinguished_name.push(DnType::OrganizationName, *org);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(&params, what)
    }

    fn leaf_params(&self, what: &str, requested: Duration) -> Result<CertificateParams, CertError> {
        let validity = validity(what, requested)?;
        let now = OffsetDateTime::now_utc();
        if self.not_after <= now {
            return Err(CertError::CaExpired {
                subject: self.subject.clone(),
                not_after: self.not_after,
            });
        }
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.use_authority_key_identifier_extension = true;
        params.not_before = now - skew();
        params.not_after = (now + validity).min(self.not_after);
        Ok(params)
    }

    fn sign(&self, params: &CertificateParams, what: &str) -> Result<IssuedCert, CertError> {
        let ca_der = pem::first_certificate(&self.cert_pem, "CA certificate")?;
        let ca_key = load_key(&self.key_pem, "CA private key")?;
        let issuer = Issuer::from_ca_cert_der(&ca_der, ca_key).map_err(generate_err("CA issuer"))?;
        let key = new_key(what)?;
        let cert = params.signed_by(&key, &issuer).map_err(generate_err(what))?;
        let parsed = pem::parse_x509(cert.der(), what)?;
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            not_after: parsed.validity().not_after.to_datetime(),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn dns_names_are_checked() {
        for ok in [
            "nodewarden-webhook",
            "nodewarden-webhook.nodewarden.svc.cluster.local",
            "*.example.com",
            "A1.Example.COM",
        ] {
            assert!(validate_dns_name(ok).is_ok(), "{ok} should be accepted");
        }
        assert_eq!(validate_dns_name("A.B").unwrap(), "a.b");
        for bad in [
            "",
            "a..b",
            ".a",
            "a.",
            "-a.b",
            "a-.b",
            "a_b.c",
            "a b",
            "10.0.0.1",
            "::1",
            "*.com",
            "a.*.b",
            &"x".repeat(64),
            &format!("{}.a", vec!["x".repeat(63); 4].join(".")),
        ] {
            let err = validate_dns_name(bad).expect_err(bad).to_string();
            assert!(err.contains("expected RFC 1123"), "{err}");
        }
    }

    #[test]
    fn service_names_are_the_four_cluster_forms() {
        assert_eq!(
            service_dns_names("wh", "ns"),
            ["wh", "wh.ns", "wh.ns.svc", "wh.ns.svc.cluster.local"]
        );
    }

    #[test]
    fn validity_bounds() {
        assert!(validity("CA", Duration::ZERO).is_err());
        assert!(validity("CA", MAX_VALIDITY + Duration::from_secs(1)).is_err());
        assert!(validity("CA", Duration::from_secs(1)).is_ok());
        let msg = validity("CA", Duration::ZERO).unwrap_err().to_string();
        assert!(msg.contains("between 1 second and 100 years"), "{msg}");
    }

    #[test]
    fn debug_never_prints_keys() {
        let ca = Ca::generate(&CaConfig {
            common_name: "debug-ca".into(),
            validity: Duration::from_secs(3600),
        })
        .unwrap();
        let shown = format!("{ca:?}");
        assert!(!shown.contains("PRIVATE KEY"), "{shown}");
        let issued = ca.issue_client("u", &[], Duration::from_secs(60)).unwrap();
        let shown = format!("{issued:?}");
        assert!(!shown.contains("PRIVATE KEY"), "{shown}");
    }
}
