//! `cargo xtask compat`: the Kubernetes version matrix. For each version it builds the API-server
//! tier's binaries (`tests/controlplane/build-version.sh`), runs the API-server tier's test files
//! against them (`NODEWARDEN_KUBE_VERSION`), keeps what each run gave in
//! `<target>/compat/results.json` (runs of other versions are kept, a version run again replaces
//! its own), and writes docs/compatibility.md from those results: a table version × capability,
//! what failed, and what each version cost to build and run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

/// Every minor from the oldest the chart supports to the newest, and the next one's beta as a
/// look-ahead whose failures do not fail the run.
pub const DEFAULT_VERSIONS: &[&str] = &[
    "v1.30.14",
    "v1.31.14",
    "v1.32.13",
    "v1.33.13",
    "v1.34.4",
    "v1.35.4",
    "v1.36.3",
    "v1.37.2",
    "v1.38.0-beta.0",
];

/// The API-server tier's files and the capability each proves (the table's columns).
pub const CAPABILITIES: &[(&str, &str)] = &[
    ("claims", "claims"),
    ("features", "features"),
    ("rightsizing", "right-sizing at admission"),
    ("helm_install", "helm install/upgrade"),
    ("agent", "agent: publish, InPlace, Recreate"),
];

/// Where the hand-written part of docs/compatibility.md starts; everything from this line on is
/// kept as it is when the table is written again.
pub const NOTES_MARKER: &str = "<!-- written by hand below this line; cargo xtask compat keeps it -->";

pub struct CompatOptions {
    pub versions: Vec<String>,
    pub files: Vec<String>,
    /// Write the document from the results kept so far, without building or running anything.
    pub write_only: bool,
}

/// One test file's run against one version.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FileRun {
    pub seconds: u64,
    /// `passed`, `failed` (some test failed), or `error` (the file did not build or run)
    pub outcome: String,
    pub passed: Vec<String>,
    /// Each failed test with the first line of what it said.
    pub failed: Vec<(String, String)>,
    pub log: String,
}

/// What one version's run gave.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VersionRun {
    /// When (UTC, RFC 3339) the run ended.
    pub date: String,
    pub build_seconds: u64,
    /// The version's own folder (its Go module and binaries), in bytes.
    pub build_bytes: u64,
    /// Why the build failed, when it did.
    pub build_error: Option<String>,
    pub files: BTreeMap<String, FileRun>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Results {
    pub versions: BTreeMap<String, VersionRun>,
}

pub fn compat(root: &Path, opts: &CompatOptions) -> Result<()> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let dir = target.join("compat");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let results_path = dir.join("results.json");
    let mut results: Results = match std::fs::read(&results_path) {
        Ok(bytes) => {
            serde_json::from_slice(&bytes).with_context(|| format!("reading {}", results_path.display()))?
        }
        Err(_) => Results::default(),
    };
    let versions: Vec<String> = opts
        .versions
        .iter()
        .map(|v| normalize(v))
        .collect::<Result<_>>()?;
    for f in &opts.files {
        if !root.join("tests/tests").join(format!("{f}.rs")).is_file() {
            bail!("--files: tests/tests/{f}.rs does not exist");
        }
    }
    let mut failed_versions = Vec::new();
    if !opts.write_only {
        // the test binaries once, before the first version's clock starts; each file is then run
        // from its executable (no cargo, so no wait for the target folder's lock between files)
        let executables = build_tests(root, &opts.files)?;
        for version in &versions {
            let run = run_version(root, &dir, version, &executables)?;
            if run.build_error.is_some() || run.files.values().any(|f| f.outcome != "passed") {
                failed_versions.push(version.clone());
            }
            results.versions.insert(version.clone(), run);
            std::fs::write(&results_path, serde_json::to_vec_pretty(&results)?)
                .with_context(|| format!("writing {}", results_path.display()))?;
        }
    }
    let doc_path = root.join("docs/compatibility.md");
    let old = std::fs::read_to_string(&doc_path).unwrap_or_default();
    std::fs::write(&doc_path, render(&results, &old))
        .with_context(|| format!("writing {}", doc_path.display()))?;
    eprintln!("==> compat: wrote {}", doc_path.display());
    let must_pass: Vec<&String> = failed_versions.iter().filter(|v| !v.contains('-')).collect();
    if !must_pass.is_empty() {
        bail!("the API-server tier failed on {must_pass:?} (see docs/compatibility.md)");
    }
    Ok(())
}

