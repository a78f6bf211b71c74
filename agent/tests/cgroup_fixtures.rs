//! Discovery and reading against fixture cgroup trees written as the kernel writes them.

use std::path::{Path, PathBuf};

use nodewarden_agent::cgroup::{self, CgroupError, Hierarchy, Runtime, Throttling, Version};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn hex(s: &str) -> String {
    s.repeat(64)[..64].to_string()
}

/// (pod UID, container ID, runtime) of every container found.
fn found(tree: &str) -> Vec<(String, String, Runtime)> {
    let mut v: Vec<_> = cgroup::discover(&fixture(tree))
        .into_iter()
        .map(|c| (c.pod_uid, c.container_id, c.runtime))
        .collect();
    v.sort();
    v
}

fn uid(n: u32) -> String {
    format!("0a1b2c3d-0000-4000-8000-{n:012}")
}

#[test]
fn systemd_containerd_burstable_besteffort_and_guaranteed_pods() {
    let want = {
        let mut v = vec![
            (uid(1), hex("5"), Runtime::Containerd), // the sandbox is a cgroup too; the join drops it
            (uid(1), hex("a1"), Runtime::Containerd),
            (uid(1), hex("b2"), Runtime::Containerd),
            (uid(2), hex("c3"), Runtime::Containerd),
            (uid(3), hex("d4"), Runtime::Containerd),
        ];
        v.sort();
        v
    };
    assert_eq!(found("systemd-containerd"), want);
}

#[test]
fn systemd_crio_skips_conmon() {
    let mut want = vec![
        (uid(4), hex("e5"), Runtime::CriO),
        (uid(4), hex("f6"), Runtime::CriO),
    ];
    want.sort();
    assert_eq!(found("systemd-crio"), want);
    // read at the scope, not at crun's `container` child
    let c = cgroup::discover(&fixture("systemd-crio"))
        .into_iter()
        .find(|c| c.container_id == hex("e5"))
        .expect("test setup");
    assert!(c.path.ends_with(format!("crio-{}.scope", hex("e5"))));
    assert_eq!(
        cgroup::read(&c.path).expect("test setup").memory_current,
        104_857_600
    );
}

#[test]
fn cgroupfs_containerd_with_and_without_qos_level() {
    let mut want = vec![
        (uid(5), hex("6"), Runtime::Unknown),
        (uid(5), hex("7a"), Runtime::Unknown),
        (uid(6), hex("8b"), Runtime::Unknown),
        (uid(7), hex("9c"), Runtime::Unknown),
    ];
    want.sort();
    assert_eq!(found("cgroupfs-containerd"), want);
}

#[test]
fn any_prefix_before_kubepods() {
    assert_eq!(
        found("systemd-prefixed"),
        vec![(uid(8), hex("ad"), Runtime::Containerd)]
    );
}

#[test]
fn readings_are_the_files_figures() {
    let c = cgroup::discover(&fixture("systemd-containerd"))
        .into_iter()
        .find(|c| c.container_id == hex("a1"))
        .expect("test setup");
    let r = cgroup::read(&c.path).expect("test setup");
    assert_eq!(r.cpu_usage_usec, 12_500_000);
    assert_eq!(r.memory_current, 314_572_800);
    assert_eq!(r.inactive_file, 52_428_800);
    assert_eq!(r.working_set(), 262_144_000);
    assert_eq!(r.oom_kill, 0);
    let side = cgroup::discover(&fixture("systemd-containerd"))
        .into_iter()
        .find(|c| c.container_id == hex("b2"))
        .expect("test setup");
    assert_eq!(cgroup::read(&side.path).expect("test setup").oom_kill, 2);
    // inactive_file above current: the working set is 0, not negative
    let g = cgroup::discover(&fixture("cgroupfs-containerd"))
        .into_iter()
        .find(|c| c.container_id == hex("8b"))
        .expect("test setup");
    assert_eq!(cgroup::read(&g.path).expect("test setup").working_set(), 0);
}

#[test]
fn unreadable_containers_fail_alone_with_the_file_named() {
    let all = cgroup::discover(&fixture("unreadable"));
    assert_eq!(all.len(), 3);
    let read = |id: &str| {
        cgroup::read(
            &all.iter()
                .find(|c| c.container_id == hex(id))
                .expect("test setup")
                .path,
        )
    };
    assert_eq!(read("1e").expect("test setup").memory_current, 10_485_760);
    for bad in ["2f", "3a"] {
        let err = read(bad).expect_err("must fail");
        assert!(matches!(err, CgroupError::Read { .. }), "{err}");
        assert!(err.to_string().contains("memory.current"), "{err}");
    }
}

