//! Every runtime's container cgroups, as each writes them, for both cgroup drivers and both
//! cgroup versions: one table of recorded trees (made in a temporary folder), each saying which
//! (pod UID, container ID) the reader must map and to which cgroup; the sandbox (pause) and
//! CRI-O's conmon cgroups are never taken for a pod's containers. A second table holds trees the
//! agent cannot map, and what it says about each. docs/agent.md's table names these cases.

use std::collections::BTreeSet;
use std::fs;

use nodewarden_cgroup::{Hierarchy, Locator, Runtime, Unmapped, Version, discover};

const UID: &str = "8d3f1c2e-5a6b-4c7d-9e0f-1a2b3c4d5e6f";
const UID2: &str = "0f9e8d7c-6b5a-4f3e-8d2c-1b0a9f8e7d6c";

fn id(c: char) -> String {
    c.to_string().repeat(64)
}

/// Fills a path template: `{uid}` / `{uid_}` the first pod's UID (with `_` as systemd writes
/// it), `{uid2}` / `{uid2_}` the second's, `{c1}` `{c2}` `{c3}` container IDs, `{sb}` the sandbox's,
/// `{node}` the container ID of a k3s-in-Docker node.
fn expand(t: &str) -> String {
    t.replace("{uid_}", &UID.replace('-', "_"))
        .replace("{uid2_}", &UID2.replace('-', "_"))
        .replace("{uid}", UID)
        .replace("{uid2}", UID2)
        .replace("{c1}", &id('a'))
        .replace("{c2}", &id('b'))
        .replace("{c3}", &id('c'))
        .replace("{sb}", &id('5'))
        .replace("{node}", &id('e'))
}

/// A tree with `dirs` (relative to the hierarchy the containers are found in), as cgroup v2,
/// or as cgroup v1 (the same relative paths in the memory and cpu,cpuacct hierarchies).
fn tree(v1: bool, dirs: &[String]) -> (tempfile::TempDir, Hierarchy) {
    let tmp = tempfile::tempdir().expect("temp dir");
    let root = tmp.path();
    let hierarchies: Vec<_> = if v1 {
        let memory = root.join("memory");
        let cpu = root.join("cpu,cpuacct");
        for (dir, file) in [
            (&memory, "memory.usage_in_bytes"),
            (&cpu, "cpuacct.usage"),
            (&cpu, "cpu.stat"),
        ] {
            fs::create_dir_all(dir).expect("mkdir");
            fs::write(dir.join(file), "0\n").expect("write");
        }
        vec![memory, cpu]
    } else {
        fs::write(root.join("cgroup.controllers"), "cpu memory pids\n").expect("write");
        vec![root.to_path_buf()]
    };
    for h in &hierarchies {
        for d in dirs {
            fs::create_dir_all(h.join(d)).expect("mkdir");
        }
    }
    let h = Hierarchy::detect_with(root, Version::Auto, None).expect("a usable hierarchy");
    assert_eq!(matches!(h, Hierarchy::V1(_)), v1, "{h}");
    (tmp, h)
}

/// A pod's container named in its status: pod UID, container ID, its cgroup's path.
type Container = (&'static str, &'static str, &'static str);

struct Case {
    /// Runtime, cgroup driver, cgroup version (docs/agent.md names the case so).
    name: &'static str,
    v1: bool,
    runtime: Runtime,
    /// The containers of the pods' statuses: each is mapped to exactly this cgroup.
    containers: &'static [Container],
    /// The pod's sandbox cgroup: found in a container's form, but named in no status.
    sandbox: Option<&'static str>,
    /// Other cgroups: conmon, the runtime's own, crun's `container` child, look-alikes.
    others: &'static [&'static str],
    /// Containers a status still names whose cgroup is gone (a crash loop), while something
    /// named after them stays: not mapped, and no alarm.
    gone: &'static [(&'static str, &'static str)],
}

const SYSTEMD_C1: &str =
    "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{c1}.scope";
const SYSTEMD_C2: &str = "kubepods.slice/kubepods-pod{uid2_}.slice/cri-containerd-{c2}.scope";
const SYSTEMD_SB: &str =
    "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{sb}.scope";
