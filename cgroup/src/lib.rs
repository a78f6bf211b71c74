//! Finding and reading container cgroups, cgroup v2 (here) or v1 ([`v1`]); which one is
//! decided once at start ([`Hierarchy::detect`]).
//!
//! Layouts recognised (any prefix before the `kubepods` part, so
//! `kubelet.slice/kubelet-kubepods.slice/…`, rootless k3s's `user.slice/…/k3s-rootless.service/kubepods/…`
//! and a k3s-in-Docker node seen from its host, `system.slice/docker-<node>.scope/kubepods/…`, work too):
//!
//! - systemd driver: `…kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid with _>.slice/<scope>`,
//!   Guaranteed pods without the QoS level: `…kubepods.slice/kubepods-pod<uid_>.slice/<scope>`;
//!   scopes `cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope`
//!   (`crio-conmon-<id>.scope` is CRI-O's monitor, not a container, and is skipped);
//! - cgroupfs driver: `…kubepods/<qos>/pod<uid>/<id>` and `…kubepods/pod<uid>/<id>`
//!   (CRI-O: `crio-<id>`, its monitor `crio-conmon-<id>` skipped).
//!
//! Every container cgroup of a pod is returned, the sandbox (pause) container included; the
//! join with the pod's `containerStatuses` keeps only real containers. A wanted container
//! that cannot be mapped is explained by [`Survey::diagnose`] ([`Locator::unmapped`]) when the
//! tree is in a form the agent does not know.
//!
//! A crate of its own (`nodewarden-cgroup`, re-exported by the agent as `nodewarden_agent::cgroup`)
//! on the standard library alone, so its tests build in seconds for another architecture: `cargo
//! xtask ci` runs them for aarch64 under qemu-user.

#![warn(missing_docs)]

mod survey;
pub mod v1;

pub use survey::{KNOWN_FORMS, PodCgroup, Survey, Unmapped, survey};

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Why the cgroup root is not usable or a cgroup file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// The cgroup root cannot be read.
    #[error(
        "cgroup root {path} cannot be read: {source} (mount the host's /sys/fs/cgroup there, read-only, \
         or point --cgroup-root / NODEWARDEN_CGROUP_ROOT at it)"
    )]
    RootUnreadable {
        /// The cgroup root.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// `v2` was asked for, but the root is not the unified hierarchy.
    #[error(
        "cgroup root {path} is not a cgroup v2 hierarchy: {why}; --cgroup-version v2 needs the \
         unified hierarchy, with cgroup.controllers at its root (`auto` also accepts cgroup v1)"
    )]
    NotV2 {
        /// The cgroup root.
        path: PathBuf,
        /// What is missing.
        why: String,
    },
    /// `v1` was asked for, but no usable v1 hierarchies are mounted below the root.
    #[error(
        "cgroup root {path} holds no usable cgroup v1 hierarchies: {why} (a v1 node has the memory \
         and cpuacct hierarchies mounted below it, e.g. memory/ and cpu,cpuacct/)"
    )]
    NotV1 {
        /// The cgroup root.
        path: PathBuf,
        /// What is missing.
        why: String,
    },
    /// `auto` found neither a v2 nor a v1 hierarchy at the root.
    #[error(
        "cgroup root {path} is neither cgroup v2 (no cgroup.controllers) nor cgroup v1 ({why}); \
         mount the host's /sys/fs/cgroup there, read-only, or point --cgroup-root / \
         NODEWARDEN_CGROUP_ROOT at it"
    )]
    Neither {
        /// The cgroup root.
        path: PathBuf,
        /// Why it is not v1.
        why: String,
    },
    /// A cgroup file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// A cgroup file does not hold what was expected.
    #[error("{path}: {what} (expected {expected})")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What was found.
        what: String,
        /// What was expected.
        expected: &'static str,
    },
}

