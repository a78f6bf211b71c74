//! Discovery and reading against fixture cgroup trees written as the kernel writes them.

use std::path::{Path, PathBuf};

use nodewarden_agent::cgroup::{self, CgroupError, Runtime};

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
fn a_v1_root_fails_at_start_with_a_clear_message() {
    let err = cgroup::check_root(&fixture("v1"))
        .expect_err("must fail")
        .to_string();
    assert!(err.contains("not a cgroup v2 hierarchy"), "{err}");
    assert!(err.contains("looks like cgroup v1"), "{err}");
    assert!(err.contains("memory"), "{err}");
}

#[test]
fn a_missing_root_fails_at_start_naming_the_flag() {
    let err = cgroup::check_root(&fixture("does-not-exist"))
        .expect_err("must fail")
        .to_string();
    assert!(err.contains("cannot be read"), "{err}");
    assert!(err.contains("NODEWARDEN_CGROUP_ROOT"), "{err}");
}