const CGROUPFS_C1: &str = "kubepods/burstable/pod{uid}/{c1}";
const CGROUPFS_C2: &str = "kubepods/pod{uid2}/{c2}";
const CGROUPFS_SB: &str = "kubepods/burstable/pod{uid}/{sb}";

const CONTAINERD_SYSTEMD: Case = Case {
    name: "containerd, systemd",
    v1: false,
    runtime: Runtime::Containerd,
    containers: &[("{uid}", "{c1}", SYSTEMD_C1), ("{uid2}", "{c2}", SYSTEMD_C2)],
    sandbox: Some(SYSTEMD_SB),
    others: &[
        "system.slice/containerd.service",
        "init.scope",
        "user.slice/user-0.slice/session-1.scope",
    ],
    gone: &[],
};

const CONTAINERD_CGROUPFS: Case = Case {
    name: "containerd, cgroupfs",
    v1: false,
    runtime: Runtime::Unknown,
    containers: &[("{uid}", "{c1}", CGROUPFS_C1), ("{uid2}", "{c2}", CGROUPFS_C2)],
    sandbox: Some(CGROUPFS_SB),
    others: &["system.slice/containerd.service", "user.slice"],
    gone: &[("{uid}", "{c3}")],
};

const CRIO_SYSTEMD: Case = Case {
    name: "CRI-O, systemd",
    v1: false,
    runtime: Runtime::CriO,
    containers: &[(
        "{uid}",
        "{c1}",
        "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice/crio-{c1}.scope",
    )],
    // an infra container, where CRI-O keeps one (drop_infra_ctr = false)
    sandbox: Some(
        "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice/crio-{sb}.scope",
    ),
    others: &[
        // conmon_cgroup = "pod": the monitor beside the container, named after it
        "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice/crio-conmon-{c1}.scope",
        "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice/crio-conmon-{c3}.scope",
        // crun's own child of the scope: the scope is read (its counters hold the child's)
        "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice/crio-{c1}.scope/container",
        "system.slice/crio.service",
    ],
    gone: &[("{uid}", "{c3}")],
};

const CRIO_CGROUPFS: Case = Case {
    name: "CRI-O, cgroupfs",
    v1: false,
    runtime: Runtime::CriO,
    containers: &[
        ("{uid}", "{c1}", "kubepods/besteffort/pod{uid}/crio-{c1}"),
        ("{uid2}", "{c2}", "kubepods/pod{uid2}/crio-{c2}"),
    ],
    sandbox: None,
    others: &[
        "kubepods/besteffort/pod{uid}/crio-conmon-{c1}",
        "kubepods/pod{uid2}/crio-conmon-{c2}",
    ],
    gone: &[],
};

const DOCKER_SYSTEMD: Case = Case {
    name: "Docker (cri-dockerd), systemd",
    v1: false,
    runtime: Runtime::Docker,
    containers: &[
        (
            "{uid}",
            "{c1}",
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/docker-{c1}.scope",
        ),
        (
            "{uid2}",
            "{c2}",
            "kubepods.slice/kubepods-pod{uid2_}.slice/docker-{c2}.scope",
        ),
    ],
    sandbox: Some(
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/docker-{sb}.scope",
    ),
    // a container docker runs on its own, outside the kubelet: never a pod's
    others: &[
        "system.slice/docker.service",
        "system.slice/cri-docker.service",
        "system.slice/docker-{node}.scope",
    ],
    gone: &[],
};

const DOCKER_CGROUPFS: Case = Case {
    name: "Docker (cri-dockerd), cgroupfs",
    v1: false,
    runtime: Runtime::Unknown,
    containers: &[("{uid}", "{c1}", CGROUPFS_C1), ("{uid2}", "{c2}", CGROUPFS_C2)],
    sandbox: Some(CGROUPFS_SB),
    // a container docker runs on its own: docker/<id>, never a pod's
    others: &["docker/{node}", "system.slice/docker.service"],
    gone: &[],
};

