//! The one error type of this crate.

/// Everything that can go wrong in this crate.
///
/// Every message names the offending input and says what would have been accepted, so it can be shown to an
/// operator unchanged.
#[derive(thiserror::Error, Debug)]
#[non_exhaustive]
pub enum CertError {
    /// The text is not PEM, or holds no block of the wanted kind, or holds a block of a kind not allowed here.
    #[error("{what} is not usable PEM: {detail}; expected {expected}")]
    Pem {
        /// Which input (e.g. "CA certificate", "previous CA bundle").
        what: String,
        /// What was wrong.
        detail: String,
        /// What is accepted.
        expected: &'static str,
    },

    /// A PEM `CERTIFICATE` block whose content is not a well-formed X.509 certificate.
    #[error(
        "{what} is not a valid X.509 certificate: {detail}; expected a DER-encoded X.509 v3 certificate in a \
         '-----BEGIN CERTIFICATE-----' block"
    )]
    Certificate {
        /// Which input.
        what: String,
        /// What was wrong.
        detail: String,
    },

    /// The private key could not be loaded.
    #[error(
        "{what} is not usable: {detail}; expected an unencrypted PKCS#8 key ('-----BEGIN PRIVATE KEY-----') \
         of type ECDSA P-256/P-384, Ed25519 or RSA"
    )]
    PrivateKey {
        /// Which input.
        what: String,
        /// What was wrong.
        detail: String,
    },

    /// The private key and the certificate have different public keys.
    #[error(
        "{what}: the private key does not belong to the certificate (their public keys differ); expected the \
         key that was generated together with that certificate"
    )]
    KeyMismatch {
        /// Which pair (e.g. "CA", "serving certificate").
        what: String,
    },

    /// A certificate that should be a CA is not one.
    #[error(
        "certificate {subject:?} is not a CA (basicConstraints CA:TRUE is missing); expected a CA certificate"
    )]
    NotACa {
        /// Subject of the certificate.
        subject: String,
    },

    /// The CA is no longer valid.
    #[error(
        "CA certificate {subject:?} expired at {not_after}; expected a CA that is still valid: generate a new CA \
         (keep the old one in the CA bundle until it expires)"
    )]
    CaExpired {
        /// Subject of the CA certificate.
        subject: String,
        /// When it expired.
        not_after: time::OffsetDateTime,
    },

    /// A validity period is zero or absurdly long.
    #[error("{what} validity of {value:?} is not usable: {detail}; expected between 1 second and 100 years")]
    Validity {
        /// Which validity (e.g. "CA", "serving certificate").
        what: String,
        /// The value given.
        value: std::time::Duration,
        /// What was wrong.
        detail: &'static str,
    },

    /// A DNS name for a subject alternative name is malformed.
    #[error(
        "DNS name {name:?} is not valid: {reason}; expected RFC 1123 labels of letters, digits and '-' (each 1 \
         to 63 characters, not starting or ending with '-'), at most 253 characters in all, optionally starting \
         with '*.'"
    )]
    DnsName {
        /// The name given.
        name: String,
        /// What was wrong.
        reason: String,
    },

    /// A serving certificate was requested without any name.
    #[error(
        "a serving certificate needs at least one DNS name or IP address, none were given; expected e.g. the \
         names from service_dns_names(service, namespace)"
    )]
    NoSubjectNames,

    /// A subject attribute (common name, organization) is empty or too long.
    #[error(
        "{what} {value:?} is not valid: {reason}; expected 1 to 64 characters without control characters"
    )]
    SubjectAttribute {
        /// Which attribute (e.g. "CA common name").
        what: String,
        /// The value given.
        value: String,
        /// What was wrong.
        reason: &'static str,
    },

    /// More than one organization for a client certificate.
    #[error(
        "{count} organizations were given for a client certificate; expected at most one (the certificate \
         generator keeps one value per subject attribute), bind RBAC to the user name for further rights"
    )]
    TooManyOrganizations {
        /// How many were given.
        count: usize,
    },

    /// A duration string could not be parsed.
    #[error(
        "duration {input:?} is not valid: {reason}; expected a number followed by a unit \
         (e.g. 90d, 2160h, 30m, 45s), or several of them (e.g. 1h30m)"
    )]
    Duration {
        /// The text given.
        input: String,
        /// What was wrong.
        reason: String,
    },

    /// A Secret does not hold what nodewarden writes.
    #[error(
        "Secret {secret}: {detail}; expected a kubernetes.io/tls Secret with tls.crt, tls.key, ca.crt and \
         ca.key as written by nodewarden"
    )]
    Secret {
        /// namespace/name of the Secret.
        secret: String,
        /// What was wrong.
        detail: String,
    },

    /// The certificate generator failed on input that passed validation.
    #[error("{what} could not be generated: {detail}")]
    Generate {
        /// What was being generated.
        what: String,
        /// The generator's message.
        detail: String,
    },
}
