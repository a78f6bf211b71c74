//! nodewarden's container images, built without a container daemon: static binaries (glibc,
//! `+crt-static`), `/etc/passwd` and `/etc/group` from `images/etc/`, FROM scratch, one
//! uncompressed layer, written as OCI image-layout archives that `ctr images import`,
//! `kind load image-archive`, `skopeo` and `podman load` take.
//!
//! Why static glibc rather than the shared libraries beside the binary: the image then holds
//! the binary and two text files, the `Containerfile` can copy exactly the same files, and no
//! library of the build machine leaks into it. The usual catch of static glibc, NSS, does not
//! bite: both programs reach the API server and the kubelet by IP (`KUBERNETES_SERVICE_HOST`,
//! the node IP), and glibc 2.34 and later has `files` and `dns` lookups built in, so the
//! `/etc/hosts` and `/etc/resolv.conf` the kubelet mounts work too; only NSS modules loaded
//! with `dlopen` (LDAP, systemd) are out, which a FROM-scratch image cannot hold anyway.
//!
//! The tests crate builds its own images with [`write_archive`] and [`build_static_binaries`].

pub mod oci;
pub mod tar;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

pub use oci::{
    BuiltImage, ContainerConfig, File, FsEntry, ImageContents, ImageSpec, Source, extract_rootfs,
    full_reference, read_archive, write_archive,
};

/// UID and GID the images run as (the chart's `runAsUser`/`runAsGroup` default too).
pub const USER: &str = "65532:65532";
/// `PATH` of the images (there is nothing on it but the entrypoint's folder).
pub const PATH_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// One of the two nodewarden programs and how its image is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Component {
    /// Cargo package and binary name (the entrypoint), and the image's name after `nodewarden/`.
    pub package: &'static str,
    /// More binaries of the package the image holds beside the entrypoint, in `/usr/local/bin`.
    pub extra_bins: &'static [&'static str],
    /// Cargo profile of the image's build.
    pub profile: &'static str,
}

pub const WEBHOOK: Component = Component {
    package: "nodewarden-webhook",
    extra_bins: &[],
    profile: "webhook-release",
};
/// The agent's image also holds `nodewarden-agent-init`, the chart's init container for the
/// checkpoint folder, so a node pulls one image for both.
pub const AGENT: Component = Component {
    package: "nodewarden-agent",
    extra_bins: &["nodewarden-agent-init"],
    profile: "agent-release",
};
pub const COMPONENTS: [Component; 2] = [WEBHOOK, AGENT];

impl Component {
    /// `nodewarden/<package>`, the chart's default repository.
    pub fn image_name(&self) -> String {
        format!("nodewarden/{}", self.package)
    }

    /// Path of the binary in the image (the entrypoint).
    pub fn entrypoint(&self) -> String {
        format!("/usr/local/bin/{}", self.package)
    }

    /// Every binary of the image, the entrypoint first.
    pub fn bins(&self) -> Vec<&'static str> {
        std::iter::once(self.package)
            .chain(self.extra_bins.iter().copied())
            .collect()
    }

    /// The archive's file name in the output folder: `<package>.oci.tar`.
    pub fn archive_name(&self) -> String {
        format!("{}.oci.tar", self.package)
    }
}

/// Where and how to build.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// The repository root (the workspace).
    pub root: PathBuf,
    /// Cargo's target folder (`CARGO_TARGET_DIR`, else `<root>/target`).
    pub target_dir: PathBuf,
    /// Where archives go (default `<target>/images`).
    pub out_dir: PathBuf,
    /// Image tag (default: the chart's appVersion).
    pub tag: String,
    /// `org.opencontainers.image.version` (default: the workspace version).
    pub version: String,
    /// `org.opencontainers.image.revision`: git HEAD, or `unknown` outside a checkout.
    pub revision: String,
    /// mtime of every file and the config's `created`: `SOURCE_DATE_EPOCH`, else the commit
    /// time of HEAD, else 0.
    pub epoch: u64,
    /// Print progress lines on stderr.
    pub progress: bool,
}

