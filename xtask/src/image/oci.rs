//! A reproducible OCI image-layout archive writer, and a reader for the root file system and
//! configuration of such archives (ours, or one `buildah push … oci-archive:` wrote).
//!
//! An image is one uncompressed layer: containerd, CRI-O, Docker and buildah all accept
//! `application/vnd.oci.image.layer.v1.tar`, and leaving gzip out means the digest depends on
//! the files alone, not on a compressor's version or level.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use serde::{Deserialize, Serialize};

use super::tar;

pub const MEDIA_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MEDIA_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const MEDIA_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const MEDIA_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
/// The annotation containerd's importer names an image by (`ctr images import`, `kind load`).
pub const ANNOTATION_CONTAINERD_NAME: &str = "io.containerd.image.name";
/// The OCI image-layout reference (`oci-archive:x.tar:<ref>` in skopeo/buildah); the full
/// reference too, which `podman load` takes as the name (a bare tag would become `localhost/<tag>`).
pub const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";

/// Where a file's bytes come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Bytes(Vec<u8>),
    Path(PathBuf),
}

/// One regular file of the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct File {
    /// Absolute path in the image, e.g. `/usr/local/bin/nodewarden-agent`.
    pub path: String,
    pub source: Source,
    /// Permission bits, e.g. `0o755`.
    pub mode: u32,
}

/// What an image holds and how it starts. Files are owned by 0:0; their parent folders are
/// added with mode 0755 unless listed in `dirs`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageSpec {
    /// Repository, e.g. `nodewarden/nodewarden-agent`.
    pub name: String,
    pub tag: String,
    pub files: Vec<File>,
    /// Folders with a mode of their own (absolute paths), e.g. `("/tmp", 0o1777)`.
    pub dirs: Vec<(String, u32)>,
    pub entrypoint: Vec<String>,
    /// The image's `Cmd`.
    pub args: Vec<String>,
    /// `uid:gid`, e.g. `65532:65532`.
    pub user: String,
    /// `KEY=value` entries.
    pub env: Vec<String>,
    pub labels: BTreeMap<String, String>,
    pub workdir: Option<String>,
    /// Seconds since the epoch: every mtime in the layer and the config's `created`.
    pub epoch: u64,
}

impl ImageSpec {
    pub fn new(name: impl Into<String>, tag: impl Into<String>) -> Self {
        ImageSpec {
            name: name.into(),
            tag: tag.into(),
            ..ImageSpec::default()
        }
    }

    pub fn file(mut self, path: impl Into<String>, source: Source, mode: u32) -> Self {
        self.files.push(File {
            path: path.into(),
            source,
            mode,
        });
        self
    }

    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// The reference containerd gives the image after `ctr images import`, e.g.
    /// `ghcr.io/nodewarden/nodewarden-agent:0.1.0`.
    pub fn reference(&self) -> String {
        full_reference(&self.name, &self.tag)
    }
}

/// `name:tag` normalised the way containerd and the kubelet do: a name without a registry
/// host gets `docker.io/`, a single-component name also `library/`.
pub fn full_reference(name: &str, tag: &str) -> String {
    let first = name.split('/').next().unwrap_or_default();
    let has_host = name.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    let name = if has_host {
        name.to_string()
    } else if name.contains('/') {
        format!("docker.io/{name}")
    } else {
        format!("docker.io/library/{name}")
    };
    format!("{name}:{tag}")
}

/// An archive written by [`write_archive`] or [`write_multi_platform_archive`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltImage {
    /// Full reference as containerd names it after import (see [`full_reference`]).
    pub reference: String,
    pub archive: PathBuf,
    /// `sha256:…` of what the reference points to after import (`ctr images ls`, `crictl images
    /// --digests`): the image index of a multi-platform archive, the manifest of a single one.
    pub digest: String,
    /// The image of each platform, in platform order (one for [`write_archive`]).
    pub manifests: Vec<BuiltManifest>,
}

