//! nodewarden-runtime: what the webhook and the agent share at run time, so both binaries start,
//! log, report readiness and stop the same way.
//!
//! - [`duration`]: the one duration syntax of every flag (humantime: `500ms`, `10s`, `1m`, `24h`),
//! - [`telemetry`]: the global tracing subscriber (JSON or text),
//! - [`admin`]: the plain-HTTP admin server (`/livez`, `/readyz` from named [`admin::Readiness`]
//!   conditions, `/metrics`),
//! - [`signals`]: a cancellation token for SIGTERM and SIGINT,
//! - [`client`]: the API server client and the backoff of its retries,
//! - [`discovery`]: what the API server serves that the update modes lean on (`pods/resize`),
//! - [`events`]: Events on the objects acted on (one publisher, notes kept within the API's limit),
//! - [`process`]: the standard `process_*` metrics (CPU, memory, open files, threads, start time),
//! - `testing` (feature `test-util`, for tests only): free ports for the programs tests start.

#![warn(missing_docs)]

pub mod admin;
pub mod client;
pub mod discovery;
pub mod duration;
pub mod events;
pub mod process;
pub mod signals;
pub mod telemetry;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// The default address of a server flag on `port`: every interface inside a Kubernetes pod
/// (the kubelet sets `KUBERNETES_SERVICE_HOST` in every container), loopback when run by hand
/// elsewhere, so a binary started on a workstation is not reachable from the network unless
/// told so with the flag.
pub fn default_bind(port: u16) -> SocketAddr {
    bind_for(port, std::env::var_os("KUBERNETES_SERVICE_HOST").is_some())
}

/// [`default_bind`] for a process that is (`in_cluster`) or is not in a pod.
pub fn bind_for(port: u16, in_cluster: bool) -> SocketAddr {
    let ip = if in_cluster {
        Ipv4Addr::UNSPECIFIED
    } else {
        Ipv4Addr::LOCALHOST
    };
    SocketAddr::new(IpAddr::V4(ip), port)
}

#[cfg(test)]
mod tests {
    #[test]
    fn servers_listen_everywhere_in_a_pod_and_on_loopback_elsewhere() {
        assert_eq!(super::bind_for(8443, true).to_string(), "0.0.0.0:8443");
        assert_eq!(super::bind_for(8080, false).to_string(), "127.0.0.1:8080");
    }
}
