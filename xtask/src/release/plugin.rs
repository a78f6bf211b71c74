//! The platforms the kubectl plugin is released for, beside the images' (linux/amd64 and
//! linux/arm64, [`Target`]), and how each is built and checked:
//!
//! - linux: as the images' programs, static glibc, Debian's cross gcc off the host architecture
//!   ([`image::build_static_binaries_for`]); an ELF executable without a program interpreter;
//! - windows/amd64 (`x86_64-pc-windows-gnu`): linked by Debian's mingw-w64 (`gcc-mingw-w64-x86-64`,
//!   installed by `tests/node/packages.sh` when missing), the C runtime and libgcc linked in
//!   (`+crt-static`); a PE/COFF image for machine `0x8664`, `kubectl-nodewarden.exe`, in a `.zip`
//!   (what Windows users open; krew reads it too);
//! - darwin/amd64 and darwin/arm64: linked by zig through cargo-zigbuild, both installed from
//!   PyPI into a virtual environment cached under `~/.cache/nodewarden/zig/` ([`ensure_zig`]); a
//!   Mach-O executable. zig brings the C library's stubs but no framework of Apple's SDK, and the
//!   plugin's TLS clients (kube's `rustls-platform-verifier`, `rustls-native-certs`) link the
//!   Security and CoreFoundation frameworks on macOS: the link fails ("unable to find framework
//!   'Security'") unless `SDKROOT` names a macOS SDK. Not in the default platforms for that. On
//!   a Mac (the release workflow's macOS runner) they are built by Apple's own toolchain instead;
//! - windows/arm64 (`aarch64-pc-windows-msvc`): Microsoft's linker on a Windows machine (the
//!   release workflow's `windows-11-arm` runner), the C runtime linked in; refused elsewhere.
//!
//! A release made on Linux takes the archives those machines built (`--plugins-only` there,
//! `--plugin-archives` here: [`binary_in_archive`] checks each again before it joins the krew
//! manifest and `SHA256SUMS`).
//!
//! Every archive has the binary and the LICENSE at its top, dated the release's epoch.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};

use crate::image::target::{AMD64, ARM64, install_packages, on_path};
use crate::image::{self, BuildOptions, Target, tar};

use super::{PLUGIN_BIN, PLUGIN_PACKAGE, PLUGIN_PROFILE, say};

/// How the plugin is linked for a platform.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Linker {
    /// As the images' programs for that [`Target`] (Debian's cross gcc off the host).
    Linux(Target),
    /// Debian's mingw-w64: the tools `<prefix>-gcc` and `<prefix>-ar` of `package`.
    Mingw {
        prefix: &'static str,
        package: &'static str,
    },
    /// zig, through cargo-zigbuild ([`ensure_zig`]); on a Mac, Apple's toolchain.
    Zig,
    /// Microsoft's linker: built on Windows only.
    Msvc,
}

/// The executable format a platform's binary must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// 64-bit little-endian ELF executable of this `e_machine`.
    Elf { machine: u16 },
    /// PE32+ image of this COFF `Machine`.
    Pe { machine: u16 },
    /// 64-bit Mach-O executable (`MH_EXECUTE`) of this `cputype`.
    MachO { cpu_type: u32 },
}

/// One platform of the plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PluginPlatform {
    /// krew's `os` label and Go's `GOOS`: `linux`, `darwin` or `windows`.
    pub os: &'static str,
    /// krew's `arch` label: `amd64` or `arm64`.
    pub arch: &'static str,
    /// Rust target triple.
    pub triple: &'static str,
    pub linker: Linker,
    pub format: Format,
    /// The binary's file name in the archive (`kubectl-nodewarden`, `.exe` on windows).
    pub bin: &'static str,
}

/// ELF `e_machine` of x86-64 and AArch64; COFF machine of x86-64; Mach-O CPU types.
pub const ELF_X86_64: u16 = 62;
pub const ELF_AARCH64: u16 = 183;
pub const PE_AMD64: u16 = 0x8664;
pub const PE_ARM64: u16 = 0xaa64;
pub const MACHO_X86_64: u32 = 0x0100_0007;
pub const MACHO_ARM64: u32 = 0x0100_000c;