/// One platform's image in an archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltManifest {
    pub platform: Platform,
    /// `sha256:…` of the manifest.
    pub manifest_digest: String,
    /// `sha256:…` of the config: the image ID on a node of this platform.
    pub config_digest: String,
    /// Bytes of the (uncompressed) layer.
    pub layer_size: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerConfig {
    #[serde(rename = "User", default, skip_serializing_if = "String::is_empty")]
    pub user: String,
    #[serde(rename = "Env", default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(rename = "Entrypoint", default, skip_serializing_if = "Vec::is_empty")]
    pub entrypoint: Vec<String>,
    #[serde(rename = "Cmd", default, skip_serializing_if = "Vec::is_empty")]
    pub cmd: Vec<String>,
    #[serde(rename = "WorkingDir", default, skip_serializing_if = "String::is_empty")]
    pub workdir: String,
    #[serde(rename = "Labels", default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

// Field order is serialisation order, and maps are BTreeMaps: the JSON (hence every digest) does
// not depend on serde_json's `preserve_order` feature, which other workspace crates may unify in.
#[derive(Serialize, Deserialize, Debug)]
struct ImageConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    created: Option<String>,
    architecture: String,
    os: String,
    #[serde(default)]
    config: ContainerConfig,
    rootfs: RootFs,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    history: Vec<History>,
}

#[derive(Serialize, Deserialize, Debug)]
struct RootFs {
    #[serde(rename = "type")]
    kind: String,
    diff_ids: Vec<String>,
}

#[derive(Serialize, Deserialize, Debug)]
struct History {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    created: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    created_by: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub(crate) struct Descriptor {
    #[serde(rename = "mediaType")]
    pub(crate) media_type: String,
    pub(crate) digest: String,
    pub(crate) size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    platform: Option<Platform>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) annotations: BTreeMap<String, String>,
}

/// An image's platform as OCI names it: `linux/amd64`, `linux/arm64`. The field order is the
/// serialisation order (part of every digest).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Platform {
    pub architecture: String,
    pub os: String,
}

impl Platform {
    /// `linux/<architecture>`.
    pub fn linux(architecture: &str) -> Self {
        Platform {
            architecture: architecture.to_string(),
            os: "linux".to_string(),
        }
    }

    /// This machine's platform.
    pub fn host() -> Self {
        Platform::linux(oci_arch())
    }

    /// Reads `os/architecture`, e.g. `linux/arm64`.
    pub fn parse(s: &str) -> Result<Self> {
        let s = s.trim();
        match s.split_once('/') {
            Some((os, arch)) if !os.is_empty() && !arch.is_empty() && !arch.contains('/') => Ok(Platform {
                architecture: arch.to_string(),
                os: os.to_string(),
            }),
            _ => bail!("{s:?} is not a platform: expected OS/ARCHITECTURE, e.g. linux/arm64"),
        }
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)
    }
}

#[derive(Serialize, Deserialize, Debug)]
struct Manifest {
    #[serde(rename = "schemaVersion")]
    schema_version: u32,
    #[serde(rename = "mediaType", default, skip_serializing_if = "Option::is_none")]
    media_type: Option<String>,
    config: Descriptor,
    layers: Vec<Descriptor>,
}

#[derive(Serialize, Deserialize, Debug)]
struct Index {
    #[serde(rename = "schemaVersion")]
    schema_version: u32,
    #[serde(rename = "mediaType", default, skip_serializing_if = "Option::is_none")]
    media_type: Option<String>,
    manifests: Vec<Descriptor>,
}

/// The OCI name of this machine's architecture (`amd64`, `arm64`, …).
pub fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        other => other,
    }
}

pub fn sha256_hex(data: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, data);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn descriptor(media_type: &str, data: &[u8]) -> Descriptor {
    Descriptor {
        media_type: media_type.to_string(),
        digest: format!("sha256:{}", sha256_hex(data)),
        size: data.len() as u64,
        platform: None,
        annotations: BTreeMap::new(),
    }
}

