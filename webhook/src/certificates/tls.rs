//! Serving certificates that reload without a restart.
//!
//! The files are re-read on an interval and compared with what is loaded, so every way of
//! replacing them works: a plain write, a rename, and the kubelet's atomic swap of the `..data`
//! symlink in a mounted Secret (which file-write watchers miss). A new pair that does not parse,
//! or whose key does not match its certificate, is logged and the old pair kept.
//!
//! With a client CA ([`ClientVerifier`]), the server requires every caller to present a
//! certificate signed by it (optionally with one of a few names); the CA file reloads the same
//! way, by the same reloader.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use arc_swap::ArcSwapOption;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use tokio_util::sync::CancellationToken;

/// Why a certificate, key or client CA could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The certificate file holds no PEM certificate.
    #[error("{path} holds no PEM certificate (expected -----BEGIN CERTIFICATE-----)")]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// The key file holds no PEM private key (PKCS#8, PKCS#1 or SEC1).
    #[error("{path} holds no PEM private key (expected PKCS#8, PKCS#1 or SEC1)")]
    NoKey {
        /// The file.
        path: PathBuf,
    },
    /// A file is not valid PEM.
    #[error("{path}: {message}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What the PEM parser reported.
        message: String,
    },
    /// The private key is of a type rustls cannot sign with.
    #[error("the private key cannot be used: {0}")]
    Key(rustls::Error),
    /// The private key does not match the certificate's public key.
    #[error("the private key does not belong to the certificate: {0}")]
    Mismatch(rustls::Error),
    /// No certificate in the client CA file could be added as a trust anchor, or the verifier
    /// could not be built from them.
    #[error("{path}: no certificate in it can be a client CA: {message}")]
    ClientCa {
        /// The client CA file.
        path: PathBuf,
        /// What rustls reported.
        message: String,
    },
}

/// Parses a PEM certificate chain and key into a rustls [`CertifiedKey`], checking that they belong together.
pub fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
    cert_path: &Path,
    key_path: &Path,
) -> Result<CertifiedKey, TlsError> {
    let chain: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut &cert_pem[..])
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Pem {
            path: cert_path.to_path_buf(),
            message: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: cert_path.to_path_buf(),
        });
    }
    let key: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut &key_pem[..])
        .map_err(|e| TlsError::Pem {
            path: key_path.to_path_buf(),
            message: e.to_string(),
        })?
        .ok_or_else(|| TlsError::NoKey {
            path: key_path.to_path_buf(),
        })?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&key).map_err(TlsError::Key)?;
    let ck = CertifiedKey::new(chain, signing);
    ck.keys_match().map_err(TlsError::Mismatch)?;
    Ok(ck)
}

/// When the first certificate of `key`'s chain (the leaf) expires, in seconds since the Unix
/// epoch; `None` when it does not parse.
fn leaf_not_after(key: &CertifiedKey) -> Option<i64> {
    let leaf = key.cert.first()?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref()).ok()?;
    Some(cert.validity().not_after.timestamp())
}

/// Hands rustls whatever pair is current.
#[derive(Debug, Default)]
pub struct CertResolver {
    current: ArcSwapOption<CertifiedKey>,
    /// When the current leaf expires (seconds since the Unix epoch); `i64::MIN` before a pair
    /// is loaded or when the leaf does not parse.
    not_after: std::sync::atomic::AtomicI64,
}

impl CertResolver {
    /// Serves `key` from now on.
    pub fn set(&self, key: CertifiedKey) {
        let not_after = leaf_not_after(&key).unwrap_or(i64::MIN);
        self.current.store(Some(Arc::new(key)));
        self.not_after
            .store(not_after, std::sync::atomic::Ordering::Relaxed);
    }

    /// When the certificate being served expires, in seconds since the Unix epoch (`None`
    /// before one is loaded).
    pub fn not_after(&self) -> Option<i64> {
        let t = self.not_after.load(std::sync::atomic::Ordering::Relaxed);
        (t != i64::MIN && self.is_loaded()).then_some(t)
    }

    /// Whether a pair has been loaded.
    pub fn is_loaded(&self) -> bool {
        self.current.load().is_some()
    }

    /// The leaf certificate being served, DER.
    pub fn current_leaf(&self) -> Option<CertificateDer<'static>> {
        self.current.load().as_ref().and_then(|k| k.cert.first().cloned())
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.load_full()
    }
}

/// TLS 1.2 and 1.3 only, ALPN `h2` then `http/1.1`, certificates from the resolver, no client
/// certificates asked for.
pub fn server_config(resolver: Arc<CertResolver>) -> Result<Arc<ServerConfig>, rustls::Error> {
    server_config_with(resolver, None)
}

