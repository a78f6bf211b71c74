//! nodewarden's container images, built without a container daemon: static binaries (glibc,
//! `+crt-static`), `/etc/passwd` and `/etc/group` from `images/etc/`, FROM scratch, one
//! uncompressed layer, for linux/amd64 and linux/arm64 (cross-compiled: [`target`]), written
//! as one OCI image-layout archive per image with an image index over both platforms, which
//! `ctr images import`, `kind load image-archive`, `skopeo copy --all` and `podman load` take.
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
pub mod target;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

pub use oci::{
    BuiltImage, BuiltManifest, ContainerConfig, File, FsEntry, ImageContents, ImageSpec, Platform, Source,
    archive_platforms, extract_rootfs, extract_rootfs_for, full_reference, read_archive, read_archive_for,
    write_archive, write_multi_platform_archive,
};
pub use target::{AMD64, ARM64, TARGETS, Target};

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

/// The tests' profile for the platforms other than this machine's ([`BuildOptions::cross_profile`]):
/// the release profile without whole-program LTO, both programs in one cargo run sharing their
/// dependencies. The same code, built for a check that the images hold programs of that platform
/// which run (under qemu-user); the images a release ships never use it. See Cargo.toml.
pub const CHECK_PROFILE: &str = "image-check";

/// Where a release publishes the images (`.github/workflows/release.yml`), and the chart's
/// default `global.imageRegistry`.
pub const REGISTRY: &str = "ghcr.io";

