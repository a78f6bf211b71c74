//! PEM reading and writing, and X.509 parsing helpers shared by the modules of this crate.

use base64::Engine as _;
use rustls_pki_types::pem::{PemObject, SectionKind};
use rustls_pki_types::{CertificateDer, PrivatePkcs8KeyDer};
use x509_parser::certificate::X509Certificate;

use crate::CertError;

const EXPECTED_CERTS: &str = "one or more '-----BEGIN CERTIFICATE-----' blocks and nothing else";

/// Reads every `CERTIFICATE` block of `pem`, checking that each one is a well-formed X.509 certificate.
///
/// Text outside PEM blocks is ignored (as everywhere PEM is read); private keys and other block kinds are
/// rejected, so that a key can never end up in a CA bundle by mistake.
pub(crate) fn certificates(pem: &str, what: &str) -> Result<Vec<CertificateDer<'static>>, CertError> {
    let mut out = Vec::new();
    for section in <(SectionKind, Vec<u8>) as PemObject>::pem_slice_iter(pem.as_bytes()) {
        let (kind, der) = section.map_err(|e| CertError::Pem {
            what: what.to_owned(),
            detail: e.to_string(),
            expected: EXPECTED_CERTS,
        })?;
        match kind {
            SectionKind::Certificate => {
                let der = CertificateDer::from(der);
                let n = out.len() + 1;
                parse_x509(&der, &format!("{what} (certificate #{n})"))?;
                out.push(der);
            }
            SectionKind::PrivateKey | SectionKind::RsaPrivateKey | SectionKind::EcPrivateKey => {
                return Err(CertError::Pem {
                    what: what.to_owned(),
                    detail: "it contains a private key block".to_owned(),
                    expected: EXPECTED_CERTS,
                });
            }
            other => {
                return Err(CertError::Pem {
                    what: what.to_owned(),
                    detail: format!("it contains a {other:?} block"),
                    expected: EXPECTED_CERTS,
                });
            }
        }
    }
    if out.is_empty() {
        return Err(CertError::Pem {
            what: what.to_owned(),
            detail: "no '-----BEGIN CERTIFICATE-----' block was found".to_owned(),
            expected: EXPECTED_CERTS,
        });
    }
    Ok(out)
}

/// The first certificate of `pem`.
pub(crate) fn first_certificate(pem: &str, what: &str) -> Result<CertificateDer<'static>, CertError> {
    let mut all = certificates(pem, what)?;
    // `certificates` never returns an empty list.
    Ok(all.swap_remove(0))
}

/// Parses a DER certificate, rejecting trailing bytes.
pub(crate) fn parse_x509<'a>(der: &'a [u8], what: &str) -> Result<X509Certificate<'a>, CertError> {
    let (rest, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| CertError::Certificate {
        what: what.to_owned(),
        detail: e.to_string(),
    })?;
    if !rest.is_empty() {
        return Err(CertError::Certificate {
            what: what.to_owned(),
            detail: format!("{} unexpected bytes after the certificate", rest.len()),
        });
    }
    Ok(cert)
}

/// Reads the single PKCS#8 private key of `pem`.
pub(crate) fn pkcs8_key(pem: &str, what: &str) -> Result<PrivatePkcs8KeyDer<'static>, CertError> {
    let err = |detail: &str| CertError::PrivateKey {
        what: what.to_owned(),
        detail: detail.to_owned(),
    };
    if pem.contains("-----BEGIN ENCRYPTED PRIVATE KEY-----") {
        return Err(err("the key is encrypted"));
    }
    let mut found = None;
    for section in <(SectionKind, Vec<u8>) as PemObject>::pem_slice_iter(pem.as_bytes()) {
        let (kind, der) = section.map_err(|e| err(&format!("invalid PEM: {e}")))?;
        match kind {
            SectionKind::PrivateKey if found.is_none() => found = Some(PrivatePkcs8KeyDer::from(der)),
            SectionKind::PrivateKey => return Err(err("more than one private key block was found")),
            SectionKind::RsaPrivateKey => {
                return Err(err(
                    "it is a PKCS#1 'RSA PRIVATE KEY'; convert it with `openssl pkcs8 -topk8 -nocrypt`",
                ));
            }
            SectionKind::EcPrivateKey => {
                return Err(err(
                    "it is a SEC1 'EC PRIVATE KEY'; convert it with `openssl pkcs8 -topk8 -nocrypt`",
                ));
            }
            // Certificates next to the key (a combined PEM file) are tolerated.
            _ => {}
        }
    }
    found.ok_or_else(|| err("no '-----BEGIN PRIVATE KEY-----' block was found"))
}

/// Encodes DER as a PEM block with 64-character lines and a final newline.
pub(crate) fn encode(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::with_capacity(b64.len() + b64.len() / 64 + 2 * label.len() + 40);
    out.push_str("-----BEGIN ");
    out.push_str(label);
    out.push_str("-----\n");
    for (i, c) in b64.chars().enumerate() {
        if i > 0 && i % 64 == 0 {
            out.push('\n');
        }
        out.push(c);
    }
    out.push_str("\n-----END ");
    out.push_str(label);
    out.push_str("-----\n");
    out
}

/// `CN=...` style rendering of a certificate's subject.
pub(crate) fn subject_of(cert: &X509Certificate<'_>) -> String {
    cert.subject().to_string()
}
