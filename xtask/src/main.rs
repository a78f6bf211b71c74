//! Project tasks: `cargo xtask <task>`.

mod ci_watch;
mod compat;
mod fuzz;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "nodewarden project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Run nodewarden against a real control plane on this machine and show what happened.
    Demo,
    /// Write charts/nodewarden/crds/*.yaml from the api crate's types, and the Kubernetes
    /// schemas (securityContext, affinity) into charts/nodewarden/values.schema.json.
    Crdgen,
    /// Everything CI checks: formatting, clippy, every fuzz target for 20 s, every test (the
    /// end-to-end tier builds the control plane from Go modules on first use and caches it).
    Ci,
    /// Run every fuzz target for a bounded time (nightly toolchain; cargo-fuzz is installed
    /// on first use); fails on any crash. See docs/fuzzing.md.
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Targets to run (default: all).
        targets: Vec<String>,
        /// Only build the targets (with cargo-fuzz installed first if missing); run nothing.
        #[arg(long)]
        build_only: bool,
    },
    /// The Kubernetes version matrix: for each version, build its kube-apiserver and
    /// kube-controller-manager (tests/controlplane/build-version.sh, cached per version), run the
    /// API-server tier's test files against them, and write docs/compatibility.md (a table
    /// version × capability) from the results. Fails when a version other than a pre-release fails.
    Compat {
        /// Versions, comma-separated (default: every minor from 1.30 to 1.37 and v1.38.0-beta.0).
        #[arg(long, value_delimiter = ',', default_values_t = compat::DEFAULT_VERSIONS.iter().map(|v| v.to_string()))]
        versions: Vec<String>,
        /// Test files of tests/tests, comma-separated, without `.rs`.
        #[arg(long, value_delimiter = ',', default_values_t = compat::CAPABILITIES.iter().map(|(f, _)| f.to_string()))]
        files: Vec<String>,
        /// Only write docs/compatibility.md from the results of earlier runs.
        #[arg(long)]
        write_only: bool,
    },
    /// Benchmarks (release builds); figures are recorded in docs/benchmarks.md.
    Bench {
        #[command(subcommand)]
        which: Bench,
    },
    /// Build the webhook and agent images as OCI archives (no container daemon needed):
    /// `<target>/images/nodewarden-{webhook,agent}.oci.tar`, each an image index over
    /// linux/amd64 and linux/arm64, for `ctr images import` or `kind load image-archive`.
    Image {
        /// Platforms, comma-separated (arm64 is cross-compiled on an amd64 machine and the
        /// other way round; the Rust target and Debian's cross linker are installed when missing).
        #[arg(long, default_value = xtask::image::target::DEFAULT_PLATFORMS)]
        platform: String,
        /// Output folder (default: `<target>/images`).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Image tag (default: the chart's appVersion).
        #[arg(long)]
        tag: Option<String>,
        /// Build both programs for the platforms other than this machine's with this cargo
        /// profile, in one cargo run (the tests' images use `image-check`: the same code,
        /// without whole-program LTO). Not for images anyone runs: a release never does this.
        #[arg(long)]
        cross_profile: Option<String>,
    },
    /// Package a release into `<target>/release-artifacts` (publishes nothing): the chart
    /// (`helm package`, and its OCI layout as `helm push` uploads it), both image archives with
    /// a CycloneDX SBOM each, the kubectl plugin per platform with its krew manifest
    /// `nodewarden.yaml`, and `SHA256SUMS` over all of them.
    Release {
        /// Platforms, comma-separated: the images' and the plugin's (linux/amd64,
        /// linux/arm64), the plugin's alone (windows/amd64; darwin/amd64 and darwin/arm64,
        /// which need a macOS SDK in SDKROOT).
        #[arg(long, default_value = xtask::release::plugin::DEFAULT_PLATFORMS)]
        platform: String,
        /// Output folder (default: `<target>/release-artifacts`).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Where the plugin archives will be downloaded from, for the krew manifest
        /// (default: the repository's GitHub release `v<version>`).
        #[arg(long)]
        url_base: Option<String>,
        /// The helm binary (default: the one tests/controlplane/build.sh builds and caches).
        #[arg(long)]
        helm: Option<PathBuf>,
        /// Only the plugin's archives for `--platform` (no images, chart, krew manifest or
        /// SHA256SUMS): the release workflow runs this on macOS (darwin/amd64, darwin/arm64)
        /// and Windows (windows/arm64).
        #[arg(long, conflicts_with = "plugin_archives")]
        plugins_only: bool,
        /// A folder of plugin archives of this version that `--plugins-only` built on other
        /// machines: each is checked (its binary's format) and joins the krew manifest and
        /// SHA256SUMS.
        #[arg(long)]
        plugin_archives: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum Bench {
    /// Admission reviews per second and latency of the TLS server, HTTP/2 and HTTP/1.1.
    Admission {
        /// Extra arguments for the benchmark (see `-- --help`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let root = repo_root();
    match cli.task {
        Task::Crdgen => crdgen(&root),
        Task::Demo => demo(&root),
        Task::Ci => ci(&root),
        Task::Compat {
            versions,
            files,
            write_only,
        } => compat::compat(
            &root,
            &compat::CompatOptions {
                versions,
                files,
                write_only,
            },
        ),
        Task::Fuzz {
            seconds,
            targets,
            build_only,
        } => fuzz::fuzz(
            &root,
            &fuzz::FuzzOptions {
                seconds,
                targets,
                build_only,
            },
        ),
        Task::Image {
            platform,
            out,
            tag,
            cross_profile,
        } => {
            let mut opts = xtask::image::BuildOptions::for_repo(&root)?;
            opts.cross_profile = cross_profile;
            opts.targets = xtask::image::target::parse_platforms(&platform).context("--platform")?;
            if let Some(out) = out {
                opts.out_dir = out;
            }
            if let Some(tag) = tag {
                opts.tag = tag;
            }
            for image in xtask::image::build_nodewarden_images(&opts)? {
                println!("{} {} {}", image.reference, image.digest, image.archive.display());
            }
            Ok(())
        }
        Task::Release {
            platform,
            out,
            url_base,
            helm,
            plugins_only,
            plugin_archives,
        } => {
            let mut opts = xtask::release::ReleaseOptions::for_repo(&root)?;
            opts.plugins_only = plugins_only;
            opts.plugin_archives = plugin_archives;
            (opts.build.targets, opts.plugin_only) =
                xtask::release::plugin::parse_release_platforms(&platform).context("--platform")?;
            if let Some(out) = out {
                opts.out_dir = out;
            }
            if let Some(url_base) = url_base {
                opts.url_base = url_base;
            }
            opts.helm = helm;
            for file in xtask::release::release(&opts)?.files {
                println!("{}", file.display());
            }
            Ok(())
        }
        Task::Bench {
            which: Bench::Admission { args },
        } => {
            let cargo = cargo();
            let mut argv = vec![
                "run",
                "--release",
                "--quiet",
                "-p",
                "nodewarden-webhook",
                "--features",
                "loadgen",
                "--example",
                "admission-bench",
                "--",
            ];
            argv.extend(args.iter().map(String::as_str));
            run(&root, "admission benchmark", &cargo, &argv)
        }
    }
}

fn repo_root() -> PathBuf {
    xtask::image::repo_root()
}

fn crdgen(root: &Path) -> Result<()> {
    let dir = root.join(nodewarden_api::crdgen::CRD_DIR);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let files = nodewarden_api::crdgen::files().context("serializing the CRDs")?;
    // remove stale files so a renamed kind does not linger
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "yaml")
            && !files
                .iter()
                .any(|(n, _)| path.file_name().is_some_and(|f| f == n.as_str()))
        {
            std::fs::remove_file(&path)?;
        }
    }
    for (name, yaml) in files {
        std::fs::write(dir.join(&name), yaml).with_context(|| format!("writing {name}"))?;
        println!("wrote {}/{name}", nodewarden_api::crdgen::CRD_DIR);
    }
    let schema = root.join(xtask::chart_schema::SCHEMA_FILE);
    let text = std::fs::read_to_string(&schema).with_context(|| format!("reading {}", schema.display()))?;
    std::fs::write(&schema, xtask::chart_schema::update(&text)?)
        .with_context(|| format!("writing {}", schema.display()))?;
    println!("wrote {}", xtask::chart_schema::SCHEMA_FILE);
    Ok(())
}

