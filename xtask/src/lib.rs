//! Project tasks (`cargo xtask <task>`) and what other crates of the workspace reuse from them:
//! [`image`] writes nodewarden's container images and the test images of the tests crate;
//! [`release`] packages a release (chart, images, SBOMs, kubectl plugin, checksums).

pub mod image;
pub mod release;