pub const LINUX_AMD64: PluginPlatform = PluginPlatform::linux(AMD64);
pub const LINUX_ARM64: PluginPlatform = PluginPlatform::linux(ARM64);
pub const DARWIN_AMD64: PluginPlatform = PluginPlatform {
    os: "darwin",
    arch: "amd64",
    triple: "x86_64-apple-darwin",
    linker: Linker::Zig,
    format: Format::MachO {
        cpu_type: MACHO_X86_64,
    },
    bin: PLUGIN_BIN,
};
pub const DARWIN_ARM64: PluginPlatform = PluginPlatform {
    os: "darwin",
    arch: "arm64",
    triple: "aarch64-apple-darwin",
    linker: Linker::Zig,
    format: Format::MachO {
        cpu_type: MACHO_ARM64,
    },
    bin: PLUGIN_BIN,
};
pub const WINDOWS_AMD64: PluginPlatform = PluginPlatform {
    os: "windows",
    arch: "amd64",
    triple: "x86_64-pc-windows-gnu",
    linker: Linker::Mingw {
        prefix: "x86_64-w64-mingw32",
        package: "gcc-mingw-w64-x86-64",
    },
    format: Format::Pe { machine: PE_AMD64 },
    bin: "kubectl-nodewarden.exe",
};

pub const WINDOWS_ARM64: PluginPlatform = PluginPlatform {
    os: "windows",
    arch: "arm64",
    triple: "aarch64-pc-windows-msvc",
    linker: Linker::Msvc,
    format: Format::Pe { machine: PE_ARM64 },
    bin: "kubectl-nodewarden.exe",
};

/// Every platform the plugin can be built for, in `os/arch` order.
pub const PLUGIN_PLATFORMS: [PluginPlatform; 6] = [
    DARWIN_AMD64,
    DARWIN_ARM64,
    LINUX_AMD64,
    LINUX_ARM64,
    WINDOWS_AMD64,
    WINDOWS_ARM64,
];

/// The most bytes read of a plugin binary out of an archive built elsewhere.
pub const MAX_PLUGIN_BYTES: u64 = 256 << 20;

/// `cargo xtask release`'s default `--platform`: the images' platforms and windows/amd64 (not
/// darwin: see the module's documentation).
pub const DEFAULT_PLATFORMS: &str = "linux/amd64,linux/arm64,windows/amd64";

/// The zig and cargo-zigbuild releases installed from PyPI.
pub const ZIGLANG_VERSION: &str = "0.15.2";
pub const CARGO_ZIGBUILD_VERSION: &str = "0.24.1";

impl PluginPlatform {
    /// The plugin on an image platform.
    pub const fn linux(target: Target) -> PluginPlatform {
        let machine = if target.elf_machine == ELF_AARCH64 {
            ELF_AARCH64
        } else {
            ELF_X86_64
        };
        PluginPlatform {
            os: "linux",
            arch: target.arch,
            triple: target.triple,
            linker: Linker::Linux(target),
            format: Format::Elf { machine },
            bin: PLUGIN_BIN,
        }
    }

    /// `<os>/<arch>`.
    pub fn name(&self) -> String {
        format!("{}/{}", self.os, self.arch)
    }

    /// The image [`Target`] of a linux platform.
    pub fn image_target(&self) -> Option<Target> {
        match self.linker {
            Linker::Linux(t) => Some(t),
            _ => None,
        }
    }

    /// `.zip` on windows, `.tar.gz` elsewhere.
    pub fn archive_ext(&self) -> &'static str {
        if self.os == "windows" { "zip" } else { "tar.gz" }
    }

    /// `kubectl-nodewarden_<version>_<os>_<arch>.<tar.gz|zip>`.
    pub fn archive_name(&self, version: &str) -> String {
        format!(
            "{PLUGIN_BIN}_{version}_{}_{}.{}",
            self.os,
            self.arch,
            self.archive_ext()
        )
    }

    /// The platform named `os/arch`.
    pub fn parse(item: &str) -> Result<PluginPlatform> {
        let item = item.trim();
        PLUGIN_PLATFORMS
            .into_iter()
            .find(|p| p.name() == item)
            .with_context(|| {
                let known: Vec<String> = PLUGIN_PLATFORMS.iter().map(PluginPlatform::name).collect();
                format!("the plugin is not built for {item:?} (only {})", known.join(", "))
            })
    }

    /// Fails unless `data` is an executable of this platform ([`check_format`]).
    pub fn check(&self, data: &[u8]) -> Result<()> {
        check_format(data, self.format)
    }
}

