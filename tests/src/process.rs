//! Child processes of a control plane: started with their output in log files, killed when
//! their owner is dropped, and killed by a watchdog when the test process ends without
//! dropping them (a shared control plane lives in a `static`, which is never dropped).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};

/// Watches the test process and, once it is gone, kills every pid listed in `$2/pids`, puts the
/// host back as it was when a real node recorded its state in `$2/host-state` (see
/// `tests/node/host-state.sh`) and, when asked to, removes the folder. Runs in a process group of its own so a Ctrl-C in the
/// terminal (sent to the foreground group) does not take it down before it has cleaned up.
const WATCHDOG: &str = r#"
parent="$1"; dir="$2"; remove="$3"; record="$4"
trap '' INT HUP
while kill -0 "$parent" 2>/dev/null; do sleep 1; done
if [ -f "$dir/pids" ]; then kill -KILL $(cat "$dir/pids") 2>/dev/null; fi
if [ -f "$dir/host-state/host-state.sh" ]; then
    sh "$dir/host-state/host-state.sh" restore "$dir/host-state"
    if [ "$(head -n 1 "$record" 2>/dev/null)" = "$dir/host-state" ]; then rm -f "$record"; fi
fi
if [ "$remove" = remove ]; then rm -rf "$dir"; fi
"#;

/// A file in a control plane's folder whose presence says the folder is removed once the test
/// process is gone.
pub(crate) const REMOVE_ON_EXIT: &str = "remove-on-exit";

/// One running child with its log file.
#[derive(Debug)]
pub struct Supervised {
    pub name: String,
    pub log: PathBuf,
    child: Child,
}

/// The processes of one control plane, in start order.
#[derive(Debug)]
pub struct Processes {
    dir: PathBuf,
    children: Vec<Supervised>,
    watchdog: Option<Child>,
}

impl Processes {
    /// Starts the watchdog for `dir` (the control plane's temporary folder). When
    /// `remove_dir_on_exit` is set the watchdog also deletes the folder after the test
    /// process has gone.
    pub fn new(dir: &Path, remove_dir_on_exit: bool) -> Result<Self> {
        if remove_dir_on_exit {
            // for the next real cluster, should this process and its watchdog die together
            // (`node::recover_abandoned_host`)
            write_file(&dir.join(REMOVE_ON_EXIT), b"", false)?;
        }
        let watchdog = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("nodewarden-e2e-watchdog")
            .arg(std::process::id().to_string())
            .arg(dir)
            .arg(if remove_dir_on_exit { "remove" } else { "keep" })
            .arg(crate::node::host_record_path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .context("starting the watchdog shell (sh)")?;
        Ok(Self {
            dir: dir.to_path_buf(),
            children: Vec::new(),
            watchdog: Some(watchdog),
        })
    }

    /// Starts `program` with `args`, stdout and stderr appended to `<dir>/<name>.log`.
    pub fn spawn(&mut self, name: &str, program: &Path, args: &[String]) -> Result<u32> {
        let log = self.dir.join(format!("{name}.log"));
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let mut command = Command::new(program);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .current_dir(&self.dir)
            .process_group(0);
        // Everything these processes talk to is on loopback; a proxy from the
        // developer's environment must not get in the way (webhook calls, etcd).
        for var in [
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "http_proxy",
            "https_proxy",
            "ALL_PROXY",
            "all_proxy",
        ] {
            command.env_remove(var);
        }
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        let mut pids = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("pids"))?;
        writeln!(pids, "{}", child.id())?;
        let pid = child.id();
        self.children.push(Supervised {
            name: name.to_string(),
            log,
            child,
        });
        Ok(pid)
    }

    /// Kills the newest child named `name` with SIGKILL, waits for it and forgets it (its pid
    /// leaves `<dir>/pids`, so the watchdog never signals a reused pid). Returns its pid.
    pub fn kill_one(&mut self, name: &str) -> Result<u32> {
        let i = self.newest(name)?;
        let c = &mut self.children[i].child;
        let pid = c.id();
        c.kill().with_context(|| format!("killing {name} ({pid})"))?;
        c.wait().with_context(|| format!("waiting for {name} ({pid})"))?;
        self.forget(i)?;
        Ok(pid)
    }

    /// Asks the newest child named `name` to stop (SIGTERM), waits for it and forgets it.
    pub fn stop_one(&mut self, name: &str) -> Result<std::process::ExitStatus> {
        let i = self.newest(name)?;
        let c = &mut self.children[i].child;
        let pid = c.id().to_string();
        let sent = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .context("running kill")?;
        if !sent.success() {
            bail!("kill -TERM {pid} ({name}) failed: {sent}");
        }
        let status = c.wait().with_context(|| format!("waiting for {name} ({pid})"))?;
        self.forget(i)?;
        Ok(status)
    }