impl Component {
    /// `ghcr.io/nodewarden/<package>`: the chart's default image (`global.imageRegistry` and
    /// the component's `image.repository`), which a release pushes and which an imported archive
    /// is named.
    pub fn image_name(&self) -> String {
        format!("{REGISTRY}/nodewarden/{}", self.package)
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
    /// The platforms of nodewarden's images (default: [`TARGETS`], amd64 and arm64).
    pub targets: Vec<Target>,
    /// The cargo profile of both programs for the platforms other than this machine's, built in
    /// one cargo run (the tests' [`CHECK_PROFILE`]). None (the default, and always in a release):
    /// each program's own profile on every platform.
    pub cross_profile: Option<String>,
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
            targets: TARGETS.to_vec(),
            cross_profile: None,
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

/// Builds `bin` of `package` with `profile` as a static executable for this machine and returns
/// its path: `<target>/<host triple>/<profile dir>/<bin>`. See [`build_static_binaries_for`].
pub fn build_static_binary(opts: &BuildOptions, package: &str, bin: &str, profile: &str) -> Result<PathBuf> {
    let mut built = build_static_binaries(opts, package, &[bin], profile)?;
    built.pop().context("cargo built nothing")
}

/// [`build_static_binaries_for`] this machine's architecture.
pub fn build_static_binaries(
    opts: &BuildOptions,
    package: &str,
    bins: &[&str],
    profile: &str,
) -> Result<Vec<PathBuf>> {
    build_static_binaries_for(opts, Target::host()?, package, bins, profile)
}

/// Builds `bins` of `package` with `profile` as static executables for `target` in one cargo
/// run and returns their paths, in the order given: `<target>/<triple>/<profile dir>/<bin>`.
/// Call [`Target::ensure_toolchain`] first (a missing standard library or cross linker fails
/// here with cargo's words).
///
/// `--target <triple>` keeps these builds (which have their own RUSTFLAGS) apart from the
/// ordinary `target/release` ones, and leaves build scripts and proc macros alone. The release
/// profile's debug info is turned off and symbols stripped (as agent-release does already):
/// an image has no use for them. Paths of registry sources are remapped so the binary does
/// not depend on where cargo keeps them. A cross build gets its linker and C compiler from
/// the environment of this cargo run only ([`Target::cargo_env`]).
pub fn build_static_binaries_for(
    opts: &BuildOptions,
    target: Target,
    package: &str,
    bins: &[&str],
    profile: &str,
) -> Result<Vec<PathBuf>> {
    build_static_binaries_of(opts, target, &[package], bins, profile)
}

/// [`build_static_binaries_for`] of several packages in one cargo run (their dependencies
/// built once).
pub fn build_static_binaries_of(
    opts: &BuildOptions,
    target: Target,
    packages: &[&str],
    bins: &[&str],
    profile: &str,
) -> Result<Vec<PathBuf>> {
    let triple = target.triple;
    let package = packages.join(" -p ");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let mut cmd = Command::new(&cargo);
    clean_cargo_env(&mut cmd);
    cmd.current_dir(&opts.root)
        .args(["build", "--locked", "--profile", profile])
        .args(packages.iter().flat_map(|p| ["-p", p]))
        .args(bins.iter().flat_map(|b| ["--bin", b]))
        .args(["--target", triple])
        .env("CARGO_TARGET_DIR", &opts.target_dir)
        .env("CARGO_ENCODED_RUSTFLAGS", static_rustflags())
        .env_remove("RUSTFLAGS")
        .env("CARGO_PROFILE_RELEASE_DEBUG", "0")
        .env("CARGO_PROFILE_RELEASE_STRIP", "symbols")
        .envs(target.cargo_env());
    if !opts.progress {
        cmd.arg("--quiet");
    }
    let names = bins.join(", ");
    opts.say(format_args!(
        "building {names} for {} (cargo build --profile {profile} -p {package} --target {triple}, \
         static; a cold release build takes minutes)",
        target.platform()
    ));
    let started = Instant::now();
    let (status, tail) =
        status_keeping_tail(&mut cmd, ERROR_TAIL_LINES).with_context(|| format!("starting {cargo}"))?;
    if !status.success() {
        bail!(
            "building {names} for {} failed ({status}); cargo's last lines:\n{tail}",
            target.platform()
        );
    }
    let dir = if profile == "dev" { "debug" } else { profile };
    let mut paths = Vec::new();
    for bin in bins {
        let path = opts.target_dir.join(triple).join(dir).join(bin);
        opts.say(format_args!(
            "{} built in {:.0?}: {:.1} MiB",
            path.display(),
            started.elapsed(),
            std::fs::metadata(&path)?.len() as f64 / 1048576.0
        ));
        ensure_static(&path, target)?;
        paths.push(path);
    }
    Ok(paths)
}

/// Lines of a failed build's output kept in its error.
const ERROR_TAIL_LINES: usize = 25;

/// Runs `cmd` with its standard error passed on line by line as it comes (cargo's progress) and
/// returns its exit status and the last `lines` of that output. A failed build's error carries
/// them: the caller's error (in a test's panic message, say) is then enough to see why, where
/// the output itself went to a log nobody keeps.
pub fn status_keeping_tail(
    cmd: &mut Command,
    lines: usize,
) -> std::io::Result<(std::process::ExitStatus, String)> {
    use std::io::{BufRead, Write};
    let mut child = cmd.stderr(std::process::Stdio::piped()).spawn()?;
    let mut tail = std::collections::VecDeque::with_capacity(lines);
    if let Some(err) = child.stderr.take() {
        let mut reader = std::io::BufReader::new(err);
        let mut line = Vec::new();
        let stderr = std::io::stderr();
        // bytes, not strings: cargo's output is not always UTF-8 (a path, a compiler message)
        while reader.read_until(b'\n', &mut line)? > 0 {
            let _ = stderr.lock().write_all(&line);
            if tail.len() == lines {
                tail.pop_front();
            }
            // one line is bounded too: a runaway line without a newline is cut
            line.truncate(4096);
            tail.push_back(String::from_utf8_lossy(&line).trim_end().to_string());
            line.clear();
        }
    }
    let status = child.wait()?;
    Ok((status, Vec::from(tail).join("\n")))
}

/// RUSTFLAGS of the static builds, as `CARGO_ENCODED_RUSTFLAGS`: glibc linked in
/// (`+crt-static`), cargo's registry folder remapped.
pub fn static_rustflags() -> String {
    let mut flags = vec!["-Ctarget-feature=+crt-static".to_string()];
    if let Some(home) = cargo_home() {
        flags.push(format!("--remap-path-prefix={}=/cargo", home.display()));
    }
    flags.join("\x1f")
}

/// Removes the variables cargo sets for the program running this (a test binary, `cargo run` of
/// xtask) from `cmd`: build scripts such as ring's watch some of them, so leaving them in would
/// rebuild everything each time this is called from somewhere else.
pub fn clean_cargo_env(cmd: &mut Command) {
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
}

fn cargo_home() -> Option<PathBuf> {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
}

/// Fails unless `path` is an ELF executable of `target`'s architecture without a program
/// interpreter (`PT_INTERP`), i.e. one the kernel of such a node starts without a dynamic
/// loader from the image.
pub fn ensure_static(path: &Path, target: Target) -> Result<()> {
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if data.len() < 64 || &data[..4] != b"\x7fELF" || data[4] != 2 || data[5] != 1 {
        bail!("{} is not a 64-bit little-endian ELF file", path.display());
    }
    let u16_at = |o: usize| u16::from_le_bytes([data[o], data[o + 1]]);
    let u32_at = |o: usize| u32::from_le_bytes([data[o], data[o + 1], data[o + 2], data[o + 3]]);
    let machine = u16_at(0x12);
    if machine != target.elf_machine {
        bail!(
            "{} is built for ELF machine {machine}, not {} ({})",
            path.display(),
            target.elf_machine,
            target.platform()
        );
    }
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

/// Builds both programs for every platform of `opts.targets` and writes both archives (webhook
/// first, then agent) into `opts.out_dir`, each an image index over those platforms, plus
/// `images.txt` there: one `reference digest archive` line per image (the index's digest).
/// Missing Rust targets and cross linkers are installed first (see [`Target::ensure_toolchain`]),
/// so a machine that lacks one fails before minutes of building.
///
/// The two programs build at the same time, each its platforms one after the other. Their
/// profiles differ (`webhook-release`, `agent-release`), so the two cargo runs hold different
/// build-folder locks and never wait for each other, while two platforms of one profile would
/// (they share the profile's folder of build scripts). Both profiles end in whole-program LTO
/// in one codegen unit, minutes of work on one core; one after the other, the second core sat
/// idle through each of those four tails (docs/benchmarks.md, "Image builds").
pub fn build_nodewarden_images(opts: &BuildOptions) -> Result<Vec<BuiltImage>> {
    let started = Instant::now();
    anyhow::ensure!(!opts.targets.is_empty(), "no platform to build for");
    for target in &opts.targets {
        target.ensure_toolchain(&opts.root)?;
    }
    // the other platforms' programs under the cross profile, if any: one cargo run for both
    let host = Target::host()?;
    let mut cross: Vec<(Target, Vec<PathBuf>)> = Vec::new();
    if let Some(profile) = &opts.cross_profile {
        let packages: Vec<&str> = COMPONENTS.iter().map(|c| c.package).collect();
        let bins: Vec<&str> = COMPONENTS.iter().flat_map(|c| c.bins()).collect();
        for &target in opts.targets.iter().filter(|t| **t != host) {
            let built = build_static_binaries_of(opts, target, &packages, &bins, profile)?;
            cross.push((target, built));
        }
    }
    let cross = &cross;
    let specs = std::thread::scope(|scope| {
        let builds: Vec<_> = COMPONENTS
            .iter()
            .map(|&component| scope.spawn(move || component_specs(opts, component, cross)))
            .collect();
        builds
            .into_iter()
            .map(|b| {
                b.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("an image build thread panicked")))
            })
            .collect::<Result<Vec<_>>>()
    })?;
    let mut built = Vec::new();
    for (component, specs) in COMPONENTS.iter().zip(specs) {
        let image = write_multi_platform_archive(&specs, &opts.archive(*component))?;
        for manifest in &image.manifests {
            opts.say(format_args!(
                "{} {}: manifest {}, layer {:.1} MiB",
                image.reference,
                manifest.platform,
                manifest.manifest_digest,
                manifest.layer_size as f64 / 1048576.0
            ));
        }
        opts.say(format_args!(
            "{} {} → {} ({:.1} MiB)",
            image.reference,
            image.digest,
            image.archive.display(),
            std::fs::metadata(&image.archive)?.len() as f64 / 1048576.0
        ));
        built.push(image);
    }
    let list: String = built
        .iter()
        .map(|i| format!("{} {} {}\n", i.reference, i.digest, i.archive.display()))
        .collect();
    std::fs::write(opts.out_dir.join("images.txt"), list)?;
    opts.say(format_args!("done in {:.0?}", started.elapsed()));
    Ok(built)
}

/// One program's binaries for every platform of `opts.targets`, in that order, as image specs;
/// those of a platform in `cross` (every program's binaries built already, in the order of
/// [`COMPONENTS`] and their [`Component::bins`]) are taken from there.
fn component_specs(
    opts: &BuildOptions,
    component: Component,
    cross: &[(Target, Vec<PathBuf>)],
) -> Result<Vec<(Platform, ImageSpec)>> {
    let mut specs = Vec::new();
    for &target in &opts.targets {
        if let Some((_, built)) = cross.iter().find(|(t, _)| *t == target) {
            let binaries: Vec<PathBuf> = built
                .iter()
                .filter(|path| {
                    path.file_name()
                        .is_some_and(|n| component.bins().iter().any(|b| n == *b))
                })
                .cloned()
                .collect();
            specs.push((target.platform(), nodewarden_spec(opts, component, &binaries)));
            continue;
        }
        let platform_started = Instant::now();
        let binaries = build_static_binaries_for(
            opts,
            target,
            component.package,
            &component.bins(),
            component.profile,
        )?;
        opts.say(format_args!(
            "{} for {}: {:.0?}",
            component.package,
            target.platform(),
            platform_started.elapsed()
        ));
        specs.push((target.platform(), nodewarden_spec(opts, component, &binaries)));
    }
    Ok(specs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_commands_last_lines_are_kept_for_its_error() {
        let (status, tail) = status_keeping_tail(
            Command::new("sh").args(["-c", "for i in 1 2 3 4; do echo \"line $i\" >&2; done; exit 3"]),
            2,
        )
        .unwrap();
        assert_eq!(status.code(), Some(3));
        assert_eq!(tail, "line 3\nline 4");
        let (status, tail) = status_keeping_tail(Command::new("sh").args(["-c", "true"]), 2).unwrap();
        assert!(status.success());
        assert_eq!(tail, "");
    }

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
        assert_eq!(a.digest, b.digest);
        assert_eq!(
            std::fs::read(&a.archive).unwrap(),
            std::fs::read(&b.archive).unwrap()
        );
        assert_eq!(a.reference, "docker.io/nodewarden/test:1");
        let c = write_archive(&spec(1_700_000_001), &dir.path().join("c.tar")).unwrap();
        assert_ne!(a.digest, c.digest, "the epoch is part of the image");

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

    /// `path`'s bytes in an archive.
    fn archive_file(archive: &Path, path: &str) -> Vec<u8> {
        let data = std::fs::read(archive).unwrap();
        tar::entries(&data)
            .unwrap()
            .into_iter()
            .find(|e| e.name == path)
            .map(|e| e.data.to_vec())
            .unwrap_or_else(|| panic!("{path} is not in {}", archive.display()))
    }

    fn blob_json(archive: &Path, digest: &str) -> serde_json::Value {
        let hex = digest.strip_prefix("sha256:").unwrap();
        serde_json::from_slice(&archive_file(archive, &format!("blobs/sha256/{hex}"))).unwrap()
    }

    /// The spec of one platform's image: the binary differs by platform, as a real one does.
    fn platform_spec(arch: &str, epoch: u64) -> (Platform, ImageSpec) {
        let mut s = spec(epoch);
        s.files[0].source = Source::Bytes(format!("binary for {arch}").into_bytes());
        (Platform::linux(arch), s)
    }

    #[test]
    fn an_index_over_two_platforms_is_reproducible_and_reads_back_per_platform() {
        let dir = tempfile::tempdir().unwrap();
        let both = [
            platform_spec("amd64", 1_700_000_000),
            platform_spec("arm64", 1_700_000_000),
        ];
        let a = write_multi_platform_archive(&both, &dir.path().join("a.tar")).unwrap();
        // the platforms in the other order, each spec's files in the other order
        let mut reordered = [both[1].clone(), both[0].clone()];
        for (_, s) in &mut reordered {
            s.files.reverse();
        }
        let b = write_multi_platform_archive(&reordered, &dir.path().join("b.tar")).unwrap();
        assert_eq!(a.digest, b.digest);
        assert_eq!(a.manifests, b.manifests);
        assert_eq!(
            std::fs::read(&a.archive).unwrap(),
            std::fs::read(&b.archive).unwrap()
        );
        assert_eq!(a.reference, "docker.io/nodewarden/test:1");
        let platforms: Vec<String> = a.manifests.iter().map(|m| m.platform.to_string()).collect();
        assert_eq!(platforms, ["linux/amd64", "linux/arm64"]);
        assert_ne!(a.manifests[0].manifest_digest, a.manifests[1].manifest_digest);
        let c = write_multi_platform_archive(
            &[
                platform_spec("amd64", 1_700_000_000),
                platform_spec("arm64", 1_700_000_001),
            ],
            &dir.path().join("c.tar"),
        );
        assert!(c.is_err(), "one index, one epoch");
        let later = [
            platform_spec("amd64", 1_700_000_001),
            platform_spec("arm64", 1_700_000_001),
        ];
        let c = write_multi_platform_archive(&later, &dir.path().join("c.tar")).unwrap();
        assert_ne!(a.digest, c.digest, "the epoch is part of the image");

        // index.json names one image index (containerd gives every named entry of index.json a
        // record before it filters by platform); that index lists each manifest with its platform
        let top: serde_json::Value = serde_json::from_slice(&archive_file(&a.archive, "index.json")).unwrap();
        let entries = top["manifests"].as_array().unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0]["mediaType"], oci::MEDIA_INDEX);
        assert_eq!(entries[0]["digest"], a.digest.as_str());
        assert_eq!(
            entries[0]["annotations"][oci::ANNOTATION_CONTAINERD_NAME],
            "docker.io/nodewarden/test:1"
        );
        assert!(entries[0].get("platform").is_none());
        let index = blob_json(&a.archive, &a.digest);
        assert_eq!(index["mediaType"], oci::MEDIA_INDEX);
        let listed = index["manifests"].as_array().unwrap();
        assert_eq!(listed.len(), 2);
        for (desc, built) in listed.iter().zip(&a.manifests) {
            assert_eq!(desc["mediaType"], oci::MEDIA_MANIFEST);
            assert_eq!(desc["digest"], built.manifest_digest.as_str());
            assert_eq!(
                desc["platform"],
                serde_json::json!({"architecture": built.platform.architecture, "os": "linux"})
            );
            assert!(desc.get("annotations").is_none(), "only the index is named");
            let manifest = blob_json(&a.archive, &built.manifest_digest);
            assert_eq!(manifest["config"]["digest"], built.config_digest.as_str());
            let config = blob_json(&a.archive, &built.config_digest);
            assert_eq!(config["architecture"], built.platform.architecture.as_str());
            assert_eq!(config["os"], "linux");
        }

        assert_eq!(
            archive_platforms(&a.archive).unwrap(),
            [Platform::linux("amd64"), Platform::linux("arm64")]
        );
        for arch in ["amd64", "arm64"] {
            let contents = read_archive_for(&a.archive, &Platform::linux(arch)).unwrap();
            assert_eq!(contents.architecture, arch);
            let bin = &contents.rootfs["/usr/local/bin/b"];
            assert_eq!(
                bin.sha256,
                oci::sha256_hex(format!("binary for {arch}").as_bytes())
            );
            let root = dir.path().join(arch);
            extract_rootfs_for(&a.archive, &Platform::linux(arch), &root).unwrap();
            assert_eq!(
                std::fs::read(root.join("usr/local/bin/b")).unwrap(),
                format!("binary for {arch}").as_bytes()
            );
        }
        // without a platform: this machine's
        assert_eq!(read_archive(&a.archive).unwrap().architecture, oci::oci_arch());
        let missing = read_archive_for(&a.archive, &Platform::linux("s390x")).unwrap_err();
        assert!(
            format!("{missing:#}").contains("no linux/s390x image (it has linux/amd64, linux/arm64)"),
            "{missing:#}"
        );

        // a single-platform archive reads the same way
        let one = write_archive(&spec(1_700_000_000), &dir.path().join("one.tar")).unwrap();
        assert_eq!(archive_platforms(&one.archive).unwrap(), [Platform::host()]);
        assert_eq!(one.manifests.len(), 1);
        assert_eq!(one.digest, one.manifests[0].manifest_digest);
    }