/// RFC 3339 (UTC, seconds) of a Unix time.
pub fn rfc3339(epoch: u64) -> String {
    let days = (epoch / 86_400) as i64;
    let secs = epoch % 86_400;
    // civil date from days since 1970-01-01 (Howard Hinnant's algorithm)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

fn relative(path: &str) -> Result<String> {
    let rel = path.trim_start_matches('/').trim_end_matches('/');
    ensure!(
        !rel.is_empty() && !rel.split('/').any(|c| c.is_empty() || c == "." || c == ".."),
        "image path {path:?} is not a clean absolute path"
    );
    Ok(rel.to_string())
}

/// The layer tar: parent folders, folders of `spec.dirs`, files; sorted, 0:0, mtime `epoch`.
pub fn layer_tar(spec: &ImageSpec) -> Result<Vec<u8>> {
    let mut dirs: BTreeMap<String, u32> = BTreeMap::new();
    let mut files: BTreeMap<String, (&Source, u32)> = BTreeMap::new();
    for file in &spec.files {
        let rel = relative(&file.path)?;
        let mut parent = Path::new(&rel).parent();
        while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
            dirs.entry(p.to_string_lossy().into_owned()).or_insert(0o755);
            parent = p.parent();
        }
        if files.insert(rel, (&file.source, file.mode)).is_some() {
            bail!("{} is listed twice", file.path);
        }
    }
    for (dir, mode) in &spec.dirs {
        dirs.insert(relative(dir)?, *mode);
    }
    if let Some(clash) = files.keys().find(|f| dirs.contains_key(*f)) {
        bail!("/{clash} is both a file and a folder");
    }
    // one sorted list, folders as `name/` (the order tar lists them in); None: a folder
    let mut entries: Vec<(String, u32, Option<&Source>)> = Vec::new();
    entries.extend(
        dirs.into_iter()
            .map(|(dir, mode)| (format!("{dir}/"), mode, None)),
    );
    entries.extend(
        files
            .into_iter()
            .map(|(file, (source, mode))| (file, mode, Some(source))),
    );
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = Vec::new();
    for (name, mode, source) in entries {
        let data = match source {
            None => {
                tar::append(&mut out, &name, tar::Kind::Dir, mode, spec.epoch, &[])?;
                continue;
            }
            Some(Source::Bytes(b)) => std::borrow::Cow::Borrowed(b.as_slice()),
            Some(Source::Path(p)) => {
                std::borrow::Cow::Owned(std::fs::read(p).with_context(|| format!("reading {}", p.display()))?)
            }
        };
        tar::append(&mut out, &name, tar::Kind::File, mode, spec.epoch, &data)?;
    }
    tar::finish(&mut out);
    Ok(out)
}

/// One platform's image: its blobs and the manifest's descriptor (with the platform).
struct ImageBlobs {
    layer: Vec<u8>,
    config: Vec<u8>,
    manifest: Vec<u8>,
    layer_desc: Descriptor,
    config_desc: Descriptor,
    manifest_desc: Descriptor,
}

impl ImageBlobs {
    fn new(spec: &ImageSpec, platform: &Platform) -> Result<Self> {
        let layer = layer_tar(spec)?;
        let layer_desc = descriptor(MEDIA_LAYER, &layer);
        let created = rfc3339(spec.epoch);
        let config = ImageConfig {
            created: Some(created.clone()),
            architecture: platform.architecture.clone(),
            os: platform.os.clone(),
            config: ContainerConfig {
                user: spec.user.clone(),
                env: spec.env.clone(),
                entrypoint: spec.entrypoint.clone(),
                cmd: spec.args.clone(),
                workdir: spec.workdir.clone().unwrap_or_default(),
                labels: spec.labels.clone(),
            },
            rootfs: RootFs {
                kind: "layers".to_string(),
                diff_ids: vec![layer_desc.digest.clone()],
            },
            history: vec![History {
                created: Some(created),
                created_by: Some("cargo xtask image".to_string()),
            }],
        };
        let config = serde_json::to_vec(&config)?;
        let config_desc = descriptor(MEDIA_CONFIG, &config);
        let manifest = serde_json::to_vec(&Manifest {
            schema_version: 2,
            media_type: Some(MEDIA_MANIFEST.to_string()),
            config: config_desc.clone(),
            layers: vec![layer_desc.clone()],
        })?;
        let mut manifest_desc = descriptor(MEDIA_MANIFEST, &manifest);
        manifest_desc.platform = Some(platform.clone());
        Ok(ImageBlobs {
            layer,
            config,
            manifest,
            layer_desc,
            config_desc,
            manifest_desc,
        })
    }

    fn built(&self, platform: &Platform) -> BuiltManifest {
        BuiltManifest {
            platform: platform.clone(),
            manifest_digest: self.manifest_desc.digest.clone(),
            config_digest: self.config_desc.digest.clone(),
            layer_size: self.layer.len() as u64,
        }
    }
}

