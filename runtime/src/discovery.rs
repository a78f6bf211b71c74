//! What the cluster serves that nodewarden's update modes lean on, read from API discovery: both
//! binaries ask the same question and say the same thing about the answer.
//!
//! In-place resize is a `pods/resize` subresource (KEP-1287). Kubernetes serves it from 1.32 when
//! the `InPlacePodVerticalScaling` feature gate is on (alpha, off by default, in 1.32; beta, on by
//! default, in 1.33 and 1.34; GA in 1.35). Before 1.32 the alpha feature changed a pod's spec
//! directly; nodewarden resizes only through the subresource.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList;
use kube::Client;

/// How long an answer is used before discovery is asked again (an upgrade or a gate turned on
/// is noticed within this time).
pub const RESIZE_SUPPORT_MAX_AGE: Duration = Duration::from_secs(600);
/// A discovery call gives up after this long.
const CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// Whether the API server resizes pods in place, and its version (`gitVersion`, e.g. `v1.30.14`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResizeSupport {
    /// The API server serves `pods/resize`.
    Served {
        /// The API server's version.
        version: String,
    },
    /// It does not.
    Absent {
        /// The API server's version.
        version: String,
    },
}

impl ResizeSupport {
    /// The answer from the core group's resource list (`GET /api/v1`) and the server's version.
    pub fn from_discovery(core_v1: &APIResourceList, version: &str) -> Self {
        let version = version.to_string();
        if core_v1.resources.iter().any(|r| r.name == "pods/resize") {
            ResizeSupport::Served { version }
        } else {
            ResizeSupport::Absent { version }
        }
    }

    /// Whether a pod can be resized in place.
    pub fn served(&self) -> bool {
        matches!(self, ResizeSupport::Served { .. })
    }

    /// The API server's version.
    pub fn version(&self) -> &str {
        match self {
            ResizeSupport::Served { version } | ResizeSupport::Absent { version } => version,
        }
    }

    /// One sentence on why a resize is or is not possible, naming the version and the gate.
    pub fn explain(&self) -> String {
        match self {
            ResizeSupport::Served { version } => {
                format!("the API server (Kubernetes {version}) serves pods/resize")
            }
            ResizeSupport::Absent { version } => match minor(version) {
                Some(m) if m < 32 => format!(
                    "Kubernetes {version} has no pods/resize subresource (in-place resize \
                     through it came in 1.32 behind the InPlacePodVerticalScaling feature gate, \
                     on by default from 1.33)"
                ),
                _ => format!(
                    "the API server (Kubernetes {version}) does not serve pods/resize: its \
                     InPlacePodVerticalScaling feature gate is off (on by default from 1.33)"
                ),
            },
        }
    }
}