fn cases() -> Vec<Case> {
    let v1 = |c: Case, name: &'static str| Case { v1: true, name, ..c };
    vec![
        Case {
            name: "containerd, systemd, v2",
            ..CONTAINERD_SYSTEMD
        },
        v1(CONTAINERD_SYSTEMD, "containerd, systemd, v1"),
        Case {
            name: "containerd, cgroupfs, v2",
            ..CONTAINERD_CGROUPFS
        },
        v1(CONTAINERD_CGROUPFS, "containerd, cgroupfs, v1"),
        Case {
            name: "containerd, systemd, v2, kubelet --cgroup-root=/kubelet.slice",
            containers: &[(
                "{uid}",
                "{c1}",
                "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod{uid_}.slice/cri-containerd-{c1}.scope",
            )],
            sandbox: None,
            ..CONTAINERD_SYSTEMD
        },
        Case {
            name: "containerd, cgroupfs, v1, kubelet --cgroup-root=/node-a",
            v1: true,
            containers: &[("{uid}", "{c1}", "node-a/kubepods/burstable/pod{uid}/{c1}")],
            sandbox: Some("node-a/kubepods/burstable/pod{uid}/{sb}"),
            ..CONTAINERD_CGROUPFS
        },
        Case {
            name: "CRI-O, systemd, v2",
            ..CRIO_SYSTEMD
        },
        v1(CRIO_SYSTEMD, "CRI-O, systemd, v1"),
        Case {
            name: "CRI-O, cgroupfs, v2",
            ..CRIO_CGROUPFS
        },
        v1(CRIO_CGROUPFS, "CRI-O, cgroupfs, v1"),
        Case {
            name: "Docker (cri-dockerd), systemd, v2",
            ..DOCKER_SYSTEMD
        },
        v1(DOCKER_SYSTEMD, "Docker (cri-dockerd), systemd, v1"),
        Case {
            name: "Docker (cri-dockerd), cgroupfs, v2",
            ..DOCKER_CGROUPFS
        },
        v1(DOCKER_CGROUPFS, "Docker (cri-dockerd), cgroupfs, v1"),
        // k3s and RKE2: their containerd with the CRI plugin's names; the systemd driver where
        // systemd runs, else cgroupfs
        Case {
            name: "k3s / RKE2, systemd, v2",
            ..CONTAINERD_SYSTEMD
        },
        v1(CONTAINERD_CGROUPFS, "k3s / RKE2, cgroupfs, v1"),
        Case {
            name: "k3s rootless, cgroupfs, v2",
            containers: &[(
                "{uid}",
                "{c1}",
                "user.slice/user-1001.slice/user@1001.service/k3s-rootless.service/kubepods/pod{uid}/{c1}",
            )],
            sandbox: Some(
                "user.slice/user-1001.slice/user@1001.service/k3s-rootless.service/kubepods/pod{uid}/{sb}",
            ),
            others: &["user.slice/user-1001.slice/user@1001.service/app.slice/dbus.service"],
            ..CONTAINERD_CGROUPFS
        },
        Case {
            name: "k3s in Docker, cgroupfs, v2, the node's own view",
            containers: &[("{uid}", "{c1}", CGROUPFS_C1)],
            // k3s moves its own processes out of the namespace's root into init
            others: &["init"],
            ..CONTAINERD_CGROUPFS
        },
        Case {
            name: "k3s in Docker, cgroupfs, v2, seen from the host",
            containers: &[(
                "{uid}",
                "{c1}",
                "system.slice/docker-{node}.scope/kubepods/burstable/pod{uid}/{c1}",
            )],
            sandbox: Some("system.slice/docker-{node}.scope/kubepods/burstable/pod{uid}/{sb}"),
            others: &[
                "system.slice/docker-{node}.scope/init",
                "system.slice/docker.service",
            ],
            ..CONTAINERD_CGROUPFS
        },
        Case {
            name: "k3s in Docker, cgroupfs, v1, seen from the host",
            v1: true,
            containers: &[("{uid}", "{c1}", "docker/{node}/kubepods/besteffort/pod{uid}/{c1}")],
            sandbox: Some("docker/{node}/kubepods/besteffort/pod{uid}/{sb}"),
            others: &[],
            ..CONTAINERD_CGROUPFS
        },
        Case {
            name: "Bottlerocket, systemd, v2",
            others: &[
                "runtime.slice/containerd.service",
                "runtime.slice/kubelet.service",
                "system.slice",
            ],
            ..CONTAINERD_SYSTEMD
        },
        Case {
            name: "Bottlerocket, systemd, v1",
            v1: true,
            others: &[
                "runtime.slice/containerd.service",
                "runtime.slice/kubelet.service",
            ],
            ..CONTAINERD_SYSTEMD
        },
        Case {
            name: "GKE COS, systemd, v2",
            others: &["system.slice/containerd.service", "system.slice/kubelet.service"],
            ..CONTAINERD_SYSTEMD
        },
        v1(CONTAINERD_CGROUPFS, "GKE COS, cgroupfs, v1"),
    ]
}