fn run(root: &Path, what: &str, program: &str, args: &[&str]) -> Result<()> {
    run_with_env(root, what, program, args, &[])
}

/// [`run`] with more environment variables for the program.
fn run_with_env(
    root: &Path,
    what: &str,
    program: &str,
    args: &[&str],
    env: &[(String, String)],
) -> Result<()> {
    eprintln!("==> {what}: {program} {}", args.join(" "));
    let started = std::time::Instant::now();
    let status = step_command(root, program, args)
        .envs(env.iter().cloned())
        .status()
        .with_context(|| format!("starting {program}"))?;
    if !status.success() {
        bail!("{what} failed ({status}) after {:.0?}", started.elapsed());
    }
    eprintln!("==> {what}: done in {:.0?}", started.elapsed());
    Ok(())
}

/// A step's command: `program args` in `root`.
fn step_command(root: &Path, program: &str, args: &[&str]) -> Command {
    let mut command = Command::new(program);
    command.args(args).current_dir(root);
    if std::env::var("CI").as_deref() == Ok("true") {
        // a fresh clone builds once: incremental state (gigabytes for the test binaries) would
        // only fill the disk the real-node tests' kubelets and containerd share
        command.env("CARGO_INCREMENTAL", "0");
    }
    command
}

/// [`run`] of a `cargo test`, whose failures (each failed test's message, cargo's errors) come
/// back as a digest in the error.
fn run_tests(root: &Path, what: &str, program: &str, args: &[&str]) -> Result<()> {
    eprintln!("==> {what}: {program} {}", args.join(" "));
    let started = std::time::Instant::now();
    let (status, digest) = ci_watch::run_tests(&mut step_command(root, program, args), true)
        .with_context(|| format!("starting {program}"))?;
    if !status.success() {
        let failures = if digest.is_empty() {
            "(no test or cargo error named in the output: see above)\n".to_string()
        } else {
            digest.report()
        };
        bail!(
            "{what} failed ({status}) after {:.0?}; what failed:\n{failures}",
            started.elapsed()
        );
    }
    eprintln!("==> {what}: done in {:.0?}", started.elapsed());
    Ok(())
}

