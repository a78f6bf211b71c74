//! The cgroup files the agent reads on its node (v2 and v1) and the names it walks.
//!
//! The first byte picks the decoder, the rest is the file's text:
//! * 0: flat-keyed files (`cpu.stat`, `memory.stat`, `memory.events`, v1 `memory.oom_control`),
//!   every key the agent reads;
//! * 1: single-value files (`memory.current`, v1 `memory.usage_in_bytes`, `cpuacct.usage`);
//! * 2: cgroup directory names, one per line (pod UIDs, container IDs);
//! * 3: the mount table (`/proc/self/mountinfo`) and the v1 hierarchies found in it;
//! * 4: one whole container read, v2 then v1: the text split at NUL bytes into `cpu.stat`,
//!   `memory.current`, `memory.stat`, `memory.events` (v1: `cpuacct.usage`, `cpu.stat`,
//!   `memory.usage_in_bytes`, `memory.stat`, `memory.oom_control`), written to a temporary
//!   folder and read as the agent does.
//!
//! Invariants: a keyed value is the number on the first line of its key; names give a pod UID
//! with dashes and a hex container ID found in the name; v1 hierarchies are below the root; a
//! reading's working set never exceeds its memory usage.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use nodewarden_agent::cgroup::{self, v1};

const KEYS: [&str; 8] = [
    "usage_usec",
    "nr_throttled",
    "throttled_usec",
    "throttled_time",
    "inactive_file",
    "total_inactive_file",
    "oom_kill",
    "oom",
];

fn keyed(text: &str) {
    let path = Path::new("cpu.stat");
    for key in KEYS {
        let Ok(Some(value)) = cgroup::optional_keyed_value(path, text, key) else {
            continue;
        };
        let line = text
            .lines()
            .find(|l| l.split_ascii_whitespace().next() == Some(key))
            .expect("a value comes from a line with its key");
        let written = line
            .split_ascii_whitespace()
            .nth(1)
            .expect("the line has a value");
        assert_eq!(written.parse::<u64>().ok(), Some(value), "{line:?}");
        assert_eq!(cgroup::keyed_value(path, text, key).ok(), Some(value));
    }
}

fn names(text: &str) {
    for name in text.lines() {
        if let Some(uid) = cgroup::pod_uid_of(name) {
            assert!(!uid.contains('_') && uid.len() >= 8, "{name:?} -> {uid:?}");
        }
        if let Some((_, id)) = cgroup::container_of(name) {
            assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{name:?} -> {id:?}");
            assert!(name.contains(&id), "{name:?} -> {id:?}");
        }
    }
}

fn mountinfo(text: &str) {
    let root = Path::new("/sys/fs/cgroup");
    for entry in v1::parse_mountinfo(text) {
        assert!(!entry.options.is_empty());
    }
    if let Ok(Some(mounts)) = v1::from_mountinfo(root, text) {
        assert!(mounts.memory.starts_with(root) && mounts.cpuacct.starts_with(root));
        assert!(mounts.cpu.as_ref().is_none_or(|c| c.starts_with(root)));
        let _ = mounts.to_string();
    }
}

fn write(dir: &Path, name: &str, text: &[u8]) {
    std::fs::write(dir.join(name), text).expect("writing to the temporary folder");
}

fn whole_read(data: &[u8]) {
    let parts: Vec<&[u8]> = data.splitn(5, |&b| b == 0).collect();
    let part = |i: usize| parts.get(i).copied().unwrap_or_default();
    // one folder for the whole run: the files are rewritten for every input
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| tempfile::tempdir().expect("a temporary folder"));
    // v2: one folder
    let v2 = dir.path().join("v2");
    std::fs::create_dir_all(&v2).expect("folder");
    for (i, name) in ["cpu.stat", "memory.current", "memory.stat", "memory.events"]
        .iter()
        .enumerate()
    {
        write(&v2, name, part(i));
    }
    if let Ok(reading) = cgroup::read(&v2) {
        assert!(reading.working_set() <= reading.memory_current);
    }
    // v1: the same texts under the memory, cpuacct and cpu hierarchies
    let memory = dir.path().join("memory/kubepods/pod1/c");
    let cpuacct = dir.path().join("cpuacct/kubepods/pod1/c");
    let cpu = dir.path().join("cpu/kubepods/pod1/c");
    for d in [&memory, &cpuacct, &cpu] {
        std::fs::create_dir_all(d).expect("folder");
    }
    write(&cpuacct, "cpuacct.usage", part(1));
    write(&cpu, "cpu.stat", part(0));
    write(&memory, "memory.usage_in_bytes", part(1));
    write(&memory, "memory.stat", part(2));
    write(&memory, "memory.oom_control", part(3));
    let mounts = v1::Mounts {
        memory: dir.path().join("memory"),
        cpuacct: dir.path().join("cpuacct"),
        cpu: Some(dir.path().join("cpu")),
    };
    if let Ok(reading) = mounts.read(&memory) {
        assert!(reading.working_set() <= reading.memory_current);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    if which % 5 == 4 {
        whole_read(rest);
        return;
    }
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    match which % 5 {
        0 => keyed(text),
        1 => {
            if let Ok(v) = cgroup::single_value(Path::new("memory.current"), text) {
                assert_eq!(text.trim().parse::<u64>().ok(), Some(v));
            }
        }
        2 => names(text),
        _ => mountinfo(text),
    }
});
