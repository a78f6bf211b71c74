//! `cargo xtask fuzz`: every fuzz target of `fuzz/` for a bounded time (see docs/fuzzing.md).
//!
//! 1. A nightly toolchain is needed (libFuzzer's coverage instrumentation). Without one the
//!    step fails under `CI=true` and is skipped loudly elsewhere.
//! 2. cargo-fuzz is used from `PATH`, else from `<cache>/tools/bin` (the machine's build cache), where it is installed with
//!    `cargo install --locked` on first use (then cached).
//! 3. Seeds: the recorded fixtures of the repository, turned into inputs of each target, are
//!    written to `<target>/fuzz/seeds/<target>` on every run, beside the small text seeds
//!    committed in `fuzz/seeds/<target>`. What the fuzzer finds stays in
//!    `<target>/fuzz/corpus/<target>` from run to run.
//! 4. The targets are built once (`cargo +nightly fuzz build`), then each runs for
//!    `--seconds` with an RSS and an input-length limit. The executions, their rate and the
//!    corpus size are printed per target; a crash fails the step after the other targets have
//!    run, naming the input that crashed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

/// Every target in `fuzz/fuzz_targets`, with the longest input it is given (bytes): enough
/// for the largest recorded fixture of its kind with room to grow.
pub(crate) const TARGETS: &[(&str, usize)] = &[
    ("admission", 16 * 1024),
    ("quantity", 64),
    ("field_path", 4 * 1024),
    ("metrics_text", 8 * 1024),
    ("cgroup", 4 * 1024),
    ("checkpoint", 16 * 1024),
    ("h2_frames", 4 * 1024),
];

/// The memory a target may use before libFuzzer calls it a crash (an input that makes a
/// decoder allocate without bound is a finding).
pub(crate) const RSS_LIMIT_MB: u32 = 2048;

/// How long each target runs in `cargo xtask ci`.
pub(crate) const CI_SECONDS: u64 = 20;

/// Options of `cargo xtask fuzz`.
pub(crate) struct FuzzOptions {
    /// Seconds per target.
    pub(crate) seconds: u64,
    /// Targets to run; empty: all of [`TARGETS`].
    pub(crate) targets: Vec<String>,
    /// Build the targets and stop (`cargo xtask ci` builds them in its background prefetch,
    /// beside the tests, and runs them at the end).
    pub(crate) build_only: bool,
}

/// What one target did.
struct Ran {
    name: String,
    seconds: f64,
    executions: Option<u64>,
    corpus: usize,
    crash: Option<String>,
}

fn ci_mode() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|p| if p.is_absolute() { p } else { root.join(p) })
        .unwrap_or_else(|| root.join("target"))
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string())
}

/// `cargo +nightly`: the rustup proxy picks the toolchain (`$CARGO` is the stable cargo itself,
/// which does not read `+toolchain`).
fn nightly_cargo() -> Command {
    let mut command = Command::new("cargo");
    command.arg("+nightly");
    command
}

/// The host triple of the nightly toolchain, or `None` when there is no nightly toolchain.
fn nightly_host() -> Option<String> {
    let out = Command::new("rustc")
        .args(["+nightly", "-vV"])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_string)
}

