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
    /// `docker.io/nodewarden/nodewarden-agent:0.1.0`.
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

/// An archive written by [`write_archive`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltImage {
    /// Full reference as containerd names it after import (see [`full_reference`]).
    pub reference: String,
    pub archive: PathBuf,
    /// `sha256:…` of the manifest: the image's digest (`crictl images --digests`, `ctr images ls`).
    pub manifest_digest: String,
    /// `sha256:…` of the config: the image ID.
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
struct Descriptor {
    #[serde(rename = "mediaType")]
    media_type: String,
    digest: String,
    size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    platform: Option<Platform>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    annotations: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
struct Platform {
    architecture: String,
    os: String,
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

fn descriptor(media_type: &str, data: &[u8]) -> Descriptor {
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

/// Writes `spec` as an OCI image-layout tar archive at `archive` and returns what was built.
/// The same spec (same file bytes) gives the same bytes, hence the same digests.
pub fn write_archive(spec: &ImageSpec, archive: &Path) -> Result<BuiltImage> {
    ensure!(
        !spec.name.is_empty() && !spec.tag.is_empty(),
        "an image needs a name and a tag"
    );
    let layer = layer_tar(spec)?;
    let layer_desc = descriptor(MEDIA_LAYER, &layer);
    let created = rfc3339(spec.epoch);
    let config = ImageConfig {
        created: Some(created.clone()),
        architecture: oci_arch().to_string(),
        os: "linux".to_string(),
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
    manifest_desc.platform = Some(Platform {
        architecture: oci_arch().to_string(),
        os: "linux".to_string(),
    });
    let reference = spec.reference();
    manifest_desc
        .annotations
        .insert(ANNOTATION_CONTAINERD_NAME.to_string(), reference.clone());
    manifest_desc
        .annotations
        .insert(ANNOTATION_REF_NAME.to_string(), reference.clone());
    let index = serde_json::to_vec(&Index {
        schema_version: 2,
        media_type: Some(MEDIA_INDEX.to_string()),
        manifests: vec![manifest_desc.clone()],
    })?;

    let mut blobs: BTreeMap<String, &[u8]> = BTreeMap::new();
    for (desc, data) in [
        (&layer_desc, layer.as_slice()),
        (&config_desc, config.as_slice()),
        (&manifest_desc, manifest.as_slice()),
    ] {
        blobs.insert(format!("blobs/sha256/{}", &desc.digest["sha256:".len()..]), data);
    }
    let mut out = Vec::with_capacity(layer.len() + 8192);
    tar::append(&mut out, "blobs/", tar::Kind::Dir, 0o755, spec.epoch, &[])?;
    tar::append(&mut out, "blobs/sha256/", tar::Kind::Dir, 0o755, spec.epoch, &[])?;
    for (name, data) in blobs {
        tar::append(&mut out, &name, tar::Kind::File, 0o644, spec.epoch, data)?;
    }
    tar::append(&mut out, "index.json", tar::Kind::File, 0o644, spec.epoch, &index)?;
    let layout = br#"{"imageLayoutVersion":"1.0.0"}"#;
    tar::append(&mut out, "oci-layout", tar::Kind::File, 0o644, spec.epoch, layout)?;
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
    Ok(BuiltImage {
        reference,
        archive: archive.to_path_buf(),
        manifest_digest: manifest_desc.digest,
        config_digest: config_desc.digest,
        layer_size: layer.len() as u64,
    })
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

/// Reads an OCI image-layout tar archive with one image (uncompressed or gzip layers).
pub fn read_archive(archive: &Path) -> Result<ImageContents> {
    Ok(read_impl(archive, false)?.0)
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

/// The contents, and (when `keep_bytes`) every regular file's bytes by sha256.
fn read_impl(archive: &Path, keep_bytes: bool) -> Result<(ImageContents, BTreeMap<String, Vec<u8>>)> {
    let data = std::fs::read(archive).with_context(|| format!("reading {}", archive.display()))?;
    let mut files: BTreeMap<String, &[u8]> = BTreeMap::new();
    for entry in tar::entries(&data)? {
        if entry.kind == tar::Kind::File {
            files.insert(entry.name.trim_start_matches("./").to_string(), entry.data);
        }
    }
    let blob = |digest: &str| -> Result<&[u8]> {
        let hex = digest
            .strip_prefix("sha256:")
            .context("only sha256 digests are read")?;
        let data = files
            .get(&format!("blobs/sha256/{hex}"))
            .with_context(|| format!("blob {digest} is not in the archive"))?;
        ensure!(sha256_hex(data) == hex, "blob {digest} does not match its digest");
        Ok(data)
    };
    let index: Index = serde_json::from_slice(
        files
            .get("index.json")
            .context("no index.json: not an OCI layout")?,
    )?;
    let [desc] = index.manifests.as_slice() else {
        bail!(
            "index.json lists {} manifests, expected one",
            index.manifests.len()
        );
    };
    ensure!(
        desc.media_type == MEDIA_MANIFEST,
        "index.json points to {}, expected an image manifest",
        desc.media_type
    );
    let manifest: Manifest = serde_json::from_slice(blob(&desc.digest)?)?;
    let config: ImageConfig = serde_json::from_slice(blob(&manifest.config.digest)?)?;
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
/// are not changed), e.g. to run its entrypoint with `chroot`.
pub fn extract_rootfs(archive: &Path, dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let (contents, bytes) = read_impl(archive, true)?;
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