/// [`server_config`], requiring a client certificate that `client_auth` accepts when it is given.
pub fn server_config_with(
    resolver: Arc<CertResolver>,
    client_auth: Option<Arc<ClientVerifier>>,
) -> Result<Arc<ServerConfig>, rustls::Error> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
    let builder = match client_auth {
        Some(verifier) => builder.with_client_cert_verifier(verifier),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Builds a verifier of client certificates signed by a CA in `ca_pem` (rustls'
/// [`WebPkiClientVerifier`]: chain, validity, and the `clientAuth` key usage when the
/// certificate lists key usages).
fn webpki_verifier(ca_pem: &[u8], path: &Path) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let certs: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut &ca_pem[..])
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots.add(cert).map_err(|e| TlsError::ClientCa {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|e| TlsError::ClientCa {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
}

/// Whether the certificate's subject common name or one of its DNS names is in `names`
/// (compared without regard to ASCII case). A certificate that does not parse has no names.
fn has_allowed_name(cert: &CertificateDer<'_>, names: &[String]) -> bool {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return false;
    };
    let allowed = |name: &str| names.iter().any(|n| n.eq_ignore_ascii_case(name));
    let common_names = cert
        .subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok().map(str::to_string));
    let dns_names = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|g| match g {
                    x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
                    _ => None,
                })
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    common_names.chain(dns_names).any(|n| allowed(&n))
}

/// Requires a client certificate signed by a CA of the client CA file and, when names are
/// given, whose subject common name or a DNS subject alternative name is one of them.
///
/// The CA file is re-read by [`CertReloader::with_client_ca`]: a changed file that holds no
/// usable CA is logged and the CAs loaded before are kept. Revocation lists are not read. The
/// server's certificate request names no CAs, so a client offers the certificate it has.
pub struct ClientVerifier {
    ca_path: PathBuf,
    names: Vec<String>,
    current: ArcSwap<Arc<dyn ClientCertVerifier>>,
    last: std::sync::Mutex<Vec<u8>>,
}

impl std::fmt::Debug for ClientVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientVerifier")
            .field("ca_path", &self.ca_path)
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

impl ClientVerifier {
    /// Reads the CA file at `ca_path`; `names` empty means any certificate the CAs signed.
    /// Fails when the file cannot be read or holds no usable CA certificate.
    pub fn load(ca_path: PathBuf, names: Vec<String>) -> Result<Self, TlsError> {
        let pem = std::fs::read(&ca_path).map_err(|source| TlsError::Read {
            path: ca_path.clone(),
            source,
        })?;
        let verifier = webpki_verifier(&pem, &ca_path)?;
        let names = names
            .into_iter()
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .collect();
        Ok(ClientVerifier {
            ca_path,
            names,
            current: ArcSwap::from_pointee(verifier),
            last: std::sync::Mutex::new(pem),
        })
    }

    /// Re-reads the CA file; uses it if it changed and holds a usable CA.
    pub fn check(&self) -> Reload {
        self.check_counted(&())
    }

    /// [`ClientVerifier::check`], counting a changed file in `observer`.
    fn check_counted(&self, observer: &dyn ReloadObserver) -> Reload {
        let pem = match std::fs::read(&self.ca_path) {
            Ok(pem) => pem,
            Err(source) => {
                let err = TlsError::Read {
                    path: self.ca_path.clone(),
                    source,
                };
                tracing::warn!(reason = %err, "client CA file unreadable; keeping the loaded CAs");
                return Reload::Rejected(err.to_string());
            }
        };
        let mut last = self.last.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if *last == pem {
            return Reload::Unchanged;
        }
        let outcome = match webpki_verifier(&pem, &self.ca_path) {
            Ok(verifier) => {
                self.current.store(Arc::new(verifier));
                observer.reloaded(true);
                tracing::info!(ca = %self.ca_path.display(), "loaded client CA");
                Reload::Loaded
            }
            Err(err) => {
                observer.reloaded(false);
                tracing::error!(error = %err, "new client CA rejected; keeping the loaded CAs");
                Reload::Rejected(err.to_string())
            }
        };
        *last = pem;
        outcome
    }
}

impl ClientCertVerifier for ClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // the CAs can change under a running server; a borrowed list cannot follow them
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .current
            .load()
            .verify_client_cert(end_entity, intermediates, now)
            .inspect_err(|err| tracing::warn!(error = %err, "client certificate refused"))?;
        if self.names.is_empty() || has_allowed_name(end_entity, &self.names) {
            Ok(verified)
        } else {
            tracing::warn!(
                allowed = ?self.names,
                "client certificate refused: neither its common name nor a DNS name is allowed"
            );
            Err(rustls::Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current.load().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current.load().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.current.load().supported_verify_schemes()
    }
}

/// What one look at the files found.
#[derive(Debug, PartialEq, Eq)]
pub enum Reload {
    /// The files are what was loaded last.
    Unchanged,
    /// A new pair was loaded.
    Loaded,
    /// The files changed but could not be used; the message says why. The old pair stays.
    Rejected(String),
}

/// Counts certificate reloads (the webhook's metrics, or nothing).
pub trait ReloadObserver: Send + Sync {
    /// A changed pair was loaded (`true`) or rejected (`false`).
    fn reloaded(&self, loaded: bool);
}

