//! The container images: `cargo xtask image`'s OCI archives start their program from their own
//! root file system, and the repository's Containerfile, built with buildah (daemonless), gives
//! the same files, modes, owners, user, entrypoint, environment and labels.
//!
//! Both tests build the release binaries (minutes on a cold target folder). Under `CI=true` a
//! missing buildah fails the test; elsewhere it is skipped with a loud line
//! (`tests/node/packages.sh buildah` installs it).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use xtask::image::{self, BuildOptions, BuiltImage, COMPONENTS, FsEntry};

/// Both images, built once per test binary.
fn images() -> &'static (BuildOptions, Vec<BuiltImage>) {
    static BUILT: OnceLock<(BuildOptions, Vec<BuiltImage>)> = OnceLock::new();
    BUILT.get_or_init(|| {
        let opts = BuildOptions::for_repo(&image::repo_root()).expect("build options");
        let built = image::build_nodewarden_images(&opts).expect("cargo xtask image");
        (opts, built)
    })
}

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// `Some(path)` of a tool on PATH; `None` (after a loud line) when it is missing outside CI.
fn require_tool(tool: &str, package: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(tool))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        let msg = format!("{tool} is missing: install it with `tests/node/packages.sh {package}`");
        assert!(!ci(), "{msg} (CI=true: this test does not skip)");
        eprintln!("\n!!! SKIPPED: {msg}\n");
    }
    found
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_images_start_their_program_from_their_own_files() {
    let (_, built) = images();
    for image in built {
        let contents = image::read_archive(&image.archive).expect("reading our archive");
        assert_eq!(contents.config.user, image::USER, "{}", image.reference);
        let paths: Vec<&str> = contents.rootfs.keys().map(String::as_str).collect();
        let entry = &contents.config.entrypoint[0];
        let component = COMPONENTS
            .iter()
            .find(|c| image.reference.contains(&c.image_name()))
            .expect("one of nodewarden's images");
        let mut expected = vec![
            "/etc",
            "/etc/group",
            "/etc/passwd",
            "/usr",
            "/usr/local",
            "/usr/local/bin",
        ]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
        expected.extend(component.bins().iter().map(|b| format!("/usr/local/bin/{b}")));
        expected.sort();
        assert_eq!(&format!("/usr/local/bin/{}", component.package), entry);
        assert_eq!(
            paths, expected,
            "{}: the static binaries and the two account files, nothing else (no shell)",
            image.reference
        );
        assert!(contents.rootfs.values().all(|e| e.uid == 0 && e.gid == 0));
        for key in ["source", "version", "revision"] {
            let label = format!("org.opencontainers.image.{key}");
            assert!(
                contents.config.labels.get(&label).is_some_and(|v| !v.is_empty()),
                "{}: label {label}",
                image.reference
            );
        }

        // The binary, run from the extracted root file system: chroot when root (then nothing
        // of the host is visible to it), else directly (a static binary needs no loader either way).
        let dir = tempfile::tempdir().expect("temporary folder");
        image::extract_rootfs(&image.archive, dir.path()).expect("extracting the root file system");
        let is_root = run(Command::new("id").arg("-u")).trim() == "0";
        let help = if is_root {
            run(Command::new("chroot")
                .arg("--userspec=65532:65532")
                .arg(dir.path())
                .args([entry.as_str(), "--help"])
                .env_clear()
                .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"))
        } else {
            let bin = dir.path().join(entry.trim_start_matches('/'));
            run(Command::new(bin).arg("--help").env_clear())
        };
        assert!(
            help.contains("Usage:"),
            "{}: --help printed {help}",
            image.reference
        );
    }
}

/// buildah with its own storage in a temporary folder, removed on drop.
struct Buildah {
    bin: PathBuf,
    dir: tempfile::TempDir,
}

impl Buildah {
    fn cmd(&self) -> Command {
        let mut cmd = Command::new(&self.bin);
        let d = self.dir.path();
        cmd.arg("--root")
            .arg(d.join("root"))
            .arg("--runroot")
            .arg(d.join("runroot"))
            .args(["--storage-driver", "vfs"])
            .env("BUILDAH_ISOLATION", "chroot")
            // no registries.conf or policy of the machine matters: FROM scratch, nothing pulled
            .env("REGISTRIES_CONFIG_PATH", d.join("registries.conf"))
            .env("CONTAINERS_REGISTRIES_CONF", d.join("registries.conf"))
            // its network configuration in the temporary folder too: by default buildah creates
            // /etc/cni/net.d on the host
            .env("CONTAINERS_CONF", d.join("containers.conf"));
        cmd
    }

    fn policy(&self) -> PathBuf {
        self.dir.path().join("policy.json")
    }
}

impl Drop for Buildah {
    fn drop(&mut self) {
        let _ = self.cmd().args(["rmi", "--all", "--force"]).output();
        let _ = std::fs::remove_dir_all(self.dir.path().join("root"));
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let dir = self.dir.path().to_string_lossy().into_owned();
        if mounts.contains(&dir) {
            eprintln!("!!! buildah left mounts under {dir}");
        }
    }
}

fn describe(rootfs: &BTreeMap<String, FsEntry>) -> String {
    rootfs
        .iter()
        .map(|(p, e)| {
            format!(
                "{p} {:?} {:o} {}:{} {} {}\n",
                e.kind, e.mode, e.uid, e.gid, e.size, e.sha256
            )
        })
        .collect()
}

#[test]
fn the_containerfile_builds_the_same_images() {
    let Some(bin) = require_tool("buildah", "buildah") else {
        return;
    };
    let (opts, built) = images();
    let buildah = Buildah {
        bin,
        dir: tempfile::Builder::new()
            .prefix("nodewarden-buildah")
            .tempdir()
            .expect("temporary folder"),
    };
    std::fs::write(
        buildah.policy(),
        r#"{"default":[{"type":"insecureAcceptAnything"}]}"#,
    )
    .expect("writing policy.json");
    std::fs::write(buildah.dir.path().join("registries.conf"), "").expect("writing registries.conf");
    std::fs::write(
        buildah.dir.path().join("containers.conf"),
        format!(
            "[network]\nnetwork_config_dir = \"{}\"\n",
            buildah.dir.path().join("cni").display()
        ),
    )
    .expect("writing containers.conf");
    let triple = image::host_triple().expect("host triple");
    let root = &opts.root;
    // the Containerfile expects the binaries under <root>/target
    assert_eq!(
        opts.target_dir,
        root.join("target"),
        "the Containerfile reads target/ of the checkout; unset CARGO_TARGET_DIR"
    );

    for (component, ours) in COMPONENTS.into_iter().zip(built) {
        let tag = format!("localhost/nodewarden-test/{}:containerfile", component.package);
        run(buildah
            .cmd()
            .current_dir(root)
            .arg("bud")
            .arg("--signature-policy")
            .arg(buildah.policy())
            .args(["--pull-never", "--quiet", "-f", "Containerfile"])
            .args(["--target", containerfile_stage(component.package), "-t", &tag])
            .args(["--build-arg", &format!("TRIPLE={triple}")])
            .args(["--build-arg", &format!("VERSION={}", opts.version)])
            .args(["--build-arg", &format!("REVISION={}", opts.revision)])
            .arg("."));
        let archive = buildah.dir.path().join(format!("{}.oci.tar", component.package));
        run(buildah
            .cmd()
            .arg("push")
            .arg("--signature-policy")
            .arg(buildah.policy())
            .args(["--quiet", &tag])
            .arg(format!("oci-archive:{}", archive.display())));

        let theirs = image::read_archive(&archive).expect("reading buildah's archive");
        let ours_contents = image::read_archive(&ours.archive).expect("reading our archive");
        assert_eq!(
            describe(&theirs.rootfs),
            describe(&ours_contents.rootfs),
            "{}: the Containerfile's root file system (left) differs from xtask's (right)",
            component.package
        );
        let mut their_config = theirs.config.clone();
        // buildah's own label says which buildah built it
        their_config.labels.retain(|k, _| !k.starts_with("io.buildah."));
        assert_eq!(
            their_config, ours_contents.config,
            "{}: config",
            component.package
        );
        assert_eq!(
            (theirs.architecture.as_str(), theirs.os.as_str()),
            (ours_contents.architecture.as_str(), ours_contents.os.as_str())
        );
        eprintln!(
            "{}: the Containerfile and xtask agree on {} paths",
            component.package,
            theirs.rootfs.len()
        );
    }
}

fn containerfile_stage(package: &str) -> &'static str {
    match package {
        "nodewarden-webhook" => "webhook",
        "nodewarden-agent" => "agent",
        other => panic!("no Containerfile stage for {other}"),
    }
}