/// The minor version of a `gitVersion` such as `v1.30.14` or `v1.38.0-beta.0`.
pub fn minor(version: &str) -> Option<u32> {
    let rest = version.trim_start_matches('v');
    let mut parts = rest.split('.');
    if parts.next()? != "1" {
        return None;
    }
    let digits: String = parts.next()?.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Asks the API server whether it serves `pods/resize` (two GETs: `/version` and `/api/v1`).
pub async fn resize_support(client: &Client) -> Result<ResizeSupport, kube::Error> {
    let ask = async {
        let version = client.apiserver_version().await?.git_version;
        let core = client.list_core_api_resources("v1").await?;
        Ok(ResizeSupport::from_discovery(&core, &version))
    };
    match tokio::time::timeout(CALL_TIMEOUT, ask).await {
        Ok(answer) => answer,
        Err(_) => Err(kube::Error::Service(
            format!("API discovery did not answer within {}s", CALL_TIMEOUT.as_secs()).into(),
        )),
    }
}

/// After a failed discovery call, how long the last answer is used before asking again (so an
/// API server that does not answer costs one call a minute, not one per pod and round).
pub const RESIZE_SUPPORT_RETRY: Duration = Duration::from_secs(60);

/// The last answer of [`resize_support`]; asks again [`RESIZE_SUPPORT_MAX_AGE`] after an answer
/// and [`RESIZE_SUPPORT_RETRY`] after a failure. When discovery fails, the last answer stands (none
/// at first: then resize is assumed served, and a refused resize is handled where it happens).
#[derive(Debug, Default)]
pub struct ResizeSupportCache {
    last: Option<ResizeSupport>,
    /// When to ask again (`None`: never asked).
    next: Option<tokio::time::Instant>,
}

/// What [`ResizeSupportCache::get`] read.
#[derive(Debug)]
pub struct Read {
    /// The answer (`None`: never read).
    pub support: Option<ResizeSupport>,
    /// The answer differs from the one before it (or is the first): say it once.
    pub changed: bool,
}

impl ResizeSupportCache {
    /// The answer, asked again when it is due (see the type).
    pub async fn get(&mut self, client: &Client) -> Read {
        let now = tokio::time::Instant::now();
        if !self.due(now) {
            return Read {
                support: self.last.clone(),
                changed: false,
            };
        }
        let answer = resize_support(client).await;
        if let Err(err) = &answer {
            tracing::warn!(error = %err, "asking the API server whether it serves pods/resize failed; using the last answer, asking again in a minute");
        }
        self.record(tokio::time::Instant::now(), answer.ok())
    }

    /// Whether the answer is to be asked again at `now`.
    fn due(&self, now: tokio::time::Instant) -> bool {
        self.next.is_none_or(|next| now >= next)
    }

    /// Keeps what discovery answered at `now` (`None`: it failed) and says what to use.
    fn record(&mut self, now: tokio::time::Instant, answer: Option<ResizeSupport>) -> Read {
        match answer {
            Some(support) => {
                let changed = self.last.as_ref() != Some(&support);
                self.last = Some(support.clone());
                self.next = Some(now + RESIZE_SUPPORT_MAX_AGE);
                Read {
                    support: Some(support),
                    changed,
                }
            }
            None => {
                self.next = Some(now + RESIZE_SUPPORT_RETRY);
                Read {
                    support: self.last.clone(),
                    changed: false,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResource;

    fn core(names: &[&str]) -> APIResourceList {
        APIResourceList {
            group_version: "v1".to_string(),
            resources: names
                .iter()
                .map(|n| APIResource {
                    name: n.to_string(),
                    namespaced: true,
                    kind: "Pod".to_string(),
                    singular_name: String::new(),
                    verbs: vec!["patch".to_string()],
                    ..APIResource::default()
                })
                .collect(),
        }
    }

    #[test]
    fn served_when_discovery_lists_pods_resize() {
        let s = ResizeSupport::from_discovery(&core(&["pods", "pods/status", "pods/resize"]), "v1.37.2");
        assert!(s.served());
        assert_eq!(s.version(), "v1.37.2");
    }

    #[test]
    fn absent_names_the_version_and_the_gate() {
        let old = ResizeSupport::from_discovery(&core(&["pods", "pods/status"]), "v1.30.14");
        assert!(!old.served());
        let said = old.explain();
        assert!(
            said.contains("v1.30.14") && said.contains("no pods/resize"),
            "{said}"
        );
        assert!(said.contains("InPlacePodVerticalScaling"), "{said}");
        let gated = ResizeSupport::from_discovery(&core(&["pods"]), "v1.32.13");
        let said = gated.explain();
        assert!(
            said.contains("v1.32.13") && said.contains("gate is off"),
            "{said}"
        );
    }

    #[test]
    fn minor_versions_parse_with_suffixes() {
        assert_eq!(minor("v1.30.14"), Some(30));
        assert_eq!(minor("v1.38.0-beta.0"), Some(38));
        assert_eq!(minor("v1.33.1+k3s1"), Some(33));
        assert_eq!(minor("v1.29"), Some(29));
        assert_eq!(minor("2.0.0"), None);
        assert_eq!(minor(""), None);
    }

    #[test]
    fn a_failed_call_is_retried_after_a_minute_and_an_answer_after_ten() {
        let t0 = tokio::time::Instant::now();
        let mut cache = ResizeSupportCache::default();
        assert!(cache.due(t0), "never asked");
        let failed = cache.record(t0, None);
        assert_eq!((failed.support, failed.changed), (None, false));
        assert!(
            !cache.due(t0 + Duration::from_secs(59)),
            "a failure is not asked again at once"
        );
        assert!(cache.due(t0 + RESIZE_SUPPORT_RETRY));
        let served = ResizeSupport::from_discovery(&core(&["pods/resize"]), "v1.36.3");
        let t1 = t0 + RESIZE_SUPPORT_RETRY;
        let first = cache.record(t1, Some(served.clone()));
        assert!(first.changed, "the first answer is said");
        assert!(!cache.due(t1 + Duration::from_secs(599)));
        assert!(cache.due(t1 + RESIZE_SUPPORT_MAX_AGE));
        // a failure after an answer keeps the answer, unchanged
        let kept = cache.record(t1 + RESIZE_SUPPORT_MAX_AGE, None);
        assert_eq!((kept.support, kept.changed), (Some(served.clone()), false));
        let same = cache.record(t1 + RESIZE_SUPPORT_MAX_AGE * 2, Some(served));
        assert!(!same.changed, "the same answer is not said again");
    }
}
