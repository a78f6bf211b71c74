//! A release as users download it, and the README's user path on its files ("Use it on a
//! cluster"): `cargo xtask release` of this machine's platform (into
//! [`xtask::release::host_release_dir`], where the CI prefetch builds it first), checked with
//! `sha256sum -c SHA256SUMS`; the chart's `.tgz` taken out of the chart's OCI layout as a
//! registry client takes it (`helm pull oci://…` after `helm push`); the images' archives, which
//! `crate::registry` pushes as the release workflow does; the plugin unpacked from its archive
//! and run as kubectl runs it.
//!
//! The README's commands are read from the README itself ([`UserPath`]), so the README and the
//! test that walks it cannot drift apart: `cgroupv2_node.rs` runs these very lines.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;
use xtask::image::Target;
use xtask::release::{self, ReleaseOptions};

use crate::images::Image;

/// The README's user path, the lines a user types, with `{version}` for the release's version
/// (the images' tag, the chart's appVersion), `{chart_version}` for the chart's and `{arch}` for
/// the machine's architecture.
pub struct UserPath;

impl UserPath {
    /// Step 1: the chart from the registry the release is published to; every node pulls the
    /// chart's default images from there.
    pub const INSTALL: &str = "helm install nodewarden oci://ghcr.io/nodewarden/charts/nodewarden --version {chart_version} --namespace nodewarden --create-namespace --wait";
    /// Step 3: the plugin's download checked, out of its archive (then on PATH), and the report.
    pub const CHECK: &str = "sha256sum -c --ignore-missing SHA256SUMS";
    pub const UNPACK: &str = "tar -xzf kubectl-nodewarden_{version}_linux_{arch}.tar.gz kubectl-nodewarden";
    pub const REPORT: &str = "kubectl nodewarden report -n logging";
    pub const REPORT_HTML: &str = "kubectl nodewarden report -n logging -o html > report.html";

    /// Every line above, in the README's order.
    pub const LINES: [&str; 5] = [
        Self::INSTALL,
        Self::CHECK,
        Self::UNPACK,
        Self::REPORT,
        Self::REPORT_HTML,
    ];

    /// `line` for this release and architecture.
    pub fn line(line: &str, version: &str, chart_version: &str, arch: &str) -> String {
        line.replace("{version}", version)
            .replace("{chart_version}", chart_version)
            .replace("{arch}", arch)
    }
}

/// The first `sh` block of the README's "Use it on a cluster".
pub fn readme_user_path() -> Result<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let section = text
        .split_once("\n## Use it on a cluster\n")
        .map(|(_, s)| s)
        .context("README.md has no section \"Use it on a cluster\"")?;
    let block = section
        .split_once("```sh\n")
        .and_then(|(_, s)| s.split_once("\n```"))
        .map(|(b, _)| b.to_string())
        .context("README.md's \"Use it on a cluster\" has no sh block")?;
    Ok(block)
}

/// Checks that the README's user path has every line of [`UserPath`] for this checkout's chart
/// (on amd64, as the README writes it), in that order, and returns its DaemonSetAutoscaler (the
/// YAML of its `kubectl apply -f - <<'EOF'`).
pub fn check_readme() -> Result<serde_json::Value> {
    let version = xtask::image::chart_app_version(&xtask::image::repo_root())?;
    check_user_path(&readme_user_path()?, &version, &chart_version()?)
}

/// [`check_readme`] of the user path `block`.
pub fn check_user_path(block: &str, version: &str, chart_version: &str) -> Result<serde_json::Value> {
    let mut from = 0;
    for line in UserPath::LINES {
        let line = UserPath::line(line, version, chart_version, "amd64");
        let at = block[from..].find(&line).with_context(|| {
            format!("the README's user path lacks `{line}` (or has it out of order); it says:\n{block}")
        })?;
        from += at + line.len();
    }
    let yaml = block
        .split_once("kubectl apply -f - <<'EOF'\n")
        .and_then(|(_, s)| s.split_once("\nEOF"))
        .map(|(y, _)| y)
        .context("the README's user path has no `kubectl apply -f - <<'EOF'` … `EOF`")?;
    let autoscaler: serde_json::Value =
        serde_yaml_ng::from_str(yaml).context("the README's DaemonSetAutoscaler is not YAML")?;
    ensure!(
        autoscaler["kind"] == "DaemonSetAutoscaler",
        "the README applies {autoscaler}, not a DaemonSetAutoscaler"
    );
    Ok(autoscaler)
}