impl ReloadObserver for () {
    fn reloaded(&self, _: bool) {}
}

/// Watches a certificate and key file and keeps the resolver current.
pub struct CertReloader {
    cert_path: PathBuf,
    key_path: PathBuf,
    resolver: Arc<CertResolver>,
    observer: Arc<dyn ReloadObserver>,
    last: std::sync::Mutex<Option<(Vec<u8>, Vec<u8>)>>,
    client_ca: Option<Arc<ClientVerifier>>,
}

impl CertReloader {
    /// A reloader of the pair at `cert_path` and `key_path` into `resolver`, counting reloads in `observer`.
    pub fn new(
        cert_path: PathBuf,
        key_path: PathBuf,
        resolver: Arc<CertResolver>,
        observer: Arc<dyn ReloadObserver>,
    ) -> Self {
        CertReloader {
            cert_path,
            key_path,
            resolver,
            observer,
            last: std::sync::Mutex::new(None),
            client_ca: None,
        }
    }

    /// Also re-reads the client CA file of `client_ca` on every look (counted in the observer
    /// like the serving pair).
    pub fn with_client_ca(mut self, client_ca: Option<Arc<ClientVerifier>>) -> Self {
        self.client_ca = client_ca;
        self
    }

    /// Reads both files (and the client CA file); loads them if they differ from what was last
    /// seen. The outcome is the serving pair's.
    pub fn check(&self) -> Reload {
        if let Some(client_ca) = &self.client_ca {
            client_ca.check_counted(self.observer.as_ref());
        }
        self.check_pair()
    }

    fn check_pair(&self) -> Reload {
        let read = |p: &Path| {
            std::fs::read(p).map_err(|source| TlsError::Read {
                path: p.to_path_buf(),
                source,
            })
        };
        let files = read(&self.cert_path).and_then(|c| read(&self.key_path).map(|k| (c, k)));
        let mut last = self.last.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (cert, key) = match files {
            Ok(files) => files,
            Err(err) => {
                // a missing file mid-rotation: keep serving what we have
                let message = err.to_string();
                if last.is_some() || self.resolver.is_loaded() {
                    tracing::warn!(reason = %message, "certificate files unreadable; keeping the loaded pair");
                }
                return Reload::Rejected(message);
            }
        };
        if last.as_ref().is_some_and(|(c, k)| *c == cert && *k == key) {
            return Reload::Unchanged;
        }
        let outcome = match certified_key(&cert, &key, &self.cert_path, &self.key_path) {
            Ok(ck) => {
                self.resolver.set(ck);
                self.observer.reloaded(true);
                tracing::info!(cert = %self.cert_path.display(), "loaded serving certificate");
                Reload::Loaded
            }
            Err(err) => {
                self.observer.reloaded(false);
                tracing::error!(error = %err, "new serving certificate rejected; keeping the loaded pair");
                Reload::Rejected(err.to_string())
            }
        };
        // remember the bytes either way, so a broken pair is reported once, not every tick
        *last = Some((cert, key));
        outcome
    }

    /// Checks every `interval` until cancelled, telling `loaded` after each look whether a pair is being served.
    pub async fn run(self: Arc<Self>, interval: Duration, cancel: CancellationToken, loaded: impl Fn(bool)) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {
                    let me = self.clone();
                    // file reads are blocking; a join error only means the runtime is shutting down
                    let _ = tokio::task::spawn_blocking(move || me.check()).await;
                    loaded(self.resolver.is_loaded());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodewarden_certs::{Ca, CaConfig, ServingSpec};

    fn der(pem: &str) -> CertificateDer<'static> {
        rustls_pemfile::certs(&mut pem.as_bytes())
            .next()
            .and_then(Result::ok)
            .expect("one certificate")
    }

    #[test]
    fn names_are_read_from_the_common_name_and_the_dns_names() {
        let ca = Ca::generate(&CaConfig {
            common_name: "callers".to_string(),
            validity: Duration::from_secs(3600),
        })
        .expect("ca");
        let client = ca
            .issue_client("kube-apiserver", &["system:masters"], Duration::from_secs(3600))
            .expect("client");
        let names = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(has_allowed_name(
            &der(&client.cert_pem),
            &names(&["KUBE-APISERVER"])
        ));
        assert!(!has_allowed_name(
            &der(&client.cert_pem),
            &names(&["system:masters"])
        ));
        let with_dns = ca
            .issue_serving(&ServingSpec {
                dns_names: vec![
                    "apiserver.example.com".to_string(),
                    "other.example.com".to_string(),
                ],
                ip_addresses: vec![],
                validity: Duration::from_secs(3600),
            })
            .expect("cert");
        assert!(has_allowed_name(
            &der(&with_dns.cert_pem),
            &names(&["other.example.com"])
        ));
        assert!(!has_allowed_name(
            &der(&with_dns.cert_pem),
            &names(&["example.com"])
        ));
        assert!(!has_allowed_name(
            &CertificateDer::from(vec![1, 2, 3]),
            &names(&["x"])
        ));
    }
}