#[test]
fn v2_roots_are_accepted() {
    for tree in [
        "systemd-containerd",
        "systemd-crio",
        "cgroupfs-containerd",
        "systemd-prefixed",
    ] {
        cgroup::check_root(&fixture(tree)).expect("test setup");
    }
}

#[test]
fn a_v1_root_is_not_taken_for_v2() {
    let err = cgroup::check_root(&fixture("v1-cgroupfs"))
        .expect_err("must fail")
        .to_string();
    assert!(err.contains("not a cgroup v2 hierarchy"), "{err}");
    assert!(err.contains("looks like cgroup v1"), "{err}");
    assert!(err.contains("memory"), "{err}");
    let err = Hierarchy::detect(&fixture("v1-cgroupfs"), Version::V2)
        .expect_err("v2 forced")
        .to_string();
    assert!(err.contains("not a cgroup v2 hierarchy"), "{err}");
}

/// The v1 hierarchies of a fixture (no mount table: the folders decide).
fn v1(tree: &str) -> Hierarchy {
    Hierarchy::detect_with(&fixture(tree), Version::Auto, None).expect("test setup")
}

/// (pod UID, container ID, runtime) of every container found in a v1 fixture.
fn found_v1(tree: &str) -> Vec<(String, String, Runtime)> {
    let mut v: Vec<_> = cgroup::discover(v1(tree).walk_root())
        .into_iter()
        .map(|c| (c.pod_uid, c.container_id, c.runtime))
        .collect();
    v.sort();
    v
}

fn read_v1(tree: &str, id: &str) -> Result<cgroup::Reading, CgroupError> {
    let h = v1(tree);
    let c = cgroup::discover(h.walk_root())
        .into_iter()
        .find(|c| c.container_id == hex(id))
        .expect("test setup");
    h.read(&c.path)
}

#[test]
fn v1_separate_hierarchies_are_detected_from_the_folders() {
    let Hierarchy::V1(m) = v1("v1-cgroupfs") else {
        panic!("not v1")
    };
    assert_eq!(m.memory, fixture("v1-cgroupfs/memory"));
    assert_eq!(m.cpuacct, fixture("v1-cgroupfs/cpuacct"));
    assert_eq!(m.cpu, Some(fixture("v1-cgroupfs/cpu")));
    let Hierarchy::V1(m) = v1("v1-systemd") else {
        panic!("not v1")
    };
    // the real folder or one of the links distributions add: the same hierarchy either way
    assert!(m.cpuacct.join("cpuacct.usage").is_file());
    assert!(m.cpu.expect("cpu").join("cpu.stat").is_file());
    // forced v1 agrees
    assert_eq!(
        Hierarchy::detect_with(&fixture("v1-systemd"), Version::V1, None).expect("test setup"),
        v1("v1-systemd")
    );
}

#[test]
fn v1_cgroupfs_driver_under_a_cgroup_root_prefix() {
    let mut want = vec![
        (uid(11), hex("0c"), Runtime::Unknown), // the sandbox; the join drops it
        (uid(11), hex("1b"), Runtime::Unknown),
        (uid(12), hex("2c"), Runtime::Unknown),
        (uid(13), hex("3d"), Runtime::Unknown),
        (uid(13), hex("4e"), Runtime::Unknown),
    ];
    want.sort();
    assert_eq!(found_v1("v1-cgroupfs"), want);
    let h = v1("v1-cgroupfs");
    let c = cgroup::discover(h.walk_root())
        .into_iter()
        .find(|c| c.container_id == hex("1b"))
        .expect("test setup");
    assert!(
        c.path.ends_with(format!(
            "memory/node-a/kubepods/burstable/pod{}/{}",
            uid(11),
            hex("1b")
        )),
        "{}",
        c.path.display()
    );
}

#[test]
fn v1_systemd_driver_skips_conmon() {
    let mut want = vec![
        (uid(14), hex("5f"), Runtime::Containerd),
        (uid(14), hex("60"), Runtime::Containerd),
        (uid(15), hex("71"), Runtime::CriO),
    ];
    want.sort();
    assert_eq!(found_v1("v1-systemd"), want);
}