/// Container runtime, from the cgroup name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Runtime {
    /// `cri-containerd-<id>.scope`.
    Containerd,
    /// `crio-<id>.scope` or `crio-<id>`.
    CriO,
    /// `docker-<id>.scope`.
    Docker,
    /// cgroupfs driver: a bare 64-hex directory.
    Unknown,
}

/// One container cgroup found under the root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerCgroup {
    /// Pod UID with dashes, as in `metadata.uid` (or the static pod hash).
    pub pod_uid: String,
    /// Container ID without the runtime prefix.
    pub container_id: String,
    /// Container runtime, from the cgroup's name.
    pub runtime: Runtime,
    /// The container's cgroup directory (in v1, below the memory hierarchy).
    pub path: PathBuf,
}

/// CPU throttling counters of a container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Throttling {
    /// Periods in which the container was throttled (`nr_throttled`).
    pub periods: u64,
    /// Time throttled: v2 `throttled_usec`, v1 `throttled_time` / 1000.
    pub time_usec: u64,
}

/// One reading of a container's cgroup files (v2 names; v1 fills the same fields).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    /// `cpu.stat` `usage_usec` (v1: `cpuacct.usage` / 1000).
    pub cpu_usage_usec: u64,
    /// `memory.current` (v1: `memory.usage_in_bytes`).
    pub memory_current: u64,
    /// `memory.stat` `inactive_file` (v1: `total_inactive_file`).
    pub inactive_file: u64,
    /// `memory.events` `oom_kill` (v1: `memory.oom_control` `oom_kill`, 0 before kernel 4.13).
    pub oom_kill: u64,
    /// Throttling, where the cpu controller reports it.
    pub throttled: Option<Throttling>,
}

impl Reading {
    /// Working set as kubelet computes it: current − inactive_file, never below zero.
    pub fn working_set(&self) -> u64 {
        self.memory_current.saturating_sub(self.inactive_file)
    }
}

/// Which cgroup version to use: `auto` detects it at start (the agent's `--cgroup-version`, with
/// the feature `clap`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Version {
    /// Whichever the root holds, v2 first.
    #[default]
    Auto,
    /// cgroup v1 only.
    V1,
    /// cgroup v2 only.
    V2,
}

/// The node's cgroup hierarchy, as detected at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hierarchy {
    /// The unified hierarchy at this root.
    V2 {
        /// The root of the unified hierarchy.
        root: PathBuf,
    },
    /// Per-controller hierarchies.
    V1(v1::Mounts),
}

/// A bare path is a cgroup v2 root (what the sampler took before v1 was supported).
impl From<PathBuf> for Hierarchy {
    fn from(root: PathBuf) -> Self {
        Hierarchy::V2 { root }
    }
}

impl fmt::Display for Hierarchy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Hierarchy::V2 { root } => write!(f, "cgroup v2 at {}", root.display()),
            Hierarchy::V1(m) => m.fmt(f),
        }
    }
}

impl Hierarchy {
    /// Detects the hierarchy at `root` with this process's mount table: v2 when
    /// `cgroup.controllers` is there, else v1 when a `memory` hierarchy is mounted below it.
    pub fn detect(root: &Path, version: Version) -> Result<Hierarchy, CgroupError> {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok();
        Self::detect_with(root, version, mountinfo.as_deref())
    }

    /// [`Hierarchy::detect`] with the mount table given (`None`: use the folders only).
    pub fn detect_with(
        root: &Path,
        version: Version,
        mountinfo: Option<&str>,
    ) -> Result<Hierarchy, CgroupError> {
        let as_v1 = || -> Result<Hierarchy, CgroupError> {
            match v1::find(root, mountinfo) {
                Ok(Some(m)) => Ok(Hierarchy::V1(m)),
                Ok(None) => Err(CgroupError::NotV1 {
                    path: root.to_path_buf(),
                    why: "no memory hierarchy is mounted there".to_string(),
                }),
                Err(why) => Err(CgroupError::NotV1 {
                    path: root.to_path_buf(),
                    why,
                }),
            }
        };
        match version {
            Version::V2 => check_root(root).map(|()| Hierarchy::V2 {
                root: root.to_path_buf(),
            }),
            Version::V1 => {
                fs::read_dir(root).map_err(|source| CgroupError::RootUnreadable {
                    path: root.to_path_buf(),
                    source,
                })?;
                as_v1()
            }
            Version::Auto => match check_root(root) {
                Ok(()) => Ok(Hierarchy::V2 {
                    root: root.to_path_buf(),
                }),
                Err(CgroupError::NotV2 { .. }) => as_v1().map_err(|e| match e {
                    CgroupError::NotV1 { path, why } => CgroupError::Neither { path, why },
                    other => other,
                }),
                Err(other) => Err(other),
            },
        }
    }