/// A release of this machine's platform, as the test found or built it.
#[derive(Debug, Clone)]
pub struct HostRelease {
    pub dir: PathBuf,
    /// The images' tag and the plugin's version (the chart's appVersion).
    pub version: String,
    /// The chart's version.
    pub chart_version: String,
    pub target: Target,
    pub webhook: Image,
    pub agent: Image,
}

impl HostRelease {
    /// `UserPath::line(line)` for this release.
    pub fn line(&self, line: &str) -> String {
        UserPath::line(line, &self.version, &self.chart_version, self.target.arch)
    }

    /// The plugin's archive for this machine.
    pub fn plugin_archive(&self) -> PathBuf {
        self.dir
            .join(release::plugin_archive_name(&self.version, self.target))
    }

    /// The chart's `.tgz` (`nodewarden-<chart version>.tgz`).
    pub fn chart_tgz(&self) -> PathBuf {
        self.dir.join(format!("nodewarden-{}.tgz", self.chart_version))
    }

    /// The chart's OCI layout (`nodewarden-chart-<chart version>.oci.tar`).
    pub fn chart_layout(&self) -> PathBuf {
        self.dir
            .join(format!("nodewarden-chart-{}.oci.tar", self.chart_version))
    }
}

/// `cargo xtask release --platform <this machine's> --out <host_release_dir>`: nothing is built
/// again when the CI prefetch built it already (a release running there is waited for).
pub async fn host_release() -> Result<HostRelease> {
    tokio::task::spawn_blocking(|| -> Result<HostRelease> {
        let root = xtask::image::repo_root();
        let target = Target::host().context("a release for this machine")?;
        let mut opts = ReleaseOptions::for_repo(&root)?;
        opts.build.targets = vec![target];
        opts.out_dir = release::host_release_dir(&opts.build.target_dir, target);
        let released = release::release(&opts).context("cargo xtask release")?;
        let image = |package: &str| -> Result<Image> {
            released
                .images
                .iter()
                .find(|i| i.package == package)
                .map(|i| Image {
                    archive: i.archive.clone(),
                    reference: i.reference.clone(),
                })
                .with_context(|| format!("the release has no {package} image"))
        };
        Ok(HostRelease {
            webhook: image("nodewarden-webhook")?,
            agent: image("nodewarden-agent")?,
            dir: opts.out_dir,
            version: opts.build.tag,
            chart_version: chart_version()?,
            target,
        })
    })
    .await?
}

