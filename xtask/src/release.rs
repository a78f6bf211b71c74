//! `cargo xtask release`: everything a release publishes, written to one folder
//! (`<target>/release-artifacts` by default), nothing published:
//!
//! - `nodewarden-<chart version>.tgz`: `helm package charts/nodewarden`, every file dated the
//!   release's epoch so the same sources give the same bytes;
//! - `nodewarden-chart-<chart version>.oci.tar`: the chart as `helm push` uploads it, in an OCI
//!   image layout (config `application/vnd.cncf.helm.config.v1+json`, the chart's metadata as
//!   helm marshals it; one layer `application/vnd.cncf.helm.chart.content.v1.tar+gzip`, the
//!   `.tgz`), for `oras cp --from-oci-layout` or to check what a push will send;
//! - `nodewarden-{webhook,agent}-<version>.oci.tar`: the images of `cargo xtask image`, and
//!   `nodewarden-{webhook,agent}-<version>.cdx.json`, a CycloneDX 1.5 SBOM of each ([`sbom`]);
//! - `kubectl-nodewarden_<version>_<os>_<arch>.tar.gz` (`.zip` on windows): the kubectl plugin
//!   ([`PLUGIN_PROFILE`]) per platform, the images' and windows/amd64 by default ([`plugin`]),
//!   and `nodewarden.yaml`, its krew manifest pointing at `--url-base`;
//! - `SHA256SUMS` over all of the above (`sha256sum -c SHA256SUMS`).
//!
//! The packaging functions take already built files, so their tests run on small fakes; only
//! [`release`] builds. A release of no linux platform (`--platform windows/amd64`) has no images. Two releases into one folder take turns (a lock file beside it): the CI
//! prefetch and the cgroup v2 node's test both write [`host_release_dir`].

pub mod plugin;
pub mod sbom;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use serde::{Deserialize, Serialize};

use crate::image::oci::{self, Descriptor, sha256_hex};
use crate::image::{self, BuildOptions, COMPONENTS, Target, tar};
pub use plugin::PluginPlatform;

/// Helm's media types (helm.sh/helm/v4 `pkg/registry/constants.go`).
pub const HELM_CONFIG_MEDIA_TYPE: &str = "application/vnd.cncf.helm.config.v1+json";
pub const HELM_CHART_MEDIA_TYPE: &str = "application/vnd.cncf.helm.chart.content.v1.tar+gzip";

/// The plugin's cargo package and binary.
pub const PLUGIN_PACKAGE: &str = "nodewarden-cli";
pub const PLUGIN_BIN: &str = "kubectl-nodewarden";
/// The plugin's cargo profile: the agent image's (size-optimised, whole-program LTO, abort on
/// panic, stripped). Its dependencies are mostly the agent's, already compiled with that profile
/// for the image, so the plugin adds its own few crates and its link: 85 CPU-seconds here,
/// against 872 for a cold `release` build, and 7.2 MiB against 15.1 (README, "Releases").
pub const PLUGIN_PROFILE: &str = "agent-release";
/// The krew plugin's name (`kubectl krew install nodewarden`, manifest `nodewarden.yaml`).
pub const KREW_NAME: &str = "nodewarden";
/// The checksum file's name.
pub const CHECKSUMS: &str = "SHA256SUMS";

/// Where and what to release.
#[derive(Debug, Clone)]
pub struct ReleaseOptions {
    /// The image build's options (root, target folder, platforms, epoch, tag).
    pub build: BuildOptions,
    /// Where every artifact goes (default `<target>/release-artifacts`).
    pub out_dir: PathBuf,
    /// Base URL the krew manifest's archives are downloaded from (the release's download page),
    /// without a trailing `/`.
    pub url_base: String,
    /// The helm binary (default: the one `tests/controlplane/build.sh` builds and caches).
    pub helm: Option<PathBuf>,
    /// The plugin's platforms beyond the images' (`build.targets`, for which it is always
    /// built): windows, darwin ([`plugin::parse_release_platforms`]). None by default, so a
    /// release of `build.targets` alone is what it always was.
    pub plugin_only: Vec<PluginPlatform>,
    /// Build the plugin archives alone (no images, chart, krew manifest or `SHA256SUMS`): what
    /// the release workflow's macOS and Windows runners do, for the release made on Linux to take.
    pub plugins_only: bool,
    /// A folder of plugin archives built on other machines (`plugins_only` there) to check and
    /// add to this release ([`adopt_plugin_archives`]).
    pub plugin_archives: Option<PathBuf>,
}

