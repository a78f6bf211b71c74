//! What `cargo xtask ci` keeps for the end of its output, where a reader of a failed run looks
//! first (a CI log is often shown from its tail): each failed test's own message, and how low
//! the machine's free disk and memory went while the run lasted.
//!
//! The tests' output still streams as it comes; these only keep bounded copies of it.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Lines kept of each failed test's message.
const MESSAGE_LINES: usize = 14;
/// Characters kept of one line.
const LINE_CHARS: usize = 400;
/// Failed tests whose messages are kept (the others are only named).
const MESSAGES: usize = 12;
/// Lines kept of cargo's own error output (a test binary that crashed, a build that failed).
const CARGO_ERROR_LINES: usize = 20;

/// A `cargo test` run's failures as its output names them: libtest's `---- <test> stdout ----`
/// sections, reduced to each panic's message, and cargo's `error:` lines.
#[derive(Debug, Default)]
pub struct TestDigest {
    /// (test, its message's first lines), in the order they failed.
    failures: Vec<(String, Vec<String>)>,
    /// Failed tests beyond [`MESSAGES`].
    more: Vec<String>,
    /// The section being read: its test, its lines so far, and whether the message began.
    section: Option<(String, Vec<String>, bool)>,
    cargo_errors: VecDeque<String>,
}

impl TestDigest {
    /// One line of libtest's output (the tests' standard output).
    pub fn test_line(&mut self, line: &str) {
        let line = cut(line);
        if let Some(name) = line.strip_prefix("---- ").and_then(|l| {
            l.strip_suffix(" stdout ----")
                .or_else(|| l.strip_suffix(" stderr ----"))
        }) {
            self.end_section();
            self.section = Some((name.to_string(), Vec::new(), false));
            return;
        }
        if line == "failures:" || line.starts_with("test result:") {
            self.end_section();
            return;
        }
        if let Some((_, lines, begun)) = &mut self.section {
            // the message, not the test's progress lines before it
            if !*begun
                && (line.starts_with("thread '") && line.contains("panicked at")
                    || line.starts_with("Error: "))
            {
                *begun = true;
                lines.clear();
            }
            let ended =
                line.starts_with("stack backtrace:") || line.starts_with("note: run with `RUST_BACKTRACE");
            if *begun && ended {
                self.end_section();
            } else if *begun || lines.len() < MESSAGE_LINES {
                lines.push(line);
                if *begun && lines.len() >= MESSAGE_LINES {
                    self.end_section();
                }
            }
        }
    }

    /// One line of cargo's standard error: its own `error:` lines and what follows each.
    pub fn cargo_line(&mut self, line: &str) {
        let line = cut(line);
        let wanted = line.starts_with("error")
            || line.starts_with("Caused by:")
            || line.starts_with("  process didn't exit successfully")
            || line.starts_with("    `-p ")
            || self
                .cargo_errors
                .back()
                .is_some_and(|l| l.starts_with("Caused by:"));
        if wanted {
            if self.cargo_errors.len() == CARGO_ERROR_LINES {
                self.cargo_errors.pop_front();
            }
            self.cargo_errors.push_back(line);
        }
    }

    fn end_section(&mut self) {
        if let Some((name, lines, _)) = self.section.take() {
            if self.failures.iter().any(|(n, _)| *n == name) || self.more.contains(&name) {
                return;
            }
            if self.failures.len() < MESSAGES {
                self.failures.push((name, lines));
            } else {
                self.more.push(name);
            }
        }
    }

    /// True when nothing failed that this saw.
    pub fn is_empty(&self) -> bool {
        self.failures.is_empty() && self.more.is_empty() && self.cargo_errors.is_empty()
    }

    /// The digest, for the end of the run's output.
    pub fn report(mut self) -> String {
        self.end_section();
        let mut out = String::new();
        for (name, lines) in &self.failures {
            out.push_str(&format!("--- {name}\n"));
            for l in lines.iter().filter(|l| !l.trim().is_empty()) {
                out.push_str(&format!("    {l}\n"));
            }
        }
        if !self.more.is_empty() {
            out.push_str(&format!(
                "--- and {} more: {}\n",
                self.more.len(),
                self.more.join(", ")
            ));
        }
        if !self.cargo_errors.is_empty() {
            out.push_str("--- cargo said\n");
            for l in &self.cargo_errors {
                out.push_str(&format!("    {l}\n"));
            }
        }
        out
    }
}

fn cut(line: &str) -> String {
    let line = line.trim_end();
    match line.char_indices().nth(LINE_CHARS) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line.to_string(),
    }
}

