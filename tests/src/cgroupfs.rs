//! Synthetic cgroup files for the node agent to measure: cgroup v2 with the layout of the
//! systemd cgroup driver with containerd, or cgroup v1 with the cgroupfs driver (separate
//! `memory` and co-mounted `cpu,cpuacct` hierarchies), and the counters the kernel would write
//! for one container.
//!
//! ```no_run
//! # fn example(root: &std::path::Path) -> anyhow::Result<()> {
//! use nodewarden_tests::cgroupfs;
//! cgroupfs::write_root(root)?;
//! let scope = cgroupfs::container_scope(root, "0b6c2a8e-pod-uid", &format!("{:064x}", 1));
//! cgroupfs::write_container(&scope, 5_000_000, 300 << 20)?; // 5 s of CPU, 300 MiB
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Marks `root` as a cgroup v2 hierarchy root (its `cgroup.controllers`).
pub fn write_root(root: &Path) -> Result<()> {
    std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
    write(&root.join("cgroup.controllers"), "cpuset cpu io memory pids\n")
}

/// The scope of container `container_id` of burstable pod `pod_uid` under `root`.
pub fn container_scope(root: &Path, pod_uid: &str, container_id: &str) -> PathBuf {
    root.join("kubepods.slice/kubepods-burstable.slice")
        .join(format!(
            "kubepods-burstable-pod{}.slice",
            pod_uid.replace('-', "_")
        ))
        .join(format!("cri-containerd-{container_id}.scope"))
}

/// Writes what the kernel would for a container: CPU used so far (all user time), memory in
/// use (all anonymous, so the working set equals it), and no OOM events.
pub fn write_container(scope: &Path, cpu_usec: u64, memory: u64) -> Result<()> {
    std::fs::create_dir_all(scope).with_context(|| format!("creating {}", scope.display()))?;
    write(
        &scope.join("cpu.stat"),
        &format!("usage_usec {cpu_usec}\nuser_usec {cpu_usec}\nsystem_usec 0\n"),
    )?;
    write(&scope.join("memory.current"), &format!("{memory}\n"))?;
    write(
        &scope.join("memory.stat"),
        &format!("anon {memory}\nfile 0\ninactive_file 0\nactive_file 0\n"),
    )?;
    write(
        &scope.join("memory.events"),
        "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
    )
}

/// Marks `root` as the folder of cgroup v1 hierarchies: `memory` and `cpu,cpuacct`, each with
/// its controller's files at its top (as the agent recognises them without a mount table).
pub fn write_root_v1(root: &Path) -> Result<()> {
    for dir in ["memory", "cpu,cpuacct"] {
        std::fs::create_dir_all(root.join(dir))
            .with_context(|| format!("creating {}", root.join(dir).display()))?;
    }
    write(&root.join("memory/memory.usage_in_bytes"), "0\n")?;
    write(&root.join("cpu,cpuacct/cpuacct.usage"), "0\n")?;
    write(
        &root.join("cpu,cpuacct/cpu.stat"),
        "nr_periods 0\nnr_throttled 0\nthrottled_time 0\n",
    )
}

/// The relative path of container `container_id` of burstable pod `pod_uid` in each v1
/// hierarchy (cgroupfs driver).
pub fn container_path_v1(pod_uid: &str, container_id: &str) -> PathBuf {
    Path::new("kubepods/burstable")
        .join(format!("pod{pod_uid}"))
        .join(container_id)
}

/// [`write_container`] for cgroup v1: the container's files at `rel` in each hierarchy below
/// `root` (CPU in nanoseconds in `cpuacct.usage`, memory all anonymous, no OOM kill).
pub fn write_container_v1(root: &Path, rel: &Path, cpu_usec: u64, memory: u64) -> Result<()> {
    let cpu = root.join("cpu,cpuacct").join(rel);
    let mem = root.join("memory").join(rel);
    for dir in [&cpu, &mem] {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    write(
        &cpu.join("cpuacct.usage"),
        &format!("{}\n", cpu_usec.saturating_mul(1000)),
    )?;
    write(
        &cpu.join("cpu.stat"),
        "nr_periods 0\nnr_throttled 0\nthrottled_time 0\n",
    )?;
    write(&mem.join("memory.usage_in_bytes"), &format!("{memory}\n"))?;
    write(
        &mem.join("memory.stat"),
        &format!("rss {memory}\ninactive_file 0\ntotal_rss {memory}\ntotal_inactive_file 0\n"),
    )?;
    write(
        &mem.join("memory.oom_control"),
        "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
    )
}

fn write(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodewarden_agent::cgroup::{self, Hierarchy, Version};

    #[test]
    fn the_agent_reads_both_synthetic_layouts_alike() -> Result<()> {
        let tmp = tempfile::tempdir()?;
        let id = format!("{:064x}", 7);
        let (v2, v1) = (tmp.path().join("v2"), tmp.path().join("v1"));
        write_root(&v2)?;
        write_container(&container_scope(&v2, "pod-uid-0001", &id), 5_000_000, 300 << 20)?;
        write_root_v1(&v1)?;
        write_container_v1(&v1, &container_path_v1("pod-uid-0001", &id), 5_000_000, 300 << 20)?;
        let mut readings = Vec::new();
        for root in [&v2, &v1] {
            let h = Hierarchy::detect_with(root, Version::Auto, None)?;
            let found = cgroup::discover(h.walk_root());
            assert_eq!(found.len(), 1, "{h}");
            readings.push(h.read(&found[0].path)?);
        }
        assert_eq!(readings[0].cpu_usage_usec, readings[1].cpu_usage_usec);
        assert_eq!(readings[0].working_set(), readings[1].working_set());
        assert_eq!(readings[1].working_set(), 300 << 20);
        Ok(())
    }
}
