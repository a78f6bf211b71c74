//! The v1 reader against the real cgroup v1 hierarchy of the machine running the tests.
//!
//! Runs only as root on a cgroup v1 host (else it says so and passes): creates a
//! `…/nodewarden-v1-test-<pid>/kubepods/besteffort/pod<uid>/<id>` cgroup in the memory,
//! cpuacct and cpu hierarchies (below this process's own memory cgroup, so its memory stays
//! accounted where it was), moves a busy shell into it, finds it and reads it as the agent does,
//! then kills the shell and removes every folder it created — on every path, panics included.
//! Leftovers of an earlier run that was killed are removed first.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nodewarden_agent::cgroup::{Hierarchy, Locator, Version, v1::Mounts};

const ROOT: &str = "/sys/fs/cgroup";
const PREFIX: &str = "nodewarden-v1-test-";
const POD_UID: &str = "0a1b2c3d-0000-4000-8000-0000000000f1";

/// What the test changed on the host; undone on drop.
struct HostCgroup {
    child: Option<Child>,
    /// Every folder created, in creation order (outer before inner).
    created: Vec<PathBuf>,
}

impl HostCgroup {
    fn undo(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // cgroup folders go with rmdir only (their files are not real), innermost first, and
        // only those this test made (a shared parent may hold another run's folders)
        for dir in self.created.drain(..).rev() {
            remove_dir(&dir);
        }
    }
}

impl Drop for HostCgroup {
    fn drop(&mut self) {
        self.undo();
    }
}

/// Removes one cgroup folder (a killed task may take a moment to leave it).
fn remove_dir(dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while dir.exists() && fs::remove_dir(dir).is_err() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    if dir.exists() {
        eprintln!("could not remove {}", dir.display());
    }
}

/// Removes a cgroup folder of this test's own naming and the folders below it, innermost first.
fn remove_tree(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.filter_map(|e| e.ok()) {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                remove_tree(&e.path());
            }
        }
    }
    remove_dir(dir);
}

/// This process's cgroup path in the memory hierarchy (`/proc/self/cgroup`).
fn own_memory_cgroup() -> Option<String> {
    let text = fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let _id = parts.next()?;
        let controllers = parts.next()?;
        let path = parts.next()?;
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then(|| path.trim_start_matches('/').to_string())
    })
}

/// Leftovers of an earlier run whose process is gone.
fn sweep_leftovers(parents: &[PathBuf]) {
    for parent in parents {
        let Ok(entries) = fs::read_dir(parent) else {
            continue;
        };
        for e in entries.filter_map(|e| e.ok()) {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(pid) = name.strip_prefix(PREFIX) else {
                continue;
            };
            if !Path::new("/proc").join(pid).exists() {
                remove_tree(&e.path());
            }
        }
    }
}

fn v1_host() -> Option<Mounts> {
    let is_root = fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1).map(|euid| euid == "0"))
        .unwrap_or(false);
    if !is_root {
        eprintln!("SKIP: not root; the real cgroup v1 test needs to create cgroups");
        return None;
    }
    match Hierarchy::detect(Path::new(ROOT), Version::Auto) {
        Ok(Hierarchy::V1(m)) => Some(m),
        other => {
            eprintln!("SKIP: {ROOT} is not a usable cgroup v1 host: {other:?}");
            None
        }
    }
}

#[test]
fn reads_a_busy_process_in_a_real_v1_cgroup() {
    let Some(mounts) = v1_host() else { return };
    let own = own_memory_cgroup().unwrap_or_default();
    let mut hierarchies = vec![mounts.memory.clone(), mounts.cpuacct.clone()];
    hierarchies.extend(mounts.cpu.clone());
    hierarchies.sort();
    hierarchies.dedup();
    let parents: Vec<PathBuf> = hierarchies.iter().map(|h| h.join(&own)).collect();
    sweep_leftovers(&parents);

    let id = format!("{:064x}", (u128::from(std::process::id()) << 64) | 0xf1);
    let top = format!("{PREFIX}{}", std::process::id());
    let rel = Path::new(&own)
        .join(&top)
        .join("kubepods/besteffort")
        .join(format!("pod{POD_UID}"))
        .join(&id);
    let mut host = HostCgroup {
        child: None,
        created: Vec::new(),
    };
    for h in &hierarchies {
        // folder by folder, so that exactly the ones made here are removed
        let mut chain: Vec<&Path> = rel.ancestors().filter(|a| !a.as_os_str().is_empty()).collect();
        chain.reverse();
        for part in chain {
            let dir = h.join(part);
            match fs::create_dir(&dir) {
                Ok(()) => host.created.push(dir),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => panic!("creating {}: {e}", dir.display()),
            }
        }
    }

    // a shell that moves itself into the cgroup, then holds 8 MiB and burns CPU
    let procs: Vec<String> = hierarchies
        .iter()
        .map(|h| h.join(&rel).join("cgroup.procs").display().to_string())
        .collect();
    let script = "for f in \"$@\"; do echo $$ > \"$f\" || exit 1; done; \
                  x=$(head -c 8388608 /dev/zero | tr '\\0' a); while :; do :; done";
    host.child = Some(
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg("sh")
            .args(&procs)
            .stdin(Stdio::null())
            .spawn()
            .expect("starting the busy shell"),
    );

    // found as the agent finds containers: by walking the memory hierarchy
    let hierarchy = Hierarchy::V1(mounts.clone());
    let mut locator = Locator::new(hierarchy.walk_root().to_path_buf());
    let paths = locator.locate([(POD_UID, id.as_str())].into_iter());
    let path = paths.get(&id).expect("the test cgroup is found").clone();
    assert_eq!(path, mounts.memory.join(&rel));

    // wait until the shell is in and has built its 8 MiB string
    let deadline = Instant::now() + Duration::from_secs(20);
    let first = loop {
        let r = hierarchy.read(&path).expect("reading the real cgroup");
        if r.working_set() >= 4 << 20 && r.cpu_usage_usec > 0 {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "the busy shell never showed in the cgroup: {r:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    std::thread::sleep(Duration::from_millis(500));
    let second = hierarchy.read(&path).expect("reading the real cgroup");
    assert!(
        second.cpu_usage_usec >= first.cpu_usage_usec + 50_000,
        "a busy loop uses CPU: {first:?} then {second:?}"
    );
    assert!(second.working_set() > 0, "{second:?}");
    assert_eq!(second.oom_kill, 0, "{second:?}");
    if mounts.cpu.is_some() {
        assert!(second.throttled.is_some(), "{second:?}");
    }

    host.undo();
    for dir in hierarchies.iter().map(|h| h.join(&own).join(&top)) {
        assert!(!dir.exists(), "{} is left behind", dir.display());
    }
}
