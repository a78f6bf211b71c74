//! The images the real-node tier runs: nodewarden's own (webhook, agent) and the test image
//! (`nodewarden/testbox`: the pod sandbox and the log-shipper-like workload).

use std::path::PathBuf;

use anyhow::{Result, bail};

/// The image archives of one test run and their references.
#[derive(Debug, Clone)]
pub struct TestImages {
    pub webhook: PathBuf,
    pub agent: PathBuf,
    pub testbox: PathBuf,
    pub tag: String,
}

impl TestImages {
    pub fn archives(&self) -> Vec<PathBuf> {
        vec![self.webhook.clone(), self.agent.clone(), self.testbox.clone()]
    }

    pub fn testbox_ref(&self) -> String {
        "docker.io/nodewarden/testbox:test".to_string()
    }

    /// `--set` arguments for helm: the chart's images with `pullPolicy: Never`.
    pub fn helm_set_args(&self) -> Vec<String> {
        vec![
            "--set".to_string(),
            "webhook.image.pullPolicy=Never".to_string(),
            "--set".to_string(),
            "agent.image.pullPolicy=Never".to_string(),
        ]
    }
}

/// Builds the three images (scratch: from NODEWARDEN_TEST_IMAGES).
pub async fn build_test_images() -> Result<TestImages> {
    let Some(dir) = std::env::var_os("NODEWARDEN_TEST_IMAGES") else {
        bail!("NODEWARDEN_TEST_IMAGES");
    };
    let dir = PathBuf::from(dir);
    Ok(TestImages {
        webhook: dir.join("webhook.tar"),
        agent: dir.join("agent.tar"),
        testbox: dir.join("testbox.tar"),
        tag: "0.1.0".to_string(),
    })
}

/// One image: its archive and the reference containerd knows it by after import.
#[derive(Debug, Clone)]
pub struct Image {
    pub archive: PathBuf,
    pub reference: String,
}

/// The test image alone.
pub async fn build_testbox() -> Result<Image> {
    let all = build_test_images().await?;
    Ok(Image {
        reference: all.testbox_ref(),
        archive: all.testbox,
    })
}