/// Runs `command` (a `cargo test`) with its output passed on as it comes (if `echo`), and
/// returns its exit status and the digest of its failures.
pub fn run_tests(command: &mut Command, echo: bool) -> std::io::Result<(ExitStatus, TestDigest)> {
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let digest = Arc::new(Mutex::new(TestDigest::default()));
    let pass = |from: Box<dyn Read + Send>, to_stderr: bool, digest: Arc<Mutex<TestDigest>>| {
        std::thread::spawn(move || {
            let mut reader = BufReader::new(from);
            let mut raw = Vec::new();
            while let Ok(n) = reader.read_until(b'\n', &mut raw) {
                if n == 0 {
                    break;
                }
                if echo && to_stderr {
                    let _ = std::io::stderr().lock().write_all(&raw);
                } else if echo {
                    let _ = std::io::stdout().lock().write_all(&raw);
                }
                let line = String::from_utf8_lossy(&raw);
                if let Ok(mut d) = digest.lock() {
                    if to_stderr {
                        d.cargo_line(&line);
                    } else {
                        d.test_line(&line);
                    }
                }
                raw.clear();
            }
        })
    };
    let out = child
        .stdout
        .take()
        .map(|o| pass(Box::new(o), false, digest.clone()));
    let err = child
        .stderr
        .take()
        .map(|e| pass(Box::new(e), true, digest.clone()));
    let status = child.wait()?;
    for t in [out, err].into_iter().flatten() {
        let _ = t.join();
    }
    let digest = Arc::try_unwrap(digest)
        .ok()
        .and_then(|m| m.into_inner().ok())
        .unwrap_or_default();
    Ok((status, digest))
}

/// The lowest free disk and available memory seen while it lives, sampled every few seconds,
/// and the kernel's OOM kills in that time (`oom_kill` of `/proc/vmstat`, which counts a memory
/// cgroup's kills too); said when dropped.
pub struct ResourceWatch {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Lows>>,
    oom_kills_before: Option<u64>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Lows {
    disk: Option<(u64, Duration)>,
    memory: Option<(u64, Duration)>,
}

/// Between samples.
const SAMPLE_EVERY: Duration = Duration::from_secs(5);

impl ResourceWatch {
    /// Watches the filesystem of `path` and the machine's memory.
    pub fn start(path: PathBuf) -> ResourceWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("resource-watch".into())
            .spawn(move || {
                let began = Instant::now();
                let mut lows = Lows::default();
                while !stopped.load(Ordering::Relaxed) {
                    let at = began.elapsed();
                    let low = |now: Option<u64>, low: &mut Option<(u64, Duration)>| {
                        if let Some(now) = now
                            && low.is_none_or(|(l, _)| now < l)
                        {
                            *low = Some((now, at));
                        }
                    };
                    low(free_disk(&path), &mut lows.disk);
                    low(
                        std::fs::read_to_string("/proc/meminfo")
                            .ok()
                            .and_then(|m| available_memory(&m)),
                        &mut lows.memory,
                    );
                    // short sleeps, so that a drop does not wait a whole period
                    let next = Instant::now() + SAMPLE_EVERY;
                    while Instant::now() < next && !stopped.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(200));
                    }
                }
                lows
            })
            .ok();
        ResourceWatch {
            stop,
            thread,
            oom_kills_before: oom_kills(),
        }
    }
}

impl Drop for ResourceWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let lows = self.thread.take().and_then(|t| t.join().ok()).unwrap_or_default();
        let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
        let low = |what: &str, l: Option<(u64, Duration)>| match l {
            Some((bytes, at)) => format!("{what} {:.1} GiB (at {:.0} s)", gib(bytes), at.as_secs_f64()),
            None => format!("{what} not read"),
        };
        let ooms = match (self.oom_kills_before, oom_kills()) {
            // memory cgroups' kills count too: the OOM-loop tests' pods are killed on purpose
            (Some(before), Some(after)) => format!(
                "{} OOM kills by the kernel (a memory cgroup's included: the OOM-loop tests' pods \
                 are killed on purpose)",
                after.saturating_sub(before)
            ),
            _ => "OOM kills not read".to_string(),
        };
        eprintln!(
            "==> resources during the run: least {}, least {}; {ooms}",
            low("free disk", lows.disk),
            low("available memory", lows.memory)
        );
    }
}

fn free_disk(path: &std::path::Path) -> Option<u64> {
    let out = Command::new("df").arg("-Pk").arg(path).output().ok()?;
    crate::available_bytes(&String::from_utf8_lossy(&out.stdout))
}