    /// Where container cgroups are looked for (v1: the memory hierarchy).
    pub fn walk_root(&self) -> &Path {
        match self {
            Hierarchy::V2 { root } => root,
            Hierarchy::V1(m) => m.walk_root(),
        }
    }

    /// Reads the container cgroup `dir` found below [`Hierarchy::walk_root`].
    pub fn read(&self, dir: &Path) -> Result<Reading, CgroupError> {
        match self {
            Hierarchy::V2 { .. } => read(dir),
            Hierarchy::V1(m) => m.read(dir),
        }
    }
}

/// Checks that `root` is a readable cgroup v2 hierarchy.
pub fn check_root(root: &Path) -> Result<(), CgroupError> {
    let entries = fs::read_dir(root).map_err(|source| CgroupError::RootUnreadable {
        path: root.to_path_buf(),
        source,
    })?;
    let names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    if names.iter().any(|n| n == "cgroup.controllers") {
        return Ok(());
    }
    let v1: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|n| {
            matches!(
                *n,
                "cpu" | "cpuacct" | "cpu,cpuacct" | "memory" | "pids" | "blkio" | "systemd"
            )
        })
        .collect();
    let why = if v1.is_empty() {
        "there is no cgroup.controllers file".to_string()
    } else {
        format!(
            "it looks like cgroup v1 (found per-controller directories {})",
            v1.join(", ")
        )
    };
    Err(CgroupError::NotV2 {
        path: root.to_path_buf(),
        why,
    })
}

/// Finds every container cgroup below `root` ([`survey`] keeps what else the walk saw).
/// Directories that cannot be listed are skipped (a pod may go away while we walk).
pub fn discover(root: &Path) -> Vec<ContainerCgroup> {
    survey(root).containers
}

fn is_uid_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

/// The pod UID of a pod cgroup directory name, with `_` turned back into `-`.
pub fn pod_uid_of(name: &str) -> Option<String> {
    let raw = if let Some(stem) = name.strip_suffix(".slice") {
        // systemd: <prefix>kubepods[-<qos>]-pod<uid_>.slice
        let (prefix, uid) = stem.rsplit_once("-pod")?;
        if !prefix.ends_with("kubepods")
            && !prefix.ends_with("-burstable")
            && !prefix.ends_with("-besteffort")
        {
            return None;
        }
        uid
    } else {
        // cgroupfs: pod<uid>
        name.strip_prefix("pod")?
    };
    if raw.len() < 8 || !raw.chars().all(is_uid_char) {
        return None;
    }
    Some(raw.replace('_', "-"))
}

fn is_container_id(s: &str) -> bool {
    s.len() >= 12 && s.len() <= 128 && s.chars().all(|c| c.is_ascii_hexdigit())
}

/// The runtime and container ID of a container cgroup directory name.
pub fn container_of(name: &str) -> Option<(Runtime, String)> {
    let (runtime, id) = if let Some(rest) = name.strip_suffix(".scope") {
        if rest.starts_with("crio-conmon-") {
            return None;
        }
        if let Some(id) = rest.strip_prefix("cri-containerd-") {
            (Runtime::Containerd, id)
        } else if let Some(id) = rest.strip_prefix("crio-") {
            (Runtime::CriO, id)
        } else if let Some(id) = rest.strip_prefix("docker-") {
            (Runtime::Docker, id)
        } else {
            return None;
        }
    } else if name.starts_with("crio-conmon-") {
        return None;
    } else if let Some(id) = name.strip_prefix("crio-") {
        (Runtime::CriO, id)
    } else {
        (Runtime::Unknown, name)
    };
    is_container_id(id).then(|| (runtime, id.to_string()))
}

