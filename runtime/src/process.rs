//! The standard Prometheus process metrics of the running binary, as every official client library
//! exports them: `process_cpu_seconds_total`, `process_resident_memory_bytes`,
//! `process_virtual_memory_bytes`, `process_open_fds`, `process_max_fds`, `process_threads` and
//! `process_start_time_seconds`, unprefixed so that the usual dashboards and alerts find them.
//!
//! prometheus-client has no process collector of its own (an open request upstream), and the one
//! companion crate for it is built against an older prometheus-client, whose `Collector` trait
//! our registries do not take. So this module reads Linux's `/proc/self` itself, on each scrape:
//! `stat` (CPU time, threads, start), `statm` (memory), `limits` (the open-files limit), the
//! entries of `fd`, and `/proc/uptime` (once, for the start time). Each read is bounded, every
//! field is parsed without panicking, and a metric whose source is missing or odd is left out of
//! that scrape rather than reported as 0. Elsewhere than Linux nothing is exported.

// the readers below are Linux's; the kubectl plugin, built for Windows and macOS too, links this
// crate for its other parts and leaves them unused there
#![cfg_attr(not(target_os = "linux"), allow(dead_code, unused_imports))]

use std::fmt;
use std::io::Read;
use std::path::Path;
#[cfg(target_os = "linux")]
use std::sync::OnceLock;
#[cfg(target_os = "linux")]
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

/// At most this much is read of one `/proc` file (`stat` is about 300 bytes, `limits` 1.5 KiB).
const READ_LIMIT: u64 = 16 * 1024;
/// At most this many `fd` entries are counted (a process near it has other problems already).
const FD_COUNT_LIMIT: usize = 1 << 20;

/// Encodes `registry` and then the process metrics as one OpenMetrics text (one `# EOF`): what
/// both binaries serve on `/metrics`.
pub fn encode(out: &mut String, registry: &Registry) -> fmt::Result {
    prometheus_client::encoding::text::encode_registry(out, registry)?;
    let mut process = Registry::default();
    process.register_collector(Box::new(ProcessCollector));
    prometheus_client::encoding::text::encode_registry(out, &process)?;
    prometheus_client::encoding::text::encode_eof(out)
}

/// The process metrics of this process, read from `/proc/self` on each scrape. Register it in an
/// unprefixed registry (a prefixed one would rename the metrics), or use [`encode`].
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let snapshot = Snapshot::read();
        if let Some(v) = snapshot.cpu_seconds {
            let counter = ConstCounter::new(v);
            let m = encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                None,
                counter.metric_type(),
            )?;
            counter.encode(m)?;
        }
        let gauges: [(&str, &str, Option<f64>); 6] = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                snapshot.resident_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                snapshot.virtual_bytes,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors.",
                snapshot.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors.",
                snapshot.max_fds,
            ),
            (
                "process_threads",
                "Number of OS threads in the process.",
                snapshot.threads,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                snapshot.start_time_seconds,
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(v) = value {
                let gauge = ConstGauge::new(v);
                let m = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
                gauge.encode(m)?;
            }
        }
        Ok(())
    }
}

/// One reading of the process's figures; `None` where the source was missing or odd.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Snapshot {
    cpu_seconds: Option<f64>,
    resident_bytes: Option<f64>,
    virtual_bytes: Option<f64>,
    open_fds: Option<f64>,
    max_fds: Option<f64>,
    threads: Option<f64>,
    start_time_seconds: Option<f64>,
}