/// Runs `line` with `sh -c` in `dir`; fails with its output unless it succeeded; returns stdout.
pub fn sh(dir: &Path, line: &str) -> Result<String> {
    let out = Command::new("sh")
        .args(["-c", line])
        .current_dir(dir)
        .output()
        .with_context(|| format!("running `{line}`"))?;
    ensure!(
        out.status.success(),
        "`{line}` in {} failed ({}):\n{}{}",
        dir.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// [`UserPath::CHECK`] in the release's folder: every file it lists says `OK`, and it lists
/// every file of `expected`; returns the files it checked.
pub fn check_sums(release: &HostRelease, expected: &[&Path]) -> Result<Vec<String>> {
    let out = sh(&release.dir, UserPath::CHECK)?;
    let checked: Vec<String> = out
        .lines()
        .filter_map(|l| l.strip_suffix(": OK"))
        .map(str::to_string)
        .collect();
    let listed = std::fs::read_to_string(release.dir.join(release::CHECKSUMS))?
        .lines()
        .count();
    ensure!(
        checked.len() == listed && listed > 0,
        "sha256sum -c checked {} of the {listed} files of SHA256SUMS:\n{out}",
        checked.len()
    );
    for file in expected {
        let name = file
            .file_name()
            .context("a file without a name")?
            .to_string_lossy();
        ensure!(
            checked.iter().any(|c| *c == name),
            "SHA256SUMS does not cover {name}: {checked:?}"
        );
    }
    Ok(checked)
}

/// What a registry client gets for the chart's tag from the chart's OCI layout (the manifest
/// `helm push` uploads): the layout unpacked with `tar -xf` into `work`, `index.json`'s manifest
/// for the tag `version`, each blob's SHA-256 and size checked against its descriptor, the
/// config and the one layer of helm's media types. Writes the layer as
/// `<work>/<name>-<version>.tgz` (as `helm pull` names it) and returns that file.
pub fn chart_from_layout(layout: &Path, version: &str, work: &Path) -> Result<PathBuf> {
    let dir = work.join("chart-layout");
    std::fs::create_dir_all(&dir)?;
    sh(&dir, &format!("tar -xf '{}'", layout.display()))?;
    let read_json = |path: &Path| -> Result<Value> {
        let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_slice(&data).with_context(|| format!("{} is not JSON", path.display()))
    };
    let blob = |desc: &Value| -> Result<Vec<u8>> {
        let digest = desc["digest"].as_str().context("a descriptor without a digest")?;
        let hex = digest
            .strip_prefix("sha256:")
            .with_context(|| format!("{digest} is not a SHA-256 digest"))?;
        let data = std::fs::read(dir.join("blobs/sha256").join(hex))
            .with_context(|| format!("the layout has no blob {digest}"))?;
        ensure!(
            xtask::image::oci::sha256_hex(&data) == hex,
            "blob {digest} does not have that digest"
        );
        ensure!(
            desc["size"].as_u64() == Some(data.len() as u64),
            "blob {digest} is {} bytes, its descriptor says {}",
            data.len(),
            desc["size"]
        );
        Ok(data)
    };
    let layout_file = read_json(&dir.join("oci-layout"))?;
    ensure!(
        layout_file["imageLayoutVersion"] == "1.0.0",
        "oci-layout: {layout_file}"
    );
    let index = read_json(&dir.join("index.json"))?;
    let manifests = index["manifests"]
        .as_array()
        .context("index.json has no manifests")?;
    let tagged = manifests
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == version)
        .with_context(|| format!("index.json names no manifest {version}: {index}"))?;
    let manifest: Value = serde_json::from_slice(&blob(tagged)?)?;
    let config = &manifest["config"];
    ensure!(
        config["mediaType"] == "application/vnd.cncf.helm.config.v1+json",
        "the manifest's config is not helm's: {config}"
    );
    let config: Value = serde_json::from_slice(&blob(config)?)?;
    let layers = manifest["layers"]
        .as_array()
        .context("the manifest has no layers")?;
    let [layer] = layers.as_slice() else {
        bail!(
            "the chart's manifest has {} layers, helm pushes one",
            layers.len()
        );
    };
    ensure!(
        layer["mediaType"] == "application/vnd.cncf.helm.chart.content.v1.tar+gzip",
        "the layer is not a helm chart: {layer}"
    );
    let name = config["name"]
        .as_str()
        .context("the chart's config has no name")?;
    ensure!(
        config["version"] == version,
        "the tag {version} points to chart version {}",
        config["version"]
    );
    let tgz = work.join(format!("{name}-{version}.tgz"));
    std::fs::write(&tgz, blob(layer)?)?;
    Ok(tgz)
}

/// The chart's `version` (the OCI tag and the `.tgz`'s name).
pub fn chart_version() -> Result<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/nodewarden/Chart.yaml");
    let chart: serde_yaml_ng::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&path)?)?;
    chart
        .get("version")
        .and_then(|v| v.as_str())
        .map(str::to_string)
        .context("Chart.yaml has no version")
}