/// The machine's build cache (`$NODEWARDEN_CACHE`, else `~/.cache/nodewarden`), as the Go
/// builds' scripts use it.
fn cache_dir() -> Option<PathBuf> {
    std::env::var_os("NODEWARDEN_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("nodewarden")))
}

/// A `PATH` on which `cargo fuzz` works: the current one when it has cargo-fuzz, else with
/// `<cache>/tools/bin` first, installing cargo-fuzz there when it is missing.
fn cargo_fuzz_path(cache: &Path) -> Result<std::ffi::OsString> {
    let current = std::env::var_os("PATH").unwrap_or_default();
    let works = |path: &std::ffi::OsStr| {
        nightly_cargo()
            .args(["fuzz", "--version"])
            .env("PATH", path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if works(&current) {
        return Ok(current);
    }
    let tools = cache.join("tools");
    let mut dirs = vec![tools.join("bin")];
    dirs.extend(std::env::split_paths(&current));
    let path = std::env::join_paths(dirs).context("building PATH")?;
    if works(&path) {
        return Ok(path);
    }
    let root = tools.to_str().context("cache path is not UTF-8")?;
    eprintln!("==> fuzz: installing cargo-fuzz into {root}");
    let status = Command::new(cargo())
        .args(["install", "cargo-fuzz", "--locked", "--root", root])
        .status()
        .context("starting cargo install")?;
    if !status.success() || !works(&path) {
        bail!("installing cargo-fuzz failed ({status}); try `cargo install cargo-fuzz --locked`");
    }
    Ok(path)
}

/// Runs the fuzz targets; `Ok` when none crashed (or, outside CI, when there is no nightly
/// toolchain and the step is skipped).
pub(crate) fn fuzz(root: &Path, options: &FuzzOptions) -> Result<()> {
    let names: Vec<(&str, usize)> = if options.targets.is_empty() {
        TARGETS.to_vec()
    } else {
        let mut picked = Vec::new();
        for name in &options.targets {
            match TARGETS.iter().find(|(t, _)| t == name) {
                Some(t) => picked.push(*t),
                None => bail!(
                    "no fuzz target {name:?}; the targets are {}",
                    TARGETS.iter().map(|(t, _)| *t).collect::<Vec<_>>().join(", ")
                ),
            }
        }
        picked
    };
    let Some(host) = nightly_host() else {
        let why = "no nightly toolchain (`rustup toolchain install nightly`); libFuzzer needs one";
        if ci_mode() {
            bail!("fuzz: {why}");
        }
        eprintln!("==> fuzz: SKIPPED: {why}. Under CI=true this fails.");
        return Ok(());
    };
    let started = Instant::now();
    // the fuzz build (nightly, coverage instrumentation) takes 10+ CPU minutes from nothing: it
    // lives in the machine's cache, like the Go builds, so a fresh clone rebuilds only nodewarden
    let cache = cache_dir().unwrap_or_else(|| target_dir(root));
    let fuzz_target_dir = cache.join("fuzz").join("target");
    let path = cargo_fuzz_path(&cache)?;
    let fuzz_dir = root.join("fuzz");

    eprintln!("==> fuzz: build (nightly, no sanitizer)");
    let build = Instant::now();
    let status = nightly_cargo()
        .args(["fuzz", "build", "--sanitizer", "none", "--target-dir"])
        .arg(&fuzz_target_dir)
        .arg("--fuzz-dir")
        .arg(&fuzz_dir)
        .env("PATH", &path)
        .current_dir(root)
        .status()
        .context("starting cargo fuzz build")?;
    if !status.success() {
        bail!("building the fuzz targets failed ({status})");
    }
    eprintln!("==> fuzz: built in {:.0?}", build.elapsed());
    if options.build_only {
        return Ok(());
    }

    let seeds = fuzz_target_dir.join("seeds");
    write_seeds(root, &seeds)?;
    let mut ran = Vec::new();
    for (name, max_len) in names {
        let binary = fuzz_target_dir.join(&host).join("release").join(name);
        ran.push(run_target(
            root,
            &fuzz_target_dir,
            &binary,
            name,
            max_len,
            options.seconds,
        )?);
    }

    eprintln!(
        "==> fuzz: {:<14} {:>8} {:>12} {:>10} {:>8}",
        "target", "seconds", "executions", "per second", "corpus"
    );
    for r in &ran {
        let rate = r.executions.map(|e| e as f64 / r.seconds.max(0.001));
        eprintln!(
            "==> fuzz: {:<14} {:>8.0} {:>12} {:>10} {:>8}{}",
            r.name,
            r.seconds,
            r.executions.map_or("?".to_string(), |e| e.to_string()),
            rate.map_or("?".to_string(), |r| format!("{r:.0}")),
            r.corpus,
            if r.crash.is_some() { "  CRASH" } else { "" }
        );
    }
    let crashes: Vec<String> = ran
        .iter()
        .filter_map(|r| r.crash.as_ref().map(|c| format!("{}: {c}", r.name)))
        .collect();
    eprintln!("==> fuzz: done in {:.0?}", started.elapsed());
    if !crashes.is_empty() {
        bail!(
            "fuzzing found {} crash(es); reproduce with `cargo +nightly fuzz run -s none <target> <input>`:\n{}",
            crashes.len(),
            crashes.join("\n")
        );
    }
    Ok(())
}

fn run_target(
    root: &Path,
    fuzz_target_dir: &Path,
    binary: &Path,
    name: &str,
    max_len: usize,
    seconds: u64,
) -> Result<Ran> {
    let corpus = fuzz_target_dir.join("corpus").join(name);
    let artifacts = fuzz_target_dir.join("artifacts").join(name);
    for dir in [&corpus, &artifacts] {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut command = Command::new(binary);
    // the cgroup and checkpoint targets write files for every input: in memory where it can
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        command.env("TMPDIR", shm);
    }
    command.arg(&corpus);
    // read-only seed folders: derived from the fixtures, and committed in fuzz/seeds
    for seeds in [
        fuzz_target_dir.join("seeds").join(name),
        root.join("fuzz/seeds").join(name),
    ] {
        if seeds.is_dir() {
            command.arg(seeds);
        }
    }
    // a dictionary of the tokens the target's format is made of (edge numbers, key names)
    let dict = root.join("fuzz/dicts").join(format!("{name}.dict"));
    if dict.is_file() {
        let mut arg = std::ffi::OsString::from("-dict=");
        arg.push(&dict);
        command.arg(arg);
    }
    let mut prefix = artifacts.into_os_string();
    prefix.push("/");
    let mut artifact_prefix = std::ffi::OsString::from("-artifact_prefix=");
    artifact_prefix.push(prefix);
    command
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"))
        .arg(format!("-max_len={max_len}"))
        .arg("-print_final_stats=1")
        .arg(artifact_prefix)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    eprintln!("==> fuzz: {name} for {seconds} s");
    let started = Instant::now();
    let out = command
        .output()
        .with_context(|| format!("starting {}", binary.display()))?;
    let elapsed = started.elapsed().as_secs_f64();
    let log = String::from_utf8_lossy(&out.stderr);
    let stat = |key: &str| {
        log.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let executions = stat("stat::number_of_executed_units:");
    let crash = if out.status.success() {
        None
    } else {
        // libFuzzer names the input it wrote; keep the last lines of its report too
        let input = log
            .lines()
            .filter_map(|l| {
                l.split_once("Test unit written to ")
                    .map(|(_, p)| p.trim().to_string())
            })
            .next_back();
        let tail: Vec<&str> = log
            .lines()
            .rev()
            .take(40)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        eprintln!("{}", tail.join("\n"));
        Some(input.unwrap_or_else(|| format!("exited with {} and wrote no input", out.status)))
    };
    let corpus_size = std::fs::read_dir(&corpus).map(|d| d.count()).unwrap_or(0);
    Ok(Ran {
        name: name.to_string(),
        seconds: elapsed,
        executions,
        corpus: corpus_size,
        crash,
    })
}

/// Writes the seeds derived from the recorded fixtures, one folder per target.
fn write_seeds(root: &Path, seeds: &Path) -> Result<()> {
    let mut count = 0;
    for (target, inputs) in derive_seeds(root)? {
        let dir = seeds.join(target);
        // regenerated from scratch: a fixture that changed replaces its old seed
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
        }
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        for (i, input) in inputs.iter().enumerate() {
            std::fs::write(dir.join(format!("fixture-{i:03}")), input)?;
            count += 1;
        }
    }
    eprintln!("==> fuzz: {count} seeds from the fixtures in {}", seeds.display());
    Ok(())
}

fn read(root: &Path, rel: &str) -> Result<String> {
    std::fs::read_to_string(root.join(rel)).with_context(|| format!("reading fixture {rel}"))
}

fn yaml(root: &Path, rel: &str) -> Result<Value> {
    serde_yaml_ng::from_str(&read(root, rel)?).with_context(|| format!("parsing fixture {rel}"))
}

fn json_fixture(root: &Path, rel: &str) -> Result<Value> {
    serde_json::from_str(&read(root, rel)?).with_context(|| format!("parsing fixture {rel}"))
}

/// A route byte (see `fuzz/fuzz_targets/admission.rs`) and a review body.
fn review_seed(route: u8, review: &Value) -> Vec<u8> {
    let mut out = vec![route];
    out.extend(serde_json::to_vec(review).unwrap_or_default());
    out
}

/// An AdmissionReview of `object` as the API server would send it.
fn review(group: &str, resource: &str, object: &Value, operation: &str, user: Value) -> Value {
    let kind = object["kind"].clone();
    let version = object["apiVersion"]
        .as_str()
        .and_then(|v| v.rsplit('/').next())
        .unwrap_or("v1")
        .to_string();
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0f0e0d0c-0000-4000-8000-000000000001",
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": resource},
            "name": object["metadata"]["name"],
            "namespace": object["metadata"]["namespace"],
            "operation": operation,
            "userInfo": user,
            "object": object,
            "oldObject": if operation == "UPDATE" { object.clone() } else { Value::Null },
        }
    })
}