fn pair(pod: &str, container: &str) -> (String, String) {
    (expand(pod), expand(container))
}

#[test]
fn every_runtime_driver_and_version_maps_the_status_containers_and_nothing_else() {
    let cases = cases();
    assert!(cases.len() >= 20);
    for case in cases {
        let name = case.name;
        let mut dirs: Vec<String> = case.containers.iter().map(|(_, _, p)| expand(p)).collect();
        dirs.extend(case.sandbox.iter().map(|p| expand(p)));
        dirs.extend(case.others.iter().map(|p| expand(p)));
        let (_tmp, h) = tree(case.v1, &dirs);
        let root = h.walk_root();

        // discovery: the containers and the sandbox, in the runtime's form; nothing else
        let mut want: BTreeSet<(String, String, String)> = case
            .containers
            .iter()
            .map(|(pod, c, path)| (expand(pod), expand(c), expand(path)))
            .collect();
        if let Some(sb) = case.sandbox {
            want.insert((UID.to_string(), id('5'), expand(sb)));
        }
        let found = discover(root);
        assert!(
            found.iter().all(|c| c.runtime == case.runtime),
            "{name}: {found:?}"
        );
        let got: BTreeSet<(String, String, String)> = found
            .into_iter()
            .map(|c| {
                let rel = c
                    .path
                    .strip_prefix(root)
                    .expect("below the root")
                    .display()
                    .to_string();
                (c.pod_uid, c.container_id, rel)
            })
            .collect();
        assert_eq!(got, want, "{name}");

        // the join with the statuses: exactly the statuses' containers, at their own cgroups
        let mut wanted: Vec<(String, String)> = case.containers.iter().map(|(p, c, _)| pair(p, c)).collect();
        wanted.extend(case.gone.iter().map(|(p, c)| pair(p, c)));
        let mut locator = Locator::new(root.to_path_buf());
        let located = locator.locate(wanted.iter().map(|(p, c)| (p.as_str(), c.as_str())));
        assert_eq!(located.len(), case.containers.len(), "{name}: {located:?}");
        for (_, c, path) in case.containers {
            assert_eq!(located.get(&expand(c)), Some(&root.join(expand(path))), "{name}");
        }
        assert!(
            !located.contains_key(&id('5')),
            "{name}: the sandbox is no container"
        );
        // a container gone while its conmon stays is not mapped, and raises no alarm
        for (_, c) in case.gone {
            assert!(!located.contains_key(&expand(c)), "{name}");
        }
        assert_eq!(locator.unmapped(), &[] as &[Unmapped], "{name}");
    }
}