/// Names `desc` for importers: containerd's name annotation and the OCI reference name.
fn name(desc: &mut Descriptor, reference: &str) {
    desc.annotations
        .insert(ANNOTATION_CONTAINERD_NAME.to_string(), reference.to_string());
    desc.annotations
        .insert(ANNOTATION_REF_NAME.to_string(), reference.to_string());
}

/// Writes `spec` as an OCI image-layout tar archive at `archive` and returns what was built: one
/// image of this machine's platform, `index.json` naming its manifest. The same spec (same file
/// bytes) gives the same bytes, hence the same digests.
pub fn write_archive(spec: &ImageSpec, archive: &Path) -> Result<BuiltImage> {
    ensure!(
        !spec.name.is_empty() && !spec.tag.is_empty(),
        "an image needs a name and a tag"
    );
    let platform = Platform::host();
    let image = ImageBlobs::new(spec, &platform)?;
    let reference = spec.reference();
    let mut top = image.manifest_desc.clone();
    name(&mut top, &reference);
    let blobs = [
        (&image.layer_desc, image.layer.as_slice()),
        (&image.config_desc, image.config.as_slice()),
        (&image.manifest_desc, image.manifest.as_slice()),
    ];
    write_layout(archive, spec.epoch, &top, &blobs)?;
    Ok(BuiltImage {
        reference,
        archive: archive.to_path_buf(),
        digest: top.digest,
        manifests: vec![image.built(&platform)],
    })
}

/// Writes one image over several platforms as an OCI image-layout tar archive at `archive`:
/// `index.json` names an image index (the reference's target after import), which lists each
/// platform's manifest with its `platform`. The specs must agree on name, tag and epoch; the
/// platforms are listed in their sort order, so the order given does not change the bytes.
///
/// Why the index in between rather than the manifests straight in `index.json`: containerd's
/// importer gives every named entry of `index.json` an image record before it filters by
/// platform, so two named manifests would leave whichever came last under the name (arm64 on
/// an amd64 node). A named index is one record, and containerd resolves it to the node's
/// platform (`ctr images import` keeps only that platform's content; the kubelet's CRI reads
/// that platform's config).
pub fn write_multi_platform_archive(images: &[(Platform, ImageSpec)], archive: &Path) -> Result<BuiltImage> {
    let mut sorted: Vec<&(Platform, ImageSpec)> = images.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let Some((_, first)) = sorted.first() else {
        bail!("an image index needs at least one platform");
    };
    ensure!(
        !first.name.is_empty() && !first.tag.is_empty(),
        "an image needs a name and a tag"
    );
    for pair in sorted.windows(2) {
        ensure!(pair[0].0 != pair[1].0, "platform {} is listed twice", pair[0].0);
    }
    for (platform, spec) in &sorted {
        ensure!(
            (&spec.name, &spec.tag, spec.epoch) == (&first.name, &first.tag, first.epoch),
            "the {platform} image is {}:{} at {}, the {} one {}:{} at {}: one index holds one \
             name, tag and epoch",
            spec.name,
            spec.tag,
            spec.epoch,
            sorted[0].0,
            first.name,
            first.tag,
            first.epoch
        );
    }
    let built: Vec<ImageBlobs> = sorted
        .iter()
        .map(|(platform, spec)| {
            ImageBlobs::new(spec, platform).with_context(|| format!("the {platform} image"))
        })
        .collect::<Result<_>>()?;
    let index = serde_json::to_vec(&Index {
        schema_version: 2,
        media_type: Some(MEDIA_INDEX.to_string()),
        manifests: built.iter().map(|b| b.manifest_desc.clone()).collect(),
    })?;
    let reference = first.reference();
    let mut top = descriptor(MEDIA_INDEX, &index);
    name(&mut top, &reference);
    let mut blobs: Vec<(&Descriptor, &[u8])> = vec![(&top, index.as_slice())];
    for b in &built {
        blobs.push((&b.layer_desc, &b.layer));
        blobs.push((&b.config_desc, &b.config));
        blobs.push((&b.manifest_desc, &b.manifest));
    }
    write_layout(archive, first.epoch, &top, &blobs)?;
    Ok(BuiltImage {
        reference,
        archive: archive.to_path_buf(),
        digest: top.digest.clone(),
        manifests: sorted
            .iter()
            .zip(&built)
            .map(|((platform, _), b)| b.built(platform))
            .collect(),
    })
}

