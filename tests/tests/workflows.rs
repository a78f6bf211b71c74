//! The GitHub Actions workflows under `.github/workflows` (CI and release) are valid: actionlint
//! (built from its Go module by `tests/actionlint/build.sh`, offline once built) reports nothing,
//! with shellcheck on their `run:` scripts; and every action they use is pinned by a full commit
//! digest. A broken workflow is shown to be reported, so the check cannot pass by running nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, ensure};
use nodewarden_tests::process::cached_build;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

fn workflows() -> Result<Vec<PathBuf>> {
    let dir = repo_root().join(".github/workflows");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yml" || e == "yaml"))
        .collect();
    files.sort();
    Ok(files)
}

/// shellcheck's path: actionlint checks `run:` scripts with it. Missing: a loud line, and under
/// CI=true a failure (`cargo xtask ci` installs Debian's package).
fn shellcheck() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("shellcheck"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
        let msg = "shellcheck is missing: install it with `tests/node/packages.sh shellcheck`";
        assert!(!ci, "{msg} (CI=true: the run: scripts must be checked)");
        eprintln!("\n!!! {msg}; actionlint runs without it\n");
    }
    found
}

/// Runs actionlint on `files` (from `dir`); returns (success, what it printed).
fn actionlint(dir: &Path, files: &[PathBuf]) -> Result<(bool, String)> {
    let bin = cached_build("actionlint/build.sh", &["actionlint"])?.join("actionlint");
    let shellcheck = shellcheck().map(|p| p.display().to_string()).unwrap_or_default();
    let out = Command::new(bin)
        .arg("-no-color")
        .arg(format!("-shellcheck={shellcheck}"))
        // no Python in the workflows
        .arg("-pyflakes=")
        .args(files)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .context("running actionlint")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status.success() && text.trim().is_empty(), text))
}

#[test]
fn actionlint_reports_nothing_on_the_workflows() -> Result<()> {
    let files = workflows()?;
    let names: Vec<String> = files
        .iter()
        .filter_map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    ensure!(
        names.contains(&"ci.yml".to_string()) && names.contains(&"release.yml".to_string()),
        "the CI and release workflows: {names:?}"
    );
    let (ok, text) = actionlint(&repo_root(), &files)?;
    ensure!(ok, "actionlint reported problems in .github/workflows:\n{text}");
    Ok(())
}

#[test]
fn actionlint_reports_a_broken_workflow() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let wf = dir.path().join(".github/workflows");
    std::fs::create_dir_all(&wf)?;
    let file = wf.join("broken.yml");
    // an unknown event, a job without runs-on, an undefined step output, a script bug
    std::fs::write(
        &file,
        "on: pushed\njobs:\n  a:\n    steps:\n      - run: echo ${{ steps.nope.outputs.x }}\n      - run: cd $UNSET_DIR\n",
    )?;
    let (ok, text) = actionlint(dir.path(), &[file])?;
    ensure!(!ok, "actionlint passed a broken workflow:\n{text}");
    for needle in ["pushed", "runs-on"] {
        ensure!(
            text.contains(needle),
            "actionlint should name `{needle}`:\n{text}"
        );
    }
    Ok(())
}

/// `uses: owner/repo@<40 hex digits>` for every third-party action (a tag or branch can be moved
/// to other code; a commit cannot), followed by a comment naming the release.
#[test]
fn every_action_is_pinned_by_commit_digest() -> Result<()> {
    let mut seen = 0;
    for file in workflows()? {
        let text = std::fs::read_to_string(&file)?;
        for (n, line) in text.lines().enumerate() {
            let Some(rest) = line.trim_start().trim_start_matches("- ").strip_prefix("uses:") else {
                continue;
            };
            let (action, comment) = rest.split_once('#').unwrap_or((rest, ""));
            let action = action.trim();
            let at = format!("{}:{}", file.display(), n + 1);
            if action.starts_with("./") || action.starts_with("docker://") {
                continue;
            }
            let (_, reference) = action
                .split_once('@')
                .with_context(|| format!("{at}: `{action}` names no version"))?;
            ensure!(
                reference.len() == 40 && reference.chars().all(|c| c.is_ascii_hexdigit()),
                "{at}: `{action}` is not pinned by a full commit digest"
            );
            ensure!(
                comment.trim().starts_with('v'),
                "{at}: `{action}` needs a comment naming its release, e.g. `# v1.2.3`"
            );
            seen += 1;
        }
    }
    ensure!(seen > 0, "no `uses:` found: the check read nothing");
    Ok(())
}