impl From<Target> for PluginPlatform {
    fn from(target: Target) -> Self {
        PluginPlatform::linux(target)
    }
}

/// Reads `--platform` of a release: comma-separated `os/arch`. Returns the images' targets (its
/// linux platforms, for [`BuildOptions::targets`]) and the plugin's other platforms, each in
/// platform order without repeats; either may be empty, not both.
pub fn parse_release_platforms(list: &str) -> Result<(Vec<Target>, Vec<PluginPlatform>)> {
    let mut images = Vec::new();
    let mut others = Vec::new();
    for item in list.split(',').filter(|s| !s.trim().is_empty()) {
        let platform = PluginPlatform::parse(item)?;
        match platform.image_target() {
            Some(t) if !images.contains(&t) => images.push(t),
            Some(_) => {}
            None if !others.contains(&platform) => others.push(platform),
            None => {}
        }
    }
    ensure!(
        !images.is_empty() || !others.is_empty(),
        "no platform given (e.g. {DEFAULT_PLATFORMS})"
    );
    images.sort_by_key(|t| t.platform());
    others.sort_by_key(PluginPlatform::name);
    Ok((images, others))
}

/// Fails unless `data` is an executable of `format` (its headers only: magic, machine, kind).
pub fn check_format(data: &[u8], format: Format) -> Result<()> {
    let u16_at = |o: usize| data.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| {
        data.get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    match format {
        Format::Elf { machine } => {
            ensure!(
                data.len() >= 64 && data[..4] == *b"\x7fELF" && data[4] == 2 && data[5] == 1,
                "not a 64-bit little-endian ELF file"
            );
            // e_type: ET_EXEC or ET_DYN (a static-pie executable)
            let kind = u16_at(0x10).unwrap_or(0);
            ensure!(
                kind == 2 || kind == 3,
                "an ELF file of type {kind}, not an executable"
            );
            let found = u16_at(0x12).unwrap_or(0);
            ensure!(found == machine, "built for ELF machine {found}, not {machine}");
        }
        Format::Pe { machine } => {
            ensure!(data.starts_with(b"MZ"), "not a PE image (no MZ header)");
            let pe = u32_at(0x3c).context("a truncated DOS header")? as usize;
            ensure!(
                data.get(pe..pe + 4) == Some(b"PE\0\0".as_slice()),
                "not a PE image (no PE signature at {pe:#x})"
            );
            let found = u16_at(pe + 4).context("a truncated COFF header")?;
            ensure!(
                found == machine,
                "built for COFF machine {found:#06x}, not {machine:#06x}"
            );
            // IMAGE_FILE_EXECUTABLE_IMAGE, not IMAGE_FILE_DLL
            let characteristics = u16_at(pe + 22).context("a truncated COFF header")?;
            ensure!(
                characteristics & 0x0002 != 0 && characteristics & 0x2000 == 0,
                "a PE file that is no executable (characteristics {characteristics:#06x})"
            );
            let magic = u16_at(pe + 24).context("no optional header")?;
            ensure!(
                magic == 0x20b,
                "not a PE32+ image (optional header magic {magic:#x})"
            );
        }
        Format::MachO { cpu_type } => {
            ensure!(
                u32_at(0) == Some(0xfeed_facf),
                "not a 64-bit little-endian Mach-O file"
            );
            let found = u32_at(4).context("a truncated Mach-O header")?;
            ensure!(
                found == cpu_type,
                "built for Mach-O CPU type {found:#010x}, not {cpu_type:#010x}"
            );
            let kind = u32_at(12).context("a truncated Mach-O header")?;
            ensure!(kind == 2, "a Mach-O file of type {kind}, not MH_EXECUTE");
        }
    }
    Ok(())
}

/// Builds the plugin for `platform` (installing what the build needs when missing) and returns
/// the binary, checked with [`PluginPlatform::check`].
pub fn build_plugin(opts: &BuildOptions, platform: PluginPlatform) -> Result<PathBuf> {
    let path = match platform.linker {
        Linker::Linux(target) => {
            target.ensure_toolchain(&opts.root)?;
            let bins = image::build_static_binaries_for(
                opts,
                target,
                PLUGIN_PACKAGE,
                &[PLUGIN_BIN],
                PLUGIN_PROFILE,
            )?;
            bins.into_iter().next().context("cargo built no plugin")?
        }
        Linker::Mingw { prefix, package } => {
            let env = mingw_env(&opts.root, platform, prefix, package)?;
            let mut cmd = cargo_command(opts, platform, "cargo", &image::static_rustflags());
            cmd.envs(env.into_iter().filter(|(k, _)| std::env::var_os(k).is_none()));
            run_build(opts, platform, cmd)?
        }
        // on a Mac: Apple's toolchain and SDK link both architectures
        Linker::Zig if cfg!(target_os = "macos") => {
            ensure_std(&opts.root, platform.triple)?;
            let cmd = cargo_command(opts, platform, "cargo", &flags_without_crt_static());
            run_build(opts, platform, cmd)?
        }
        Linker::Zig => {
            ensure_std(&opts.root, platform.triple)?;
            let venv = ensure_zig()?;
            let bin = venv.join("bin");
            let mut path = vec![bin.clone()];
            path.extend(std::env::split_paths(
                &std::env::var_os("PATH").unwrap_or_default(),
            ));
            let zigbuild = bin.join("cargo-zigbuild");
            let mut cmd = cargo_command(
                opts,
                platform,
                &zigbuild.to_string_lossy(),
                &flags_without_crt_static(),
            );
            cmd.env("PATH", std::env::join_paths(path)?);
            run_build(opts, platform, cmd).map_err(|e| {
                if std::env::var_os("SDKROOT").is_some() {
                    return e;
                }
                e.context(format!(
                    "linking for {} needs the Security and CoreFoundation frameworks of a macOS \
                     SDK (kube's and nodewarden-history's TLS roots), which zig does not ship: \
                     set SDKROOT to a MacOSX.sdk folder, or build on macOS",
                    platform.name()
                ))
            })?
        }
        Linker::Msvc => {
            ensure_buildable_here(platform)?;
            ensure_std(&opts.root, platform.triple)?;
            // `+crt-static`: the C runtime linked in, nothing to install beside the .exe
            let cmd = cargo_command(opts, platform, "cargo", &image::static_rustflags());
            run_build(opts, platform, cmd)?
        }
    };
    let data = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    platform
        .check(&data)
        .with_context(|| format!("{} is not a {} executable", path.display(), platform.name()))?;
    Ok(path)
}

/// Fails for a platform this machine cannot link at all (windows/arm64 off Windows), naming
/// where it is built.
pub fn ensure_buildable_here(platform: PluginPlatform) -> Result<()> {
    ensure!(
        platform.linker != Linker::Msvc || cfg!(windows),
        "{} is linked by Microsoft's linker on Windows (the release workflow builds it on a \
         windows-11-arm runner: `cargo xtask release --plugins-only --platform {}`), not on this \
         machine",
        platform.name(),
        platform.name()
    );
    Ok(())
}

/// The static builds' RUSTFLAGS without `+crt-static` (macOS has no static C library), the
/// registry's paths still remapped.
fn flags_without_crt_static() -> String {
    image::static_rustflags()
        .split('\x1f')
        .filter(|f| !f.contains("crt-static"))
        .collect::<Vec<_>>()
        .join("\x1f")
}

/// The plugin's binary out of one of its archives (`.zip` on windows, `.tar.gz` elsewhere, as
/// [`write_archive`] writes them), checked to be an executable of `platform`; at most
/// [`MAX_PLUGIN_BYTES`] of it are read.
pub fn binary_in_archive(data: &[u8], platform: PluginPlatform) -> Result<Vec<u8>> {
    use std::io::Read as _;
    let mut bin = Vec::new();
    if platform.archive_ext() == "zip" {
        let mut archive = zip::ZipArchive::new(std::io::Cursor::new(data)).context("not a zip archive")?;
        let file = archive
            .by_name(platform.bin)
            .with_context(|| format!("no {} in the archive", platform.bin))?;
        file.take(MAX_PLUGIN_BYTES + 1).read_to_end(&mut bin)?;
    } else {
        let mut tar_bytes = Vec::new();
        flate2::read::GzDecoder::new(data)
            .take(2 * MAX_PLUGIN_BYTES)
            .read_to_end(&mut tar_bytes)
            .context("not a gzip file")?;
        bin = tar::entries(&tar_bytes)?
            .into_iter()
            .find(|e| e.name == platform.bin)
            .map(|e| e.data.to_vec())
            .with_context(|| format!("no {} in the archive", platform.bin))?;
    }
    ensure!(
        bin.len() as u64 <= MAX_PLUGIN_BYTES,
        "{} is over {} MiB",
        platform.bin,
        MAX_PLUGIN_BYTES >> 20
    );
    platform
        .check(&bin)
        .with_context(|| format!("its {} is not a {} executable", platform.bin, platform.name()))?;
    Ok(bin)
}

/// Makes sure the standard library of `platform` and Debian's mingw-w64 (`package`, tools
/// `<prefix>-gcc`, `<prefix>-ar`) are there (installed when missing and allowed), and returns
/// the environment that has cargo and the C builds (ring's) use them.
fn mingw_env(
    root: &Path,
    platform: PluginPlatform,
    prefix: &str,
    package: &str,
) -> Result<Vec<(String, String)>> {
    ensure_std(root, platform.triple)?;
    if on_path("dpkg-query").is_some() {
        install_packages(root, &[package]).with_context(|| {
            format!(
                "the plugin for {} is linked by Debian's {package}",
                platform.name()
            )
        })?;
    }
    let gcc = format!("{prefix}-gcc");
    ensure!(
        on_path(&gcc).is_some(),
        "the plugin for {} is linked by {gcc}, which is not on PATH (Debian: {package})",
        platform.name()
    );
    let lower = platform.triple.replace('-', "_");
    let upper = lower.to_uppercase();
    Ok(vec![
        (format!("CARGO_TARGET_{upper}_LINKER"), gcc.clone()),
        (format!("CC_{lower}"), gcc),
        (format!("AR_{lower}"), format!("{prefix}-ar")),
    ])
}

/// `cargo clippy` of the plugin for `platform` (a mingw one: its compiler is needed for ring's C
/// even to check), warnings denied, into `target_dir`: what `cargo xtask ci` runs so that a
/// change that breaks the windows plugin (a Unix-only call in a crate it links) fails before a
/// release does. A cold check is about 2 minutes; no link, no release profile.
pub fn lint_plugin(root: &Path, target_dir: &Path, platform: PluginPlatform) -> Result<()> {
    let Linker::Mingw { prefix, package } = platform.linker else {
        bail!("only the mingw platforms are linted apart (the linux ones are the workspace's own lint)");
    };
    let env = mingw_env(root, platform, prefix, package)?;
    let mut cmd = Command::new("cargo");
    image::clean_cargo_env(&mut cmd);
    cmd.current_dir(root)
        .args([
            "clippy",
            "--locked",
            "-p",
            PLUGIN_PACKAGE,
            "--target",
            platform.triple,
        ])
        .args(["--", "-D", "warnings"])
        .env("CARGO_TARGET_DIR", target_dir)
        .envs(env.into_iter().filter(|(k, _)| std::env::var_os(k).is_none()));
    let status = cmd.status().context("starting cargo clippy")?;
    ensure!(
        status.success(),
        "cargo clippy of {PLUGIN_BIN} for {} failed ({status})",
        platform.name()
    );
    Ok(())
}

/// `<program> build --locked --profile PLUGIN_PROFILE -p PLUGIN_PACKAGE --bin PLUGIN_BIN
/// --target <triple>` into the build's target folder, with `rustflags`.
fn cargo_command(opts: &BuildOptions, platform: PluginPlatform, program: &str, rustflags: &str) -> Command {
    let mut cmd = Command::new(program);
    image::clean_cargo_env(&mut cmd);
    cmd.current_dir(&opts.root)
        .args([
            "build",
            "--locked",
            "--profile",
            PLUGIN_PROFILE,
            "-p",
            PLUGIN_PACKAGE,
        ])
        .args(["--bin", PLUGIN_BIN, "--target", platform.triple])
        .env("CARGO_TARGET_DIR", &opts.target_dir)
        .env("CARGO_ENCODED_RUSTFLAGS", rustflags)
        .env_remove("RUSTFLAGS");
    if !opts.progress {
        cmd.arg("--quiet");
    }
    cmd
}

/// Runs the build `cmd`; returns the binary it wrote.
fn run_build(opts: &BuildOptions, platform: PluginPlatform, mut cmd: Command) -> Result<PathBuf> {
    say(format_args!(
        "building {PLUGIN_BIN} for {} ({}; a cold build takes minutes)",
        platform.name(),
        platform.triple
    ));
    let started = std::time::Instant::now();
    let status = cmd.status().context("starting cargo")?;
    ensure!(
        status.success(),
        "building {PLUGIN_BIN} for {} failed ({status})",
        platform.name()
    );
    let path = opts
        .target_dir
        .join(platform.triple)
        .join(PLUGIN_PROFILE)
        .join(platform.bin);
    say(format_args!(
        "{} built in {:.0?}: {:.1} MiB",
        path.display(),
        started.elapsed(),
        std::fs::metadata(&path)
            .with_context(|| format!("cargo wrote no {}", path.display()))?
            .len() as f64
            / 1048576.0
    ));
    Ok(path)
}

/// Makes sure rustc has the standard library of `triple` (`rustup target add` when missing).
fn ensure_std(root: &Path, triple: &str) -> Result<()> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());
    let has_std = || -> bool {
        let Ok(out) = Command::new(&rustc)
            .args(["--print", "target-libdir", "--target", triple])
            .current_dir(root)
            .output()
        else {
            return false;
        };
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        out.status.success()
            && std::fs::read_dir(dir).is_ok_and(|entries| {
                entries
                    .flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with("libstd-"))
            })
    };
    if has_std() {
        return Ok(());
    }
    say(format_args!("rustup target add {triple}"));
    let status = Command::new("rustup")
        .args(["target", "add", triple])
        .current_dir(root)
        .status()
        .context("running rustup (the standard library of a target comes with rustup)")?;
    ensure!(status.success(), "`rustup target add {triple}` failed ({status})");
    ensure!(
        has_std(),
        "`rustup target add {triple}` succeeded but rustc has no standard library for it"
    );
    Ok(())
}

