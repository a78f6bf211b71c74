//! Reading one component's `/metrics`: the kubelet over HTTPS with the service-account token,
//! kube-proxy over plain HTTP on loopback.

use std::path::PathBuf;
use std::time::Duration;

use kube::Client;
use kube::config::{
    AuthInfo, Cluster, Context, KubeConfigOptions, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
};

use nodewarden_api::features::ReadFailure;

use super::GatesArgs;

/// Most bytes of a `/metrics` answer read (a kubelet's is 100–500 KiB); a larger one is an error.
pub const MAX_SCRAPE_BYTES: u64 = 4 * 1024 * 1024;

/// Why a component's `/metrics` could not be read: the message, and what kind of failure it is
/// (a certificate that could not be verified is told apart from the rest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrapeError {
    /// What kind of failure.
    pub reason: ReadFailure,
    /// What went wrong, in words.
    pub message: String,
}

impl std::fmt::Display for ScrapeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<String> for ScrapeError {
    /// A failure of no particular kind.
    fn from(message: String) -> Self {
        ScrapeError {
            reason: ReadFailure::Other,
            message,
        }
    }
}

impl From<&str> for ScrapeError {
    /// A failure of no particular kind.
    fn from(message: &str) -> Self {
        message.to_string().into()
    }
}

/// What kind of failure a request's error is: a TLS certificate the agent could not verify,
/// credentials the component refused, or something else.
pub fn classify(error: &kube::Error) -> ReadFailure {
    if let kube::Error::Api(status) = error
        && matches!(status.code, 401 | 403)
    {
        return ReadFailure::Forbidden;
    }
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(err) = next {
        if matches!(
            err.downcast_ref::<rustls::Error>(),
            Some(rustls::Error::InvalidCertificate(_))
        ) {
            return ReadFailure::CertificateNotVerified;
        }
        // an io::Error's source() is the source of the error it wraps, skipping that error
        // itself (and the TLS error comes wrapped twice): step into the wrapped one instead
        next = match err.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
            Some(inner) => Some(inner),
            None => err.source(),
        };
    }
    ReadFailure::Other
}

/// How the kubelet's serving certificate is verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeletTrust {
    /// Against the CA bundle in this file.
    Ca(PathBuf),
    /// Against the kubelet's own certificate.
    Pinned(PinnedCertificate),
    /// Not at all.
    Insecure,
}

/// The kubelet's own serving certificate, read from its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinnedCertificate {
    /// Every certificate of the file, DER: the roots the kubelet is verified against.
    pub certificates: Vec<Vec<u8>>,
    /// The first certificate's first subject alternative name (DNS name or IP): the name the
    /// connection is verified for.
    pub server_name: String,
    /// Where it was read from.
    pub file: PathBuf,
}

/// Reads one component's `/metrics`.
pub struct Scraper {
    client: Client,
    path: String,
}

impl Scraper {
    /// The kubelet at `args.kubelet_url()` with the token, verified as `trust` says.
    pub async fn kubelet(args: &GatesArgs, trust: &KubeletTrust) -> Result<Self, String> {
        let url = args.kubelet_url();
        let cluster = Cluster {
            server: Some(url.clone()),
            insecure_skip_tls_verify: Some(matches!(trust, KubeletTrust::Insecure)),
            certificate_authority: match trust {
                KubeletTrust::Ca(path) => Some(path.display().to_string()),
                _ => None,
            },
            ..Default::default()
        };
        let user = AuthInfo {
            token_file: Some(args.kubelet_token_file.display().to_string()),
            ..Default::default()
        };
        let adjust = |config: &mut kube::Config| match trust {
            KubeletTrust::Ca(_) => {}
            // Without roots of its own, kube's client falls back to the system's trust store,
            // and an image with none (the agent's is `FROM scratch`) fails before it connects,
            // even though nothing is verified. An empty set of roots keeps it from looking.
            KubeletTrust::Insecure => config.root_cert = Some(Vec::new()),
            KubeletTrust::Pinned(pinned) => {
                config.root_cert = Some(pinned.certificates.clone());
                config.tls_server_name = Some(pinned.server_name.clone());
            }
        };
        Self::build(&url, cluster, Some(user), "/metrics", adjust).await
    }