impl ReleaseOptions {
    /// Defaults for the checkout at `root`.
    pub fn for_repo(root: &Path) -> Result<Self> {
        let build = BuildOptions::for_repo(root)?;
        Ok(ReleaseOptions {
            out_dir: build.target_dir.join("release-artifacts"),
            url_base: default_url_base(&build.tag),
            build,
            helm: None,
            plugin_only: Vec::new(),
            plugins_only: false,
            plugin_archives: None,
        })
    }
}

/// `<repository>/releases/download/v<version>` (the workspace's repository).
pub fn default_url_base(version: &str) -> String {
    format!(
        "{}/releases/download/v{version}",
        env!("CARGO_PKG_REPOSITORY").trim_end_matches('/')
    )
}

/// Where a release of this machine's platform alone goes (`cargo xtask release --platform
/// linux/<arch> --out <this>`, as the CI prefetch runs it; the cgroup v2 node's test installs
/// it): `<target>/release-artifacts-linux-<arch>`, apart from a full release's folder.
pub fn host_release_dir(target_dir: &Path, target: Target) -> PathBuf {
    target_dir.join(format!("release-artifacts-linux-{}", target.arch))
}

/// Everything [`release`] wrote, each a file of the output folder.
#[derive(Debug, Clone)]
pub struct Released {
    pub files: Vec<PathBuf>,
    /// The image archives among `files`, webhook first.
    pub images: Vec<ReleasedImage>,
}

/// One image of a release.
#[derive(Debug, Clone)]
pub struct ReleasedImage {
    /// The program's package, e.g. `nodewarden-agent`.
    pub package: &'static str,
    /// The name containerd gives it on import, e.g. `ghcr.io/nodewarden/nodewarden-agent:0.1.0`.
    pub reference: String,
    /// `nodewarden-<program>-<version>.oci.tar` in the output folder.
    pub archive: PathBuf,
}

/// Takes the lock file beside `out_dir` (`<out_dir>.lock`, created), waiting while another
/// release writes the same folder; held until the file is dropped.
fn lock_out_dir(out_dir: &Path) -> Result<std::fs::File> {
    let path = match (out_dir.parent(), out_dir.file_name()) {
        (Some(parent), Some(name)) => parent.join(format!("{}.lock", name.to_string_lossy())),
        _ => out_dir.join(".release.lock"),
    };
    let file = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    if let Err(std::fs::TryLockError::WouldBlock) = file.try_lock() {
        say(format_args!(
            "another release is writing {}; waiting for it ({})",
            out_dir.display(),
            path.display()
        ));
    }
    file.lock()
        .with_context(|| format!("locking {}", path.display()))?;
    Ok(file)
}

fn say(line: std::fmt::Arguments) {
    eprintln!("==> release: {line}");
}

