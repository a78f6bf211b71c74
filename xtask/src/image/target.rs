//! The platforms nodewarden's images are built for, and what building for one needs: Rust's
//! standard library for its target (`rustup target add`), and away from the build machine's own
//! architecture Debian's cross linker and C library (`gcc-aarch64-linux-gnu`,
//! `libc6-dev-arm64-cross`), all installed when missing.
//!
//! Both platforms use the glibc targets, linked statically as the amd64 images always were,
//! rather than musl: the agent hands its free heap back with glibc's `malloc_trim`
//! (nodewarden-sys), the figures of docs/benchmarks.md were measured with glibc's allocator, and
//! Debian ships a glibc cross toolchain (for ring's C and assembly too) but no musl one for
//! aarch64.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};

use super::oci::{Platform, oci_arch};

/// One platform of the images and how cargo builds for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    /// OCI architecture, e.g. `arm64`.
    pub arch: &'static str,
    /// Rust target triple, e.g. `aarch64-unknown-linux-gnu`.
    pub triple: &'static str,
    /// Prefix of Debian's cross tools for it, e.g. `aarch64-linux-gnu` (`…-gcc`, `…-ar`).
    pub gnu_prefix: &'static str,
    /// Debian's packages of the cross linker and the static C library for it.
    pub cross_packages: &'static [&'static str],
    /// ELF `e_machine` of its executables.
    pub elf_machine: u16,
    /// Debian's (qemu-user-static) user-mode emulator that runs its executables elsewhere.
    pub qemu: &'static str,
}

pub const AMD64: Target = Target {
    arch: "amd64",
    triple: "x86_64-unknown-linux-gnu",
    gnu_prefix: "x86_64-linux-gnu",
    cross_packages: &["gcc-x86-64-linux-gnu", "libc6-dev-amd64-cross"],
    elf_machine: 62,
    qemu: "qemu-x86_64-static",
};

pub const ARM64: Target = Target {
    arch: "arm64",
    triple: "aarch64-unknown-linux-gnu",
    gnu_prefix: "aarch64-linux-gnu",
    cross_packages: &["gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross"],
    elf_machine: 183,
    qemu: "qemu-aarch64-static",
};

/// Every platform the images are built for by default, in platform order.
pub const TARGETS: [Target; 2] = [AMD64, ARM64];

/// `--platform`'s default.
pub const DEFAULT_PLATFORMS: &str = "linux/amd64,linux/arm64";

/// The Debian package of the `qemu-*-static` emulators.
pub const QEMU_PACKAGE: &str = "qemu-user-static";

impl Target {
    /// `linux/<arch>`.
    pub fn platform(&self) -> Platform {
        Platform::linux(self.arch)
    }

    /// The target of `platform`, if the images are built for it.
    pub fn for_platform(platform: &Platform) -> Result<Target> {
        TARGETS
            .into_iter()
            .find(|t| t.platform() == *platform)
            .with_context(|| {
                let known: Vec<String> = TARGETS.iter().map(|t| t.platform().to_string()).collect();
                format!(
                    "the images are not built for {platform} (only {})",
                    known.join(", ")
                )
            })
    }

    /// The build machine's own architecture's, if the images are built for it.
    pub fn host() -> Result<Target> {
        Target::for_platform(&Platform::host())
    }

    /// Whether this is the build machine's own architecture (no cross linker needed).
    pub fn is_host(&self) -> bool {
        self.arch == oci_arch()
    }

    /// Environment for a cargo build of this target on this machine: off the host architecture,
    /// the cross linker for rustc (`CARGO_TARGET_<TRIPLE>_LINKER`) and the cross C compiler and
    /// archiver for build scripts that compile C (ring: `CC_<triple>`, `AR_<triple>`). A
    /// variable already set is left to the caller.
    pub fn cargo_env(&self) -> Vec<(String, String)> {
        if self.is_host() {
            return Vec::new();
        }
        let upper = self.triple.to_uppercase().replace('-', "_");
        let lower = self.triple.replace('-', "_");
        let gcc = format!("{}-gcc", self.gnu_prefix);
        [
            (format!("CARGO_TARGET_{upper}_LINKER"), gcc.clone()),
            (format!("CC_{lower}"), gcc),
            (format!("AR_{lower}"), format!("{}-ar", self.gnu_prefix)),
        ]
        .into_iter()
        .filter(|(key, _)| std::env::var_os(key).is_none())
        .collect()
    }

    /// The cross linker this target needs here (`None` on its own architecture).
    pub fn linker(&self) -> Option<String> {
        if self.is_host() {
            return None;
        }
        let key = format!(
            "CARGO_TARGET_{}_LINKER",
            self.triple.to_uppercase().replace('-', "_")
        );
        Some(std::env::var(&key).unwrap_or_else(|_| format!("{}-gcc", self.gnu_prefix)))
    }

