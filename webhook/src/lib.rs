//! nodewarden-webhook: the admission server and, in the same process, nodewarden's controllers.
//!
//! One folder per capability, each holding its admission handler, its pure rules, its cache and
//! its controller: [`rightsizing`], [`claims`], [`features`], [`node_reports`],
//! [`certificates`]. Shared by all of them: [`admission`] (the AdmissionReview pipeline and
//! wire types), `watch` (watching the API server into caches), [`controllers`] (leader
//! election), [`server`] (TLS serving), [`crds`] (the `crds apply` command). [`app`] wires them
//! together with [`metrics`];
//! `main.rs` parses flags and calls [`run`].

#![warn(missing_docs)]

pub mod admission;
pub mod app;
pub mod certificates;
pub mod claims;
pub mod config;
pub mod controllers;
pub mod crds;
pub(crate) mod events;
pub mod features;
#[cfg(feature = "loadgen")]
pub mod loadgen;
pub mod metrics;
pub mod node_reports;
pub mod rightsizing;
pub mod server;
pub(crate) mod watch;

pub use app::App;

use tokio_util::sync::CancellationToken;

use crate::config::Config;

/// Builds the [`App`] from `config` and runs it until `shutdown` is cancelled.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    App::new(config)?.run(shutdown).await
}