    #[test]
    fn an_index_refuses_what_it_cannot_hold() {
        let dir = tempfile::tempdir().unwrap();
        let x = dir.path().join("x.tar");
        assert!(write_multi_platform_archive(&[], &x).is_err());
        let twice = [platform_spec("arm64", 0), platform_spec("arm64", 0)];
        assert!(write_multi_platform_archive(&twice, &x).is_err());
        let mut renamed = platform_spec("arm64", 0);
        renamed.1.name = "nodewarden/other".into();
        assert!(write_multi_platform_archive(&[platform_spec("amd64", 0), renamed], &x).is_err());
        assert!(!x.exists());
    }

    #[test]
    fn platforms_are_read_and_written_as_os_slash_arch() {
        assert_eq!(Platform::parse(" linux/arm64").unwrap(), Platform::linux("arm64"));
        assert_eq!(Platform::linux("amd64").to_string(), "linux/amd64");
        for bad in ["", "linux", "linux/", "/arm64", "linux/arm64/v8"] {
            assert!(Platform::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_binary_of_the_other_architecture_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        // a minimal static ELF header: 64-bit, little-endian, no program headers
        let elf = |machine: u16| {
            let mut h = vec![0u8; 64];
            h[..4].copy_from_slice(b"\x7fELF");
            h[4] = 2;
            h[5] = 1;
            h[0x12..0x14].copy_from_slice(&machine.to_le_bytes());
            h
        };
        let path = dir.path().join("bin");
        std::fs::write(&path, elf(183)).unwrap();
        ensure_static(&path, ARM64).unwrap();
        let wrong = ensure_static(&path, AMD64).unwrap_err();
        assert!(wrong.to_string().contains("not 62 (linux/amd64)"), "{wrong}");
        std::fs::write(&path, b"#!/bin/sh\n").unwrap();
        assert!(ensure_static(&path, ARM64).is_err());
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
