//! Serving certificates that reload without a restart.
//!
//! The files are re-read on an interval and compared with what is loaded, so every way of
//! replacing them works: a plain write, a rename, and the kubelet's atomic swap of the `..data`
//! symlink in a mounted Secret (which file-write watchers miss). A new pair that does not parse,
//! or whose key does not match its certificate, is logged and the old pair kept.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use rustls::ServerConfig;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} holds no PEM certificate (expected -----BEGIN CERTIFICATE-----)")]
    NoCertificate { path: PathBuf },
    #[error("{path} holds no PEM private key (expected PKCS#8, PKCS#1 or SEC1)")]
    NoKey { path: PathBuf },
    #[error("{path}: {message}")]
    Pem { path: PathBuf, message: String },
    #[error("the private key cannot be used: {0}")]
    Key(rustls::Error),
    #[error("the private key does not belong to the certificate: {0}")]
    Mismatch(rustls::Error),
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

/// Hands rustls whatever pair is current.
#[derive(Debug, Default)]
pub struct CertResolver {
    current: ArcSwapOption<CertifiedKey>,
}

impl CertResolver {
    /// Serves `key` from now on.
    pub fn set(&self, key: CertifiedKey) {
        self.current.store(Some(Arc::new(key)));
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

/// TLS 1.2 and 1.3 only, ALPN `h2` then `http/1.1`, certificates from the resolver.
pub fn server_config(resolver: Arc<CertResolver>) -> Result<Arc<ServerConfig>, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
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
        }
    }

    /// Reads both files; loads them if they differ from what was last seen.
    pub fn check(&self) -> Reload {
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