/// Builds and packages everything (see the module's documentation) into `opts.out_dir`.
pub fn release(opts: &ReleaseOptions) -> Result<Released> {
    let started = std::time::Instant::now();
    let root = &opts.build.root;
    std::fs::create_dir_all(&opts.out_dir).with_context(|| format!("creating {}", opts.out_dir.display()))?;
    let _lock = lock_out_dir(&opts.out_dir)?;
    let version = &opts.build.tag;
    let epoch = opts.build.epoch;
    let mut files = Vec::new();

    // the images (cargo rebuilds nothing when they are up to date) and their SBOMs, if the
    // release has a linux platform
    // a platform this machine cannot link, or a folder of archives that is not there, fails
    // now, not after minutes of other builds
    for platform in &opts.plugin_only {
        plugin::ensure_buildable_here(*platform)?;
    }
    if let Some(dir) = &opts.plugin_archives {
        ensure!(
            dir.is_dir(),
            "--plugin-archives {}: no such folder",
            dir.display()
        );
    }
    let mut released = Vec::new();
    if !opts.build.targets.is_empty() && !opts.plugins_only {
        released = release_images(opts, &mut files)?;
    }

    // the plugin, per platform, and its krew manifest
    let license = root.join("LICENSE");
    let license = license.is_file().then_some(license);
    let platforms: Vec<PluginPlatform> = opts
        .build
        .targets
        .iter()
        .map(|&t| PluginPlatform::linux(t))
        .chain(opts.plugin_only.iter().copied())
        .collect();
    let mut archives = Vec::new();
    for platform in platforms {
        let binary = plugin::build_plugin(&opts.build, platform)?;
        let archive = package_plugin(
            &binary,
            license.as_deref(),
            platform,
            version,
            &opts.out_dir,
            epoch,
        )?;
        say(format_args!("plugin {}", archive.display()));
        archives.push((platform, archive));
    }
    if opts.plugins_only {
        files.extend(archives.into_iter().map(|(_, a)| a));
        say(format_args!(
            "{} plugin archives in {} ({:.0?})",
            files.len(),
            opts.out_dir.display(),
            started.elapsed()
        ));
        return Ok(Released {
            files,
            images: released,
        });
    }
    if let Some(dir) = &opts.plugin_archives {
        let built: Vec<PluginPlatform> = archives.iter().map(|(p, _)| *p).collect();
        for (platform, archive) in adopt_plugin_archives(dir, version, &built, &opts.out_dir)? {
            say(format_args!(
                "plugin {} (built elsewhere, checked)",
                archive.display()
            ));
            archives.push((platform, archive));
        }
        archives.sort_by_key(|(p, _)| p.name());
    }
    let manifest = write_krew_manifest(&archives, version, &opts.url_base, &opts.out_dir)?;
    files.extend(archives.into_iter().map(|(_, a)| a));
    files.push(manifest);

    // the chart, last: the pinned helm may still be building (the CI prefetch builds it beside)
    let helm = match &opts.helm {
        Some(h) => h.clone(),
        None => pinned_helm(root)?,
    };
    let tgz = package_chart(&helm, &root.join("charts/nodewarden"), &opts.out_dir, epoch)?;
    say(format_args!("chart {}", tgz.display()));
    let chart = write_chart_layout(&tgz, &opts.out_dir, epoch)?;
    say(format_args!(
        "chart OCI layout {} (manifest {})",
        chart.archive.display(),
        chart.manifest_digest
    ));
    files.push(tgz);
    files.push(chart.archive);

    files.push(write_checksums(&opts.out_dir, &files)?);
    say(format_args!(
        "{} files in {} ({:.0?})",
        files.len(),
        opts.out_dir.display(),
        started.elapsed()
    ));
    Ok(Released {
        files,
        images: released,
    })
}

/// The images of `opts.build.targets` and their SBOMs, into `opts.out_dir` (added to `files`).
fn release_images(opts: &ReleaseOptions, files: &mut Vec<PathBuf>) -> Result<Vec<ReleasedImage>> {
    let root = &opts.build.root;
    let version = &opts.build.tag;
    let epoch = opts.build.epoch;
    for target in &opts.build.targets {
        target.ensure_toolchain(root)?;
    }
    // built into a folder of this release's own, so a release of other platforms than
    // `cargo xtask image`'s leaves that command's archives (which the tests import) as they are
    let work = tempdir_in(&opts.out_dir)?;
    let mut build = opts.build.clone();
    build.out_dir = work.clone();
    let images = image::build_nodewarden_images(&build);
    let images = images.and_then(|images| {
        let mut moved = Vec::new();
        for (component, built) in COMPONENTS.iter().zip(images) {
            let archive = opts
                .out_dir
                .join(format!("{}-{version}.oci.tar", component.package));
            std::fs::rename(&built.archive, &archive)
                .with_context(|| format!("moving {} to {}", built.archive.display(), archive.display()))?;
            moved.push((component, built, archive));
        }
        Ok(moved)
    });
    let _ = std::fs::remove_dir_all(&work);
    let images = images?;
    let triples: Vec<&str> = opts.build.targets.iter().map(|t| t.triple).collect();
    let graphs = sbom::CrateGraph::load_all(root, &triples)?;
    let mut released = Vec::new();
    for (component, built, archive) in images {
        let name = format!("{}-{version}", component.package);
        let subject = sbom::Subject {
            name: component.image_name(),
            version: version.clone(),
            reference: built.reference.clone(),
            digest: built.digest.clone(),
            archive_sha256: sha256_file(&archive)?,
        };
        let doc = sbom::image_sbom(&subject, component.package, &graphs, epoch)?;
        let path = opts.out_dir.join(format!("{name}.cdx.json"));
        std::fs::write(&path, sbom::to_json(&doc)?)?;
        say(format_args!("{} and {}", archive.display(), path.display()));
        released.push(ReleasedImage {
            package: component.package,
            reference: built.reference.clone(),
            archive: archive.clone(),
        });
        files.push(archive);
        files.push(path);
    }
    Ok(released)
}