    /// kube-proxy at its full metrics URL, without credentials.
    pub async fn kube_proxy(url: &str) -> Result<Self, String> {
        let uri: http::Uri = url.parse().map_err(|e| {
            format!("--kube-proxy-metrics-url {url:?}: {e} (expected e.g. http://127.0.0.1:10249/metrics)")
        })?;
        let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
            return Err(format!(
                "--kube-proxy-metrics-url {url:?} needs a scheme and a host (e.g. http://127.0.0.1:10249/metrics)"
            ));
        };
        let base = format!("{scheme}://{authority}");
        let path = if uri.path().is_empty() {
            "/metrics"
        } else {
            uri.path()
        };
        let cluster = Cluster {
            server: Some(base.clone()),
            ..Default::default()
        };
        Self::build(&base, cluster, None, path, |_| {}).await
    }

    async fn build(
        url: &str,
        cluster: Cluster,
        user: Option<AuthInfo>,
        path: &str,
        adjust: impl FnOnce(&mut kube::Config),
    ) -> Result<Self, String> {
        let kubeconfig = Kubeconfig {
            clusters: vec![NamedCluster {
                name: "target".into(),
                cluster: Some(cluster),
                other: Default::default(),
            }],
            auth_infos: vec![NamedAuthInfo {
                name: "agent".into(),
                auth_info: Some(user.unwrap_or_default()),
                other: Default::default(),
            }],
            contexts: vec![NamedContext {
                name: "target".into(),
                context: Some(Context {
                    cluster: "target".into(),
                    user: Some("agent".into()),
                    ..Default::default()
                }),
                other: Default::default(),
            }],
            current_context: Some("target".into()),
            ..Default::default()
        };
        let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        adjust(&mut config);
        config.connect_timeout = Some(Duration::from_secs(5));
        config.read_timeout = Some(Duration::from_secs(10));
        let client = Client::try_from(config).map_err(|e| format!("{url}: {e}"))?;
        Ok(Scraper {
            client,
            path: path.to_string(),
        })
    }

    /// The exposition text, or why it could not be read.
    pub async fn scrape(&self) -> Result<String, ScrapeError> {
        let request = http::Request::get(self.path.as_str())
            .body(Vec::new())
            .map_err(|e| ScrapeError::from(e.to_string()))?;
        let body = self
            .client
            .request_stream(request)
            .await
            .map_err(|e| ScrapeError {
                reason: classify(&e),
                message: format!("GET {}: {e}", self.path),
            })?;
        read_bounded(body, MAX_SCRAPE_BYTES)
            .await
            .map_err(|e| ScrapeError::from(format!("GET {}: {e}", self.path)))
    }
}

/// Reads at most `limit` bytes of UTF-8 text; more is an error that names the limit.
pub async fn read_bounded(body: impl futures::AsyncRead + Unpin, limit: u64) -> Result<String, String> {
    use futures::AsyncReadExt;
    let mut bytes = Vec::new();
    body.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .await
        .map_err(|e| format!("reading the body: {e}"))?;
    if bytes.len() as u64 > limit {
        return Err(format!(
            "the metrics text is larger than {limit} bytes; nodewarden reads at most that much"
        ));
    }
    String::from_utf8(bytes).map_err(|e| format!("the metrics text is not UTF-8: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_body_over_the_limit_is_a_clear_error_and_one_at_the_limit_is_read() {
        let at_limit = vec![b'#'; 1024];
        let read = read_bounded(futures::io::Cursor::new(at_limit), 1024).await;
        assert_eq!(read.map(|t| t.len()), Ok(1024));
        let over = vec![b'#'; 1025];
        let err = read_bounded(futures::io::Cursor::new(over), 1024)
            .await
            .expect_err("over the limit");
        assert!(err.contains("larger than 1024 bytes"), "{err}");
    }

    #[tokio::test]
    async fn a_body_that_is_not_utf8_is_an_error() {
        let err = read_bounded(futures::io::Cursor::new(vec![b'a', 0xff, b'b']), 1024)
            .await
            .expect_err("not UTF-8");
        assert!(err.contains("not UTF-8"), "{err}");
    }
}