/// Reads the four files the agent needs from one cgroup v2 container cgroup.
pub fn read(dir: &Path) -> Result<Reading, CgroupError> {
    let cpu_stat_path = dir.join("cpu.stat");
    let cpu_stat = read_file(&cpu_stat_path)?;
    let memory_current_path = dir.join("memory.current");
    let memory_current = read_file(&memory_current_path)?;
    let memory_stat = read_file(&dir.join("memory.stat"))?;
    let memory_events = read_file(&dir.join("memory.events"))?;
    // the throttling keys are there only when the cpu controller is enabled for the cgroup
    let periods = optional_keyed_value(&cpu_stat_path, &cpu_stat, "nr_throttled")?;
    let time_usec = optional_keyed_value(&cpu_stat_path, &cpu_stat, "throttled_usec")?;
    Ok(Reading {
        cpu_usage_usec: keyed_value(&cpu_stat_path, &cpu_stat, "usage_usec")?,
        memory_current: single_value(&memory_current_path, &memory_current)?,
        inactive_file: keyed_value(&dir.join("memory.stat"), &memory_stat, "inactive_file")?,
        oom_kill: keyed_value(&dir.join("memory.events"), &memory_events, "oom_kill")?,
        throttled: periods
            .zip(time_usec)
            .map(|(periods, time_usec)| Throttling { periods, time_usec }),
    })
}