impl BuildOptions {
    /// Defaults for the checkout at `root` (see the fields).
    pub fn for_repo(root: &Path) -> Result<Self> {
        let target_dir = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .map(|t| if t.is_absolute() { t } else { root.join(t) })
            .unwrap_or_else(|| root.join("target"));
        let git = |args: &[&str]| -> Option<String> {
            let out = Command::new("git").args(args).current_dir(root).output().ok()?;
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
                .filter(|s| !s.is_empty())
        };
        let epoch = match std::env::var("SOURCE_DATE_EPOCH") {
            Ok(v) => v
                .trim()
                .parse()
                .context("SOURCE_DATE_EPOCH is not a number of seconds")?,
            Err(_) => git(&["log", "-1", "--format=%ct"])
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
        };
        Ok(BuildOptions {
            out_dir: target_dir.join("images"),
            target_dir,
            tag: chart_app_version(root)?,
            version: env!("CARGO_PKG_VERSION").to_string(),
            revision: git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".to_string()),
            epoch,
            progress: true,
            root: root.to_path_buf(),
        })
    }

    /// The archive path of a component in `out_dir`.
    pub fn archive(&self, component: Component) -> PathBuf {
        self.out_dir.join(component.archive_name())
    }

    fn say(&self, line: std::fmt::Arguments) {
        if self.progress {
            eprintln!("==> image: {line}");
        }
    }
}

/// The repository root of this checkout (the folder above `xtask/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// `appVersion` of charts/nodewarden/Chart.yaml: the images' default tag.
pub fn chart_app_version(root: &Path) -> Result<String> {
    let path = root.join("charts/nodewarden/Chart.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let chart: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text)?;
    match chart.get("appVersion") {
        Some(serde_yaml_ng::Value::String(v)) => Ok(v.clone()),
        other => bail!("{}: appVersion is {other:?}, expected a string", path.display()),
    }
}

/// The host's target triple (`rustc -vV`).
pub fn host_triple() -> Result<String> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());
    let out = Command::new(&rustc)
        .arg("-vV")
        .output()
        .with_context(|| format!("running {rustc} -vV"))?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_string)
        .context("rustc -vV printed no host triple")
}

/// Builds `bin` of `package` with `profile` as a static executable and returns its path:
/// `<target>/<host triple>/<profile dir>/<bin>`. See [`build_static_binaries`].
pub fn build_static_binary(opts: &BuildOptions, package: &str, bin: &str, profile: &str) -> Result<PathBuf> {
    let mut built = build_static_binaries(opts, package, &[bin], profile)?;
    built.pop().context("cargo built nothing")
}

/// Builds `bins` of `package` with `profile` as static executables in one cargo run and returns
/// their paths, in the order given: `<target>/<host triple>/<profile dir>/<bin>`.
///
/// `--target <host>` keeps these builds (which have their own RUSTFLAGS) apart from the
/// ordinary `target/release` ones, and leaves build scripts and proc macros alone. The release
/// profile's debug info is turned off and symbols stripped (as agent-release does already):
/// an image has no use for them. Paths of registry sources are remapped so the binary does
/// not depend on where cargo keeps them.
pub fn build_static_binaries(
    opts: &BuildOptions,
    package: &str,
    bins: &[&str],
    profile: &str,
) -> Result<Vec<PathBuf>> {
    let triple = host_triple()?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let mut flags = vec!["-Ctarget-feature=+crt-static".to_string()];
    if let Some(home) = cargo_home() {
        flags.push(format!("--remap-path-prefix={}=/cargo", home.display()));
    }
    let mut cmd = Command::new(&cargo);
    // Variables cargo sets for the program running this (a test binary, `cargo run` of xtask):
    // build scripts such as ring's watch some of them, so leaving them in would rebuild
    // everything each time this is called from somewhere else.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if key == "OUT_DIR"
            || key.starts_with("CARGO_PKG_")
            || key.starts_with("CARGO_BIN_")
            || [
                "CARGO_MANIFEST_DIR",
                "CARGO_MANIFEST_PATH",
                "CARGO_CRATE_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "CARGO_RUSTC_CURRENT_DIR",
            ]
            .contains(&key.as_ref())
        {
            cmd.env_remove(key.as_ref());
        }
    }
    cmd.current_dir(&opts.root)
        .args(["build", "--locked", "--profile", profile, "-p", package])
        .args(bins.iter().flat_map(|b| ["--bin", b]))
        .args(["--target", &triple])
        .env("CARGO_TARGET_DIR", &opts.target_dir)
        .env("CARGO_ENCODED_RUSTFLAGS", flags.join("\x1f"))
        .env_remove("RUSTFLAGS")
        .env("CARGO_PROFILE_RELEASE_DEBUG", "0")
        .env("CARGO_PROFILE_RELEASE_STRIP", "symbols");
    if !opts.progress {
        cmd.arg("--quiet");
    }
    let names = bins.join(", ");
    opts.say(format_args!(
        "building {names} (cargo build --profile {profile} -p {package} --target {triple}, static; \
         a cold release build takes minutes)"
    ));
    let started = Instant::now();
    let status = cmd.status().with_context(|| format!("starting {cargo}"))?;
    if !status.success() {
        bail!("building {names} failed ({status})");
    }
    let dir = if profile == "dev" { "debug" } else { profile };
    let mut paths = Vec::new();
    for bin in bins {
        let path = opts.target_dir.join(&triple).join(dir).join(bin);
        opts.say(format_args!(
            "{} built in {:.0?}: {:.1} MiB",
            path.display(),
            started.elapsed(),
            std::fs::metadata(&path)?.len() as f64 / 1048576.0
        ));
        ensure_static(&path)?;
        paths.push(path);
    }
    Ok(paths)
}