/// `1.30.14` → `v1.30.14`; anything else than `v1.MINOR.PATCH[-pre.N]` is refused.
pub fn normalize(version: &str) -> Result<String> {
    let v = format!("v{}", version.trim().trim_start_matches('v'));
    let (core, pre) = match v[1..].split_once('-') {
        Some((core, pre)) => (core, Some(pre)),
        None => (&v[1..], None),
    };
    let numbers: Vec<&str> = core.split('.').collect();
    let ok = numbers.len() == 3
        && numbers[0] == "1"
        && numbers
            .iter()
            .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        && pre.is_none_or(|p| {
            p.split_once('.').is_some_and(|(kind, n)| {
                ["alpha", "beta", "rc"].contains(&kind)
                    && !n.is_empty()
                    && n.bytes().all(|b| b.is_ascii_digit())
            })
        });
    if !ok {
        bail!("{version:?} is not a Kubernetes version (expected e.g. v1.30.14 or v1.38.0-beta.0)");
    }
    Ok(v)
}

/// `cargo test --no-run` of the files; each file's test executable.
fn build_tests(root: &Path, files: &[String]) -> Result<Vec<(String, PathBuf)>> {
    let mut args = vec![
        "test",
        "--no-run",
        "--message-format=json-render-diagnostics",
        "-p",
        "nodewarden-tests",
    ];
    for f in files {
        args.extend(["--test", f.as_str()]);
    }
    eprintln!("==> compat: cargo {}", args.join(" "));
    let out = Command::new(crate::cargo())
        .args(&args)
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .context("starting cargo")?;
    if !out.status.success() {
        bail!("building the test files failed ({})", out.status);
    }
    let found = test_executables(&String::from_utf8_lossy(&out.stdout));
    files
        .iter()
        .map(|f| {
            found
                .get(f)
                .map(|exe| (f.clone(), exe.clone()))
                .with_context(|| format!("cargo named no test executable for {f}"))
        })
        .collect()
}