/// The helm the tests use: `tests/controlplane/build.sh` builds it from Go modules on first use
/// (with the control plane) and prints its cached bin folder last.
pub fn pinned_helm(root: &Path) -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("NODEWARDEN_CONTROLPLANE_BIN") {
        return Ok(PathBuf::from(dir).join("helm"));
    }
    let script = root.join("tests/controlplane/build.sh");
    say(format_args!(
        "helm: {} (builds and caches it on first use)",
        script.display()
    ));
    let out = Command::new("bash")
        .arg(&script)
        .current_dir(root)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    ensure!(
        out.status.success(),
        "{} failed ({})",
        script.display(),
        out.status
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let dir = stdout
        .lines()
        .last()
        .context("tests/controlplane/build.sh printed no folder")?;
    Ok(PathBuf::from(dir.trim()).join("helm"))
}

/// SHA-256 of a file, hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(sha256_hex(&data))
}

/// Copies the folder `from` into `to` (created), every file and folder dated `epoch`.
fn copy_tree_dated(from: &Path, to: &Path, epoch: u64) -> Result<()> {
    std::fs::create_dir_all(to)?;
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(epoch);
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let dest = to.join(entry.file_name());
        if kind.is_dir() {
            copy_tree_dated(&entry.path(), &dest, epoch)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &dest)?;
            std::fs::File::options()
                .write(true)
                .open(&dest)?
                .set_modified(time)?;
        } else {
            bail!(
                "{}: only files and folders belong in a chart",
                entry.path().display()
            );
        }
    }
    Ok(())
}

/// `helm package` of the chart folder `chart_dir` into `out_dir`; returns the `.tgz`. Helm dates
/// each entry with its file's mtime, so the chart is packaged from a copy whose files are all
/// dated `epoch`: the same chart gives the same bytes. The `.tgz` itself is dated `epoch` too,
/// which `helm push` takes as the manifest's `org.opencontainers.image.created`.
pub fn package_chart(helm: &Path, chart_dir: &Path, out_dir: &Path, epoch: u64) -> Result<PathBuf> {
    let meta = read_chart_yaml(&std::fs::read(chart_dir.join("Chart.yaml"))?)?;
    let work = tempdir_in(out_dir)?;
    let copy = work.join(&meta.name);
    let result = (|| {
        copy_tree_dated(chart_dir, &copy, epoch)?;
        let out = Command::new(helm)
            .arg("package")
            .arg(&copy)
            .arg("--destination")
            .arg(out_dir)
            .output()
            .with_context(|| format!("running {}", helm.display()))?;
        ensure!(
            out.status.success(),
            "helm package failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let tgz = out_dir.join(format!("{}-{}.tgz", meta.name, meta.version));
        ensure!(tgz.is_file(), "helm package wrote no {}", tgz.display());
        let time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(epoch);
        std::fs::File::options()
            .write(true)
            .open(&tgz)?
            .set_modified(time)?;
        Ok(tgz)
    })();
    let _ = std::fs::remove_dir_all(&work);
    result
}

/// A fresh folder inside `dir` (removed by the caller).
fn tempdir_in(dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!(".work-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir_all(&path)?;
    Ok(path)
}

/// A chart maintainer as helm marshals it.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct Maintainer {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub email: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub url: String,
}

/// Chart.yaml as helm's `chart.Metadata` (helm.sh/helm/v4 `pkg/chart/v2/metadata.go`): the
/// fields in its order, empty ones left out, which is how `json.Marshal` writes the config of a
/// pushed chart. Charts with `dependencies` are refused (nodewarden's has none, and their
/// marshalled form is not reproduced here).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ChartMetadata {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub home: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keywords: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub maintainers: Vec<Maintainer>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub icon: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub condition: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tags: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub app_version: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deprecated: bool,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kube_version: String,
    #[serde(default, skip_serializing)]
    pub dependencies: Vec<serde_yaml_ng::Value>,
    #[serde(default, rename = "type", skip_serializing_if = "String::is_empty")]
    pub kind: String,
}

