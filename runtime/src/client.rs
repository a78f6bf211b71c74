//! The API server client, and how calls to it are retried.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use backon::BackoffBuilder;

/// A client for the API server from `kubeconfig`, else in-cluster or `$KUBECONFIG`.
/// Nothing is sent to the API server yet.
pub async fn kube_client(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Client> {
    let config = kube_config(kubeconfig).await?;
    kube::Client::try_from(config).context("building the API server client")
}

/// A client that answers every status as it comes: kube's client otherwise retries 429, 503
/// and 504 itself (up to 15 times, backing off for minutes), which is wrong where a 429 is an
/// answer (an eviction a PodDisruptionBudget refuses).
pub fn client_without_retries(mut config: kube::Config) -> anyhow::Result<kube::Client> {
    config.default_retry = false;
    kube::Client::try_from(config).context("building the API server client")
}

/// The API server settings from `kubeconfig`, else in-cluster or `$KUBECONFIG`.
pub async fn kube_config(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Config> {
    let config = match kubeconfig {
        Some(path) => {
            // the file's own error first, in one line: kube's error names the path quoted twice
            // and then repeats the system's message
            std::fs::File::open(path)
                .map_err(|e| anyhow::anyhow!("reading kubeconfig {}: {e}", path.display()))?;
            // read_from also resolves relative file names against the kubeconfig's folder
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("using kubeconfig {}", path.display()))?
        }
        None => {
            if let Some(why) = no_credentials_anywhere() {
                anyhow::bail!("{why}");
            }
            kube::Config::infer().await.context(
                "finding API server credentials (in-cluster service account, $KUBECONFIG or ~/.kube/config)",
            )?
        }
    };
    Ok(config)
}

/// Why no credentials can be found, in one line, when none of the places `Config::infer` looks
/// at is there: not in a pod (no `KUBERNETES_SERVICE_HOST`), no `$KUBECONFIG`, no
/// `~/.kube/config`. `None` when one of them is (then infer's own error says what is wrong).
fn no_credentials_anywhere() -> Option<String> {
    let set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
    if set("KUBERNETES_SERVICE_HOST") || set("KUBECONFIG") {
        return None;
    }
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
    if home.as_ref().is_some_and(|h| h.join(".kube/config").exists()) {
        return None;
    }
    Some(
        "no API server credentials: not running in a pod (KUBERNETES_SERVICE_HOST is not set), \
         $KUBECONFIG is not set and there is no ~/.kube/config; pass --kubeconfig <file>"
            .to_string(),
    )
}

/// Delays between retries of API server calls: exponential from 500 ms to 30 s, with jitter,
/// without end.
pub fn retry_backoff() -> impl Iterator<Item = Duration> + Send {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(500))
        .with_max_delay(Duration::from_secs(30))
        .with_jitter()
        .without_max_times()
        .build()
}
