//! cgroup v1: one hierarchy per controller (or per group of co-mounted controllers).
//!
//! The kubelet creates a container's cgroup at the same relative path in every hierarchy
//! (`…kubepods/<qos>/pod<uid>/<id>` with the cgroupfs driver, the systemd slices with the systemd
//! driver), so containers are found by walking the `memory` hierarchy and read at the same
//! relative path under `cpuacct` (usage) and `cpu` (throttling):
//!
//! - `cpuacct.usage`: CPU time used, nanoseconds;
//! - `cpu.stat`: `nr_throttled`, `throttled_time` (nanoseconds);
//! - `memory.usage_in_bytes`, and `total_inactive_file` in `memory.stat`: the working set is
//!   usage − total_inactive_file, never below 0;
//! - `memory.oom_control`: `oom_kill` (kernel ≥ 4.13; older kernels have no such line, and
//!   OOM kills then come from the pod status only).
//!
//! Where the hierarchies are is found from the mount table (`/proc/self/mountinfo`: mounts of
//! type `cgroup` below the configured root, their controllers in the super options), or, when
//! the table lists none there (a copy of the tree, a test fixture), from the folder names below
//! the root (`memory`, `cpuacct`, `cpu,cpuacct`, …) that hold the controller's files.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use super::{CgroupError, Reading, Throttling, keyed_value, optional_keyed_value, read_file, single_value};

/// Where the v1 hierarchies the agent reads are mounted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mounts {
    /// The `memory` hierarchy: containers are found here.
    pub memory: PathBuf,
    /// The `cpuacct` hierarchy (often co-mounted with `cpu`).
    pub cpuacct: PathBuf,
    /// The `cpu` hierarchy, for throttling; without it there are no throttling figures.
    pub cpu: Option<PathBuf>,
}

impl fmt::Display for Mounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cgroup v1 (memory at {}, cpuacct at {}",
            self.memory.display(),
            self.cpuacct.display()
        )?;
        match &self.cpu {
            Some(cpu) => write!(f, ", cpu at {})", cpu.display()),
            None => write!(f, ", no cpu hierarchy: no throttling figures)"),
        }
    }
}

/// One `cgroup` (v1) mount from the mount table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    /// Where the hierarchy is mounted.
    pub mount_point: PathBuf,
    /// The super options: the controllers (`cpu`, `cpuacct`, `memory`, `name=systemd`, …)
    /// besides `rw`/`ro` and the like.
    pub options: Vec<String>,
}

impl MountEntry {
    fn has(&self, controller: &str) -> bool {
        self.options.iter().any(|o| o == controller)
    }
}

/// Undoes the octal escapes (`\040` for a space, …) of a mountinfo path.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = (u32::from(b[i + 1] - b'0') << 6)
                | (u32::from(b[i + 2] - b'0') << 3)
                | u32::from(b[i + 3] - b'0');
            if let Ok(byte) = u8::try_from(v) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The `cgroup` (v1) mounts of a mountinfo text
/// (`id parent major:minor root mount-point options [optional…] - type source super-options`).
/// Lines that do not have that shape are ignored.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    let mut out = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if sep < 6 || fields.len() < sep + 4 || fields[sep + 1] != "cgroup" {
            continue;
        }
        out.push(MountEntry {
            mount_point: PathBuf::from(unescape(fields[4])),
            options: fields[sep + 3].split(',').map(str::to_string).collect(),
        });
    }
    out
}

/// The hierarchies mounted at or below `root`, from the mount table. `None` when the table
/// lists no `memory` hierarchy there.
pub fn from_mountinfo(root: &Path, mountinfo: &str) -> Result<Option<Mounts>, String> {
    let below: Vec<MountEntry> = parse_mountinfo(mountinfo)
        .into_iter()
        .filter(|m| m.mount_point.starts_with(root))
        .collect();
    let pick = |c: &str| below.iter().find(|m| m.has(c)).map(|m| m.mount_point.clone());
    let Some(memory) = pick("memory") else {
        return Ok(None);
    };
    let Some(cpuacct) = pick("cpuacct") else {
        return Err(format!(
            "the mount table has a memory hierarchy at {} but no cpuacct hierarchy below {}",
            memory.display(),
            root.display()
        ));
    };
    Ok(Some(Mounts {
        memory,
        cpuacct,
        cpu: pick("cpu"),
    }))
}