/// Test target name → executable, from cargo's JSON messages.
pub fn test_executables(messages: &str) -> BTreeMap<String, PathBuf> {
    messages
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .filter(|m| {
            m["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "test"))
        })
        .filter_map(|m| {
            Some((
                m["target"]["name"].as_str()?.to_string(),
                PathBuf::from(m["executable"].as_str()?),
            ))
        })
        .collect()
}

fn run_version(
    root: &Path,
    dir: &Path,
    version: &str,
    executables: &[(String, PathBuf)],
) -> Result<VersionRun> {
    let logs = dir.join(version);
    std::fs::create_dir_all(&logs)?;
    let mut run = VersionRun::default();
    let script = root.join("tests/controlplane/build-version.sh");
    eprintln!("==> compat {version}: building kube-apiserver and kube-controller-manager");
    let started = Instant::now();
    let build_log = logs.join("build.log");
    let out = Command::new("bash")
        .arg(&script)
        .arg(version)
        .stdin(Stdio::null())
        .stderr(std::fs::File::create(&build_log)?)
        .output()
        .with_context(|| format!("starting {}", script.display()))?;
    run.build_seconds = started.elapsed().as_secs();
    let bin = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or("")
        .trim()
        .to_string();
    if !out.status.success() || bin.is_empty() {
        let tail = last_lines(&std::fs::read_to_string(&build_log).unwrap_or_default(), 3);
        run.build_error = Some(format!("{} ({}): {tail}", out.status, build_log.display()));
        eprintln!(
            "==> compat {version}: build failed after {}s: {tail}",
            run.build_seconds
        );
        run.date = now();
        return Ok(run);
    }
    // the version's folder: its Go module and bin/ (etcd and helm copied from the pinned build)
    run.build_bytes = Path::new(&bin).parent().map(du_bytes).unwrap_or(0);
    eprintln!(
        "==> compat {version}: built in {}s ({:.0} MiB in {bin})",
        run.build_seconds,
        run.build_bytes as f64 / 1048576.0
    );
    for (file, exe) in executables {
        eprintln!("==> compat {version}: tests/tests/{file}.rs");
        let log = logs.join(format!("{file}.log"));
        let started = Instant::now();
        let out = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        // as `cargo test` runs it: from the crate's folder
        let status = Command::new(exe)
            .arg("--test-threads=1")
            .current_dir(root.join("tests"))
            .env("NODEWARDEN_KUBE_VERSION", version)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .status()
            .with_context(|| format!("running the tests of {file}"))?;
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let mut result = parse_libtest(&text);
        result.seconds = started.elapsed().as_secs();
        result.log = log.display().to_string();
        result.outcome = if status.success() {
            "passed"
        } else if result.failed.is_empty() {
            "error"
        } else {
            "failed"
        }
        .to_string();
        eprintln!(
            "==> compat {version}: {file}: {} in {}s ({} passed, {} failed)",
            result.outcome,
            result.seconds,
            result.passed.len(),
            result.failed.len()
        );
        run.files.insert(file.clone(), result);
    }
    run.date = now();
    Ok(run)
}

/// The tests a libtest run reports (`test NAME ... ok` / `... FAILED`), with the first line
/// each failed test printed after `---- NAME stdout ----`.
pub fn parse_libtest(text: &str) -> FileRun {
    let mut run = FileRun::default();
    let mut failed = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("test ") {
            if let Some(name) = rest.strip_suffix(" ... ok") {
                run.passed.push(name.to_string());
            } else if let Some(name) = rest.strip_suffix(" ... FAILED") {
                failed.push(name.to_string());
            }
        }
    }
    for name in failed {
        let header = format!("---- {name} stdout ----");
        let said = text
            .split(&header)
            .nth(1)
            .and_then(|after| {
                let lines: Vec<&str> = after.lines().map(str::trim).collect();
                // the panic's message (the line after `thread '…' panicked at …`), else the first line
                let start = lines
                    .iter()
                    .position(|l| l.starts_with("thread '") && l.contains("panicked at"))
                    .map_or(0, |i| i + 1);
                lines[start..]
                    .iter()
                    .find(|l| !l.is_empty() && !l.starts_with("nodewarden-tests:"))
                    .map(|l| l.to_string())
            })
            .unwrap_or_default();
        run.failed.push((name, said));
    }
    run
}