/// `MemAvailable` of `/proc/meminfo`, in bytes.
fn available_memory(meminfo: &str) -> Option<u64> {
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// The kernel's count of OOM kills since boot (`oom_kill` of `/proc/vmstat`).
fn oom_kills() -> Option<u64> {
    std::fs::read_to_string("/proc/vmstat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest_of(stdout: &str) -> String {
        let mut d = TestDigest::default();
        for l in stdout.lines() {
            d.test_line(l);
        }
        d.report()
    }

    #[test]
    fn each_failed_tests_panic_message_is_kept_without_its_progress_or_backtrace() {
        let out = "\
running 2 tests
test a ... FAILED
test b ... ok

failures:

---- a stdout ----
progress line one
progress line two

thread 'a' panicked at tests/tests/x.rs:39:19:
starting a control plane: kube-apiserver exited
bind: address already in use
stack backtrace:
   0: frame
   1: frame

failures:
    a

test result: FAILED. 1 passed; 1 failed
";
        assert_eq!(
            digest_of(out),
            "--- a\n    thread 'a' panicked at tests/tests/x.rs:39:19:\n    \
             starting a control plane: kube-apiserver exited\n    bind: address already in use\n"
        );
    }

    #[test]
    fn a_test_without_a_panic_line_keeps_its_first_lines_and_many_failures_are_bounded() {
        let mut out = String::from("failures:\n\n---- quiet stdout ----\nonly this\n");
        for i in 0..MESSAGES + 3 {
            out.push_str(&format!(
                "---- t{i} stdout ----\nthread 't{i}' panicked at f.rs:1:1:\nboom {i}\n"
            ));
        }
        out.push_str("\nfailures:\n");
        let report = digest_of(&out);
        assert!(
            report.starts_with("--- quiet\n    only this\n--- t0\n"),
            "{report}"
        );
        assert!(report.contains("    boom 10\n"), "{report}");
        assert!(!report.contains("boom 11"), "{report}");
        assert!(
            report.ends_with("--- and 4 more: t11, t12, t13, t14\n"),
            "{report}"
        );
    }

    #[test]
    fn cargos_error_lines_are_kept() {
        let mut d = TestDigest::default();
        for l in [
            "   Compiling x v0.1.0",
            "error: test failed, to rerun pass `-p nodewarden-tests --test images`",
            "",
            "Caused by:",
            "  process didn't exit successfully: `images-123` (signal: 9, SIGKILL: kill)",
            "     Running tests/realnode.rs",
        ] {
            d.cargo_line(l);
        }
        assert!(!d.is_empty());
        assert_eq!(
            d.report(),
            "--- cargo said\n    error: test failed, to rerun pass `-p nodewarden-tests --test images`\n    \
             Caused by:\n      process didn't exit successfully: `images-123` (signal: 9, SIGKILL: kill)\n"
        );
    }

    /// A real `cargo test` of a crate with a failing test: its real output gives the digest.
    #[test]
    fn a_real_cargo_test_runs_failure_is_digested() {
        let dir = tempfile::tempdir().unwrap();
        let krate = dir.path().join("probe");
        std::fs::create_dir_all(krate.join("src")).unwrap();
        std::fs::write(
            krate.join("Cargo.toml"),
            "[package]\nname = \"probe\"\nversion = \"0.1.0\"\nedition = \"2021\"\n[workspace]\n",
        )
        .unwrap();
        std::fs::write(
            krate.join("src/lib.rs"),
            "#[test]\nfn fine() {}\n#[test]\nfn broken() {\n    println!(\"progress\");\n    \
             panic!(\"the port was taken\");\n}\n",
        )
        .unwrap();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
        let mut command = Command::new(cargo);
        command
            .args(["test", "--offline", "--quiet"])
            .current_dir(&krate)
            .env("CARGO_TARGET_DIR", dir.path().join("target"))
            .env("RUST_BACKTRACE", "1");
        let (status, digest) = run_tests(&mut command, false).unwrap();
        assert!(!status.success());
        let report = digest.report();
        assert!(
            report.starts_with("--- broken\n    thread 'broken' ")
                && report.contains("    the port was taken\n"),
            "{report}"
        );
        assert!(
            !report.contains("progress") && !report.contains("fine"),
            "{report}"
        );
        assert!(
            report.contains("--- cargo said\n    error: test failed"),
            "{report}"
        );
    }

    #[test]
    fn a_long_line_is_cut() {
        let long = "x".repeat(LINE_CHARS * 3);
        assert_eq!(cut(&long).chars().count(), LINE_CHARS + 1);
    }

    #[test]
    fn available_memory_and_oom_kills_are_read_from_procs_formats() {
        let meminfo = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   2000000 kB\n";
        assert_eq!(available_memory(meminfo), Some(2_000_000 * 1024));
        assert_eq!(available_memory("MemTotal: 1 kB\n"), None);
        // this machine's own counter reads (Linux 4.13 and later)
        assert!(oom_kills().is_some());
    }
}