/// The hierarchies as folders right below `root`: a folder whose name, split at commas, names
/// the controller (`memory`, `cpu,cpuacct`, …) and that holds the controller's own file.
/// `None` when there is no `memory` folder.
pub fn from_folders(root: &Path) -> Result<Option<Mounts>, String> {
    let Ok(entries) = fs::read_dir(root) else {
        return Ok(None);
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let pick = |c: &str, marker: &str| {
        names
            .iter()
            .filter(|n| n.split(',').any(|p| p == c))
            .map(|n| root.join(n))
            .find(|p| p.join(marker).is_file())
    };
    let Some(memory) = pick("memory", "memory.usage_in_bytes") else {
        return Ok(None);
    };
    let Some(cpuacct) = pick("cpuacct", "cpuacct.usage") else {
        return Err(format!(
            "{} holds a memory hierarchy but no cpuacct hierarchy (a folder such as cpuacct or \
             cpu,cpuacct with cpuacct.usage)",
            root.display()
        ));
    };
    Ok(Some(Mounts {
        memory,
        cpuacct,
        cpu: pick("cpu", "cpu.stat"),
    }))
}

/// The v1 hierarchies below `root`: from the mount table if it lists any there, else from the
/// folders. `Ok(None)`: no memory hierarchy at all; `Err`: one that cannot be used, and why.
pub fn find(root: &Path, mountinfo: Option<&str>) -> Result<Option<Mounts>, String> {
    if let Some(text) = mountinfo
        && let Some(m) = from_mountinfo(root, text)?
    {
        return Ok(Some(m));
    }
    from_folders(root)
}

impl Mounts {
    /// Where the container cgroups are looked for.
    pub fn walk_root(&self) -> &Path {
        &self.memory
    }

    /// Reads one container whose cgroup `dir` was found under the memory hierarchy.
    pub fn read(&self, dir: &Path) -> Result<Reading, CgroupError> {
        let rel = dir.strip_prefix(&self.memory).map_err(|_| CgroupError::Parse {
            path: dir.to_path_buf(),
            what: format!("not below the memory hierarchy {}", self.memory.display()),
            expected: "a container cgroup found by walking the memory hierarchy",
        })?;
        let usage_path = self.cpuacct.join(rel).join("cpuacct.usage");
        let usage_ns = single_value(&usage_path, &read_file(&usage_path)?)?;
        let throttled = match &self.cpu {
            Some(cpu) => {
                let path = cpu.join(rel).join("cpu.stat");
                let text = read_file(&path)?;
                Some(Throttling {
                    periods: keyed_value(&path, &text, "nr_throttled")?,
                    time_usec: keyed_value(&path, &text, "throttled_time")? / 1000,
                })
            }
            None => None,
        };
        let usage_path = dir.join("memory.usage_in_bytes");
        let memory_usage = single_value(&usage_path, &read_file(&usage_path)?)?;
        let stat_path = dir.join("memory.stat");
        let inactive_file = keyed_value(&stat_path, &read_file(&stat_path)?, "total_inactive_file")?;
        let oom_path = dir.join("memory.oom_control");
        let oom_kill = optional_keyed_value(&oom_path, &read_file(&oom_path)?, "oom_kill")?.unwrap_or(0);
        Ok(Reading {
            cpu_usage_usec: usage_ns / 1000,
            memory_current: memory_usage,
            inactive_file,
            oom_kill,
            throttled,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_cgroup_mounts_separate_and_co_mounted() {
        let text = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
90 80 0:29 / /host/sys/fs/cgroup/cpu,cpuacct ro,relatime master:3 - cgroup cgroup rw,cpu,cpuacct
91 80 0:32 /kubepods /host/sys/fs/cgroup/memory ro,relatime - cgroup cgroup rw,memory
92 80 0:40 / /with\\040space/memory rw - cgroup cgroup rw,memory
garbage line
";
        let all = parse_mountinfo(text);
        assert_eq!(all.len(), 7);
        assert_eq!(all[6].mount_point, Path::new("/with space/memory"));
        let host = from_mountinfo(Path::new("/sys/fs/cgroup"), text)
            .expect("usable")
            .expect("found");
        assert_eq!(
            host,
            Mounts {
                memory: "/sys/fs/cgroup/memory".into(),
                cpuacct: "/sys/fs/cgroup/cpuacct".into(),
                cpu: Some("/sys/fs/cgroup/cpu".into()),
            }
        );
        let container = from_mountinfo(Path::new("/host/sys/fs/cgroup"), text)
            .expect("usable")
            .expect("found");
        assert_eq!(container.cpuacct, Path::new("/host/sys/fs/cgroup/cpu,cpuacct"));
        assert_eq!(container.cpu, Some("/host/sys/fs/cgroup/cpu,cpuacct".into()));
        // nothing below an unrelated root; a memory hierarchy without cpuacct is an error
        assert_eq!(from_mountinfo(Path::new("/elsewhere"), text), Ok(None));
        let err = from_mountinfo(Path::new("/with space"), text).expect_err("no cpuacct");
        assert!(err.contains("no cpuacct"), "{err}");
    }

    #[test]
    fn escapes_in_mount_points() {
        assert_eq!(unescape("/a\\040b"), "/a b");
        assert_eq!(unescape("/a\\134b"), "/a\\b");
        assert_eq!(unescape("/trailing\\"), "/trailing\\");
        assert_eq!(unescape("/short\\04"), "/short\\04");
        assert_eq!(unescape("/\\999"), "/\\999");
    }
}
