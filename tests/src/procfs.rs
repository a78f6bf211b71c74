//! A process's figures from `/proc` (Linux): what the footprint benchmarks and the soak record
//! of nodewarden's own processes, and how to find them on a real node.

use std::path::Path;

/// `utime + stime` of a process, in seconds (all its threads); `None` once it is gone.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(cpu_ticks_of(&stat)? as f64 / clock_ticks_per_second())
}

/// `utime + stime` in clock ticks, from the text of a `/proc/<pid>/stat`.
pub fn cpu_ticks_of(stat: &str) -> Option<u64> {
    // the command name, in parentheses, may hold spaces: the fields start after its last ')'
    let (_, after) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// The kernel's clock ticks a second (`getconf CLK_TCK`; 100 on every Linux these tests run on).
pub fn clock_ticks_per_second() -> f64 {
    static HZ: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *HZ.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// A `/proc/<pid>/status` figure in KiB (`VmRSS:`, `RssAnon:`, `VmHWM:`); 0 when absent.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| status_field_kib(&s, field))
        .unwrap_or(0)
}

/// A figure in KiB from the text of a `/proc/<pid>/status`.
pub fn status_field_kib(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
}

/// Resident memory (bytes) and open files of a process, if it still exists.
pub fn rss_and_open_files(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some((rss_kib * 1024, fds))
}

/// The processes whose program is named `program` (the file name of `argv[0]`) and whose cgroup
/// path holds `cgroup_part` (a real node's cgroup root: its pods' processes), sorted.
pub fn processes_in(cgroup_part: &str, program: &str) -> Vec<u32> {
    let part = cgroup_part.trim_start_matches('/');
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if program_of(&entry.path()).as_deref() != Some(program) {
            continue;
        }
        let in_node = std::fs::read_to_string(entry.path().join("cgroup")).is_ok_and(|c| c.contains(part));
        if in_node {
            out.push(pid);
        }
    }
    out.sort_unstable();
    out
}

fn program_of(proc_dir: &Path) -> Option<String> {
    let cmdline = std::fs::read(proc_dir.join("cmdline")).ok()?;
    let argv0 = cmdline.split(|b| *b == 0).next()?;
    let name = String::from_utf8_lossy(argv0);
    Some(name.rsplit('/').next()?.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_found_and_measured() {
        let me = std::process::id();
        assert!(cpu_seconds(me).is_some_and(|s| s >= 0.0));
        assert!(status_kib(me, "VmRSS:") > 0);
        let (rss, fds) = rss_and_open_files(me).expect("this process exists");
        assert!(rss > 0 && fds > 0);
        let program = program_of(Path::new(&format!("/proc/{me}"))).expect("a program name");
        assert!(processes_in("/", &program).contains(&me), "{program}");
        assert!(cpu_seconds(u32::MAX).is_none());
    }
}