impl Snapshot {
    #[cfg(target_os = "linux")]
    fn read() -> Snapshot {
        let ticks = rustix::param::clock_ticks_per_second();
        let page = rustix::param::page_size() as u64;
        let stat = read_bounded(Path::new("/proc/self/stat")).and_then(|s| parse_stat(&s));
        let statm = read_bounded(Path::new("/proc/self/statm")).and_then(|s| parse_statm(&s));
        let seconds = |t: u64| (ticks > 0).then(|| t as f64 / ticks as f64);
        Snapshot {
            cpu_seconds: stat.and_then(|s| seconds(s.utime.saturating_add(s.stime))),
            resident_bytes: statm.map(|m| m.resident_pages.saturating_mul(page) as f64),
            virtual_bytes: statm.map(|m| m.size_pages.saturating_mul(page) as f64),
            open_fds: count_fds(Path::new("/proc/self/fd")).map(|n| n as f64),
            max_fds: read_bounded(Path::new("/proc/self/limits"))
                .and_then(|s| parse_max_open_files(&s))
                .map(|n| n as f64),
            threads: stat.map(|s| s.threads as f64),
            start_time_seconds: stat.and_then(|s| start_time(s.start_ticks, ticks)),
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn read() -> Snapshot {
        Snapshot::default()
    }
}

/// Seconds since the Unix epoch when the process started: the boot time (now less
/// `/proc/uptime`) plus the start in ticks after boot. Computed once, on the first scrape, so
/// it does not jitter between scrapes.
#[cfg(target_os = "linux")]
fn start_time(start_ticks: u64, ticks_per_second: u64) -> Option<f64> {
    static START: OnceLock<Option<f64>> = OnceLock::new();
    *START.get_or_init(|| {
        if ticks_per_second == 0 {
            return None;
        }
        let uptime = read_bounded(Path::new("/proc/uptime")).and_then(|s| parse_uptime(&s))?;
        let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?.as_secs_f64();
        let start = now - uptime + start_ticks as f64 / ticks_per_second as f64;
        (start.is_finite() && start > 0.0).then_some(start)
    })
}

/// A `/proc` file's text, at most [`READ_LIMIT`] bytes of it, invalid UTF-8 replaced.
fn read_bounded(path: &Path) -> Option<String> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(READ_LIMIT)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// Entries of a `fd` folder, at most [`FD_COUNT_LIMIT`] (the folder's own descriptor, open
/// while it is read, is among them, as in the other clients).
fn count_fds(dir: &Path) -> Option<usize> {
    Some(std::fs::read_dir(dir).ok()?.take(FD_COUNT_LIMIT).count())
}

/// The fields of `/proc/<pid>/stat` used here.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Stat {
    /// User-mode CPU time, in clock ticks (field 14).
    utime: u64,
    /// Kernel-mode CPU time, in clock ticks (field 15).
    stime: u64,
    /// Threads (field 20).
    threads: u64,
    /// Start after boot, in clock ticks (field 22).
    start_ticks: u64,
}

/// Parses `/proc/<pid>/stat`. The command name (field 2) is in parentheses and may itself hold
/// spaces and parentheses, so the fields are counted from the last `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    // fields from 3 (state) on: field n is at index n - 3
    let fields: Vec<&str> = rest.split_ascii_whitespace().take(20).collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        utime: field(14)?,
        stime: field(15)?,
        threads: field(20)?,
        start_ticks: field(22)?,
    })
}

/// The fields of `/proc/<pid>/statm` used here, in pages.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Statm {
    size_pages: u64,
    resident_pages: u64,
}

/// Parses `/proc/<pid>/statm`: size and resident set, the first two numbers, in pages.
fn parse_statm(text: &str) -> Option<Statm> {
    let mut it = text.split_ascii_whitespace().map(|f| f.parse::<u64>().ok());
    Some(Statm {
        size_pages: it.next()??,
        resident_pages: it.next()??,
    })
}

