//! Project tasks (`cargo xtask <task>`) and what other crates of the workspace reuse from them:
//! [`image`] writes nodewarden's container images and the test images of the tests crate;
//! [`release`] packages a release (chart, images, SBOMs, kubectl plugin, checksums);
//! [`chart_schema`] the Kubernetes schemas in the chart's values schema.

pub mod chart_schema;
pub mod image;
pub mod release;