/// helm's `sanitizeString`: white space becomes a space, other unprintable characters go.
fn sanitize(s: &str) -> String {
    s.chars()
        .filter_map(|c| {
            if c.is_whitespace() {
                Some(' ')
            } else if c.is_control() {
                None
            } else {
                Some(c)
            }
        })
        .collect()
}

/// Reads Chart.yaml and normalises it as helm's loader does (`Metadata.Validate`).
pub fn read_chart_yaml(data: &[u8]) -> Result<ChartMetadata> {
    let mut m: ChartMetadata = serde_yaml_ng::from_slice(data).context("reading Chart.yaml")?;
    ensure!(
        m.dependencies.is_empty(),
        "charts with dependencies are not supported by the OCI layout writer"
    );
    ensure!(
        !m.name.is_empty() && !m.version.is_empty(),
        "Chart.yaml needs a name and a version"
    );
    for field in [
        &mut m.name,
        &mut m.description,
        &mut m.home,
        &mut m.icon,
        &mut m.condition,
        &mut m.tags,
        &mut m.app_version,
        &mut m.kube_version,
    ] {
        *field = sanitize(field);
    }
    for s in m.sources.iter_mut().chain(m.keywords.iter_mut()) {
        *s = sanitize(s);
    }
    for maintainer in &mut m.maintainers {
        for field in [&mut maintainer.name, &mut maintainer.email, &mut maintainer.url] {
            *field = sanitize(field);
        }
    }
    Ok(m)
}

/// JSON as Go's `encoding/json` writes it: serde_json's compact form with `<`, `>`, `&`,
/// U+2028 and U+2029 escaped (they can only occur inside strings).
pub fn go_json<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    let text = serde_json::to_string(value)?;
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    Ok(out.into_bytes())
}

/// helm's manifest annotations for a pushed chart (`generateOCIAnnotations`): description,
/// title, version, url, created, source, authors, then the chart's own annotations (which
/// replace any of those but the title and the version).
pub fn chart_annotations(meta: &ChartMetadata, created: &str) -> BTreeMap<String, String> {
    let mut a = BTreeMap::new();
    let mut add = |k: &str, v: &str| {
        if !v.trim().is_empty() {
            a.insert(k.to_string(), v.to_string());
        }
    };
    add("org.opencontainers.image.description", &meta.description);
    add("org.opencontainers.image.title", &meta.name);
    add("org.opencontainers.image.version", &meta.version);
    add("org.opencontainers.image.url", &meta.home);
    add("org.opencontainers.image.created", created);
    if let Some(source) = meta.sources.first() {
        add("org.opencontainers.image.source", source);
    }
    let authors: Vec<String> = meta
        .maintainers
        .iter()
        .map(|m| {
            let mut s = m.name.clone();
            if !m.email.is_empty() {
                s.push_str(&format!(" ({})", m.email));
            }
            s
        })
        .collect();
    add("org.opencontainers.image.authors", &authors.join(", "));
    for (k, v) in &meta.annotations {
        if !matches!(
            k.as_str(),
            "org.opencontainers.image.title" | "org.opencontainers.image.version"
        ) {
            a.insert(k.clone(), v.clone());
        }
    }
    a
}