fn cargo_home() -> Option<PathBuf> {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
}

/// Fails unless `path` is an ELF executable without a program interpreter (`PT_INTERP`), i.e.
/// one the kernel starts without a dynamic loader from the image.
pub fn ensure_static(path: &Path) -> Result<()> {
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if data.len() < 64 || &data[..4] != b"\x7fELF" || data[4] != 2 || data[5] != 1 {
        bail!("{} is not a 64-bit little-endian ELF file", path.display());
    }
    let u16_at = |o: usize| u16::from_le_bytes([data[o], data[o + 1]]);
    let u32_at = |o: usize| u32::from_le_bytes([data[o], data[o + 1], data[o + 2], data[o + 3]]);
    let phoff = u64::from(u32_at(0x20)) | (u64::from(u32_at(0x24)) << 32);
    let (phentsize, phnum) = (usize::from(u16_at(0x36)), usize::from(u16_at(0x38)));
    for i in 0..phnum {
        let at = usize::try_from(phoff)? + i * phentsize;
        if at + 4 > data.len() {
            bail!("{}: program headers past the end", path.display());
        }
        if u32_at(at) == 3 {
            bail!(
                "{} needs a dynamic loader (PT_INTERP): it would not start in a FROM-scratch image",
                path.display()
            );
        }
    }
    Ok(())
}

/// The spec of an image around one static `binary`, the way nodewarden's are made: the binary
/// at `/usr/local/bin/<its file name>` as the entrypoint, `images/etc/{passwd,group}`, user
/// [`USER`], `PATH`, the OCI labels (title = the file name), files dated `opts.epoch`. The
/// tests crate makes its own images (sandbox, load generator) with it; add `args`, `env` or
/// files to the returned spec as needed.
pub fn binary_spec(opts: &BuildOptions, name: &str, binary: &Path) -> ImageSpec {
    let file_name = binary
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let entrypoint = format!("/usr/local/bin/{file_name}");
    let etc = opts.root.join("images/etc");
    let mut spec = ImageSpec::new(name, &opts.tag)
        .file("/etc/passwd", Source::Path(etc.join("passwd")), 0o644)
        .file("/etc/group", Source::Path(etc.join("group")), 0o644)
        .file(&entrypoint, Source::Path(binary.to_path_buf()), 0o755)
        .label("org.opencontainers.image.title", &file_name)
        .label("org.opencontainers.image.source", env!("CARGO_PKG_REPOSITORY"))
        .label("org.opencontainers.image.licenses", env!("CARGO_PKG_LICENSE"))
        .label("org.opencontainers.image.version", &opts.version)
        .label("org.opencontainers.image.revision", &opts.revision);
    spec.entrypoint = vec![entrypoint];
    spec.user = USER.to_string();
    spec.env = vec![PATH_ENV.to_string()];
    spec.workdir = Some("/".to_string());
    spec.epoch = opts.epoch;
    spec
}

/// The spec of a nodewarden image around its already built `binaries` (the entrypoint first,
/// named as the package, then the component's extra binaries beside it).
pub fn nodewarden_spec(opts: &BuildOptions, component: Component, binaries: &[PathBuf]) -> ImageSpec {
    let (entry, extra) = binaries
        .split_first()
        .map_or((Path::new(""), &[][..]), |(e, x)| (e.as_path(), x));
    let mut spec = binary_spec(opts, &component.image_name(), entry);
    for bin in extra {
        let name = bin
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        spec = spec.file(format!("/usr/local/bin/{name}"), Source::Path(bin.clone()), 0o755);
    }
    spec
}