/// Writes the archive: `blobs/sha256/*` (sorted by digest, each once), `index.json` listing
/// `top`, `oci-layout`; every entry dated `epoch`.
pub(crate) fn write_layout(
    archive: &Path,
    epoch: u64,
    top: &Descriptor,
    blobs: &[(&Descriptor, &[u8])],
) -> Result<()> {
    let index = serde_json::to_vec(&Index {
        schema_version: 2,
        media_type: Some(MEDIA_INDEX.to_string()),
        manifests: vec![top.clone()],
    })?;
    let mut files: BTreeMap<String, &[u8]> = BTreeMap::new();
    for (desc, data) in blobs {
        files.insert(format!("blobs/sha256/{}", &desc.digest["sha256:".len()..]), data);
    }
    let size = files.values().map(|d| d.len() + 512).sum::<usize>() + 8192;
    let mut out = Vec::with_capacity(size);
    tar::append(&mut out, "blobs/", tar::Kind::Dir, 0o755, epoch, &[])?;
    tar::append(&mut out, "blobs/sha256/", tar::Kind::Dir, 0o755, epoch, &[])?;
    for (name, data) in files {
        tar::append(&mut out, &name, tar::Kind::File, 0o644, epoch, data)?;
    }
    tar::append(&mut out, "index.json", tar::Kind::File, 0o644, epoch, &index)?;
    let layout = br#"{"imageLayoutVersion":"1.0.0"}"#;
    tar::append(&mut out, "oci-layout", tar::Kind::File, 0o644, epoch, layout)?;
    tar::finish(&mut out);

    if let Some(dir) = archive.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    // write next to it and rename: a reader never sees half an archive. The partial file's name
    // is this writer's own: two tests of one process writing the same image at once each
    // renamed the other's file away (the second rename found none)
    static WRITERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let writer = WRITERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = archive.with_extension(format!("tar.{}-{writer}.partial", std::process::id()));
    std::fs::write(&tmp, &out).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, archive).with_context(|| format!("renaming to {}", archive.display()))?;
    Ok(())
}

/// One path of an image's root file system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsEntry {
    pub kind: tar::Kind,
    /// Permission bits (`0o7777`).
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
    /// `sha256` hex of a regular file's bytes; empty for others.
    pub sha256: String,
    pub size: u64,
    /// A symlink's or hard link's target.
    pub link: String,
}

/// What an archive holds: its root file system (layers applied in order, whiteouts honoured)
/// keyed by absolute path, and its container configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageContents {
    pub rootfs: BTreeMap<String, FsEntry>,
    pub config: ContainerConfig,
    pub architecture: String,
    pub os: String,
}

/// Reads an OCI image-layout tar archive (uncompressed or gzip layers): its only image, or
/// this machine's platform's of a multi-platform one.
pub fn read_archive(archive: &Path) -> Result<ImageContents> {
    Ok(read_impl(archive, None, false)?.0)
}

/// Reads the image of `platform` from an OCI image-layout tar archive; fails when the archive
/// has none.
pub fn read_archive_for(archive: &Path, platform: &Platform) -> Result<ImageContents> {
    Ok(read_impl(archive, Some(platform), false)?.0)
}

/// The platforms of an archive's images, as its index (or indexes) list them, sorted. A
/// manifest listed without a platform is named by its config.
pub fn archive_platforms(archive: &Path) -> Result<Vec<Platform>> {
    let data = std::fs::read(archive).with_context(|| format!("reading {}", archive.display()))?;
    let layout = Layout::new(&data)?;
    let mut platforms = Vec::new();
    for desc in layout.manifests()? {
        platforms.push(match desc.platform {
            Some(p) => p,
            None => layout.config(&desc)?.1,
        });
    }
    platforms.sort();
    Ok(platforms)
}

fn layer_bytes<'a>(desc: &Descriptor, blob: &'a [u8]) -> Result<std::borrow::Cow<'a, [u8]>> {
    match desc.media_type.as_str() {
        MEDIA_LAYER | "application/vnd.docker.image.rootfs.diff.tar" => Ok(std::borrow::Cow::Borrowed(blob)),
        "application/vnd.oci.image.layer.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.diff.tar.gzip" => {
            let mut out = Vec::new();
            std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(blob), &mut out)
                .with_context(|| format!("decompressing layer {}", desc.digest))?;
            Ok(std::borrow::Cow::Owned(out))
        }
        other => bail!("layer {} is {other}: not read", desc.digest),
    }
}