fn demo(root: &Path) -> Result<()> {
    let cargo = cargo();
    let build = [
        "build",
        "--quiet",
        "-p",
        "nodewarden-webhook",
        "-p",
        "nodewarden-agent",
        "-p",
        "nodewarden-cli",
        "-p",
        "nodewarden-tests",
        "--bins",
    ];
    run(root, "build", &cargo, &build)?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let bin = |name: &str| -> Result<String> {
        let path = target.join("debug").join(name);
        path.to_str()
            .map(str::to_owned)
            .context("target path is not UTF-8")
    };
    let (webhook, agent, plugin) = (
        bin("nodewarden-webhook")?,
        bin("nodewarden-agent")?,
        bin("kubectl-nodewarden")?,
    );
    run(
        root,
        "demo",
        &bin("nodewarden-demo")?,
        &["--webhook", &webhook, "--agent", &agent, "--plugin", &plugin],
    )
}

/// The agent's cgroup readers' unit tests (which parse the kernel's files with integer
/// arithmetic a 64-bit ARM machine must get right too; the crate `nodewarden-cgroup`, which
/// needs nothing but the standard library and thiserror), compiled for aarch64 and run under
/// qemu-user: cargo hands each test binary to `qemu-aarch64-static` (its runner), so nothing is
/// registered with the kernel's binfmt_misc. Statically linked as the images are, so no aarch64
/// loader is needed either. The Rust target, Debian's cross linker and qemu-user-static are
/// installed when missing.
fn arm64_tests(root: &Path) -> Result<()> {
    use xtask::image::{self, ARM64};
    let what = "arm64 tests";
    if ARM64.is_host() {
        eprintln!("==> {what}: this machine is arm64; the workspace tests ran on it already");
        return Ok(());
    }
    ARM64.ensure_toolchain(root).context(what)?;
    let qemu = ARM64.ensure_qemu(root).context(what)?;
    let upper = ARM64.triple.to_uppercase().replace('-', "_");
    let mut env = ARM64.cargo_env();
    env.push((format!("CARGO_TARGET_{upper}_RUNNER"), qemu.display().to_string()));
    env.push(("CARGO_ENCODED_RUSTFLAGS".to_string(), image::static_rustflags()));
    run_with_env(
        root,
        what,
        &cargo(),
        &[
            "test",
            "--locked",
            "-p",
            "nodewarden-cgroup",
            "--target",
            ARM64.triple,
            "--lib",
        ],
        &env,
    )
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string())
}

/// Debian packages `cargo xtask ci` makes sure of before the tests (see tests/node/packages.sh):
/// buildah for the Containerfile test, qemu-user-static for the arm64 ones, chromium for the report's
/// page, shellcheck for the workflows' scripts, and what a real node runs on (the same list as
/// `nodewarden_tests::node::NODE_PACKAGES`, which the real-node tier installs itself too).
const TEST_PACKAGES: &[&str] = &[
    "buildah",
    // qemu-aarch64-static runs the arm64 images' programs and the agent's arm64 tests
    xtask::image::target::QEMU_PACKAGE,
    // headless Chromium loads the report's HTML page (cli/src/report/tests.rs)
    "chromium",
    // actionlint checks the workflows' run: scripts with it (tests/tests/workflows.rs)
    "shellcheck",
    // pushes a release into the test registry as the release workflow does (tests/src/registry.rs)
    "skopeo",
    "containerd",
    "runc",
    "containernetworking-plugins",
    "iptables",
    "conntrack",
];

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// The builds the tests need that do not depend on the Rust build, in the order the tests ask for
/// them ([`test_phases`]): VPA's recommender model (the estimator's differential test), the
/// control plane and Helm (nearly every test file), promtool (the alert-rule and history tests),
/// then for the last test files (as root on Linux, the cgroup v2 node's disk image:
/// [`PREFETCH_ROOT_SCRIPTS`]) the registry (the cgroup v2 node's test pushes the release into
/// it). Each script caches its result and lets one
/// build run at a time, so a test that asks before the background got there waits for it, and
/// nothing is built twice.
const PREFETCH_SCRIPTS: &[&str] = &[
    "tests/vpa/build-recommend.sh",
    "tests/controlplane/build.sh",
    "tests/promtool/build.sh",
    "tests/registry/build.sh",
];
const PREFETCH_ROOT_SCRIPTS: &[&str] = &["tests/node/vm/build.sh"];

