//! nodewarden's estimator, in one place: what the agent publishes for a node and what
//! `kubectl nodewarden report` prints are computed here, by the same code.
//!
//! - [`histogram`]: VPA's decaying exponential histograms.
//! - [`recommender`]: one container's history on one node (CPU samples, memory peaks, OOM
//!   kills) and its estimate, rule by rule as VPA's recommender.
//! - [`policy`]: what an autoscaler's container policy says (controlled resources,
//!   `minAllowed`, `maxAllowed`).
//! - [`figures`]: the estimate within the policy and the node's allocatable, as one
//!   `NodeRecommendation` entry; nothing before the first measurement.
//! - [`due`]: whether a node's figures are due to be written again.
//! - [`samples`]: samples read from Prometheus, fed into a history as the agent feeds its own.
//!
//! No I/O: the agent reads cgroups and writes to the API server, the plugin reads Prometheus;
//! both hand the numbers to this crate. docs/estimator.md says where it follows VPA and where
//! it departs.

pub mod due;
pub mod figures;
pub mod histogram;
pub mod policy;
pub mod recommender;
pub mod samples;
