//! One walk of the tree: the container cgroups found, and what was seen on the way, so that a
//! wanted container that cannot be mapped to a cgroup is explained ([`Survey::diagnose`]).
//!
//! The walk starts at the root and goes down every directory (any prefix before `kubepods`:
//! `kubelet.slice/…`, rootless k3s's `user.slice/…/k3s-rootless.service/…`, a k3s-in-Docker
//! node's `system.slice/docker-<node>.scope/…` or `docker/<node>/…`) until it meets a pod
//! cgroup below a `kubepods` one; a pod cgroup's own sub-cgroups are the containers.

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use super::{ContainerCgroup, container_of, pod_uid_of};

/// How deep below the root a pod cgroup may sit: a prefix of up to six levels (rootless k3s:
/// `user.slice/user-<uid>.slice/user@<uid>.service/app.slice/k3s-rootless.service`), then
/// kubepods, QoS and pod.
const MAX_POD_DEPTH: usize = 10;

/// At most this many names are kept for a diagnosis, so that its message stays one line.
const NAMES_SHOWN: usize = 8;

/// The container cgroup forms recognised, as a diagnosis names them.
pub const KNOWN_FORMS: &str =
    "cri-containerd-<id>.scope, crio-<id>.scope, docker-<id>.scope, crio-<id> or <id>";

/// A pod cgroup found by the walk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodCgroup {
    /// Its directory.
    pub path: PathBuf,
    /// Container cgroups in it (the sandbox's included).
    pub containers: usize,
    /// Its sub-cgroups in no known form (neither a container nor CRI-O's conmon), sorted.
    pub unknown: Vec<String>,
}

/// What one walk of the tree found.
#[derive(Clone, Debug, Default)]
pub struct Survey {
    /// The directory walked.
    pub root: PathBuf,
    /// Every container cgroup found in a pod cgroup, by path.
    pub containers: Vec<ContainerCgroup>,
    /// The topmost directories whose name holds `kubepods`.
    pub kubepods: Vec<PathBuf>,
    /// Pod cgroups, by pod UID.
    pub pods: HashMap<String, PodCgroup>,
    /// The root's own sub-directories (the first few, sorted).
    pub top: Vec<String>,
    /// Directories below a `kubepods` one that are not pod cgroups (the first few), relative
    /// to the root.
    pub below_kubepods: Vec<String>,
    /// Directories not taken for a pod's container whose name holds a long hex run (a
    /// container ID, perhaps): name and path.
    pub named: Vec<(String, PathBuf)>,
}

/// Why a wanted container has no cgroup the agent can read: the tree is not in a form it knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unmapped {
    /// A cgroup named after the container exists, but not in a known form inside its pod's
    /// cgroup (outside any pod cgroup, in another pod's, or in its pod's in another form).
    Elsewhere {
        /// The container.
        container_id: String,
        /// The cgroup named after it.
        path: PathBuf,
        /// The pod cgroup it sits in, when it is in its own pod's.
        pod: Option<PathBuf>,
    },
    /// The pod's cgroup holds sub-cgroups in no known form, and none for the container.
    UnknownForm {
        /// The pod.
        pod_uid: String,
        /// Its cgroup.
        pod: PathBuf,
        /// The sub-cgroups in no known form.
        children: Vec<String>,
    },
    /// `kubepods` cgroups exist but hold no pod cgroup in a known form.
    NoPodCgroups {
        /// The first `kubepods` cgroup.
        kubepods: PathBuf,
        /// What is below it.
        below: Vec<String>,
    },
    /// No cgroup whose name holds `kubepods` below the root.
    NoKubepods {
        /// The root walked.
        root: PathBuf,
        /// Its sub-directories.
        top: Vec<String>,
    },
}

impl Unmapped {
    /// One key per problem, to say it once: per container, per pod, or once for the tree.
    pub fn key(&self) -> String {
        match self {
            Unmapped::Elsewhere { container_id, .. } => format!("container/{container_id}"),
            Unmapped::UnknownForm { pod_uid, .. } => format!("pod/{pod_uid}"),
            Unmapped::NoPodCgroups { .. } => "no-pod-cgroups".to_string(),
            Unmapped::NoKubepods { .. } => "no-kubepods".to_string(),
        }
    }

    /// A short, fixed name of the kind of problem (a metric label).
    pub fn reason(&self) -> &'static str {
        match self {
            Unmapped::Elsewhere { .. } => "outside_pod",
            Unmapped::UnknownForm { .. } => "unknown_form",
            Unmapped::NoPodCgroups { .. } => "no_pod_cgroups",
            Unmapped::NoKubepods { .. } => "no_kubepods",
        }
    }

    /// The path the problem was found at.
    pub fn path(&self) -> &Path {
        match self {
            Unmapped::Elsewhere { path, .. } => path,
            Unmapped::UnknownForm { pod, .. } => pod,
            Unmapped::NoPodCgroups { kubepods, .. } => kubepods,
            Unmapped::NoKubepods { root, .. } => root,
        }
    }
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "nothing".to_string()
    } else {
        names.join(", ")
    }
}