fn read_file(path: &Path) -> Result<String, CgroupError> {
    fs::read_to_string(path).map_err(|source| CgroupError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// The value of `key` in a flat-keyed file (`key value` per line), as the kernel writes
/// `cpu.stat`, `memory.stat` and `memory.events` (v1: also `memory.oom_control`).
pub fn keyed_value(path: &Path, text: &str, key: &str) -> Result<u64, CgroupError> {
    optional_keyed_value(path, text, key)?.ok_or_else(|| CgroupError::Parse {
        path: path.to_path_buf(),
        what: format!("no {key} line"),
        expected: "a line `<key> <value>` as the kernel writes it",
    })
}

/// [`keyed_value`] for a key that may be absent (`None`); a malformed value is an error.
pub fn optional_keyed_value(path: &Path, text: &str, key: &str) -> Result<Option<u64>, CgroupError> {
    for line in text.lines() {
        let mut parts = line.split_ascii_whitespace();
        if parts.next() == Some(key) {
            let value = parts.next().unwrap_or("");
            return value.parse().map(Some).map_err(|_| CgroupError::Parse {
                path: path.to_path_buf(),
                what: format!("{key} has value {value:?}"),
                expected: "a non-negative integer",
            });
        }
    }
    Ok(None)
}

/// A single-value file such as `memory.current`.
pub fn single_value(path: &Path, text: &str) -> Result<u64, CgroupError> {
    let t = text.trim();
    t.parse().map_err(|_| CgroupError::Parse {
        path: path.to_path_buf(),
        what: format!("content {t:?}"),
        expected: "a non-negative integer",
    })
}

/// After a walk, containers still missing cause another walk only after this many calls
/// (a crash-looping container keeps its last ID in the status while its cgroup is gone).
const MISSING_RETRY_CALLS: u32 = 6;

/// Where each known container's cgroup is, refreshed by walking the tree only when a wanted
/// container is new, or its directory went away; containers the last walk did not find are
/// looked for again every [`MISSING_RETRY_CALLS`] calls.
#[derive(Debug)]
pub struct Locator {
    root: PathBuf,
    by_id: HashMap<String, ContainerCgroup>,
    /// Wanted container IDs the last walk did not find.
    not_found: HashSet<String>,
    /// Why wanted containers the last walk did not map cannot be mapped, one per problem.
    unmapped: Vec<Unmapped>,
    calls_since_walk: u32,
    /// How many full walks were made (for tests and metrics).
    pub walks: u64,
}

impl Locator {
    /// A locator below `root`, nothing found yet.
    pub fn new(root: PathBuf) -> Self {
        Locator {
            root,
            by_id: HashMap::new(),
            not_found: HashSet::new(),
            unmapped: Vec::new(),
            calls_since_walk: 0,
            walks: 0,
        }
    }

    /// The directory searched.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Why wanted containers that the last walk did not map cannot be mapped, where the tree
    /// says so (one entry per [`Unmapped::key`]); kept until the next walk.
    pub fn unmapped(&self) -> &[Unmapped] {
        &self.unmapped
    }

    /// The cgroups of `wanted` (pod UID, container ID) pairs that exist.
    pub fn locate<'a>(
        &mut self,
        wanted: impl Iterator<Item = (&'a str, &'a str)> + Clone,
    ) -> HashMap<String, PathBuf> {
        self.calls_since_walk = self.calls_since_walk.saturating_add(1);
        let retry_missing = self.calls_since_walk >= MISSING_RETRY_CALLS;
        let walk = wanted.clone().any(|(uid, id)| match self.by_id.get(id) {
            Some(c) => c.pod_uid != uid || !c.path.is_dir(),
            None => retry_missing || !self.not_found.contains(id),
        });
        if walk {
            self.walks += 1;
            self.calls_since_walk = 0;
            let survey = survey(&self.root);
            self.by_id = survey
                .containers
                .iter()
                .map(|c| (c.container_id.clone(), c.clone()))
                .collect();
            self.not_found = wanted
                .clone()
                .filter(|(_, id)| !self.by_id.contains_key(*id))
                .map(|(_, id)| id.to_string())
                .collect();
            let mut keys = HashSet::new();
            self.unmapped = wanted
                .clone()
                .filter(|(uid, id)| self.by_id.get(*id).is_none_or(|c| c.pod_uid != *uid))
                .filter_map(|(uid, id)| survey.diagnose(uid, id))
                .filter(|u| keys.insert(u.key()))
                .collect();
        }
        wanted
            .filter_map(|(uid, id)| {
                self.by_id
                    .get(id)
                    .filter(|c| c.pod_uid == uid)
                    .map(|c| (id.to_string(), c.path.clone()))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_directory_names() {
        let cases: &[(&str, Option<&str>)] = &[
            (
                "kubepods-burstable-pod1b2c3d4e_5f60_7182_93a4_b5c6d7e8f901.slice",
                Some("1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901"),
            ),
            (
                "kubepods-besteffort-pod1b2c3d4e_5f60_7182_93a4_b5c6d7e8f901.slice",
                Some("1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901"),
            ),
            (
                "kubepods-pod1b2c3d4e_5f60_7182_93a4_b5c6d7e8f901.slice",
                Some("1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901"),
            ),
            (
                "kubelet-kubepods-burstable-pod1b2c3d4e_5f60_7182_93a4_b5c6d7e8f901.slice",
                Some("1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901"),
            ),
            (
                "pod1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901",
                Some("1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901"),
            ),
            // static pod: the config hash
            (
                "pod6f1c0b0a8e2d4c3b9a7f5e4d3c2b1a09",
                Some("6f1c0b0a8e2d4c3b9a7f5e4d3c2b1a09"),
            ),
            ("kubepods-burstable.slice", None),
            ("kubepods.slice", None),
            ("system.slice", None),
            ("podman-1234.slice", None),
            ("pod", None),
        ];
        for (name, want) in cases {
            assert_eq!(pod_uid_of(name).as_deref(), *want, "{name}");
        }
    }

    #[test]
    fn container_directory_names() {
        let id = "4f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8";
        let cases: Vec<(String, Option<(Runtime, &str)>)> = vec![
            (
                format!("cri-containerd-{id}.scope"),
                Some((Runtime::Containerd, id)),
            ),
            (format!("crio-{id}.scope"), Some((Runtime::CriO, id))),
            (format!("crio-conmon-{id}.scope"), None),
            (format!("docker-{id}.scope"), Some((Runtime::Docker, id))),
            (id.to_string(), Some((Runtime::Unknown, id))),
            (format!("crio-{id}"), Some((Runtime::CriO, id))),
            (format!("crio-conmon-{id}"), None),
            ("container".to_string(), None),
            ("init.scope".to_string(), None),
            ("cri-containerd-xyz.scope".to_string(), None),
        ];
        for (name, want) in cases {
            assert_eq!(
                container_of(&name),
                want.map(|(r, i)| (r, i.to_string())),
                "{name}"
            );
        }
    }

    #[test]
    fn flat_keyed_files_as_the_kernel_writes_them() {
        let p = Path::new("cpu.stat");
        let cpu = "usage_usec 123456\nuser_usec 100000\nsystem_usec 23456\nnr_periods 0\n";
        assert_eq!(keyed_value(p, cpu, "usage_usec").unwrap(), 123456);
        let err = keyed_value(p, "user_usec 1\n", "usage_usec")
            .unwrap_err()
            .to_string();
        assert!(err.contains("no usage_usec line"), "{err}");
        let err = keyed_value(p, "usage_usec lots\n", "usage_usec")
            .unwrap_err()
            .to_string();
        assert!(err.contains("non-negative integer"), "{err}");
        assert_eq!(single_value(Path::new("memory.current"), "4096\n").unwrap(), 4096);
        assert!(single_value(Path::new("memory.current"), "max\n").is_err());
    }

    #[test]
    fn the_tree_is_walked_only_for_new_or_vanished_containers() {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path();
        fs::write(root.join("cgroup.controllers"), "cpu memory\n").expect("write");
        let pod = root.join("kubepods/burstable/pod11111111-2222-3333-4444-555555555555");
        let a = "a".repeat(64);
        let b = "b".repeat(64);
        fs::create_dir_all(pod.join(&a)).expect("mkdir");
        let uid = "11111111-2222-3333-4444-555555555555";
        let mut l = Locator::new(root.to_path_buf());
        let found = l.locate([(uid, a.as_str())].into_iter());
        assert_eq!(found.len(), 1);
        assert_eq!(l.walks, 1);
        // known and still there: no walk
        l.locate([(uid, a.as_str())].into_iter());
        assert_eq!(l.walks, 1);
        // b is new: one walk; still missing afterwards: no walk on every call…
        let both = [(uid, a.as_str()), (uid, b.as_str())];
        assert_eq!(l.locate(both.into_iter()).len(), 1);
        assert_eq!(l.walks, 2);
        for _ in 0..(MISSING_RETRY_CALLS - 1) {
            l.locate(both.into_iter());
        }
        assert_eq!(l.walks, 2);
        // …but again after a few calls, and then it is found
        fs::create_dir_all(pod.join(&b)).expect("mkdir");
        assert_eq!(l.locate(both.into_iter()).len(), 2);
        assert_eq!(l.walks, 3);
        // a's cgroup goes away: walk at once
        fs::remove_dir(pod.join(&a)).expect("rmdir");
        assert_eq!(l.locate(both.into_iter()).len(), 1);
        assert_eq!(l.walks, 4);
    }

    #[test]
    fn working_set_never_goes_below_zero() {
        let r = Reading {
            cpu_usage_usec: 0,
            memory_current: 100,
            inactive_file: 150,
            oom_kill: 0,
            throttled: None,
        };
        assert_eq!(r.working_set(), 0);
        let r = Reading {
            inactive_file: 30,
            ..r
        };
        assert_eq!(r.working_set(), 70);
    }
}
