//! nodewarden-runtime: what the webhook and the agent share at run time, so both binaries start,
//! log, report readiness and stop the same way.
//!
//! - [`duration`]: the one duration syntax of every flag (humantime: `500ms`, `10s`, `1m`, `24h`),
//! - [`telemetry`]: the global tracing subscriber (JSON or text),
//! - [`admin`]: the plain-HTTP admin server (`/livez`, `/readyz` from named [`admin::Readiness`]
//!   conditions, `/metrics`),
//! - [`signals`]: a cancellation token for SIGTERM and SIGINT,
//! - [`client`]: the API server client and the backoff of its retries,
//! - [`events`]: Events on the objects acted on (one publisher, notes kept within the API's limit).

#![warn(missing_docs)]

pub mod admin;
pub mod client;
pub mod duration;
pub mod events;
pub mod signals;
pub mod telemetry;