/// The Go builds and the VM image (`nice 5`), the release images (`cargo xtask image`, beside
/// the scripts, `nice 10`) and the fuzz targets (beside them too, `nice 19`), started in the
/// background when `cargo xtask ci` begins, in the order the tests need them: the first test
/// files need the control plane, the last ones the images, and only the step after the tests
/// the fuzz build. On a fresh machine their downloads (Go modules, Debian's archive) overlap
/// with the Rust steps, and their compiles take the cores those leave idle (the tests waiting
/// on nodes and API servers, the release builds' LTO tails). The tests that need the images
/// start when its images and release have finished ([`Prefetch::wait_for_images`]); the other
/// tests call the same scripts (each locks its cache folder), and the fuzz step at the end the
/// same build (cargo's lock on the fuzz build folder). Dropped, it stops the
/// scripts if they still run (each builds beside its cache folder and renames the result into
/// place, so a stopped build leaves nothing half made) and says how it ended. Its output is in
/// `target/ci-prefetch.log`.
struct Prefetch {
    child: Option<std::process::Child>,
    log: PathBuf,
    started: std::time::Instant,
    /// Written with the exit status of the images and the release when they have finished.
    images_done: PathBuf,
}

impl Prefetch {
    fn start(root: &Path) -> Prefetch {
        let log = root.join("target").join("ci-prefetch.log");
        // the VM image (which needs the control plane's kubelet) before promtool: the cgroup v2
        // node's test runs early in the tests' order, the alert-rule tests late
        let mut scripts: Vec<&str> = PREFETCH_SCRIPTS.to_vec();
        if cfg!(target_os = "linux") && is_root() {
            scripts.splice(3..3, PREFETCH_ROOT_SCRIPTS.iter().copied());
        }
        // the release images too (what the real-node tests and the demo import), then a release
        // of this machine's platform (what the cgroup v2 node's test installs: its plugin is one
        // more release build). The tests that need them start after these have finished
        // ([`Prefetch::wait_for_images`]), so no test builds them at the same time
        let images_done = root.join("target").join("ci-prefetch-images.status");
        let _ = std::fs::remove_file(&images_done);
        let beside: Vec<String> = std::env::current_exe()
            .map(|xtask| {
                vec![
                    beside_command(&xtask, host_release(root).as_ref(), &images_done),
                    fuzz_build_command(&xtask),
                ]
            })
            .unwrap_or_default();
        let script = prefetch_script(&beside, &scripts);
        let child = std::fs::create_dir_all(root.join("target"))
            .and_then(|()| std::fs::File::create(&log))
            .and_then(|out| {
                let err = out.try_clone()?;
                let mut command = Command::new("nice");
                command
                    .args(["-n", "5", "bash", "-c", &script])
                    .current_dir(root)
                    .stdin(std::process::Stdio::null())
                    .stdout(out)
                    .stderr(err);
                #[cfg(unix)]
                std::os::unix::process::CommandExt::process_group(&mut command, 0);
                command.spawn()
            });
        let child = match child {
            Ok(child) => {
                eprintln!(
                    "==> prefetch: {} in the background at low priority (log: {})",
                    beside
                        .iter()
                        .map(String::as_str)
                        .chain(scripts.iter().copied())
                        .collect::<Vec<_>>()
                        .join(", "),
                    log.display()
                );
                Some(child)
            }
            Err(e) => {
                eprintln!("==> prefetch: not started ({e}); the tests build what they need themselves");
                None
            }
        };
        Prefetch {
            child,
            log,
            started: std::time::Instant::now(),
            images_done,
        }
    }

