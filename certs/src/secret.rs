//! The Kubernetes Secret that holds the webhook's certificates.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::{Ca, CertError, IssuedCert, ca, info, pem};

/// Secret type of a TLS Secret.
pub const SECRET_TYPE_TLS: &str = "kubernetes.io/tls";
/// Key of the serving certificate in the Secret.
pub const TLS_CRT: &str = "tls.crt";
/// Key of the serving private key in the Secret.
pub const TLS_KEY: &str = "tls.key";
/// Key of the CA bundle (new CA first, then still-valid previous CAs) in the Secret.
pub const CA_CRT: &str = "ca.crt";
/// Key of the current CA's private key in the Secret.
pub const CA_KEY: &str = "ca.key";

/// Builds the `kubernetes.io/tls` Secret: `tls.crt`, `tls.key`, `ca.crt` (= `ca_bundle`) and `ca.key`, so
/// that whichever replica rotates next can issue again from the same CA.
///
/// The CA certificate itself is the first certificate of `ca.crt` when `ca_bundle` comes from
/// [`crate::ca_bundle`]. Labels: `app.kubernetes.io/name=nodewarden`,
/// `app.kubernetes.io/component=webhook-certificates`, `app.kubernetes.io/managed-by=nodewarden`.
pub fn tls_secret(name: &str, namespace: &str, serving: &IssuedCert, ca: &Ca, ca_bundle: &str) -> Secret {
    let labels = BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), "nodewarden".to_owned()),
        (
            "app.kubernetes.io/component".to_owned(),
            "webhook-certificates".to_owned(),
        ),
        ("app.kubernetes.io/managed-by".to_owned(), "nodewarden".to_owned()),
    ]);
    let bytes = |s: &str| ByteString(s.as_bytes().to_vec());
    let data = BTreeMap::from([
        (TLS_CRT.to_owned(), bytes(&serving.cert_pem)),
        (TLS_KEY.to_owned(), bytes(&serving.key_pem)),
        (CA_CRT.to_owned(), bytes(ca_bundle)),
        (CA_KEY.to_owned(), bytes(&ca.key_pem)),
    ]);
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        type_: Some(SECRET_TYPE_TLS.to_owned()),
        data: Some(data),
        ..Secret::default()
    }
}

/// What [`read_tls_secret`] finds in a Secret written by [`tls_secret`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsSecretContents {
    /// `tls.crt` + `tls.key`.
    pub serving: IssuedCert,
    /// The CA: first certificate of `ca.crt` + `ca.key`.
    pub ca: Ca,
    /// `ca.crt` as stored (the bundle).
    pub ca_bundle: String,
}

/// Reads back a Secret written by [`tls_secret`], checking that each key matches its certificate. The
/// in-process rotator uses it to decide whether to renew and to issue from the stored CA.
pub fn read_tls_secret(secret: &Secret) -> Result<TlsSecretContents, CertError> {
    let id = format!(
        "{}/{}",
        secret.metadata.namespace.as_deref().unwrap_or(""),
        secret.metadata.name.as_deref().unwrap_or("")
    );
    let fail = |detail: String| CertError::Secret {
        secret: id.clone(),
        detail,
    };
    if secret.type_.as_deref() != Some(SECRET_TYPE_TLS) {
        return Err(fail(format!(
            "type is {:?}",
            secret.type_.as_deref().unwrap_or("")
        )));
    }
    let field = |key: &str| -> Result<String, CertError> {
        let data = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .ok_or_else(|| fail(format!("{key} is missing")))?;
        String::from_utf8(data.0.clone()).map_err(|_| fail(format!("{key} is not UTF-8 PEM text")))
    };
    let (tls_crt, tls_key, ca_crt, ca_key) =
        (field(TLS_CRT)?, field(TLS_KEY)?, field(CA_CRT)?, field(CA_KEY)?);
    let in_field = |key: &str, e: CertError| fail(format!("{key}: {e}"));
    let ca = Ca::from_pem(&ca_crt, &ca_key).map_err(|e| in_field("ca.crt/ca.key", e))?;
    pem::certificates(&ca_crt, "ca.crt").map_err(|e| in_field(CA_CRT, e))?;
    ca::check_key_pair(&tls_crt, &tls_key, "serving").map_err(|e| in_field("tls.crt/tls.key", e))?;
    let not_after = info::parse_certificate_info(&tls_crt)
        .map_err(|e| in_field(TLS_CRT, e))?
        .not_after;
    Ok(TlsSecretContents {
        serving: IssuedCert {
            cert_pem: tls_crt,
            key_pem: tls_key,
            not_after,
        },
        ca,
        ca_bundle: ca_crt,
    })
}