impl fmt::Display for Unmapped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unmapped::Elsewhere {
                container_id,
                path,
                pod,
            } => {
                let place = match pod {
                    Some(pod) => format!(
                        "in its pod's cgroup {} but in a form the agent does not know",
                        pod.display()
                    ),
                    None => "outside its pod's cgroup".to_string(),
                };
                write!(
                    f,
                    "the cgroup of container {container_id} is {}, {place}; a container is read only as a \
                     sub-cgroup of its pod's cgroup named {KNOWN_FORMS} (do the kubelet and the runtime use \
                     the same cgroup driver?)",
                    path.display()
                )
            }
            Unmapped::UnknownForm {
                pod_uid,
                pod,
                children,
            } => write!(
                f,
                "pod {pod_uid}'s cgroup {} holds no container cgroup in a known form ({KNOWN_FORMS}); it \
                 holds {}",
                pod.display(),
                list(children)
            ),
            Unmapped::NoPodCgroups { kubepods, below } => write!(
                f,
                "{} holds no pod cgroup in a known form (cgroupfs pod<uid>, systemd \
                 kubepods[-<qos>]-pod<uid with _>.slice); below it: {}",
                kubepods.display(),
                list(below)
            ),
            Unmapped::NoKubepods { root, top } => write!(
                f,
                "no kubepods cgroup below {} (cgroupfs …/kubepods/…, systemd …/kubepods.slice/…); it \
                 holds {}; is --cgroup-root the node's cgroup hierarchy?",
                root.display(),
                list(top)
            ),
        }
    }
}

/// Walks the tree below `root`. Directories that cannot be listed are skipped (a pod may go
/// away while we walk).
pub fn survey(root: &Path) -> Survey {
    let mut s = Survey {
        root: root.to_path_buf(),
        ..Survey::default()
    };
    let mut top: Vec<String> = subdirs(root).into_iter().map(|(n, _)| n).collect();
    top.sort();
    top.truncate(NAMES_SHOWN);
    s.top = top;
    walk(root, 0, false, &mut s);
    s.containers.sort_by(|a, b| a.path.cmp(&b.path));
    s.kubepods.sort();
    s
}

fn subdirs(dir: &Path) -> Vec<(String, PathBuf)> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
        .collect()
}

/// Whether `name` holds a run of at least 32 hex digits (container IDs have 64).
fn has_long_hex_run(name: &str) -> bool {
    let mut run = 0;
    for c in name.chars() {
        run = if c.is_ascii_hexdigit() { run + 1 } else { 0 };
        if run >= 32 {
            return true;
        }
    }
    false
}

fn is_conmon(name: &str) -> bool {
    name.starts_with("crio-conmon-")
}

fn walk(dir: &Path, depth: usize, under_kubepods: bool, s: &mut Survey) {
    if depth > MAX_POD_DEPTH {
        return;
    }
    for (name, path) in subdirs(dir) {
        let kubepods = under_kubepods || name.contains("kubepods");
        if kubepods && !under_kubepods {
            s.kubepods.push(path.clone());
        }
        if kubepods && let Some(uid) = pod_uid_of(&name) {
            let mut pod = PodCgroup {
                path: path.clone(),
                ..PodCgroup::default()
            };
            for (cname, cpath) in subdirs(&path) {
                if let Some((runtime, id)) = container_of(&cname) {
                    pod.containers += 1;
                    s.containers.push(ContainerCgroup {
                        pod_uid: uid.clone(),
                        container_id: id,
                        runtime,
                        path: cpath,
                    });
                } else if !is_conmon(&cname) {
                    if has_long_hex_run(&cname) {
                        s.named.push((cname.clone(), cpath));
                    }
                    pod.unknown.push(cname);
                }
            }
            pod.unknown.sort();
            pod.unknown.truncate(NAMES_SHOWN);
            s.pods.insert(uid, pod);
            continue;
        }
        if under_kubepods
            && s.below_kubepods.len() < NAMES_SHOWN
            && let Ok(rel) = path.strip_prefix(&s.root)
        {
            s.below_kubepods.push(rel.display().to_string());
        }
        if has_long_hex_run(&name) {
            s.named.push((name, path.clone()));
        }
        walk(&path, depth + 1, kubepods, s);
    }
}

impl Survey {
    /// Why the wanted container `container_id` of pod `pod_uid` has no cgroup here, when the
    /// tree says so; `None` when nothing points at a form the agent does not know (the
    /// container is gone, or not there yet).
    pub fn diagnose(&self, pod_uid: &str, container_id: &str) -> Option<Unmapped> {
        let pod = self.pods.get(pod_uid);
        if container_id.len() >= 12 {
            let elsewhere = self
                .named
                .iter()
                .find(|(name, _)| name.contains(container_id))
                .map(|(_, path)| path.clone())
                .or_else(|| {
                    // found in a known form, but in another pod's cgroup
                    self.containers
                        .iter()
                        .find(|c| c.container_id == container_id && c.pod_uid != pod_uid)
                        .map(|c| c.path.clone())
                });
            if let Some(path) = elsewhere {
                return Some(Unmapped::Elsewhere {
                    container_id: container_id.to_string(),
                    pod: pod.map(|p| p.path.clone()).filter(|p| path.starts_with(p)),
                    path,
                });
            }
        }
        if self.kubepods.is_empty() {
            return Some(Unmapped::NoKubepods {
                root: self.root.clone(),
                top: self.top.clone(),
            });
        }
        if self.pods.is_empty() {
            return Some(Unmapped::NoPodCgroups {
                kubepods: self.kubepods[0].clone(),
                below: self.below_kubepods.clone(),
            });
        }
        let pod = pod?;
        (!pod.unknown.is_empty()).then(|| Unmapped::UnknownForm {
            pod_uid: pod_uid.to_string(),
            pod: pod.path.clone(),
            children: pod.unknown.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_hex_runs() {
        assert!(has_long_hex_run(&format!("docker-{}.scope", "ab".repeat(32))));
        assert!(!has_long_hex_run(
            "kubepods-burstable-pod1b2c3d4e_5f60_7182_93a4_b5c6d7e8f901.slice"
        ));
        assert!(!has_long_hex_run("system.slice"));
    }
}