/// The soft limit of `Max open files` in `/proc/<pid>/limits`; `None` when `unlimited` or
/// missing.
fn parse_max_open_files(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_ascii_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Seconds since boot: the first number of `/proc/uptime`.
fn parse_uptime(text: &str) -> Option<f64> {
    let up: f64 = text.split_ascii_whitespace().next()?.parse().ok()?;
    (up.is_finite() && up >= 0.0).then_some(up)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// Sample name → value of an OpenMetrics text's unlabelled samples.
    fn samples(text: &str) -> BTreeMap<String, f64> {
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .filter_map(|l| {
                let (name, value) = l.split_once(' ')?;
                Some((name.to_string(), value.trim().parse().ok()?))
            })
            .collect()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_has_sane_figures_under_the_standard_names() {
        let mut registry = Registry::with_prefix("nodewarden");
        let c = prometheus_client::metrics::counter::Counter::<u64>::default();
        registry.register("things", "Things", c.clone());
        c.inc();
        // some CPU time and memory of our own
        let burn: Vec<u64> = (0..200_000u64).map(|i| i.wrapping_mul(i)).collect();
        assert!(burn.iter().any(|&v| v > 0));

        let mut out = String::new();
        encode(&mut out, &registry).expect("encodes");
        assert!(out.ends_with("# EOF\n"), "{out}");
        assert_eq!(out.matches("# EOF").count(), 1, "{out}");
        assert!(out.contains("# TYPE process_cpu_seconds counter"), "{out}");
        let s = samples(&out);
        assert_eq!(s.get("nodewarden_things_total"), Some(&1.0), "{out}");

        let get = |name: &str| *s.get(name).unwrap_or_else(|| panic!("{name} missing: {out}"));
        let rss = get("process_resident_memory_bytes");
        let vsz = get("process_virtual_memory_bytes");
        // between 1 MiB and 64 GiB
        assert!((1048576.0..68719476736.0).contains(&rss), "rss {rss}");
        assert!(vsz >= rss, "virtual {vsz} < resident {rss}");
        let cpu = get("process_cpu_seconds_total");
        assert!((0.0..86_400.0).contains(&cpu), "cpu {cpu}");
        let fds = get("process_open_fds");
        let max = get("process_max_fds");
        assert!(fds >= 1.0 && fds <= max, "open fds {fds}, max {max}");
        let threads = get("process_threads");
        assert!((1.0..100_000.0).contains(&threads), "threads {threads}");
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_secs_f64();
        let start = get("process_start_time_seconds");
        // this test process started within the last day, and not after now (tick granularity
        // and the uptime's rounding give a few hundredths of slack)
        assert!(
            start > now - 86_400.0 && start < now + 1.0,
            "start {start}, now {now}"
        );

        // a second scrape: CPU does not go back, the start time does not move
        let mut again = String::new();
        encode(&mut again, &Registry::default()).expect("encodes");
        let s2 = samples(&again);
        assert!(s2["process_cpu_seconds_total"] >= cpu);
        assert_eq!(s2["process_start_time_seconds"], start);
    }

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        // comm with spaces and parentheses, as a process may name itself
        let line = "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 500 0 0 0 \
                    250 75 0 0 20 0 7 0 123456 104857600 2560 18446744073709551615 \
                    1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                utime: 250,
                stime: 75,
                threads: 7,
                start_ticks: 123456,
            })
        );
    }

    #[test]
    fn odd_proc_contents_give_nothing_and_never_panic() {
        for text in [
            "",
            ")",
            "1 (x",
            "1 (x) S 1 2 3",
            "1 (x) S 1 1 1 0 -1 0 0 0 0 0 abc 1 0 0 20 0 1 0 5",
            "1 (x) S 1 1 1 0 -1 0 0 0 0 0 99999999999999999999999 1 0 0 20 0 1 0 5",
            "\u{fffd}\u{fffd})\u{fffd}",
        ] {
            assert_eq!(parse_stat(text), None, "{text:?}");
        }
        for text in ["", "12", "a b", "-1 5", "1\u{fffd} 2"] {
            assert_eq!(parse_statm(text), None, "{text:?}");
        }
        assert_eq!(
            parse_statm("2048 512 100 10 0 300 0\n"),
            Some(Statm {
                size_pages: 2048,
                resident_pages: 512
            })
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max open files            1048576              1048576              files     \n";
        assert_eq!(parse_max_open_files(limits), Some(1_048_576));
        assert_eq!(
            parse_max_open_files(
                "Max open files            unlimited            unlimited            files\n"
            ),
            None
        );
        assert_eq!(parse_max_open_files("Max open files"), None);
        assert_eq!(parse_max_open_files(""), None);
        assert_eq!(parse_uptime("350735.47 234388.90\n"), Some(350735.47));
        for text in ["", "NaN 1", "inf", "-5 1", "x"] {
            assert_eq!(parse_uptime(text), None, "{text:?}");
        }
    }

    #[test]
    fn missing_proc_files_give_nothing() {
        let dir = std::env::temp_dir().join("nodewarden-no-such-proc-folder");
        assert_eq!(read_bounded(&dir.join("stat")), None);
        assert_eq!(count_fds(&dir.join("fd")), None);
    }
}