/// The virtual environment with zig ([`ZIGLANG_VERSION`]) and cargo-zigbuild
/// ([`CARGO_ZIGBUILD_VERSION`]) from PyPI: `<cache>/zig/<versions>`, `<cache>` being
/// `NODEWARDEN_CACHE` or `~/.cache/nodewarden`; made with `python3 -m venv` and pip on first use
/// (one maker at a time; a half-made one is made again).
pub fn ensure_zig() -> Result<PathBuf> {
    let cache = match std::env::var_os("NODEWARDEN_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?).join(".cache/nodewarden"),
    };
    let root = cache.join("zig");
    let venv = root.join(format!(
        "ziglang-{ZIGLANG_VERSION}-cargo-zigbuild-{CARGO_ZIGBUILD_VERSION}"
    ));
    let done = venv.join(".complete");
    if done.is_file() {
        return Ok(venv);
    }
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let lock = std::fs::File::create(root.join(".lock"))?;
    lock.lock()?;
    if done.is_file() {
        return Ok(venv);
    }
    let _ = std::fs::remove_dir_all(&venv);
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string());
    say(format_args!(
        "installing zig {ZIGLANG_VERSION} and cargo-zigbuild {CARGO_ZIGBUILD_VERSION} from PyPI into {}",
        venv.display()
    ));
    let run = |mut cmd: Command, what: &str| -> Result<()> {
        let status = cmd.status().with_context(|| format!("running {what}"))?;
        ensure!(status.success(), "{what} failed ({status})");
        Ok(())
    };
    let mut make = Command::new(&python);
    make.args(["-m", "venv"]).arg(&venv);
    run(make, &format!("{python} -m venv"))?;
    let mut pip = Command::new(venv.join("bin/python"));
    pip.args(["-m", "pip", "install", "--disable-pip-version-check", "--quiet"])
        .arg(format!("ziglang=={ZIGLANG_VERSION}"))
        .arg(format!("cargo-zigbuild=={CARGO_ZIGBUILD_VERSION}"));
    run(pip, "pip install ziglang cargo-zigbuild")?;
    if !venv.join("bin/cargo-zigbuild").is_file() {
        bail!("pip installed no cargo-zigbuild into {}", venv.display());
    }
    std::fs::write(&done, "")?;
    Ok(venv)
}