/// The files of an OCI image-layout tar archive, and its blobs by digest.
struct Layout<'a> {
    files: BTreeMap<String, &'a [u8]>,
}

impl<'a> Layout<'a> {
    fn new(data: &'a [u8]) -> Result<Self> {
        let mut files: BTreeMap<String, &[u8]> = BTreeMap::new();
        for entry in tar::entries(data)? {
            if entry.kind == tar::Kind::File {
                files.insert(entry.name.trim_start_matches("./").to_string(), entry.data);
            }
        }
        Ok(Layout { files })
    }

    fn blob(&self, digest: &str) -> Result<&'a [u8]> {
        let hex = digest
            .strip_prefix("sha256:")
            .context("only sha256 digests are read")?;
        let data = self
            .files
            .get(&format!("blobs/sha256/{hex}"))
            .with_context(|| format!("blob {digest} is not in the archive"))?;
        ensure!(sha256_hex(data) == hex, "blob {digest} does not match its digest");
        Ok(data)
    }

    /// Every image manifest `index.json` lists, directly or through image indexes (one level
    /// deep, as a multi-platform image has them).
    fn manifests(&self) -> Result<Vec<Descriptor>> {
        let index: Index = serde_json::from_slice(
            self.files
                .get("index.json")
                .context("no index.json: not an OCI layout")?,
        )
        .context("reading index.json")?;
        let mut manifests = Vec::new();
        for desc in index.manifests {
            match desc.media_type.as_str() {
                MEDIA_MANIFEST | "application/vnd.docker.distribution.manifest.v2+json" => {
                    manifests.push(desc)
                }
                MEDIA_INDEX | "application/vnd.docker.distribution.manifest.list.v2+json" => {
                    let nested: Index = serde_json::from_slice(self.blob(&desc.digest)?)
                        .with_context(|| format!("reading image index {}", desc.digest))?;
                    for inner in nested.manifests {
                        ensure!(
                            inner.media_type == MEDIA_MANIFEST
                                || inner.media_type == "application/vnd.docker.distribution.manifest.v2+json",
                            "image index {} lists {}, expected image manifests",
                            desc.digest,
                            inner.media_type
                        );
                        manifests.push(inner);
                    }
                }
                other => bail!("index.json lists {other}, expected an image manifest or index"),
            }
        }
        ensure!(!manifests.is_empty(), "the archive lists no image");
        Ok(manifests)
    }

    /// A manifest, its config, and the config's platform.
    fn config(&self, desc: &Descriptor) -> Result<(Manifest, Platform, ImageConfig)> {
        let manifest: Manifest = serde_json::from_slice(self.blob(&desc.digest)?)
            .with_context(|| format!("reading manifest {}", desc.digest))?;
        let config: ImageConfig = serde_json::from_slice(self.blob(&manifest.config.digest)?)
            .with_context(|| format!("reading config {}", manifest.config.digest))?;
        let platform = Platform {
            architecture: config.architecture.clone(),
            os: config.os.clone(),
        };
        Ok((manifest, platform, config))
    }

    /// The manifest of `platform` (`None`: the only one, else this machine's), read with its
    /// config; the config must say the platform the index does.
    fn select(&self, platform: Option<&Platform>) -> Result<(Manifest, ImageConfig)> {
        let manifests = self.manifests()?;
        let mut candidates = Vec::new();
        for desc in manifests {
            let (manifest, config_platform, config) = self.config(&desc)?;
            if let Some(listed) = &desc.platform {
                ensure!(
                    *listed == config_platform,
                    "manifest {} is listed as {listed} but its config says {config_platform}",
                    desc.digest
                );
            }
            candidates.push((config_platform, manifest, config));
        }
        let wanted = match platform {
            Some(p) => p.clone(),
            None if candidates.len() == 1 => candidates[0].0.clone(),
            None => Platform::host(),
        };
        let listed: Vec<String> = candidates.iter().map(|c| c.0.to_string()).collect();
        let mut matching = candidates.into_iter().filter(|c| c.0 == wanted);
        let Some((_, manifest, config)) = matching.next() else {
            bail!("the archive has no {wanted} image (it has {})", listed.join(", "));
        };
        ensure!(matching.next().is_none(), "the archive has two {wanted} images");
        Ok((manifest, config))
    }
}