    /// Makes sure cargo can build for this target from `root` (the workspace): Rust's standard
    /// library for it (`rustup target add` when missing), and off the host architecture the
    /// cross linker and static C library (Debian packages, installed by
    /// `tests/node/packages.sh` when missing). Fails saying what is missing and how to get it.
    pub fn ensure_toolchain(&self, root: &Path) -> Result<()> {
        if !has_std(root, self.triple)? {
            eprintln!(
                "==> image: Rust's standard library for {} is missing: rustup target add {}",
                self.triple, self.triple
            );
            let status = Command::new("rustup")
                .args(["target", "add", self.triple])
                .current_dir(root)
                .status()
                .context("running rustup (Rust's standard library for a target comes with rustup)");
            match status {
                Ok(s) if s.success() => {}
                Ok(s) => bail!(
                    "`rustup target add {}` failed ({s}): building for {} needs Rust's standard \
                     library for that target",
                    self.triple,
                    self.platform()
                ),
                Err(e) => return Err(e.context(format!("building for {}", self.platform()))),
            }
            ensure!(
                has_std(root, self.triple)?,
                "`rustup target add {}` succeeded but rustc still has no standard library for it \
                 (is RUSTC a rustc of another toolchain?)",
                self.triple
            );
        }
        let Some(linker) = self.linker() else {
            return Ok(());
        };
        // dpkg-query: a Debian-like machine, where packages.sh can install what is missing (a
        // no-op when everything is there); elsewhere the linker must already be on PATH
        if on_path("dpkg-query").is_some() {
            install_packages(root, self.cross_packages).with_context(|| {
                format!(
                    "building for {} needs a cross linker and C library ({}); install them, or \
                     build only --platform {}",
                    self.platform(),
                    self.cross_packages.join(", "),
                    Platform::host()
                )
            })?;
        }
        ensure!(
            on_path(&linker).is_some(),
            "building for {} needs the cross linker {linker}, which is not on PATH (Debian: {}; \
             or set CARGO_TARGET_{}_LINKER), or build only --platform {}",
            self.platform(),
            self.cross_packages.join(" "),
            self.triple.to_uppercase().replace('-', "_"),
            Platform::host()
        );
        Ok(())
    }

    /// Makes sure this target's user-mode emulator (`qemu-aarch64-static`) is there, installing
    /// Debian's qemu-user-static when it is missing, and returns it. It is run directly (the
    /// program as its argument), so nothing is registered with the kernel's binfmt_misc and the
    /// host is not changed beyond the package.
    pub fn ensure_qemu(&self, root: &Path) -> Result<PathBuf> {
        if let Some(found) = on_path(self.qemu) {
            return Ok(found);
        }
        install_packages(root, &[QEMU_PACKAGE]).with_context(|| {
            format!(
                "running {} programs here needs {} (Debian's {QEMU_PACKAGE})",
                self.platform(),
                self.qemu
            )
        })?;
        on_path(self.qemu)
            .with_context(|| format!("{QEMU_PACKAGE} is installed but {} is not on PATH", self.qemu))
    }
}

/// Reads `--platform`'s value: comma-separated `os/arch`, e.g. `linux/amd64,linux/arm64`. The
/// result is in platform order without repeats.
pub fn parse_platforms(list: &str) -> Result<Vec<Target>> {
    let mut targets = Vec::new();
    for item in list.split(',').filter(|s| !s.trim().is_empty()) {
        let target = Target::for_platform(&Platform::parse(item)?)?;
        if !targets.contains(&target) {
            targets.push(target);
        }
    }
    ensure!(
        !targets.is_empty(),
        "no platform given (e.g. {DEFAULT_PLATFORMS})"
    );
    targets.sort_by_key(|t| t.platform());
    Ok(targets)
}

/// Whether the toolchain cargo uses in `root` has the standard library of `triple`.
fn has_std(root: &Path, triple: &str) -> Result<bool> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());
    let out = Command::new(&rustc)
        .args(["--print", "target-libdir", "--target", triple])
        .current_dir(root)
        .output()
        .with_context(|| format!("running {rustc} --print target-libdir"))?;
    if !out.status.success() {
        // an unknown target, for instance: `rustup target add` says more
        return Ok(false);
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let found = std::fs::read_dir(&dir)
        .map(|entries| {
            entries.flatten().any(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.starts_with("libstd-") && name.ends_with(".rlib")
            })
        })
        .unwrap_or(false);
    Ok(found)
}

/// `tool`'s path if it is on PATH.
pub fn on_path(tool: &str) -> Option<PathBuf> {
    let tool = Path::new(tool);
    if tool.is_absolute() {
        return tool.is_file().then(|| tool.to_path_buf());
    }
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// Installs the Debian `packages` that are missing with the repository's
/// `tests/node/packages.sh` (nothing when all are there).
pub fn install_packages(root: &Path, packages: &[&str]) -> Result<()> {
    let script = root.join("tests/node/packages.sh");
    let status = Command::new("bash")
        .arg(&script)
        .args(packages)
        .current_dir(root)
        .status()
        .with_context(|| format!("running {}", script.display()))?;
    ensure!(
        status.success(),
        "tests/node/packages.sh {} failed ({status})",
        packages.join(" ")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn platforms_are_read_sorted_and_once() {
        let both = parse_platforms("linux/arm64, linux/amd64,linux/arm64").unwrap();
        assert_eq!(both, [AMD64, ARM64]);
        assert_eq!(parse_platforms(DEFAULT_PLATFORMS).unwrap(), TARGETS);
        assert_eq!(parse_platforms("linux/arm64").unwrap(), [ARM64]);
        for bad in [
            "",
            ",",
            "arm64",
            "linux/riscv64",
            "windows/amd64",
            "linux/arm64/v8",
        ] {
            assert!(parse_platforms(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_cross_target_names_its_linker_and_c_compiler() {
        let cross = if AMD64.is_host() { ARM64 } else { AMD64 };
        let env = cross.cargo_env();
        let upper = cross.triple.to_uppercase().replace('-', "_");
        for (key, value) in [
            (
                format!("CARGO_TARGET_{upper}_LINKER"),
                format!("{}-gcc", cross.gnu_prefix),
            ),
            (
                format!("CC_{}", cross.triple.replace('-', "_")),
                format!("{}-gcc", cross.gnu_prefix),
            ),
        ] {
            if std::env::var_os(&key).is_none() {
                assert!(env.contains(&(key.clone(), value)), "{key} in {env:?}");
            }
        }
        assert!(Target::host().unwrap().cargo_env().is_empty());
    }
}