/// docs/compatibility.md from the results; `old`'s hand-written part (after [`NOTES_MARKER`]) is kept.
pub fn render(results: &Results, old: &str) -> String {
    let mut s = String::new();
    s.push_str("# Kubernetes versions\n\n");
    s.push_str(
        "Written by `cargo xtask compat` from its own runs (the results of each version's last run \
         are kept in `<target>/compat/results.json`): each version's kube-apiserver and \
         kube-controller-manager built from their Go modules by `tests/controlplane/build-version.sh` \
         (etcd and helm are the pinned build's), then the API-server tier's test files run against \
         them with `NODEWARDEN_KUBE_VERSION` set. A cell is the file's tests passed, or which failed and \
         what the first one said. `cargo xtask compat --versions v1.30.14,v1.37.2 --files claims,features` \
         runs a part of the matrix; `--write-only` writes this page from the results kept. A \
         version with no run in that file (run on another machine) keeps its rows as this page had \
         them.\n\n",
    );
    let kept = KeptRows::from_page(old, results);
    let mut header = "| version |".to_string();
    let mut rule = "|---|".to_string();
    for (_, title) in CAPABILITIES {
        header.push_str(&format!(" {title} |"));
        rule.push_str("---|");
    }
    s.push_str(&format!("{header}\n{rule}\n"));
    let others: std::collections::BTreeSet<String> = results
        .versions
        .keys()
        .chain(kept.matrix.keys())
        .filter(|v| !DEFAULT_VERSIONS.contains(&v.as_str()))
        .cloned()
        .collect();
    for version in DEFAULT_VERSIONS.iter().map(|v| v.to_string()).chain(others) {
        let mut row = format!(
            "| {version}{} |",
            if version.contains('-') {
                " (look-ahead)"
            } else {
                ""
            }
        );
        match results.versions.get(&version) {
            None if kept.matrix.contains_key(&version) => row = kept.matrix[&version].clone(),
            None => {
                for _ in CAPABILITIES {
                    row.push_str(" not run yet |");
                }
            }
            Some(run) if run.build_error.is_some() => {
                for _ in CAPABILITIES {
                    row.push_str(" build failed |");
                }
            }
            Some(run) => {
                for (file, _) in CAPABILITIES {
                    row.push_str(&format!(" {} |", cell(run.files.get(*file))));
                }
            }
        }
        s.push_str(&row);
        s.push('\n');
    }
    s.push_str("\n## What each run cost\n\n");
    s.push_str("Build: kube-apiserver and kube-controller-manager from a warm Go module cache where noted in the notes below; disk: the version's folder under `${NODEWARDEN_CACHE:-$HOME/.cache/nodewarden}/controlplane` (its Go module and binaries; Go's own module and build caches grow beside it). Test times include each file's control-plane start.\n\n");
    s.push_str("| version | run ended | build | disk | tests (per file) |\n|---|---|---|---|---|\n");
    let mut total = kept.seconds;
    let mut cost_rows = kept.cost.clone();
    for (version, run) in &results.versions {
        let files: Vec<String> = run
            .files
            .iter()
            .map(|(f, r)| format!("{f} {}s", r.seconds))
            .collect();
        total += run.build_seconds + run.files.values().map(|r| r.seconds).sum::<u64>();
        cost_rows.insert(
            version.clone(),
            format!(
                "| {version} | {} | {} | {} | {} |",
                run.date,
                match &run.build_error {
                    Some(e) => format!("failed after {}s: {}", run.build_seconds, e.replace('|', "\\|")),
                    // the script only checked the binaries it built earlier
                    None if run.build_seconds < 5 => "cached".to_string(),
                    None => format!("{}s", run.build_seconds),
                },
                if run.build_bytes > 0 {
                    format!("{:.0} MiB", run.build_bytes as f64 / 1048576.0)
                } else {
                    "-".to_string()
                },
                if files.is_empty() {
                    "-".to_string()
                } else {
                    files.join(", ")
                },
            ),
        );
    }
    for row in cost_rows.values() {
        s.push_str(row);
        s.push('\n');
    }
    s.push_str(&format!(
        "\nThe versions above together: {} min of builds and test runs.\n",
        total.div_ceil(60)
    ));
    let mut failures: Vec<String> = results
        .versions
        .iter()
        .flat_map(|(v, run)| {
            run.files.iter().flat_map(move |(f, r)| {
                r.failed
                    .iter()
                    .map(move |(name, said)| format!("- {v}, `{f}.rs`, `{name}`: {said}"))
            })
        })
        .collect();
    failures.extend(kept.failed.iter().cloned());
    if !failures.is_empty() {
        s.push_str("\n## Failed tests\n\n");
        s.push_str(&failures.join("\n"));
        s.push('\n');
    }
    s.push('\n');
    s.push_str(NOTES_MARKER);
    s.push('\n');
    if let Some((_, notes)) = old.split_once(NOTES_MARKER) {
        s.push_str(notes.trim_start_matches('\n'));
    }
    s
}

/// The rows an earlier page holds for versions that have no run in the results here (runs made
/// on another machine, whose `results.json` is not here): kept as they were, and their minutes
/// counted in the total.
#[derive(Default)]
struct KeptRows {
    /// The matrix's row of each such version, if any of its cells says more than "not run yet".
    matrix: BTreeMap<String, String>,
    /// The cost table's row of each such version.
    cost: BTreeMap<String, String>,
    /// Their lines in "Failed tests".
    failed: Vec<String>,
    /// Their builds' and test files' seconds, from the cost rows.
    seconds: u64,
}

