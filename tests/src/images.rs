//! The images the real-node tier and the demo run: nodewarden's own two, exactly as
//! `cargo xtask image` builds them (static release binaries, FROM scratch), and the test image
//! `nodewarden/testbox` (the `nodewarden-testbox` package: the pod sandbox, and the log-shipper-like
//! burner), built the same way. Nothing is pulled: the archives are imported into each node's
//! containerd, and the chart is installed with `pullPolicy: Never`.
//!
//! nodewarden's archives hold both platforms, linux/amd64 and linux/arm64, as users get them:
//! the nodes (amd64) import the multi-platform archives, so a real-node run shows that
//! containerd and the kubelet pick the amd64 image out of the index. This machine's platform is
//! built exactly as a release builds it (its profiles, whole-program LTO); the other one under
//! `image-check` (`xtask::image::CHECK_PROFILE`: the same code without LTO, both programs in
//! one cargo run), which is enough for `tests/tests/images.rs` to run its programs under
//! qemu-user and saves minutes of CI per program. `cargo xtask release` builds every platform with
//! the real profiles. The test image stays amd64-only.
//!
//! The first build compiles the release binaries (minutes on two cores); later ones find them
//! current in seconds.

use std::path::PathBuf;

use anyhow::{Context, Result};
use xtask::image::{self, AGENT, BuildOptions, WEBHOOK};

/// The test image's name and the package of its program.
pub const TESTBOX: &str = "nodewarden/testbox";
const TESTBOX_PACKAGE: &str = "nodewarden-testbox";

/// One image: its archive and the reference containerd knows it by after import.
#[derive(Debug, Clone)]
pub struct Image {
    pub archive: PathBuf,
    pub reference: String,
}

/// The three images of a real-node run.
#[derive(Debug, Clone)]
pub struct TestImages {
    pub webhook: Image,
    pub agent: Image,
    pub testbox: Image,
}

impl TestImages {
    /// The archives, to import into every node.
    pub fn archives(&self) -> Vec<PathBuf> {
        [&self.webhook, &self.agent, &self.testbox]
            .iter()
            .map(|i| i.archive.clone())
            .collect()
    }

    /// The test image's reference (also the nodes' sandbox image).
    pub fn testbox_ref(&self) -> String {
        self.testbox.reference.clone()
    }

    /// `--set` arguments for helm: the chart's default image references (which these archives
    /// carry) with `pullPolicy: Never`, so nothing is pulled.
    pub fn helm_set_args(&self) -> Vec<String> {
        ["webhook.image.pullPolicy=Never", "agent.image.pullPolicy=Never"]
            .iter()
            .flat_map(|v| ["--set".to_string(), v.to_string()])
            .collect()
    }
}

/// The image build's options of the tests: the repository's, the other platform under
/// [`image::CHECK_PROFILE`].
pub fn options() -> Result<BuildOptions> {
    let mut opts = BuildOptions::for_repo(&image::repo_root()).context("image build options")?;
    opts.cross_profile = Some(image::CHECK_PROFILE.to_string());
    Ok(opts)
}

/// Builds nodewarden's two images and the test image.
pub async fn build_test_images() -> Result<TestImages> {
    tokio::task::spawn_blocking(|| -> Result<TestImages> {
        let opts = options()?;
        let built = image::build_nodewarden_images(&opts).context("building nodewarden's images")?;
        let find = |component: image::Component| -> Result<Image> {
            let name = component.image_name();
            built
                .iter()
                .find(|b| b.reference.contains(&name))
                .map(|b| Image {
                    archive: b.archive.clone(),
                    reference: b.reference.clone(),
                })
                .with_context(|| format!("no {name} image was built"))
        };
        Ok(TestImages {
            webhook: find(WEBHOOK)?,
            agent: find(AGENT)?,
            testbox: testbox(&opts)?,
        })
    })
    .await?
}

/// The test image alone.
pub async fn build_testbox() -> Result<Image> {
    tokio::task::spawn_blocking(|| testbox(&options()?)).await?
}

fn testbox(opts: &BuildOptions) -> Result<Image> {
    let binary = image::build_static_binary(opts, TESTBOX_PACKAGE, TESTBOX_PACKAGE, "release")
        .context("building the test image's program")?;
    let mut spec = image::binary_spec(opts, TESTBOX, &binary);
    // as a pod sandbox it runs with no arguments: pause
    spec.args = vec!["pause".to_string()];
    let archive = opts.out_dir.join("nodewarden-testbox.oci.tar");
    let built = image::write_archive(&spec, &archive).context("writing the test image")?;
    Ok(Image {
        archive: built.archive,
        reference: built.reference,
    })
}