/// The chart manifest as helm marshals it (`ocispec.Manifest` without a `mediaType`).
#[derive(Serialize)]
struct HelmManifest<'a> {
    #[serde(rename = "schemaVersion")]
    schema_version: u32,
    config: &'a Descriptor,
    layers: Vec<&'a Descriptor>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    annotations: BTreeMap<String, String>,
}

/// The chart's OCI layout as [`write_chart_layout`] wrote it.
#[derive(Debug, Clone)]
pub struct ChartLayout {
    pub archive: PathBuf,
    pub metadata: ChartMetadata,
    /// `sha256:…` of the manifest: what `helm push` prints as `Digest:` for the same `.tgz` and
    /// creation time.
    pub manifest_digest: String,
    pub config_digest: String,
    pub layer_digest: String,
}

/// Chart.yaml from inside a chart `.tgz` (`<name>/Chart.yaml`).
pub fn chart_yaml_of_tgz(tgz: &[u8]) -> Result<Vec<u8>> {
    let mut tar_bytes = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(tgz), &mut tar_bytes)
        .context("gunzip of the chart")?;
    let entries = tar::entries(&tar_bytes)?;
    let entry = entries
        .iter()
        .find(|e| e.name.split('/').count() == 2 && e.name.ends_with("/Chart.yaml"))
        .context("the chart archive has no <name>/Chart.yaml")?;
    Ok(entry.data.to_vec())
}

/// Writes `nodewarden-chart-<version>.oci.tar` into `out_dir`: an OCI image layout whose
/// `index.json` names (`org.opencontainers.image.ref.name` = the chart version, the tag
/// `helm push` gives it) the manifest `helm push` would upload for `tgz`: config
/// [`HELM_CONFIG_MEDIA_TYPE`] (the chart's metadata as JSON), one layer [`HELM_CHART_MEDIA_TYPE`]
/// (the `.tgz`'s bytes), annotations with `created` = the `.tgz`'s date, here `epoch`.
pub fn write_chart_layout(tgz: &Path, out_dir: &Path, epoch: u64) -> Result<ChartLayout> {
    let data = std::fs::read(tgz).with_context(|| format!("reading {}", tgz.display()))?;
    let metadata = read_chart_yaml(&chart_yaml_of_tgz(&data)?)?;
    let config = go_json(&metadata)?;
    let config_desc = oci::descriptor(HELM_CONFIG_MEDIA_TYPE, &config);
    let layer_desc = oci::descriptor(HELM_CHART_MEDIA_TYPE, &data);
    let manifest = go_json(&HelmManifest {
        schema_version: 2,
        config: &config_desc,
        layers: vec![&layer_desc],
        annotations: chart_annotations(&metadata, &oci::rfc3339(epoch)),
    })?;
    let mut top = oci::descriptor(oci::MEDIA_MANIFEST, &manifest);
    top.annotations
        .insert(oci::ANNOTATION_REF_NAME.to_string(), metadata.version.clone());
    let archive = out_dir.join(format!("{}-chart-{}.oci.tar", metadata.name, metadata.version));
    let blobs = [
        (&config_desc, config.as_slice()),
        (&layer_desc, data.as_slice()),
        (&top, manifest.as_slice()),
    ];
    oci::write_layout(&archive, epoch, &top, &blobs)?;
    Ok(ChartLayout {
        archive,
        metadata,
        manifest_digest: top.digest.clone(),
        config_digest: config_desc.digest.clone(),
        layer_digest: layer_desc.digest.clone(),
    })
}

/// `kubectl-nodewarden_<version>_<os>_<arch>.tar.gz` (`.zip` on windows); an image [`Target`]
/// names its linux platform.
pub fn plugin_archive_name(version: &str, platform: impl Into<PluginPlatform>) -> String {
    platform.into().archive_name(version)
}