/// Builds both binaries and writes both archives (webhook first, then agent) into
/// `opts.out_dir`, plus `images.txt` there: one `reference digest archive` line per image.
pub fn build_nodewarden_images(opts: &BuildOptions) -> Result<Vec<BuiltImage>> {
    let started = Instant::now();
    let mut built = Vec::new();
    for component in COMPONENTS {
        let binaries = build_static_binaries(opts, component.package, &component.bins(), component.profile)?;
        let spec = nodewarden_spec(opts, component, &binaries);
        let image = write_archive(&spec, &opts.archive(component))?;
        opts.say(format_args!(
            "{} {} → {} ({:.1} MiB)",
            image.reference,
            image.manifest_digest,
            image.archive.display(),
            std::fs::metadata(&image.archive)?.len() as f64 / 1048576.0
        ));
        built.push(image);
    }
    let list: String = built
        .iter()
        .map(|i| format!("{} {} {}\n", i.reference, i.manifest_digest, i.archive.display()))
        .collect();
    std::fs::write(opts.out_dir.join("images.txt"), list)?;
    opts.say(format_args!("done in {:.0?}", started.elapsed()));
    Ok(built)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(epoch: u64) -> ImageSpec {
        let mut s = ImageSpec::new("nodewarden/test", "1")
            .file("/usr/local/bin/b", Source::Bytes(b"binary".to_vec()), 0o755)
            .file(
                "/etc/passwd",
                Source::Bytes(b"root:x:0:0::/:/x\n".to_vec()),
                0o644,
            )
            .label("b", "2")
            .label("a", "1");
        s.entrypoint = vec!["/usr/local/bin/b".into()];
        s.user = USER.into();
        s.dirs = vec![("/tmp".into(), 0o1777)];
        s.epoch = epoch;
        s
    }

    #[test]
    fn same_spec_same_digest_and_contents_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let a = write_archive(&spec(1_700_000_000), &dir.path().join("a.tar")).unwrap();
        // the same files listed in another order
        let mut reordered = spec(1_700_000_000);
        reordered.files.reverse();
        let b = write_archive(&reordered, &dir.path().join("b.tar")).unwrap();
        assert_eq!(a.manifest_digest, b.manifest_digest);
        assert_eq!(
            std::fs::read(&a.archive).unwrap(),
            std::fs::read(&b.archive).unwrap()
        );
        assert_eq!(a.reference, "docker.io/nodewarden/test:1");
        let c = write_archive(&spec(1_700_000_001), &dir.path().join("c.tar")).unwrap();
        assert_ne!(
            a.manifest_digest, c.manifest_digest,
            "the epoch is part of the image"
        );

        let contents = read_archive(&a.archive).unwrap();
        let paths: Vec<&str> = contents.rootfs.keys().map(String::as_str).collect();
        assert_eq!(
            paths,
            [
                "/etc",
                "/etc/passwd",
                "/tmp",
                "/usr",
                "/usr/local",
                "/usr/local/bin",
                "/usr/local/bin/b"
            ]
        );
        let bin = &contents.rootfs["/usr/local/bin/b"];
        assert_eq!((bin.mode, bin.uid, bin.gid, bin.size), (0o755, 0, 0, 6));
        assert_eq!(bin.sha256, oci::sha256_hex(b"binary"));
        assert_eq!(contents.rootfs["/tmp"].mode, 0o1777);
        assert_eq!(contents.config.user, USER);
        assert_eq!(contents.config.labels.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(contents.os, "linux");

        let root = dir.path().join("rootfs");
        extract_rootfs(&a.archive, &root).unwrap();
        assert_eq!(std::fs::read(root.join("usr/local/bin/b")).unwrap(), b"binary");
    }

    #[test]
    fn bad_specs_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let twice = spec(0).file("/etc/passwd", Source::Bytes(vec![]), 0o644);
        assert!(write_archive(&twice, &dir.path().join("x.tar")).is_err());
        let dotdot = spec(0).file("/etc/../x", Source::Bytes(vec![]), 0o644);
        assert!(write_archive(&dotdot, &dir.path().join("x.tar")).is_err());
        let clash = spec(0).file("/tmp", Source::Bytes(vec![]), 0o644);
        assert!(write_archive(&clash, &dir.path().join("x.tar")).is_err());
    }

    #[test]
    fn references_and_dates() {
        assert_eq!(full_reference("busybox", "1"), "docker.io/library/busybox:1");
        assert_eq!(full_reference("a/b", "t"), "docker.io/a/b:t");
        assert_eq!(full_reference("host:5000/a/b", "t"), "host:5000/a/b:t");
        assert_eq!(oci::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(oci::rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(oci::rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn chart_app_version_is_the_workspace_version() {
        // the images' tag (appVersion) and their version label (workspace) must not drift apart
        assert_eq!(
            chart_app_version(&repo_root()).unwrap(),
            env!("CARGO_PKG_VERSION")
        );
    }
}
