//! nodewarden-history: container usage history read from Prometheus, bounded.
//!
//! The kubelet's cAdvisor series every cluster scrapes (`container_cpu_usage_seconds_total`, a
//! counter, and `container_memory_working_set_bytes`, a gauge) are read over a window with
//! `query_range`, the way the VPA recommender's Prometheus history provider reads them
//! (`pkg/recommender/input/history/history_provider.go`): CPU as `rate()` of the counter, which
//! handles counter resets (a restarted container's counter starting again from 0), memory as the
//! working set, one sample per step, per namespace, pod and container, without the pod-level
//! (`container=""`) and pause (`container="POD"`) series. Where it departs from VPA, and why:
//! docs/history.md.
//!
//! Every request is bounded ([`Limits`]): a timeout per query (also sent to Prometheus as its
//! `timeout`), at most [`Limits::max_points_per_series`] steps per query (longer windows are
//! paged by time), at most [`Limits::max_series`] series per answer, and at most
//! [`Limits::max_response_bytes`] per answer. Nothing here retries: a caller that wants backoff
//! (the agent's seeding, its `rightsizing::seed`) wraps the reads.
//!
//! Shared by `kubectl nodewarden report --prometheus` and the agent's seeding; the
//! samples go into the estimator (`nodewarden-estimator`), which this crate does not know.

#![warn(missing_docs)]

pub mod cadvisor;
mod client;
pub mod kube_state_metrics;
pub mod usage;

use std::path::PathBuf;
use std::time::Duration;

pub use client::Prometheus;

/// Where Prometheus is and how to authenticate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Base URL of the Prometheus HTTP API, `http://` or `https://`, with a path prefix when
    /// Prometheus serves under one (`https://example/prometheus`); `/api/v1/...` is appended.
    pub url: String,
    /// A file holding a bearer token, sent as `Authorization: Bearer …`. It is read again for
    /// every query, so a rotated token is picked up.
    pub bearer_token_file: Option<PathBuf>,
    /// A PEM file of CA certificates to trust for `https://`, instead of the system's roots.
    pub ca_file: Option<PathBuf>,
}

/// The bounds of every query. The defaults are documented in docs/history.md.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// How long one query may take, from connecting to the end of the answer (30 s).
    pub query_timeout: Duration,
    /// Most steps one query asks for per series (10 000; Prometheus itself refuses more than
    /// 11 000). A longer window is read in pages of this many steps.
    pub max_points_per_series: usize,
    /// Most series one answer may hold (2 000). More is an error that names the query: narrow it
    /// (`--namespace`, `--daemonset`) or raise the limit.
    pub max_series: usize,
    /// Most points (series × steps) one answer may hold (2 000 000): pages are shortened so that
    /// `max_series` series fit in it.
    pub max_points_per_query: usize,
    /// Most bytes of one answer (256 MiB).
    pub max_response_bytes: usize,
    /// Most points one [`Prometheus::query_range`] may gather over all its pages: what it holds
    /// at its end, 16 bytes a point. Unbounded by default (the report: `max_series` series of the
    /// window's steps); the agent's seeding bounds it so that a long window fits its memory.
    pub max_points_per_read: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            query_timeout: Duration::from_secs(30),
            max_points_per_series: 10_000,
            max_series: 2_000,
            max_points_per_query: 2_000_000,
            max_response_bytes: 256 << 20,
            max_points_per_read: usize::MAX,
        }
    }
}

impl Limits {
    /// Steps per page: at most `max_points_per_series`, and few enough that `max_series` series
    /// fit in `max_points_per_query`; at least 1.
    pub fn steps_per_page(&self) -> usize {
        let by_query = self.max_points_per_query / self.max_series.max(1);
        self.max_points_per_series.min(by_query).max(1)
    }
}