/// The cells of `node`'s row in the table of DaemonSet `daemonset` (`<namespace>/<name>`) of
/// `kubectl nodewarden report`'s default output, by column name. Columns are at least two spaces
/// apart; a cell holds at most single spaces (`94m / 250Mi`, `no pod`).
pub fn report_row(out: &str, daemonset: &str, node: &str) -> Result<BTreeMap<String, String>> {
    let cells = |line: &str| -> Vec<String> {
        line.trim()
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(str::to_string)
            .collect()
    };
    let mut lines = out
        .lines()
        .skip_while(|l| !l.starts_with(&format!("DaemonSet {daemonset} (")))
        .skip(1);
    let header = cells(
        lines
            .next()
            .with_context(|| format!("the report has no table for {daemonset}:\n{out}"))?,
    );
    let row = lines
        .take_while(|l| !l.trim().is_empty())
        .map(cells)
        .find(|c| c.first().map(String::as_str) == Some(node))
        .with_context(|| format!("the report's table for {daemonset} has no row for {node}:\n{out}"))?;
    ensure!(
        row.len() == header.len(),
        "the row of {node} has {} cells, the header {}: {row:?} / {header:?}",
        row.len(),
        header.len()
    );
    Ok(header.into_iter().zip(row).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table as the plugin prints it (comfy-table, no borders, right-aligned figures).
    const REPORT: &str = "\
DaemonSet logging/shipper (autoscaler shipper, mode Initial)
 NODE             CONTAINER   TEMPLATE    CURRENT       TARGET        LOWER        UPPER   SOURCE   OOM   CPU Δ   MEMORY Δ
 nodewarden-a     shipper    50m / 64Mi  50m / 64Mi    25m / 250Mi  25m / 250Mi   1 / 1Gi   node       0   -25m    +186Mi
 nodewarden-vm-a  shipper    50m / 64Mi      no pod   94m / 250Mi  25m / 250Mi   1 / 1Gi   node       0   +44m    +186Mi

  frees 25m CPU and 0 memory, needs 44m CPU and 372Mi memory on top (net +19m CPU, +372Mi memory); 0 OOM kills

Total: frees 25m CPU
";

    #[test]
    fn a_nodes_row_is_read_by_column() {
        let row = report_row(REPORT, "logging/shipper", "nodewarden-vm-a").unwrap();
        assert_eq!(row["TARGET"], "94m / 250Mi");
        assert_eq!(row["CURRENT"], "no pod");
        assert_eq!(row["SOURCE"], "node");
        assert_eq!(row["CPU Δ"], "+44m");
        assert!(report_row(REPORT, "logging/shipper", "nodewarden-b").is_err());
        assert!(report_row(REPORT, "logging/other", "nodewarden-a").is_err());
        // a row whose cells run together is refused, not misread
        let squashed = REPORT.replace("1 / 1Gi   node", "1 / 1Gi node");
        assert!(report_row(&squashed, "logging/shipper", "nodewarden-a").is_err());
    }

    #[test]
    fn the_readmes_user_path_has_every_line_the_test_runs() {
        let autoscaler = check_readme().unwrap();
        assert_eq!(autoscaler["spec"]["targetRef"]["kind"], "DaemonSet");
        // and a README that strays from them is caught
        let block = readme_user_path().unwrap();
        let version = xtask::image::chart_app_version(&xtask::image::repo_root()).unwrap();
        let chart = chart_version().unwrap();
        assert!(check_user_path(&block, &version, &chart).is_ok());
        assert!(check_user_path(&block, "9.9.9", &chart).is_err());
        let swapped = block.replace(UserPath::CHECK, "").replace(
            "kubectl nodewarden report -n logging\n",
            &format!("kubectl nodewarden report -n logging\n{}\n", UserPath::CHECK),
        );
        assert!(check_user_path(&swapped, &version, &chart).is_err());
        let no_autoscaler = block.replace("kind: DaemonSetAutoscaler", "kind: Deployment");
        assert!(check_user_path(&no_autoscaler, &version, &chart).is_err());
    }
}
