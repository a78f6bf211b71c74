//! nodewarden's webhook certificates: a CA, serving and client certificates issued from it (rcgen), the
//! `caBundle` kept across CA rotations, and the `kubernetes.io/tls` Secret that stores them.
//!
//! Used in-process by the webhook's certificate rotator and, through the `nodewarden-certs` binary, from
//! the command line.
//!
//! ```
//! use std::time::Duration;
//! use nodewarden_certs::*;
//!
//! let ca = Ca::generate(&CaConfig { common_name: "nodewarden-ca".into(), validity: Duration::from_secs(365 * 86400) })?;
//! let serving = ca.issue_serving(&ServingSpec {
//!     dns_names: service_dns_names("nodewarden-webhook", "nodewarden"),
//!     ip_addresses: vec![],
//!     validity: Duration::from_secs(90 * 86400),
//! })?;
//! let bundle = ca_bundle(&ca.cert_pem, None, time::OffsetDateTime::now_utc())?;
//! let secret = tls_secret("nodewarden-webhook-tls", "nodewarden", &serving, &ca, &bundle);
//! assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
//! # Ok::<(), CertError>(())
//! ```

#![warn(missing_docs)]

mod bundle;
mod ca;
mod duration;
mod error;
mod info;
mod pem;
mod secret;

pub use bundle::ca_bundle;
pub use ca::{
    CLOCK_SKEW_ALLOWANCE, Ca, CaConfig, IssuedCert, MAX_VALIDITY, ServingSpec, service_dns_names,
    validate_dns_name,
};
pub use duration::{format_duration, parse_duration};
pub use error::CertError;
pub use info::{CertInfo, needs_renewal, parse_certificate_info};
pub use secret::{
    CA_CRT, CA_KEY, SECRET_TYPE_TLS, TLS_CRT, TLS_KEY, TlsSecretContents, read_tls_secret, tls_secret,
};