/// What went wrong talking to Prometheus. Every message names the URL or the query.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The URL is not an `http(s)://` URL.
    #[error("--prometheus {url:?} is not a usable URL: {reason}")]
    BadUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The token or CA file could not be read, or holds nothing usable.
    #[error("{what} {path}: {reason}")]
    File {
        /// Which file (`bearer token file`, `CA file`).
        what: &'static str,
        /// Its path.
        path: String,
        /// Why it is not usable.
        reason: String,
    },
    /// No connection (refused, no route, name unknown, TLS handshake failed).
    #[error("cannot reach Prometheus at {url}: {reason}")]
    Unreachable {
        /// The base URL.
        url: String,
        /// The transport's error, with its causes.
        reason: String,
    },
    /// The query took longer than [`Limits::query_timeout`].
    #[error(
        "Prometheus at {url} did not answer within {timeout:?} (query {query}); raise --prometheus-timeout or shorten --window"
    )]
    Timeout {
        /// The base URL.
        url: String,
        /// The limit.
        timeout: Duration,
        /// The query.
        query: String,
    },
    /// 401 or 403.
    #[error(
        "Prometheus at {url} refused the query: HTTP {status}{}; give a bearer token with --prometheus-token-file",
        detail_suffix(detail)
    )]
    Unauthorized {
        /// The base URL.
        url: String,
        /// 401 or 403.
        status: u16,
        /// The start of the answer's body, if any.
        detail: String,
    },
    /// Prometheus answered with an error (bad query, its own limits, overloaded).
    #[error("Prometheus at {url} answered HTTP {status} to {query}: {detail}")]
    Query {
        /// The base URL.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The query.
        query: String,
        /// Prometheus's `errorType: error`, or the start of the body.
        detail: String,
    },
    /// The answer was not the JSON of Prometheus's HTTP API, or larger than allowed.
    #[error("Prometheus at {url} sent an answer that cannot be read ({query}): {reason}")]
    BadAnswer {
        /// The base URL.
        url: String,
        /// The query.
        query: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An answer larger than [`Limits::max_response_bytes`]: refused as it arrives, before it
    /// is held whole.
    #[error(
        "Prometheus at {url} sent an answer larger than {limit} bytes to {query}; narrow the query or \
         shorten --window"
    )]
    TooLarge {
        /// The base URL.
        url: String,
        /// The query.
        query: String,
        /// The limit, in bytes.
        limit: usize,
    },
    /// More points over all pages of one query than [`Limits::max_points_per_read`].
    #[error(
        "the query {query} returned more than {limit} points over the window; narrow it or shorten --window"
    )]
    TooManyPoints {
        /// The query.
        query: String,
        /// The limit.
        limit: usize,
    },
    /// More series than [`Limits::max_series`].
    #[error(
        "the query {query} returned {count} series, more than the limit of {limit}; narrow it \
         (--namespace, --daemonset) or raise --max-series"
    )]
    TooManySeries {
        /// The query.
        query: String,
        /// Series in the answer.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// A series the history needs is not in Prometheus at all over the window.
    #[error(
        "Prometheus at {url} has no {series} series between {start} and {end} (Unix seconds): it needs the \
         kubelet's cAdvisor metrics (/metrics/cadvisor) scraped"
    )]
    MissingSeries {
        /// The base URL.
        url: String,
        /// The series' name.
        series: String,
        /// Start of the window, in seconds since the Unix epoch.
        start: i64,
        /// End of the window, in seconds since the Unix epoch.
        end: i64,
    },
}

/// An error and its causes on one line, each cause after a `: ` unless the text before already
/// holds it (clients often repeat their cause in their own message).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

fn detail_suffix(detail: &str) -> String {
    if detail.is_empty() {
        String::new()
    } else {
        format!(" ({detail})")
    }
}

/// One series of a `query_range` answer: its labels and its `(milliseconds since the Unix
/// epoch, value)` points, oldest first. Points whose value is not a finite number are left out.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Series {
    /// The series' labels.
    pub labels: std::collections::BTreeMap<String, String>,
    /// `(time in ms, value)`, oldest first.
    pub points: Vec<(i64, f64)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|l| l as _)
        }
    }

    #[test]
    fn an_error_chain_names_each_cause_once() {
        let e = Layer(
            "client error (Connect)",
            Some(Box::new(Layer(
                "tcp connect error: Connection refused",
                Some(Box::new(Layer("Connection refused", None))),
            ))),
        );
        assert_eq!(
            error_chain(&e),
            "client error (Connect): tcp connect error: Connection refused"
        );
    }
}
