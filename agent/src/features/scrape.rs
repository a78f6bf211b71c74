//! Reading one component's `/metrics`: the kubelet over HTTPS with the service-account token,
//! kube-proxy over plain HTTP on loopback.

use std::time::Duration;

use kube::Client;
use kube::config::{
    AuthInfo, Cluster, Context, KubeConfigOptions, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
};

use super::GatesArgs;

/// Most bytes of a `/metrics` answer read (a kubelet's is 100–500 KiB); a larger one is an error.
pub const MAX_SCRAPE_BYTES: u64 = 4 * 1024 * 1024;

/// Reads one component's `/metrics`.
pub struct Scraper {
    client: Client,
    path: String,
}

impl Scraper {
    /// The kubelet at `args.kubelet_url()` with the token and CA (or no verification).
    pub async fn kubelet(args: &GatesArgs) -> Result<Self, String> {
        let url = args.kubelet_url();
        let cluster = Cluster {
            server: Some(url.clone()),
            insecure_skip_tls_verify: Some(args.kubelet_insecure_skip_verify),
            certificate_authority: (!args.kubelet_insecure_skip_verify)
                .then(|| args.kubelet_ca_file.display().to_string()),
            ..Default::default()
        };
        let user = AuthInfo {
            token_file: Some(args.kubelet_token_file.display().to_string()),
            ..Default::default()
        };
        Self::build(&url, cluster, Some(user), "/metrics").await
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
        Self::build(&base, cluster, None, path).await
    }

    async fn build(url: &str, cluster: Cluster, user: Option<AuthInfo>, path: &str) -> Result<Self, String> {
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
        config.connect_timeout = Some(Duration::from_secs(5));
        config.read_timeout = Some(Duration::from_secs(10));
        let client = Client::try_from(config).map_err(|e| format!("{url}: {e}"))?;
        Ok(Scraper {
            client,
            path: path.to_string(),
        })
    }

    /// The exposition text, or why it could not be read.
    pub async fn scrape(&self) -> Result<String, String> {
        let request = http::Request::get(self.path.as_str())
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        let body = self
            .client
            .request_stream(request)
            .await
            .map_err(|e| format!("GET {}: {e}", self.path))?;
        read_bounded(body, MAX_SCRAPE_BYTES)
            .await
            .map_err(|e| format!("GET {}: {e}", self.path))
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