impl KeptRows {
    fn from_page(old: &str, results: &Results) -> KeptRows {
        let body = old.split(NOTES_MARKER).next().unwrap_or("");
        let (matrix, costs) = body.split_once("## What each run cost").unwrap_or((body, ""));
        let kept_version = |first_cell: &str| -> Option<String> {
            let v = first_cell.trim().trim_end_matches(" (look-ahead)");
            (v.starts_with("v1.") && normalize(v).is_ok() && !results.versions.contains_key(v))
                .then(|| v.to_string())
        };
        let cells = |line: &str| -> Vec<String> {
            line.trim()
                .trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_string())
                .collect()
        };
        let mut kept = KeptRows::default();
        for line in matrix.lines().filter(|l| l.starts_with("| v1.")) {
            let cells = cells(line);
            if let Some(v) = cells.first().and_then(|c| kept_version(c))
                && cells[1..].iter().any(|c| c != "not run yet")
            {
                kept.matrix.insert(v, line.to_string());
            }
        }
        for line in costs.lines() {
            if line.starts_with("| v1.") {
                let cells = cells(line);
                let Some(v) = cells.first().and_then(|c| kept_version(c)) else {
                    continue;
                };
                let seconds_in = |text: &str| -> u64 {
                    text.split(|c: char| !c.is_ascii_alphanumeric())
                        .filter_map(|w| w.strip_suffix('s').and_then(|n| n.parse::<u64>().ok()))
                        .sum()
                };
                // the build ("600s", "cached", "failed after 12s: …") and the files ("claims 28s, …")
                let build = cells
                    .get(2)
                    .map_or(0, |b| seconds_in(b.split(':').next().unwrap_or_default()));
                kept.seconds += build + cells.get(4).map_or(0, |f| seconds_in(f));
                kept.cost.insert(v, line.to_string());
            } else if let Some(rest) = line.strip_prefix("- ")
                && let Some((v, _)) = rest.split_once(", ")
                && kept_version(v).is_some()
            {
                kept.failed.push(line.to_string());
            }
        }
        kept
    }
}

