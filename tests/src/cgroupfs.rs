//! Synthetic cgroup v2 files for the node agent to measure: the layout of the systemd cgroup
//! driver with containerd, and the counters the kernel would write for one container.
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

fn write(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}