/// The contents of `platform`'s image (see [`Layout::select`]), and (when `keep_bytes`) every
/// regular file's bytes by sha256.
fn read_impl(
    archive: &Path,
    platform: Option<&Platform>,
    keep_bytes: bool,
) -> Result<(ImageContents, BTreeMap<String, Vec<u8>>)> {
    let data = std::fs::read(archive).with_context(|| format!("reading {}", archive.display()))?;
    let layout = Layout::new(&data)?;
    let (manifest, config) = layout
        .select(platform)
        .with_context(|| format!("reading {}", archive.display()))?;
    let blob = |digest: &str| layout.blob(digest);
    let mut rootfs: BTreeMap<String, FsEntry> = BTreeMap::new();
    let mut bytes: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for layer in &manifest.layers {
        let tar_bytes = layer_bytes(layer, blob(&layer.digest)?)?;
        for entry in tar::entries(&tar_bytes)? {
            let path = format!("/{}", entry.name.trim_start_matches("./").trim_matches('/'));
            if path == "/" {
                continue;
            }
            let (parent, base) = path.rsplit_once('/').unwrap_or(("", &path));
            if base == ".wh..wh..opq" {
                let prefix = format!("{parent}/");
                rootfs.retain(|p, _| !p.starts_with(&prefix));
                continue;
            }
            if let Some(gone) = base.strip_prefix(".wh.") {
                let gone = format!("{parent}/{gone}");
                let prefix = format!("{gone}/");
                rootfs.retain(|p, _| p != &gone && !p.starts_with(&prefix));
                continue;
            }
            let sha256 = if entry.kind == tar::Kind::File {
                sha256_hex(entry.data)
            } else {
                String::new()
            };
            if keep_bytes && entry.kind == tar::Kind::File {
                bytes.insert(sha256.clone(), entry.data.to_vec());
            }
            let fs = FsEntry {
                kind: entry.kind,
                mode: entry.mode & 0o7777,
                uid: entry.uid,
                gid: entry.gid,
                sha256,
                size: entry.data.len() as u64,
                link: entry.link.clone(),
            };
            rootfs.insert(path, fs);
        }
    }
    let contents = ImageContents {
        rootfs,
        config: config.config,
        architecture: config.architecture,
        os: config.os,
    };
    Ok((contents, bytes))
}

/// Writes an archive's root file system into `dir` (regular files, folders, symlinks; owners
/// are not changed), e.g. to run its entrypoint with `chroot`: its only image's, or this
/// machine's platform's.
pub fn extract_rootfs(archive: &Path, dir: &Path) -> Result<()> {
    extract_impl(archive, None, dir)
}

/// [`extract_rootfs`] of `platform`'s image.
pub fn extract_rootfs_for(archive: &Path, platform: &Platform, dir: &Path) -> Result<()> {
    extract_impl(archive, Some(platform), dir)
}

#[cfg(not(unix))]
fn extract_impl(_: &Path, _: Option<&Platform>, _: &Path) -> Result<()> {
    anyhow::bail!("extracting an image's root file system needs Unix file modes and symlinks")
}

#[cfg(unix)]
fn extract_impl(archive: &Path, platform: Option<&Platform>, dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let (contents, bytes) = read_impl(archive, platform, true)?;
    for (path, entry) in &contents.rootfs {
        let target = dir.join(path.trim_start_matches('/'));
        match entry.kind {
            tar::Kind::Dir => std::fs::create_dir_all(&target)?,
            tar::Kind::File => {
                if let Some(parent) = target.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                let data = bytes.get(&entry.sha256).context("file bytes not found")?;
                std::fs::write(&target, data)?;
            }
            tar::Kind::Symlink => std::os::unix::fs::symlink(&entry.link, &target)?,
            tar::Kind::Hardlink | tar::Kind::Other(_) => continue,
        }
        if entry.kind != tar::Kind::Symlink {
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(entry.mode))?;
        }
    }
    Ok(())
}