/// What the agent must say about a tree it cannot map.
enum Says {
    /// Names this cgroup of the container; `true`: it sits in its pod's cgroup.
    Elsewhere(&'static str, bool),
    /// Names the pod cgroup and its sub-cgroups in no known form.
    UnknownForm(&'static str, &'static [&'static str]),
    /// Names the kubepods cgroup that holds no pod cgroup.
    NoPodCgroups(&'static str),
    /// Names the root.
    NoKubepods,
}

struct Bad {
    name: &'static str,
    dirs: &'static [&'static str],
    says: Says,
}

#[test]
fn a_tree_the_agent_cannot_map_is_named_once_and_nothing_is_mapped() {
    let bad = [
        Bad {
            name: "kubelet on systemd, Docker on cgroupfs: the containers land in docker/<id>",
            dirs: &[
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice",
                "docker/{c1}",
                "docker/{c2}",
            ],
            says: Says::Elsewhere("docker/{c1}", false),
        },
        Bad {
            name: "an unknown runtime's scope in the pod's cgroup",
            dirs: &[
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/youki-{c1}.scope",
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/youki-{c2}.scope",
            ],
            says: Says::Elsewhere(
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/youki-{c1}.scope",
                true,
            ),
        },
        Bad {
            name: "a pod cgroup holding only sub-cgroups without the containers' IDs (a VM runtime)",
            dirs: &[
                "kubepods/burstable/pod{uid}/vm-sandbox",
                "kubepods/burstable/pod{uid}/vm-overhead",
            ],
            says: Says::UnknownForm("kubepods/burstable/pod{uid}", &["vm-overhead", "vm-sandbox"]),
        },
        Bad {
            name: "pod cgroups in an unknown form",
            dirs: &["kubepods/burstable/{uid}/task"],
            says: Says::NoPodCgroups("kubepods"),
        },
        Bad {
            name: "no kubepods at all (the agent's own cgroup mounted, not the node's)",
            dirs: &["system.slice/containerd.service", "user.slice"],
            says: Says::NoKubepods,
        },
    ];
    for b in bad {
        let name = b.name;
        let dirs: Vec<String> = b.dirs.iter().map(|d| expand(d)).collect();
        let (_tmp, h) = tree(false, &dirs);
        let root = h.walk_root();
        let wanted = [pair("{uid}", "{c1}"), pair("{uid}", "{c2}")];
        let mut locator = Locator::new(root.to_path_buf());
        for _ in 0..20 {
            let located = locator.locate(wanted.iter().map(|(p, c)| (p.as_str(), c.as_str())));
            assert!(located.is_empty(), "{name}: nothing is mapped: {located:?}");
        }
        let walks = locator.walks;
        // missing containers are looked for again every few calls, not at every one
        assert!(walks <= 4, "{name}: {walks} walks in 20 calls");
        let said = locator.unmapped();
        let first = said.first().unwrap_or_else(|| panic!("{name}: nothing said"));
        let message = first.to_string();
        match b.says {
            Says::Elsewhere(path, in_pod) => {
                // one per container: both are named, each once
                assert_eq!(said.len(), 2, "{name}: {said:?}");
                let Unmapped::Elsewhere {
                    container_id,
                    path: at,
                    pod,
                } = first
                else {
                    panic!("{name}: {first:?}")
                };
                assert_eq!(container_id, &id('a'), "{name}");
                assert_eq!(at, &root.join(expand(path)), "{name}");
                assert_eq!(pod.is_some(), in_pod, "{name}");
                assert!(message.contains("cri-containerd-<id>.scope"), "{name}: {message}");
            }
            Says::UnknownForm(pod, children) => {
                // one per pod, though two of its containers are missing
                assert_eq!(said.len(), 1, "{name}: {said:?}");
                assert_eq!(
                    first,
                    &Unmapped::UnknownForm {
                        pod_uid: UID.to_string(),
                        pod: root.join(expand(pod)),
                        children: children.iter().map(|c| c.to_string()).collect(),
                    },
                    "{name}"
                );
                assert!(message.contains("vm-overhead, vm-sandbox"), "{name}: {message}");
            }
            Says::NoPodCgroups(kubepods) => {
                assert_eq!(said.len(), 1, "{name}: {said:?}");
                assert_eq!(first.path(), root.join(kubepods), "{name}");
                assert!(
                    message.contains(&format!("kubepods/burstable/{UID}")),
                    "{name}: {message}"
                );
            }
            Says::NoKubepods => {
                assert_eq!(said.len(), 1, "{name}: {said:?}");
                assert_eq!(first.path(), root, "{name}");
                assert!(message.contains("system.slice, user.slice"), "{name}: {message}");
            }
        }
        assert!(
            message.contains(&first.path().display().to_string()),
            "{name}: {message}"
        );
    }
}