    fn newest(&self, name: &str) -> Result<usize> {
        match self.children.iter().rposition(|c| c.name == name) {
            Some(i) => Ok(i),
            None => bail!("no running process named {name}"),
        }
    }

    /// Drops child `i`, which has exited, from the list and from `<dir>/pids`.
    fn forget(&mut self, i: usize) -> Result<()> {
        self.children.remove(i);
        let pids: String = self
            .children
            .iter()
            .map(|c| format!("{}\n", c.child.id()))
            .collect();
        write_file(&self.dir.join("pids"), pids.as_bytes(), false)
    }

    /// The children's names and process ids, in start order.
    pub fn pids(&self) -> Vec<(String, u32)> {
        self.children
            .iter()
            .map(|c| (c.name.clone(), c.child.id()))
            .collect()
    }

    /// Fails when a child has exited: a control plane process never should.
    pub fn check_running(&mut self) -> Result<()> {
        for c in &mut self.children {
            if let Some(status) = c.child.try_wait()? {
                bail!("{} exited ({status}); see {}", c.name, c.log.display());
            }
        }
        Ok(())
    }

    /// The last `lines` lines of every child's log, headed by its name.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for c in &self.children {
            out.push_str(&format!("----- {} ({}) -----\n", c.name, c.log.display()));
            out.push_str(&tail(&c.log, lines));
            out.push('\n');
        }
        out
    }

    /// Kills the children, newest first, and waits for them; the watchdog and the host's
    /// recorded state stay (a start tried again).
    pub fn kill_children(&mut self) {
        for c in self.children.iter_mut().rev() {
            let _ = c.child.kill();
            let _ = c.child.wait();
        }
        self.children.clear();
    }

    /// Kills the children, newest first, and waits for them; then, when a real node recorded
    /// the host's state in `<dir>/host-state`, puts the host back as it was.
    pub fn kill_all(&mut self) {
        self.kill_children();
        crate::node::restore_host_state(&self.dir);
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// Runs one of the repo's cached-build scripts (`tests/<script>`, e.g. `promtool/build.sh`), which
/// build on first use and print their output folder as the last line of stdout, and returns that
/// folder once it holds every file of `holds`. The script's progress goes to stderr, kept for the
/// error when it fails.
pub fn cached_build(script: &str, holds: &[&str]) -> Result<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(script);
    let out = Command::new("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{} failed ({}):\n{}",
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let dir = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
    for file in holds {
        if dir.as_os_str().is_empty() || !dir.join(file).is_file() {
            bail!(
                "{} printed {:?}, which holds no {file}",
                script.display(),
                dir.display().to_string()
            );
        }
    }
    Ok(dir)
}

/// The last `lines` lines of a text file (reads at most the last 256 KiB).
pub fn tail(path: &Path, lines: usize) -> String {
    let Ok(mut f) = File::open(path) else {
        return format!("(no log at {})\n", path.display());
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(256 * 1024);
    let mut buf = Vec::new();
    if f.seek(SeekFrom::Start(start)).is_err() || f.read_to_end(&mut buf).is_err() {
        return format!("(could not read {})\n", path.display());
    }
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    let from = all.len().saturating_sub(lines);
    let mut out = all[from..].join("\n");
    out.push('\n');
    out
}

/// A TCP port that was free a moment ago, for a process about to listen on it: chosen below the
/// kernel's ephemeral range (`nodewarden_runtime::testing::free_port`, which says why).
pub fn free_port() -> Result<u16> {
    nodewarden_runtime::testing::free_port().context("no free TCP port below the ephemeral range")
}

/// The first global IPv4 address of this host: the API server reaches webhooks behind a
/// Service at their endpoints' addresses, which may not be loopback.
pub fn host_address() -> Result<String> {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .context("running ip -4 addr")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            let mut words = l.split_whitespace();
            words.find(|w| *w == "inet")?;
            words.next()?.split('/').next().map(str::to_string)
        })
        .ok_or_else(|| {
            anyhow!("this host has no global IPv4 address for an EndpointSlice (loopback is refused)")
        })
}

/// `n` distinct ports of [`free_port`].
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    nodewarden_runtime::testing::free_ports(n).with_context(|| format!("no {n} distinct free TCP ports"))
}

/// Writes `contents` to `path` with mode 0600 (keys) or 0644.
pub fn write_file(path: &Path, contents: &[u8], private: bool) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(if private { 0o600 } else { 0o644 })
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(contents)?;
    Ok(())
}

/// Sleeps between polls.
pub async fn pause() {
    tokio::time::sleep(Duration::from_millis(250)).await;
}