    /// Waits (at most `limit`) until the prefetch's images and release have finished, well or
    /// not, or the prefetch has ended. Then the tests that need them find them built (or build
    /// them alone, if the prefetch failed), rather than building them at the same time: two
    /// builds of one cargo target folder rely on cargo's file lock, which not every filesystem
    /// gives, and a test that fails while the prefetch still builds tells nothing.
    fn wait_for_images(&mut self, limit: std::time::Duration) {
        let Some(child) = self.child.as_mut() else {
            return;
        };
        let began = std::time::Instant::now();
        let mut said = false;
        loop {
            if let Ok(status) = std::fs::read_to_string(&self.images_done) {
                if said {
                    eprintln!(
                        "==> prefetch: images and release finished (exit {}), waited {:.0?}",
                        status.trim(),
                        began.elapsed()
                    );
                }
                return;
            }
            if !matches!(child.try_wait(), Ok(None)) {
                return;
            }
            if began.elapsed() > limit {
                eprintln!("==> prefetch: images and release still building after {limit:?}; the tests go on");
                return;
            }
            if !said {
                eprintln!(
                    "==> prefetch: waiting for its images and release (they are {}s in; log: {})",
                    self.started.elapsed().as_secs(),
                    self.log.display()
                );
                said = true;
            }
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
    }
}

/// The longest `cargo xtask ci` waits for the prefetch's images before the tests that need them:
/// a cold build of both platforms and the release takes about 25 minutes on two busy cores.
const IMAGES_WAIT: std::time::Duration = std::time::Duration::from_secs(60 * 60);

/// This machine's platform and the folder of its release ([`xtask::release::host_release_dir`]),
/// if the images are built for it.
fn host_release(root: &Path) -> Option<(String, PathBuf)> {
    let target = xtask::image::Target::host().ok()?;
    let target_dir = xtask::image::BuildOptions::for_repo(root).ok()?.target_dir;
    Some((
        target.platform().to_string(),
        xtask::release::host_release_dir(&target_dir, target),
    ))
}

/// The prefetch's command beside the scripts: `xtask image` as the tests build the images (the
/// other platform under [`xtask::image::CHECK_PROFILE`]), then, if it succeeded and `host` names
/// a platform and a folder, `xtask release` of that platform into that folder; both at `nice 10`
/// (the prefetch's 5 and 5 more: after the Go builds, which the first test files need).
fn beside_command(xtask: &Path, host: Option<&(String, PathBuf)>, done: &Path) -> String {
    let image = format!(
        "nice -n 5 '{}' image --cross-profile {}",
        xtask.display(),
        xtask::image::CHECK_PROFILE
    );
    let chain = match host {
        Some((platform, dir)) => format!(
            "{image} && nice -n 5 '{}' release --platform {platform} --out '{}'",
            xtask.display(),
            dir.display()
        ),
        None => image,
    };
    format!("{chain}; rc=$?; echo $rc > '{}'; exit $rc", done.display())
}

/// The prefetch's fuzz build (`xtask fuzz --build-only`), at the lowest priority (`nice 19`
/// with the prefetch's own 5): nothing waits for it until the fuzz step at the end of `cargo xtask ci`, so it
/// takes only what the tests and the other builds leave of the cores.
fn fuzz_build_command(xtask: &Path) -> String {
    format!("nice -n 14 '{}' fuzz --build-only", xtask.display())
}

/// One shell command running `scripts` in order with bash, and beside them (started first) each
/// command of `beside`; every one runs even when another fails, and the command fails naming
/// those that did.
fn prefetch_script(beside: &[String], scripts: &[&str]) -> String {
    let started: String = beside
        .iter()
        .enumerate()
        .map(|(i, c)| format!("echo '==> {c}'; ( {c} ) & pid{i}=$!; "))
        .collect();
    let body: String = scripts
        .iter()
        .map(|s| format!("echo '==> {s}'; bash {s} || failed=\"$failed {s}\"; "))
        .collect();
    let waited: String = (0..beside.len())
        .map(|i| format!("wait $pid{i} || failed=\"$failed {}\"; ", beside[i]))
        .collect();
    format!(
        "failed=''; {started}{body}{waited}echo \"==> finished after ${{SECONDS}}s\"; [ -z \"$failed\" ] || {{ echo \"failed:$failed\"; exit 1; }}"
    )
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        let Some(child) = self.child.as_mut() else {
            return;
        };
        let took = self.started.elapsed();
        match child.try_wait() {
            Ok(Some(status)) if status.success() => {
                // the script's own last line says when it finished
                let finished = std::fs::read_to_string(&self.log)
                    .ok()
                    .and_then(|log| {
                        log.lines()
                            .rev()
                            .find(|l| l.starts_with("==> finished after"))
                            .map(|l| l.trim_start_matches("==> ").to_string())
                    })
                    .unwrap_or_else(|| "finished".to_string());
                eprintln!(
                    "==> prefetch: all built, {finished} (log: {})",
                    self.log.display()
                )
            }
            Ok(Some(status)) => {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                let last = lines[lines.len().saturating_sub(PREFETCH_TAIL_LINES)..].join("\n    ");
                eprintln!(
                    "==> prefetch: {status}; the tests built what they needed themselves (see {}); \
                     its last lines:\n    {last}",
                    self.log.display()
                )
            }
            Ok(None) | Err(_) => {
                // the whole process group: bash, the build script and its `go build`
                let _ = Command::new("kill")
                    .args(["-TERM", "--", &format!("-{}", child.id())])
                    .status();
                let _ = child.wait();
                eprintln!(
                    "==> prefetch: still running after {:.0?}, stopped (see {})",
                    took,
                    self.log.display()
                );
            }
        }
    }
}

/// Lines of the prefetch's log said when it failed.
const PREFETCH_TAIL_LINES: usize = 12;

/// The tests crate's files that need the images (`cargo xtask image`, a release of this
/// machine's platform) or the cgroup v2 node's VM image, which the prefetch builds last: the
/// tests step runs them after every other test file.
const LATE_TESTS: &[&str] = &["cgroupv2_node", "images", "realnode", "soak"];