/// Packs the plugin's `binary` (after checking it is an executable of `platform`, on linux a
/// static one) and `license` if given into `out_dir/<plugin_archive_name>`, the files at its top,
/// dated `epoch`, so the same binary gives the same bytes ([`plugin::write_archive`]).
pub fn package_plugin(
    binary: &Path,
    license: Option<&Path>,
    platform: impl Into<PluginPlatform>,
    version: &str,
    out_dir: &Path,
    epoch: u64,
) -> Result<PathBuf> {
    let platform = platform.into();
    let bin = std::fs::read(binary).with_context(|| format!("reading {}", binary.display()))?;
    platform
        .check(&bin)
        .with_context(|| format!("{} is not a {} executable", binary.display(), platform.name()))?;
    if let Some(target) = platform.image_target() {
        image::ensure_static(binary, target)?;
    }
    let mut files = vec![(platform.bin, 0o755, bin)];
    if let Some(license) = license {
        let text = std::fs::read(license).with_context(|| format!("reading {}", license.display()))?;
        files.push(("LICENSE", 0o644, text));
    }
    let path = out_dir.join(plugin_archive_name(version, platform));
    plugin::write_archive(&path, &files, epoch)?;
    Ok(path)
}

/// The plugin archives in `dir` built on other machines (`cargo xtask release --plugins-only`, the
/// release workflow's macOS and Windows runners) for version `version`, each read back, its
/// binary checked to be an executable of its platform ([`plugin::binary_in_archive`]) and the
/// archive copied into `out_dir`. Files not named `kubectl-nodewarden_*` are left alone; one so
/// named that is not an archive of `version` for a known platform, or one of a platform in
/// `built` (built here too), is an error, as is a folder without any.
pub fn adopt_plugin_archives(
    dir: &Path,
    version: &str,
    built: &[PluginPlatform],
    out_dir: &Path,
) -> Result<Vec<(PluginPlatform, PathBuf)>> {
    let mut adopted = Vec::new();
    let entries = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    for entry in entries {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if !name.starts_with(&format!("{PLUGIN_BIN}_")) {
            continue;
        }
        let platform = plugin::PLUGIN_PLATFORMS
            .into_iter()
            .find(|p| p.archive_name(version) == name)
            .with_context(|| {
                format!(
                    "{}: not a plugin archive of version {version} for a known platform",
                    path.display()
                )
            })?;
        ensure!(
            !built.contains(&platform),
            "{}: {} was built here too",
            path.display(),
            platform.name()
        );
        let data = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        plugin::binary_in_archive(&data, platform).with_context(|| path.display().to_string())?;
        let to = out_dir.join(name);
        std::fs::write(&to, &data).with_context(|| format!("writing {}", to.display()))?;
        adopted.push((platform, to));
    }
    ensure!(
        !adopted.is_empty(),
        "no plugin archive of version {version} in {}",
        dir.display()
    );
    adopted.sort_by_key(|(p, _)| p.name());
    Ok(adopted)
}

