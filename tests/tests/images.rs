//! The container images: `cargo xtask image`'s OCI archives start their program from their own
//! root file system, the repository's Containerfile, built with buildah (daemonless), gives
//! the same files, modes, owners, user, entrypoint, environment and labels, and the linux/arm64
//! image of each archive holds aarch64 programs that run (under qemu-user, on this machine).
//!
//! The tests build the images as the other real-node tests do (`nodewarden_tests::images`): this
//! machine's platform with the release profiles, the other one under `image-check` (minutes on a
//! cold target folder; arm64 is cross-compiled, its Rust target and Debian's cross linker
//! installed when missing). Under `CI=true` a missing buildah or qemu-user-static fails the test;
//! elsewhere it is skipped with a loud line (`tests/node/packages.sh buildah qemu-user-static`
//! installs them).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use xtask::image::{self, AMD64, ARM64, BuildOptions, BuiltImage, COMPONENTS, FsEntry};

/// Both images, for both platforms, built once per test binary.
fn images() -> &'static (BuildOptions, Vec<BuiltImage>) {
    static BUILT: OnceLock<(BuildOptions, Vec<BuiltImage>)> = OnceLock::new();
    BUILT.get_or_init(|| {
        let opts = nodewarden_tests::images::options().expect("build options");
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

/// The arm64 half of each archive, read the way a node of that platform does: the index, its
/// linux/arm64 manifest, that manifest's layer. Its programs are aarch64 static executables,
/// run here with `qemu-aarch64-static <program> --help` (Debian's qemu-user-static, called
/// directly: nothing is registered with the kernel's binfmt_misc, the host is left as it was).
#[test]
fn the_arm64_images_hold_aarch64_programs_that_run() {
    let (opts, built) = images();
    let qemu = match ARM64.ensure_qemu(&opts.root) {
        Ok(qemu) => qemu,
        Err(e) => {
            let msg = format!(
                "{e:#}: install it with `tests/node/packages.sh {}`",
                image::target::QEMU_PACKAGE
            );
            assert!(!ci(), "{msg} (CI=true: this test does not skip)");
            eprintln!("\n!!! SKIPPED: {msg}\n");
            return;
        }
    };
    let arm64 = ARM64.platform();
    for image in built {
        let component = COMPONENTS
            .iter()
            .find(|c| image.reference.contains(&c.image_name()))
            .expect("one of nodewarden's images");
        assert_eq!(
            image::archive_platforms(&image.archive).expect("reading the archive's index"),
            [AMD64.platform(), arm64.clone()],
            "{}",
            image.reference
        );
        let theirs = image::read_archive_for(&image.archive, &arm64).expect("the arm64 image");
        let ours = image::read_archive_for(&image.archive, &AMD64.platform()).expect("the amd64 image");
        assert_eq!(
            (theirs.os.as_str(), theirs.architecture.as_str()),
            ("linux", "arm64")
        );
        assert_eq!(
            theirs.config, ours.config,
            "{}: one entrypoint, user, environment and labels on both platforms",
            image.reference
        );
        let paths = |c: &image::ImageContents| c.rootfs.keys().cloned().collect::<Vec<_>>();
        assert_eq!(
            paths(&theirs),
            paths(&ours),
            "{}: the same files",
            image.reference
        );

        let dir = tempfile::tempdir().expect("temporary folder");
        image::extract_rootfs_for(&image.archive, &arm64, dir.path())
            .expect("extracting the arm64 root file system");
        for bin in component.bins() {
            let path = dir.path().join("usr/local/bin").join(bin);
            let amd64_bytes = &ours.rootfs[&format!("/usr/local/bin/{bin}")].sha256;
            assert_ne!(
                &theirs.rootfs[&format!("/usr/local/bin/{bin}")].sha256,
                amd64_bytes,
                "{bin}: the arm64 image has its own binary"
            );
            // an aarch64 ELF executable that needs no loader from the image
            image::ensure_static(&path, ARM64).expect("an aarch64 static executable");
            let help = run(Command::new(&qemu).arg(&path).arg("--help").env_clear());
            let flag = match bin {
                "nodewarden-webhook" => "--tls-cert-file",
                "nodewarden-agent" => "--node-name",
                "nodewarden-agent-init" => "--owner",
                other => panic!("no expected flag for {other}"),
            };
            assert!(
                help.contains(&format!("Usage: {bin}")) && help.contains(flag),
                "{bin} (linux/arm64, under {}): --help printed {help}",
                qemu.display()
            );
            eprintln!(
                "{bin} (linux/arm64) ran under qemu-aarch64: {}",
                help.lines().next().unwrap_or_default()
            );
        }
    }
}

/// containerd of this test's own (its folders in a temporary one, no CRI, native snapshotter
/// only, nothing unpacked, so nothing mounted), stopped on drop.
struct Containerd {
    child: std::process::Child,
    dir: tempfile::TempDir,
}

impl Containerd {
    fn start(bin: &std::path::Path) -> Containerd {
        let dir = tempfile::Builder::new()
            .prefix("nodewarden-containerd")
            .tempdir()
            .expect("temporary folder");
        let d = dir.path().to_path_buf();
        let config = format!(
            "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\n\
             disabled_plugins = [\"io.containerd.grpc.v1.cri\", \"io.containerd.snapshotter.v1.overlayfs\", \
             \"io.containerd.snapshotter.v1.btrfs\", \"io.containerd.snapshotter.v1.zfs\", \
             \"io.containerd.snapshotter.v1.devmapper\", \"io.containerd.snapshotter.v1.aufs\"]\n\
             [grpc]\n  address = \"{sock}\"\n[ttrpc]\n  address = \"{sock}.ttrpc\"\n\
             [plugins.\"io.containerd.internal.v1.opt\"]\n  path = \"{opt}\"\n",
            root = d.join("root").display(),
            state = d.join("state").display(),
            sock = d.join("containerd.sock").display(),
            opt = d.join("opt").display(),
        );
        std::fs::write(d.join("config.toml"), config).expect("writing config.toml");
        let log = std::fs::File::create(d.join("containerd.log")).expect("creating the log");
        let child = Command::new(bin)
            .arg("--config")
            .arg(d.join("config.toml"))
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("starting containerd");
        let me = Containerd { child, dir };
        let started = std::time::Instant::now();
        while !d.join("containerd.sock").exists() {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(30),
                "containerd did not listen within 30 s:\n{}",
                std::fs::read_to_string(d.join("containerd.log")).unwrap_or_default()
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        me
    }

    fn ctr(&self, ctr: &std::path::Path, args: &[&str]) -> String {
        run(Command::new(ctr)
            .arg("--address")
            .arg(self.dir.path().join("containerd.sock"))
            .args(["--namespace", "k8s.io"])
            .args(args))
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a node does with an archive: the real-node tier's `ctr images import --no-unpack`, with
/// containerd's default platform matcher, names the image by the index (so the chart's image
/// reference is the same on every platform) and keeps this machine's platform only: the index is
/// left referencing this platform's manifest alone, and the other platform's blobs are collected.
/// (containerd gives every named entry of an archive's `index.json` an image record before it
/// filters by platform; with the manifests named there, the last one listed would win.)
#[test]
fn containerd_imports_this_machines_platform_out_of_the_index() {
    let (Some(containerd), Some(ctr)) = (
        require_tool("containerd", "containerd"),
        require_tool("ctr", "containerd"),
    ) else {
        return;
    };
    if run(Command::new("id").arg("-u")).trim() != "0" {
        assert!(!ci(), "containerd needs root (CI=true: this test does not skip)");
        eprintln!("\n!!! SKIPPED: containerd needs root\n");
        return;
    }
    let (_, built) = images();
    let node = Containerd::start(&containerd);
    let host = image::Platform::host();
    for image in built {
        let archive = image.archive.to_str().expect("a UTF-8 path");
        node.ctr(&ctr, &["images", "import", "--no-unpack", archive]);
        let listed = node.ctr(&ctr, &["images", "ls"]);
        let line = listed
            .lines()
            .find(|l| l.split_whitespace().next() == Some(image.reference.as_str()))
            .unwrap_or_else(|| panic!("{} is not in\n{listed}", image.reference));
        assert_eq!(
            line.split_whitespace().nth(2),
            Some(image.digest.as_str()),
            "{}: the name points to the index\n{listed}",
            image.reference
        );
        let (ours, others): (Vec<_>, Vec<_>) = image.manifests.iter().partition(|m| m.platform == host);
        let [ours] = ours.as_slice() else {
            panic!("{}: no {host} manifest", image.reference);
        };
        assert!(!others.is_empty(), "{}: one platform only", image.reference);
        // the index's garbage-collection references: what the import kept
        let content = node.ctr(&ctr, &["content", "ls"]);
        let index_line = content
            .lines()
            .find(|l| l.starts_with(&image.digest))
            .unwrap_or_else(|| panic!("{}: the index is not in\n{content}", image.reference));
        assert!(
            index_line.contains(&format!(
                "containerd.io/gc.ref.content.m.0={}",
                ours.manifest_digest
            )) && !index_line.contains("gc.ref.content.m.1"),
            "{}: the index should keep the {host} manifest alone: {index_line}",
            image.reference
        );
        let started = std::time::Instant::now();
        loop {
            let content = node.ctr(&ctr, &["content", "ls", "--quiet"]);
            let left: Vec<&str> = others
                .iter()
                .filter(|m| content.contains(&m.manifest_digest))
                .map(|m| m.manifest_digest.as_str())
                .collect();
            if left.is_empty() {
                break;
            }
            assert!(
                started.elapsed() < std::time::Duration::from_secs(20),
                "{}: the other platforms' manifests {left:?} are still there after 20 s",
                image.reference
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        eprintln!(
            "{}: containerd kept {host} ({}) out of the index {}",
            image.reference, ours.manifest_digest, image.digest
        );
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