/// Packs `files` (archive name, mode, bytes) into `path` as a gzipped tar (owned by 0:0, dated
/// `epoch`, no date in the gzip header) or, for a `.zip`, a zip archive ([`zip`]).
pub fn write_archive(path: &Path, files: &[(&str, u32, Vec<u8>)], epoch: u64) -> Result<()> {
    let bytes = if path.extension().is_some_and(|e| e == "zip") {
        zip(files, epoch)?
    } else {
        let mut tar_bytes = Vec::new();
        for (name, mode, data) in files {
            tar::append(&mut tar_bytes, name, tar::Kind::File, *mode, epoch, data)?;
        }
        tar::finish(&mut tar_bytes);
        let mut gz = flate2::GzBuilder::new()
            .mtime(0)
            .write(Vec::new(), flate2::Compression::best());
        gz.write_all(&tar_bytes)?;
        gz.finish()?
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

/// A zip archive of `files` (name, Unix mode, bytes), each deflated, dated `epoch` (MS-DOS time,
/// UTC, 1980 at the earliest) with the Unix modes kept: the same files give the same bytes.
pub fn zip(files: &[(&str, u32, Vec<u8>)], epoch: u64) -> Result<Vec<u8>> {
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .last_modified_time(dos_time(epoch)?);
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, mode, data) in files {
        writer
            .start_file(*name, options.unix_permissions(*mode))
            .with_context(|| format!("adding {name} to a zip"))?;
        writer.write_all(data)?;
    }
    Ok(writer.finish().context("finishing a zip")?.into_inner())
}

/// The zip date of `epoch`, UTC, clamped to 1980-01-01 (the earliest MS-DOS time).
fn dos_time(epoch: u64) -> Result<zip::DateTime> {
    // "YYYY-MM-DDTHH:MM:SSZ"
    let text = crate::image::oci::rfc3339(epoch);
    let num = |r: std::ops::Range<usize>| text.get(r).and_then(|s| s.parse::<u16>().ok()).unwrap_or(0);
    if num(0..4) < 1980 {
        return Ok(zip::DateTime::default());
    }
    let byte = |r| u8::try_from(num(r)).unwrap_or(0);
    zip::DateTime::from_date_and_time(
        num(0..4),
        byte(5..7),
        byte(8..10),
        byte(11..13),
        byte(14..16),
        byte(17..19),
    )
    .map_err(|e| anyhow::anyhow!("{text} as a zip date: {e}"))
}

/// Names of a zip archive's entries, in order.
pub fn zip_entries(data: &[u8]) -> Result<Vec<String>> {
    let archive = zip::ZipArchive::new(std::io::Cursor::new(data)).context("not a zip archive")?;
    archive
        .file_names()
        .map(|n| n.map(|n| n.into_owned()).context("a zip entry's name"))
        .collect()
}
