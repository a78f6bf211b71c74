//! The `caBundle` / `ca.crt` that callers trust, kept across CA rotations.

use time::OffsetDateTime;

use crate::{CertError, info, pem};

/// Builds the CA bundle to publish after (re)issuing from `new_ca_pem`.
///
/// The result holds the new CA first, then every CA certificate of `previous_bundle_pem` that is still valid
/// at `now` (`notAfter > now`) and is not already in the result, in their previous order. A caller that
/// still holds the previous bundle keeps working until the old CA expires, and one holding the new bundle
/// accepts certificates of both CAs, so rotation never breaks a caller.
///
/// * `new_ca_pem` must hold CA certificates only, valid at `now`; otherwise this is an error.
/// * `previous_bundle_pem` may be `None` or blank (nothing was published yet). Non-CA certificates in it are
///   dropped; text that is not PEM certificates (garbage, private keys) is an error rather than silently
///   replaced, so a broken bundle is noticed.
/// * Output: canonical PEM (64-character lines), no duplicate certificate (compared byte for byte).
pub fn ca_bundle(
    new_ca_pem: &str,
    previous_bundle_pem: Option<&str>,
    now: OffsetDateTime,
) -> Result<String, CertError> {
    let mut kept = Vec::new();
    for der in pem::certificates(new_ca_pem, "new CA certificate")? {
        let cert = pem::parse_x509(&der, "new CA certificate")?;
        let info = info::info_of(&cert, "new CA certificate")?;
        if !info.is_ca {
            return Err(CertError::NotACa {
                subject: info.subject,
            });
        }
        if info.not_after <= now {
            return Err(CertError::CaExpired {
                subject: info.subject,
                not_after: info.not_after,
            });
        }
        if !kept.contains(&der) {
            kept.push(der);
        }
    }
    if let Some(previous) = previous_bundle_pem.filter(|p| !p.trim().is_empty()) {
        for der in pem::certificates(previous, "previous CA bundle")? {
            let cert = pem::parse_x509(&der, "previous CA bundle")?;
            let info = info::info_of(&cert, "previous CA bundle")?;
            if info.is_ca && info.not_after > now && !kept.contains(&der) {
                kept.push(der);
            }
        }
    }
    Ok(kept.iter().map(|der| pem::encode("CERTIFICATE", der)).collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn blank_previous_bundle_is_no_bundle() {
        let ca = crate::Ca::generate(&crate::CaConfig {
            common_name: "blank".into(),
            validity: std::time::Duration::from_secs(3600),
        })
        .unwrap();
        let now = OffsetDateTime::now_utc();
        let a = ca_bundle(&ca.cert_pem, None, now).unwrap();
        let b = ca_bundle(&ca.cert_pem, Some(" \n"), now).unwrap();
        assert_eq!(a, b);
        assert_eq!(a, ca.cert_pem);
    }

    #[test]
    fn private_key_in_bundle_is_refused() {
        let ca = crate::Ca::generate(&crate::CaConfig {
            common_name: "keyed".into(),
            validity: std::time::Duration::from_secs(3600),
        })
        .unwrap();
        let previous = format!("{}{}", ca.cert_pem, ca.key_pem);
        let err = ca_bundle(&ca.cert_pem, Some(&previous), OffsetDateTime::now_utc())
            .unwrap_err()
            .to_string();
        assert!(err.contains("private key"), "{err}");
        assert!(!err.contains(ca.key_pem.lines().nth(1).unwrap()), "{err}");
    }
}