fn cell(run: Option<&FileRun>) -> String {
    match run {
        None => "not run yet".to_string(),
        Some(r) if r.outcome == "passed" => match r.passed.len() {
            1 => "pass (1 test)".to_string(),
            n => format!("pass ({n} tests)"),
        },
        Some(r) if r.outcome == "error" => "did not run (see its log)".to_string(),
        Some(r) => format!(
            "**fail**: {} of {} ({})",
            r.failed.len(),
            r.failed.len() + r.passed.len(),
            r.failed
                .iter()
                .map(|(n, _)| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" / ")
}

fn du_bytes(path: &Path) -> u64 {
    Command::new("du")
        .arg("-sb")
        .arg(path)
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

fn now() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "running 2 tests
test claims_are_guarded ... ok
test ids_are_unique ... FAILED

failures:

---- ids_are_unique stdout ----
nodewarden-tests: control plane (Kubernetes v1.30.14) ready
upgrading from the chart of f80e183f7d5c

thread 'ids_are_unique' (25813) panicked at tests/tests/claims.rs:42:9:
the id claim was allowed: HTTP 200

failures:
    ids_are_unique

test result: FAILED. 1 passed; 1 failed
";

    #[test]
    fn libtest_output_gives_passed_and_failed_tests_with_what_they_said() {
        let run = parse_libtest(LOG);
        assert_eq!(run.passed, vec!["claims_are_guarded".to_string()]);
        assert_eq!(
            run.failed,
            vec![(
                "ids_are_unique".to_string(),
                "the id claim was allowed: HTTP 200".to_string()
            )]
        );
    }

    #[test]
    fn cargo_messages_name_each_test_files_executable() {
        let messages = r#"{"reason":"compiler-artifact","target":{"name":"nodewarden_tests","kind":["lib"]},"executable":null}
{"reason":"compiler-artifact","target":{"name":"claims","kind":["test"]},"executable":"/t/debug/deps/claims-1"}
not json
{"reason":"build-finished","success":true}"#;
        let found = test_executables(messages);
        assert_eq!(found.len(), 1);
        assert_eq!(found["claims"], PathBuf::from("/t/debug/deps/claims-1"));
    }

    #[test]
    fn versions_are_normalized_and_bad_ones_refused() {
        assert_eq!(normalize("1.30.14").unwrap(), "v1.30.14");
        assert_eq!(normalize("v1.38.0-beta.0").unwrap(), "v1.38.0-beta.0");
        for bad in ["1.30", "v1.30.x", "2.0.0", "v1.38.0-gamma.1", "v1.38.0-beta."] {
            assert!(normalize(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_page_has_a_row_per_version_and_keeps_the_notes() {
        let mut results = Results::default();
        let mut run = VersionRun {
            build_seconds: 600,
            build_bytes: 200 << 20,
            date: "2026-01-01T00:00:00Z".into(),
            ..Default::default()
        };
        let mut claims = parse_libtest(LOG);
        claims.outcome = "failed".into();
        claims.seconds = 30;
        run.files.insert("claims".into(), claims);
        run.files.insert(
            "features".into(),
            FileRun {
                outcome: "passed".into(),
                passed: vec!["a".into(), "b".into()],
                seconds: 20,
                ..Default::default()
            },
        );
        results.versions.insert("v1.30.14".into(), run);
        let old = format!("old table\n{NOTES_MARKER}\nIn-place resize on 1.30: ...\n");
        let page = render(&results, &old);
        assert!(
            page.contains("| v1.30.14 | **fail**: 1 of 2 (`ids_are_unique`) | pass (2 tests) | not run yet | not run yet |"),
            "{page}"
        );
        assert!(page.contains("| v1.37.2 | not run yet |"), "{page}");
        assert!(page.contains("| v1.38.0-beta.0 (look-ahead) |"), "{page}");
        assert!(
            page.contains("| v1.30.14 | 2026-01-01T00:00:00Z | 600s | 200 MiB | claims 30s, features 20s |"),
            "{page}"
        );
        assert!(
            page.contains("- v1.30.14, `claims.rs`, `ids_are_unique`: the id claim was allowed: HTTP 200")
        );
        assert!(page.ends_with("In-place resize on 1.30: ...\n"), "{page}");
        assert!(!page.contains("old table"));
        assert_eq!(page.matches(NOTES_MARKER).count(), 1);
    }

    #[test]
    fn rows_of_versions_run_elsewhere_are_kept_and_a_new_run_replaces_its_own() {
        let mut results = Results::default();
        results.versions.insert(
            "v1.32.13".into(),
            VersionRun {
                build_seconds: 900,
                date: "2026-02-02T00:00:00Z".into(),
                files: BTreeMap::from([(
                    "claims".to_string(),
                    FileRun {
                        outcome: "passed".into(),
                        passed: vec!["a".into()],
                        seconds: 30,
                        ..Default::default()
                    },
                )]),
                ..Default::default()
            },
        );
        // a page written on another machine: 1.30 passed there, 1.32 had failed, 1.31 never ran
        let old = format!(
            "# Kubernetes versions\n\n| version | claims | features |\n|---|---|---|\n\
             | v1.30.14 | pass (1 test) | pass (2 tests) | pass (4 tests) | pass (3 tests) | pass (3 tests) |\n\
             | v1.31.14 | not run yet | not run yet | not run yet | not run yet | not run yet |\n\
             | v1.32.13 | **fail**: 1 of 1 (`a`) | not run yet | not run yet | not run yet | not run yet |\n\
             \n## What each run cost\n\n| version | run ended | build | disk | tests (per file) |\n|---|---|---|---|---|\n\
             | v1.30.14 | 2026-01-01T00:00:00Z | 600s | 304 MiB | agent 29s, claims 31s |\n\
             | v1.32.13 | 2026-01-01T00:00:00Z | cached | 272 MiB | claims 28s |\n\
             \nThe versions above together: 12 min of builds and test runs.\n\n## Failed tests\n\n\
             - v1.32.13, `claims.rs`, `a`: it failed\n\n{NOTES_MARKER}\nnotes\n"
        );
        let page = render(&results, &old);
        assert!(
            page.contains("| v1.30.14 | pass (1 test) | pass (2 tests) | pass (4 tests) | pass (3 tests) | pass (3 tests) |\n"),
            "{page}"
        );
        assert!(page.contains("| v1.31.14 | not run yet |"), "{page}");
        assert!(
            page.contains("| v1.32.13 | pass (1 test) | not run yet |"),
            "{page}"
        );
        assert!(
            page.contains("| v1.30.14 | 2026-01-01T00:00:00Z | 600s | 304 MiB | agent 29s, claims 31s |\n")
        );
        assert!(
            page.contains("| v1.32.13 | 2026-02-02T00:00:00Z | 900s | - | claims 30s |\n"),
            "{page}"
        );
        assert!(!page.contains("it failed"), "{page}");
        // 600 + 29 + 31 kept, 900 + 30 run here: 1,590 s
        assert!(page.contains("together: 27 min"), "{page}");
        assert!(page.ends_with("notes\n"), "{page}");
        // the page written again from the same results is the same page
        assert_eq!(render(&results, &page), page);
    }
}
