//! Reading certificates back: what they say and whether they are due for renewal.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use time::OffsetDateTime;
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;

use crate::{CertError, pem};

/// What a certificate says, as far as nodewarden cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertInfo {
    /// The whole subject, e.g. `CN=nodewarden-webhook`.
    pub subject: String,
    /// The subject's first common name.
    pub common_name: Option<String>,
    /// The subject's organizations (Kubernetes reads them as groups of a client certificate).
    pub organizations: Vec<String>,
    /// The whole issuer name.
    pub issuer: String,
    /// Serial number as colon-separated hex.
    pub serial: String,
    /// DNS subject alternative names, in certificate order.
    pub dns_names: Vec<String>,
    /// IP subject alternative names, in certificate order.
    pub ip_addresses: Vec<IpAddr>,
    /// Start of validity.
    pub not_before: OffsetDateTime,
    /// End of validity.
    pub not_after: OffsetDateTime,
    /// basicConstraints CA:TRUE.
    pub is_ca: bool,
    /// The extended key usage allows TLS server authentication.
    pub server_auth: bool,
    /// The extended key usage allows TLS client authentication.
    pub client_auth: bool,
}

/// Parses the first certificate of `cert_pem` (a leaf comes first in a chain).
pub fn parse_certificate_info(cert_pem: &str) -> Result<CertInfo, CertError> {
    let der = pem::first_certificate(cert_pem, "certificate")?;
    let cert = pem::parse_x509(&der, "certificate")?;
    info_of(&cert, "certificate")
}

pub(crate) fn info_of(cert: &X509Certificate<'_>, what: &str) -> Result<CertInfo, CertError> {
    let bad = |detail: String| CertError::Certificate {
        what: what.to_owned(),
        detail,
    };
    let mut dns_names = Vec::new();
    let mut ip_addresses = Vec::new();
    let san = cert
        .subject_alternative_name()
        .map_err(|e| bad(format!("unreadable subjectAltName extension: {e}")))?;
    if let Some(san) = san {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(dns) => dns_names.push((*dns).to_owned()),
                GeneralName::IPAddress(bytes) => {
                    ip_addresses.push(ip_from_bytes(bytes).ok_or_else(|| {
                        bad(format!(
                            "an IP address SAN has {} bytes instead of 4 or 16",
                            bytes.len()
                        ))
                    })?)
                }
                _ => {}
            }
        }
    }
    let eku = cert
        .extended_key_usage()
        .map_err(|e| bad(format!("unreadable extendedKeyUsage extension: {e}")))?
        .map(|ext| ext.value);
    let (server_auth, client_auth) = match eku {
        Some(eku) => (eku.any || eku.server_auth, eku.any || eku.client_auth),
        // No extension at all means no restriction.
        None => (true, true),
    };
    let is_ca = cert
        .basic_constraints()
        .map_err(|e| bad(format!("unreadable basicConstraints extension: {e}")))?
        .is_some_and(|bc| bc.value.ca);
    let attr_strings = |iter: &mut dyn Iterator<Item = &x509_parser::x509::AttributeTypeAndValue<'_>>| {
        iter.filter_map(|a| a.as_str().ok().map(str::to_owned))
            .collect::<Vec<_>>()
    };
    let validity = cert.validity();
    Ok(CertInfo {
        subject: pem::subject_of(cert),
        common_name: attr_strings(&mut cert.subject().iter_common_name())
            .into_iter()
            .next(),
        organizations: attr_strings(&mut cert.subject().iter_organization()),
        issuer: cert.issuer().to_string(),
        serial: cert.raw_serial_as_string(),
        dns_names,
        ip_addresses,
        not_before: validity.not_before.to_datetime(),
        not_after: validity.not_after.to_datetime(),
        is_ca,
        server_auth,
        client_auth,
    })
}

fn ip_from_bytes(bytes: &[u8]) -> Option<IpAddr> {
    if let Ok(v4) = <[u8; 4]>::try_from(bytes) {
        return Some(IpAddr::V4(Ipv4Addr::from(v4)));
    }
    <[u8; 16]>::try_from(bytes)
        .ok()
        .map(|v6| IpAddr::V6(Ipv6Addr::from(v6)))
}

/// True when the first certificate of `cert_pem` expires within `renew_before` of `now` (or already has).
///
/// The boundary counts as due: a certificate expiring exactly at `now + renew_before` needs renewal.
pub fn needs_renewal(
    cert_pem: &str,
    renew_before: std::time::Duration,
    now: OffsetDateTime,
) -> Result<bool, CertError> {
    let info = parse_certificate_info(cert_pem)?;
    let deadline = time::Duration::try_from(renew_before)
        .ok()
        .and_then(|d| now.checked_add(d));
    // A renew-before window too large to represent covers every certificate.
    Ok(deadline.is_none_or(|deadline| deadline >= info.not_after))
}