/// Every string in `value`, depth first.
fn strings(value: &Value, out: &mut BTreeSet<String>) {
    match value {
        Value::String(s) => {
            out.insert(s.clone());
        }
        Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
        Value::Object(map) => map.values().for_each(|v| strings(v, out)),
        _ => {}
    }
}

/// Inputs per target: (target, inputs).
type Seeds = Vec<(&'static str, Vec<Vec<u8>>)>;

/// Seeds per target, derived from the fixtures the tests use.
fn derive_seeds(root: &Path) -> Result<Seeds> {
    let pod_review = json_fixture(root, "tests/fixtures/admission/daemonset-pod-create.json")?;
    let sidecar_pod = json_fixture(root, "webhook/tests/fixtures/features/pod-with-sidecar.json")?;
    let widget = json_fixture(root, "webhook/tests/fixtures/features/widget.json")?;
    let crs: Vec<Value> = [
        "DaemonSetAutoscaler",
        "NodeRecommendation",
        "NodeFeatureReport",
        "Feature",
        "ClusterClaim",
    ]
    .iter()
    .map(|k| yaml(root, &format!("tests/fixtures/crs/{k}.yaml")))
    .collect::<Result<_>>()?;
    let agent_user = |node: &str| {
        json!({"username": "system:serviceaccount:nodewarden:nodewarden-agent",
               "groups": ["system:serviceaccounts", "system:authenticated"],
               "extra": {"authentication.kubernetes.io/node-name": [node]}})
    };
    let alice = json!({"username": "alice", "groups": ["system:authenticated"]});
    let admin = json!({"username": "admin", "groups": ["system:authenticated"]});

    // admission: the recorded pod review on every route, and its variants on the pod route
    let mut admission = Vec::new();
    for route in 0..6 {
        admission.push(review_seed(route, &pod_review));
    }
    let mut shop = pod_review.clone();
    shop["request"]["namespace"] = json!("shop");
    admission.push(review_seed(0, &shop));
    let mut more = pod_review.clone();
    if let Some(containers) = more["request"]["object"]["spec"]["containers"].as_array_mut()
        && let Some(first) = containers.first().cloned()
    {
        for (name, resources) in [
            ("sidecar", json!({"requests": {"cpu": "50m"}})),
            ("helper", json!({"limits": {"memory": "1Gi"}})),
            ("bare", Value::Null),
        ] {
            let mut c = first.clone();
            c["name"] = json!(name);
            c["resources"] = resources;
            containers.push(c);
        }
    }
    admission.push(review_seed(0, &more));
    let mut bound = pod_review.clone();
    bound["request"]["object"]["spec"]["nodeName"] = json!("webhook-b8hcd8g-node-1");
    bound["request"]["object"]["metadata"]["annotations"] = json!({"a/b~c": "kept"});
    admission.push(review_seed(0, &bound));
    let mut autoscaler = crs[0].clone();
    autoscaler["metadata"]["namespace"] = json!("webhook-b8hcd8g");
    admission.push(review_seed(
        1,
        &review(
            "nodewarden.io",
            "daemonsetautoscalers",
            &autoscaler,
            "CREATE",
            alice.clone(),
        ),
    ));
    admission.push(review_seed(
        1,
        &review(
            "nodewarden.io",
            "daemonsetautoscalers",
            &autoscaler,
            "UPDATE",
            alice.clone(),
        ),
    ));
    for (group, resource, kind, version) in [
        ("nodewarden.io", "clusterclaims", "ClusterClaim", "v1alpha1"),
        ("about.k8s.io", "clusterproperties", "ClusterProperty", "v1alpha1"),
        (
            "cluster.open-cluster-management.io",
            "clusterclaims",
            "ClusterClaim",
            "v1alpha1",
        ),
    ] {
        for (name, value) in [
            ("id.k8s.io", "3f9c1a2e-0000-4000-8000-0000000000aa"),
            ("clusterset.k8s.io", "blue-fleet"),
            ("cluster.clusterset.k8s.io", "cluster-a.example"),
            ("region.example.com", "eu-west-1"),
        ] {
            let mut claim = crs[4].clone();
            claim["apiVersion"] = json!(format!("{group}/{version}"));
            claim["kind"] = json!(kind);
            claim["metadata"]["name"] = json!(name);
            claim["spec"] = json!({"value": value});
            // alice may not write reserved names; admin is one of the target's claim writers
            for user in [&alice, &admin] {
                for op in ["CREATE", "UPDATE", "DELETE"] {
                    admission.push(review_seed(2, &review(group, resource, &claim, op, user.clone())));
                }
            }
        }
    }
    let mut feature = crs[3].clone();
    feature["metadata"]["namespace"] = json!("kube-system");
    admission.push(review_seed(
        3,
        &review("nodewarden.io", "features", &feature, "CREATE", alice.clone()),
    ));
    admission.push(review_seed(
        3,
        &review("", "pods", &sidecar_pod, "CREATE", alice.clone()),
    ));
    admission.push(review_seed(
        3,
        &review("", "pods", &sidecar_pod, "UPDATE", alice.clone()),
    ));
    admission.push(review_seed(
        3,
        &review(
            "example.nodewarden.io",
            "widgets",
            &widget,
            "CREATE",
            alice.clone(),
        ),
    ));
    admission.push(review_seed(
        3,
        &review(
            "example.nodewarden.io",
            "widgets",
            &widget,
            "UPDATE",
            alice.clone(),
        ),
    ));
    for (i, resource) in [(1, "noderecommendations"), (2, "nodefeaturereports")] {
        let report = &crs[i];
        let node = report["metadata"]["name"]
            .as_str()
            .unwrap_or("worker-1")
            .to_string();
        for user in [agent_user(&node), agent_user("other-node"), alice.clone()] {
            admission.push(review_seed(
                4,
                &review("nodewarden.io", resource, report, "CREATE", user),
            ));
        }
    }
    for pod in ["on-node-1", "on-node-2", "unbound", "gone", "unknown"] {
        let eviction = json!({"apiVersion": "policy/v1", "kind": "Eviction",
                              "metadata": {"name": pod, "namespace": "shop"}});
        let mut r = review("", "pods", &eviction, "CREATE", agent_user("node-1"));
        r["request"]["subResource"] = json!("eviction");
        admission.push(review_seed(5, &r));
    }

    // quantities: every string of the fixtures that reads as one
    let mut all = BTreeSet::new();
    for v in crs.iter().chain([&pod_review, &sidecar_pod]) {
        strings(v, &mut all);
    }
    let quantity = all
        .iter()
        .filter(|s| nodewarden_api::quantity::parse_milli(s).is_some())
        .map(|s| s.as_bytes().to_vec())
        .collect();

    // field paths: the Feature fixture's paths over the objects they guard
    let mut field_path = Vec::new();
    let mut paths: Vec<String> = crs[3]["spec"]["fields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["path"].as_str().map(str::to_string))
        .collect();
    paths.extend([
        "spec.shades[*].tint.glow".to_string(),
        "spec.containers[*].ports[*].name".to_string(),
    ]);
    for path in &paths {
        for object in [&sidecar_pod, &widget, &pod_review["request"]["object"]] {
            let mut input = path.as_bytes().to_vec();
            input.push(0);
            input.extend(serde_json::to_vec(object)?);
            field_path.push(input);
        }
    }

    // metrics text: the recorded kubelet and OpenMetrics expositions
    let metrics_text = ["kubelet-metrics.txt", "openmetrics.txt"]
        .iter()
        .map(|f| read(root, &format!("agent/tests/fixtures/gates/{f}")).map(String::into_bytes))
        .collect::<Result<_>>()?;

    Ok(vec![
        ("admission", admission),
        ("quantity", quantity),
        ("field_path", field_path),
        ("metrics_text", metrics_text),
        ("cgroup", cgroup_seeds(&root.join("agent/tests/fixtures"))?),
    ])
}

/// The cgroup fixture trees: each file as its decoder's input, every directory name, and each
/// container folder as one whole read (see `fuzz/fuzz_targets/cgroup.rs`).
fn cgroup_seeds(fixtures: &Path) -> Result<Vec<Vec<u8>>> {
    let mut seeds = Vec::new();
    let mut names = String::new();
    let mut stack = vec![fixtures.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut files = BTreeSet::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                names.push_str(&name);
                names.push('\n');
                stack.push(path);
                continue;
            }
            let selector = match name.as_str() {
                "cpu.stat" | "memory.stat" | "memory.events" | "memory.oom_control" => 0,
                "memory.current" | "memory.usage_in_bytes" | "cpuacct.usage" => 1,
                _ => continue,
            };
            let mut input = vec![selector];
            input.extend(std::fs::read(&path)?);
            seeds.push(input);
            files.insert(name);
        }
        let v2 = ["cpu.stat", "memory.current", "memory.stat", "memory.events"];
        if v2.iter().all(|f| files.contains(*f)) {
            let mut input = vec![4];
            for (i, f) in v2.iter().enumerate() {
                if i > 0 {
                    input.push(0);
                }
                input.extend(std::fs::read(dir.join(f))?);
            }
            seeds.push(input);
        }
    }
    let mut input = vec![2];
    input.extend(names.into_bytes());
    seeds.push(input);
    Ok(seeds)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seeds come from the fixtures the tests use: every target that has fixtures gets
    /// some, and the pod route gets the recorded DaemonSet pod review.
    #[test]
    fn every_fixture_target_gets_seeds() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repo root");
        let seeds = derive_seeds(root).expect("seeds");
        let count = |t: &str| seeds.iter().find(|(n, _)| *n == t).map_or(0, |(_, s)| s.len());
        for target in ["admission", "quantity", "field_path", "metrics_text", "cgroup"] {
            assert!(count(target) > 0, "{target} has no seeds");
        }
        let admission = &seeds
            .iter()
            .find(|(n, _)| *n == "admission")
            .expect("admission")
            .1;
        assert!(
            admission
                .iter()
                .any(|s| s[0] == 0 && String::from_utf8_lossy(&s[1..]).contains("webhook-b8hcd8g-node-1"))
        );
        // each route byte picks a handler: all six routes are seeded
        let routes: BTreeSet<u8> = admission.iter().map(|s| s[0]).collect();
        assert_eq!(routes, (0..6).collect());
        assert!(count("cgroup") > 20, "one seed per cgroup fixture file");
    }

    #[test]
    fn every_target_has_a_source_file() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repo root");
        for (name, _) in TARGETS {
            assert!(
                root.join(format!("fuzz/fuzz_targets/{name}.rs")).is_file(),
                "{name}"
            );
        }
    }
}