#[test]
fn v1_readings_are_the_files_figures() {
    let r = read_v1("v1-cgroupfs", "1b").expect("test setup");
    assert_eq!(r.cpu_usage_usec, 7_250_000); // cpuacct.usage is in nanoseconds
    assert_eq!(r.memory_current, 209_715_200);
    assert_eq!(r.inactive_file, 20_971_520); // total_inactive_file, not inactive_file
    assert_eq!(r.working_set(), 188_743_680);
    assert_eq!(r.oom_kill, 1);
    assert_eq!(
        r.throttled,
        Some(Throttling {
            periods: 4,
            time_usec: 1_500_000
        })
    );
    // inactive file pages above usage: 0, not negative
    assert_eq!(read_v1("v1-cgroupfs", "2c").expect("test setup").working_set(), 0);
    let r = read_v1("v1-systemd", "5f").expect("test setup");
    assert_eq!(r.cpu_usage_usec, 12_500_000);
    assert_eq!(r.working_set(), 262_144_000);
    assert_eq!(r.oom_kill, 2);
    // a kernel before 4.13 has no oom_kill line: 0 (kills then come from the pod status)
    assert_eq!(read_v1("v1-systemd", "60").expect("test setup").oom_kill, 0);
}

#[test]
fn v1_garbled_or_missing_files_fail_alone_with_the_file_named() {
    let err = read_v1("v1-cgroupfs", "3d").expect_err("garbled");
    assert!(matches!(err, CgroupError::Parse { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("memory.stat") && msg.contains("total_inactive_file"),
        "{msg}"
    );
    let err = read_v1("v1-cgroupfs", "4e").expect_err("no cpuacct folder");
    assert!(matches!(err, CgroupError::Read { .. }), "{err}");
    assert!(err.to_string().contains("cpuacct.usage"), "{err}");
    // the others of the same tree still read
    read_v1("v1-cgroupfs", "1b").expect("unaffected");
}

#[test]
fn v1_from_the_mount_table_with_any_names() {
    let root = fixture("v1-cgroupfs");
    // the mount table says where each controller is, whatever the folders are called
    let mountinfo = format!(
        "32 31 0:29 / {cpu} rw,relatime - cgroup cgroup rw,cpu\n\
         33 31 0:30 / {acct} rw,relatime - cgroup cgroup rw,cpuacct\n\
         35 31 0:32 / {mem} rw,relatime - cgroup cgroup rw,memory\n",
        cpu = root.join("cpu").display(),
        acct = root.join("cpuacct").display(),
        mem = root.join("memory").display(),
    );
    let h = Hierarchy::detect_with(&root, Version::Auto, Some(&mountinfo)).expect("test setup");
    assert_eq!(h, v1("v1-cgroupfs"));
    assert!(h.to_string().starts_with("cgroup v1"), "{h}");
}

#[test]
fn neither_v2_nor_v1_fails_at_start_with_a_clear_message() {
    // per-controller folders without the controllers' files: not a usable hierarchy
    let err = cgroup::Hierarchy::detect_with(&fixture("v1"), Version::Auto, None)
        .expect_err("must fail")
        .to_string();
    assert!(err.contains("neither cgroup v2"), "{err}");
    assert!(err.contains("no memory hierarchy"), "{err}");
    assert!(err.contains("NODEWARDEN_CGROUP_ROOT"), "{err}");
    let err = cgroup::Hierarchy::detect_with(&fixture("systemd-containerd"), Version::V1, None)
        .expect_err("v1 forced on a v2 tree")
        .to_string();
    assert!(err.contains("no usable cgroup v1"), "{err}");
    let err = cgroup::Hierarchy::detect(&fixture("does-not-exist"), Version::Auto)
        .expect_err("must fail")
        .to_string();
    assert!(err.contains("cannot be read"), "{err}");
}

#[test]
fn a_missing_root_fails_at_start_naming_the_flag() {
    let err = cgroup::check_root(&fixture("does-not-exist"))
        .expect_err("must fail")
        .to_string();
    assert!(err.contains("cannot be read"), "{err}");
    assert!(err.contains("NODEWARDEN_CGROUP_ROOT"), "{err}");
}