/// A krew plugin manifest (`krew.googlecontainertools.github.com/v1alpha2`, kind `Plugin`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct KrewPlugin {
    pub api_version: String,
    pub kind: String,
    pub metadata: KrewMetadata,
    pub spec: KrewSpec,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct KrewMetadata {
    pub name: String,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct KrewSpec {
    pub version: String,
    pub homepage: String,
    pub short_description: String,
    pub description: String,
    pub platforms: Vec<KrewPlatform>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct KrewPlatform {
    pub selector: KrewSelector,
    pub uri: String,
    pub sha256: String,
    pub files: Vec<KrewFile>,
    pub bin: String,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct KrewSelector {
    pub match_labels: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct KrewFile {
    pub from: String,
    pub to: String,
}

/// The krew manifest of the plugin `archives` (one per platform): each platform's archive at
/// `<url_base>/<file name>` with its SHA-256, selected by krew's `os` and `arch` labels;
/// krew's `version` is `v<version>`.
pub fn krew_manifest(
    archives: &[(PluginPlatform, PathBuf)],
    version: &str,
    url_base: &str,
) -> Result<KrewPlugin> {
    ensure!(!archives.is_empty(), "no plugin archive");
    let mut platforms = Vec::new();
    for (platform, archive) in archives {
        let file = archive
            .file_name()
            .context("an archive without a file name")?
            .to_string_lossy()
            .into_owned();
        let data = std::fs::read(archive).with_context(|| format!("reading {}", archive.display()))?;
        let mut files = vec![KrewFile {
            from: platform.bin.to_string(),
            to: ".".to_string(),
        }];
        let entries = if file.ends_with(".zip") {
            plugin::zip_entries(&data)?
        } else {
            flate_entries(&data)?
        };
        ensure!(
            entries.iter().any(|n| n == platform.bin),
            "{file} has no {}",
            platform.bin
        );
        let has_license = entries.iter().any(|n| n == "LICENSE");
        if has_license {
            files.push(KrewFile {
                from: "LICENSE".to_string(),
                to: ".".to_string(),
            });
        }
        platforms.push(KrewPlatform {
            selector: KrewSelector {
                match_labels: BTreeMap::from([
                    ("os".to_string(), platform.os.to_string()),
                    ("arch".to_string(), platform.arch.to_string()),
                ]),
            },
            uri: format!("{}/{file}", url_base.trim_end_matches('/')),
            sha256: sha256_hex(&data),
            files,
            bin: platform.bin.to_string(),
        });
    }
    Ok(KrewPlugin {
        api_version: "krew.googlecontainertools.github.com/v1alpha2".to_string(),
        kind: "Plugin".to_string(),
        metadata: KrewMetadata {
            name: KREW_NAME.to_string(),
        },
        spec: KrewSpec {
            version: format!("v{}", version.trim_start_matches('v')),
            homepage: env!("CARGO_PKG_REPOSITORY").to_string(),
            short_description: "Per-node recommendations of nodewarden beside each DaemonSet".to_string(),
            description: "Shows what nodewarden recommends per node for each DaemonSet's containers, \
                          beside the DaemonSet's template, as a table, CSV, JSON, YAML or an HTML \
                          report."
                .to_string(),
            platforms,
        },
    })
}

/// Names of the entries of a gzipped tar.
fn flate_entries(tgz: &[u8]) -> Result<Vec<String>> {
    let mut tar_bytes = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(tgz), &mut tar_bytes)?;
    Ok(tar::entries(&tar_bytes)?.into_iter().map(|e| e.name).collect())
}

/// Writes [`krew_manifest`] as `out_dir/nodewarden.yaml`.
pub fn write_krew_manifest(
    archives: &[(PluginPlatform, PathBuf)],
    version: &str,
    url_base: &str,
    out_dir: &Path,
) -> Result<PathBuf> {
    let manifest = krew_manifest(archives, version, url_base)?;
    let path = out_dir.join(format!("{KREW_NAME}.yaml"));
    std::fs::write(&path, serde_yaml_ng::to_string(&manifest)?)?;
    Ok(path)
}

/// Writes `dir/SHA256SUMS`: one `<hex>  <file name>` line per file (as `sha256sum` writes and
/// `sha256sum -c` reads them), sorted by name. Every file must be in `dir`.
pub fn write_checksums(dir: &Path, files: &[PathBuf]) -> Result<PathBuf> {
    let mut lines = BTreeMap::new();
    for file in files {
        ensure!(
            file.parent() == Some(dir),
            "{} is not in {}",
            file.display(),
            dir.display()
        );
        let name = file
            .file_name()
            .context("a file without a name")?
            .to_string_lossy()
            .into_owned();
        lines.insert(name, sha256_file(file)?);
    }
    let text: String = lines
        .iter()
        .map(|(name, sum)| format!("{sum}  {name}\n"))
        .collect();
    let path = dir.join(CHECKSUMS);
    std::fs::write(&path, text)?;
    Ok(path)
}

/// Checks every line of `dir/SHA256SUMS` against its file; returns the names checked.
pub fn verify_checksums(dir: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(dir.join(CHECKSUMS))?;
    let mut names = Vec::new();
    for line in text.lines() {
        let (sum, name) = line
            .split_once("  ")
            .with_context(|| format!("{CHECKSUMS}: {line:?} is not `<sha256>  <file>`"))?;
        let actual = sha256_file(&dir.join(name))?;
        ensure!(actual == sum, "{name}: SHA-256 {actual}, {CHECKSUMS} says {sum}");
        names.push(name.to_string());
    }
    Ok(names)
}

#[cfg(test)]
mod tests;