/// The tests step of `cargo xtask ci`: what each `cargo test` run is called and its arguments, in
/// order. Together they are `cargo test --workspace --no-fail-fast` split in four, every run with
/// the whole workspace selected, so that each resolves the same features and they share one
/// build: the unit tests and every integration test file but [`LATE_TESTS`]; the doc tests; the
/// examples built, not run (as a plain `cargo test` does); last those of [`LATE_TESTS`], which
/// wait for the prefetch's images.
fn test_phases(root: &Path) -> Result<Vec<(String, Vec<String>)>> {
    let out = Command::new(cargo())
        .args(["metadata", "--no-deps", "--format-version", "1", "--locked"])
        .current_dir(root)
        .output()
        .context("starting cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let metadata: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("cargo metadata's output")?;
    split_test_phases(&integration_tests(&metadata))
}

/// The names of the workspace's integration test targets, from `cargo metadata --no-deps`.
fn integration_tests(metadata: &serde_json::Value) -> Vec<String> {
    let mut names: Vec<String> = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter(|t| {
            t["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "test"))
        })
        .filter_map(|t| t["name"].as_str().map(str::to_string))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// [`test_phases`] from the integration test names; a name of [`LATE_TESTS`] that is not among
/// them is an error (a renamed file would otherwise run nowhere).
fn split_test_phases(tests: &[String]) -> Result<Vec<(String, Vec<String>)>> {
    if let Some(missing) = LATE_TESTS.iter().find(|l| !tests.iter().any(|t| t == *l)) {
        bail!("no integration test {missing:?} in the workspace (xtask's LATE_TESTS names it)");
    }
    let common = ["test", "--workspace", "--locked", "--no-fail-fast"];
    let with =
        |extra: Vec<String>| -> Vec<String> { common.iter().map(|a| a.to_string()).chain(extra).collect() };
    let tests_of = |late: bool| -> Vec<String> {
        tests
            .iter()
            .filter(|t| LATE_TESTS.contains(&t.as_str()) == late)
            .flat_map(|t| ["--test".to_string(), t.clone()])
            .collect()
    };
    let mut first = vec!["--lib".to_string(), "--bins".to_string()];
    first.extend(tests_of(false));
    Ok(vec![
        (
            "tests (unit tests, then every file that needs no image)".to_string(),
            with(first),
        ),
        ("tests (doc tests)".to_string(), with(vec!["--doc".to_string()])),
        (
            "tests (examples built)".to_string(),
            with(vec!["--examples".to_string(), "--no-run".to_string()]),
        ),
        (
            format!("tests (those that need the images: {})", LATE_TESTS.join(", ")),
            with(tests_of(true)),
        ),
    ])
}

/// Free space a run of `cargo xtask ci` on a fresh clone needs, caches included (README, Disk).
const CI_DISK_BYTES: u64 = 25 << 30;

/// Bytes available to an unprivileged writer on the filesystem `df -Pk` describes in `out`
/// (POSIX format: a header line, then one line whose fourth field is the available KiB).
fn available_bytes(df_out: &str) -> Option<u64> {
    let line = df_out.lines().nth(1)?;
    let kib: u64 = line.split_whitespace().nth(3)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Says so when the build directory's filesystem has less free space than a fresh run needs:
/// a full disk otherwise shows up as a linker crash in the middle of the tests. Only a warning,
/// since a run that finds its caches warm needs much less.
fn check_disk(root: &Path) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let probe = if target.exists() {
        target
    } else {
        root.to_path_buf()
    };
    let free = Command::new("df")
        .arg("-Pk")
        .arg(&probe)
        .output()
        .ok()
        .and_then(|o| available_bytes(&String::from_utf8_lossy(&o.stdout)));
    match free {
        Some(free) if free < CI_DISK_BYTES => eprintln!(
            "==> disk: warning: {:.1} GiB free for {}; a run on a fresh clone needs about {} GiB \
             (README, Disk). A full disk ends the run with a linker error.",
            free as f64 / f64::from(1u32 << 30),
            probe.display(),
            CI_DISK_BYTES >> 30
        ),
        Some(free) => eprintln!("==> disk: {:.1} GiB free", free as f64 / f64::from(1u32 << 30)),
        None => eprintln!("==> disk: could not read the free space (df -Pk)"),
    }
    probe
}

fn ci(root: &Path) -> Result<()> {
    let probe = check_disk(root);
    // how low free disk and memory went, said at the very end (after the prefetch's state)
    let _watch = ci_watch::ResourceWatch::start(probe);
    // stopped (if still running) and reported when `ci` returns, whichever way
    let mut prefetch = Prefetch::start(root);
    let cargo = cargo();
    run(root, "format", &cargo, &["fmt", "--all", "--", "--check"])?;
    run(
        root,
        "lint",
        &cargo,
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            // the benchmarks need the `loadgen` features; lint them too
            "--all-features",
            "--locked",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    // the kubectl plugin also ships for windows/amd64 (`cargo xtask release`): lint it for that
    // target too, so that a Unix-only call in a crate it links fails here, not at a release's tag
    // (not where packages cannot be installed: elsewhere than Linux, or without root)
    if cfg!(target_os = "linux") && is_root() {
        let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
        eprintln!("==> lint (the plugin for windows/amd64)");
        let started = std::time::Instant::now();
        xtask::release::plugin::lint_plugin(root, &target, xtask::release::plugin::WINDOWS_AMD64)
            .context("lint of the plugin for windows/amd64")?;
        eprintln!(
            "==> lint (the plugin for windows/amd64): {:.0?}",
            started.elapsed()
        );
    }
    // Debian packages the tests use (buildah: tests/tests/images.rs builds the Containerfile;
    // the real-node tier's containerd, runc, CNI plugins, iptables, conntrack).
    // packages.sh installs only what is missing; without root it just names what is missing
    // and the tests that need it fail under CI=true (and skip loudly elsewhere).
    let mut packages = vec!["tests/node/packages.sh"];
    packages.extend(TEST_PACKAGES);
    if cfg!(target_os = "linux") && !is_root() {
        eprintln!("==> packages: not root, not installing; checking only");
        if let Err(e) = Command::new("bash")
            .args(&packages)
            .env("NODEWARDEN_NO_APT", "1")
            .current_dir(root)
            .status()
        {
            eprintln!("==> packages: {e}");
        }
    } else if cfg!(target_os = "linux") {
        run(root, "packages", "bash", &packages)?;
    }
    // every test, those that need the images or the cgroup v2 node's VM last, so that on a fresh
    // machine the rest runs while the prefetch still builds those ([`test_phases`])
    let mut failed = Vec::new();
    let mut note = |result: Result<()>| {
        if let Err(e) = result {
            eprintln!("==> {e:#}");
            failed.push(format!("{e:#}"));
        }
    };
    for (what, args) in test_phases(root)? {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        if args.iter().any(|a| LATE_TESTS.contains(a)) {
            // what needs no image runs while the prefetch finishes them
            note(arm64_tests(root));
            // the benchmarks' load generator is behind a feature the workspace's tests leave
            // off: its own tests (the open loop's clock) run here
            note(run(
                root,
                "load generator tests",
                &cargo,
                &[
                    "test",
                    "--locked",
                    "-p",
                    "nodewarden-webhook",
                    "--features",
                    "loadgen",
                    "--lib",
                    "loadgen::",
                ],
            ));
            prefetch.wait_for_images(IMAGES_WAIT);
        }
        note(run_tests(root, &what, &cargo, &args));
    }
    if !failed.is_empty() {
        // the failures again, together at the end, where a reader of a long log looks first
        bail!("tests failed:\n{}", failed.join("\n"));
    }
    // every decoder of outside input, fuzzed for a short bound (no nightly toolchain: fails
    // under CI=true, skipped loudly elsewhere). The targets' build (10+ CPU minutes cold) ran in
    // the prefetch beside the tests at the lowest priority; if it has not finished, cargo's
    // lock on the fuzz build folder makes this wait for it rather than build twice
    fuzz::fuzz(
        root,
        &fuzz::FuzzOptions {
            seconds: fuzz::CI_SECONDS,
            targets: Vec::new(),
            build_only: false,
        },
    )?;
    // last, the README's other command: the demo on a real control plane and, where the machine
    // allows, real nodes. Nothing else runs it, and a change of behaviour once left it waiting
    // for a figure that could no longer come.
    demo(root)
}

#[cfg(test)]
mod tests {
    use super::{
        Prefetch, available_bytes, beside_command, integration_tests, prefetch_script, split_test_phases,
    };
    use std::process::Command;

    #[test]
    fn the_free_space_is_read_from_dfs_posix_output() {
        let out = "Filesystem     1024-blocks      Used Available Capacity Mounted on\n\
                   overlay          263174212  93000000   3000000      97% /\n";
        assert_eq!(available_bytes(out), Some(3_000_000 * 1024));
    }

    #[test]
    fn the_tests_run_in_phases_that_together_are_every_target_once() {
        let metadata = serde_json::json!({"packages": [
            {"targets": [{"kind": ["lib"], "name": "a"}, {"kind": ["test"], "name": "soak"},
                         {"kind": ["test"], "name": "claims"}, {"kind": ["example"], "name": "bench"}]},
            {"targets": [{"kind": ["bin"], "name": "b"}, {"kind": ["test"], "name": "images"},
                         {"kind": ["test"], "name": "realnode"}, {"kind": ["test"], "name": "cgroupv2_node"},
                         {"kind": ["test"], "name": "agent"}]},
        ]});
        let tests = integration_tests(&metadata);
        assert_eq!(
            tests,
            ["agent", "cgroupv2_node", "claims", "images", "realnode", "soak"]
        );
        let phases = split_test_phases(&tests).unwrap();
        let args: Vec<String> = phases.iter().map(|(_, a)| a.join(" ")).collect();
        let common = "test --workspace --locked --no-fail-fast";
        assert_eq!(
            args,
            [
                format!("{common} --lib --bins --test agent --test claims"),
                format!("{common} --doc"),
                format!("{common} --examples --no-run"),
                format!("{common} --test cgroupv2_node --test images --test realnode --test soak"),
            ]
        );
        // a late file renamed away is an error, not a file that runs nowhere
        let err = split_test_phases(&["agent".to_string(), "images".to_string()]).unwrap_err();
        assert!(
            err.to_string().contains("no integration test \"cgroupv2_node\""),
            "{err}"
        );
    }

    #[test]
    fn the_prefetch_runs_every_script_and_names_those_that_failed() {
        let dir = std::env::temp_dir().join(format!("nodewarden-prefetch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a.sh"), "echo a-ran >> ran; exit 3\n").unwrap();
        std::fs::write(dir.join("b.sh"), "echo b-ran >> ran\n").unwrap();
        let out = Command::new("bash")
            .args([
                "-c",
                &prefetch_script(&["sleep 1; echo c-ran >> beside".to_string()], &["a.sh", "b.sh"]),
            ])
            .current_dir(&dir)
            .output()
            .unwrap();
        let ran = std::fs::read_to_string(dir.join("ran")).unwrap();
        // waited for, although it ends after the scripts
        let beside = std::fs::read_to_string(dir.join("beside")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(ran, "a-ran\nb-ran\n");
        assert_eq!(beside, "c-ran\n");
        assert!(!out.status.success());
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("failed: a.sh\n"), "{out:?}");
        assert!(stdout.contains("==> finished after "), "{out:?}");
    }

    #[test]
    fn the_prefetch_releases_this_platform_after_the_images_and_only_if_they_built() {
        let dir = tempfile::tempdir().unwrap();
        let xtask = dir.path().join("fake xtask");
        std::fs::write(
            &xtask,
            "#!/bin/sh\necho \"$*\" >> \"$(dirname \"$0\")/ran\"\n[ \"$1\" != image ] || [ ! -e \"$(dirname \"$0\")/fail\" ]\n",
        )
        .unwrap();
        std::fs::set_permissions(&xtask, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let out_dir = dir.path().join("release out");
        let host = ("linux/amd64".to_string(), out_dir.clone());
        let done = dir.path().join("images done");
        let command = beside_command(&xtask, Some(&host), &done);
        let run = |command: &str| {
            let status = Command::new("bash").args(["-c", command]).status().unwrap();
            let ran = std::fs::read_to_string(dir.path().join("ran")).unwrap();
            std::fs::remove_file(dir.path().join("ran")).unwrap();
            // the end is written, with the chain's status, whichever way it went
            let done = std::fs::read_to_string(&done).unwrap();
            (status.success(), ran, done)
        };
        assert_eq!(
            run(&command),
            (
                true,
                format!(
                    "image --cross-profile image-check\nrelease --platform linux/amd64 --out {}\n",
                    out_dir.display()
                ),
                "0\n".to_string()
            )
        );
        std::fs::write(dir.path().join("fail"), "").unwrap();
        assert_eq!(
            run(&command),
            (
                false,
                "image --cross-profile image-check\n".to_string(),
                "1\n".to_string()
            )
        );
        std::fs::remove_file(dir.path().join("fail")).unwrap();
        assert_eq!(
            run(&beside_command(&xtask, None, &done)),
            (
                true,
                "image --cross-profile image-check\n".to_string(),
                "0\n".to_string()
            )
        );
    }

    #[test]
    fn the_tests_that_need_images_wait_for_the_prefetchs_images_or_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let done = dir.path().join("images done");
        let prefetch = |child: std::process::Child| Prefetch {
            child: Some(child),
            log: dir.path().join("log"),
            started: std::time::Instant::now(),
            images_done: done.clone(),
        };
        // the images finish while the prefetch goes on: the wait ends with them
        let mut running = prefetch(Command::new("sleep").arg("600").spawn().unwrap());
        let writer = {
            let done = done.clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(300));
                std::fs::write(done, "0\n").unwrap();
            })
        };
        running.wait_for_images(std::time::Duration::from_secs(600));
        assert!(done.exists());
        let child = running.child.as_mut().unwrap();
        assert!(child.try_wait().unwrap().is_none(), "the prefetch still runs");
        child.kill().unwrap();
        child.wait().unwrap();
        writer.join().unwrap();
        // the prefetch ended without writing it (stopped, or the images' command never ran)
        std::fs::remove_file(&done).unwrap();
        let mut ended = prefetch(Command::new("true").spawn().unwrap());
        ended.wait_for_images(std::time::Duration::from_secs(600));
        assert!(!done.exists());
        assert!(ended.child.as_mut().unwrap().try_wait().unwrap().is_some());
    }

    #[test]
    fn a_failed_command_beside_the_scripts_is_named() {
        let out = Command::new("bash")
            .args(["-c", &prefetch_script(&["exit 4".to_string()], &[])])
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("failed: exit 4\n"),
            "{out:?}"
        );
    }

    #[test]
    fn output_that_is_not_dfs_gives_nothing() {
        assert_eq!(available_bytes(""), None);
        assert_eq!(available_bytes("Filesystem 1024-blocks Used Available\n"), None);
        assert_eq!(available_bytes("header\n/dev/x 1 2 lots 3% /\n"), None);
        assert_eq!(available_bytes("header\n/dev/x 1 2\n"), None);
        assert_eq!(
            available_bytes(&format!("header\n/dev/x 1 2 {} 3% /\n", u64::MAX)),
            None
        );
    }
}
