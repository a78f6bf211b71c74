//! The one program in the real-node tier's test image (`nodewarden/testbox`):
//!
//! - `nodewarden-testbox pause` (the default): the pod sandbox. Waits for SIGTERM or SIGINT and
//!   exits 0; as PID 1 of a pod it must handle them itself, or the kernel ignores them.
//! - `nodewarden-testbox burn --cpu-millicores M --memory-mib N`: a log-shipper-like workload with
//!   a known footprint. It holds N MiB of memory it has written (so it is resident and counts in the
//!   working set) and burns M millicores: in every 100 ms window each busy thread spins for its share
//!   and sleeps for the rest. `--per-node NODE=M:N,…` sets other figures for the nodes named (the
//!   node comes from `$NODE_NAME`, e.g. the downward API's `spec.nodeName`): one DaemonSet, a busy
//!   node and a quiet one.

use std::time::{Duration, Instant};

const WINDOW: Duration = Duration::from_millis(100);
const MAX_MILLICORES: u64 = 64_000;
const MAX_MEMORY_MIB: u64 = 64 * 1024;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        None | Some("pause") => pause(),
        Some("burn") => parse_burn(&args[1..]).and_then(|(cpu, mem)| burn(cpu, mem)),
        Some(other) => Err(format!(
            "unknown command {other:?}: expected `pause` or `burn --cpu-millicores M --memory-mib N`"
        )),
    };
    if let Err(e) = result {
        eprintln!("nodewarden-testbox: {e}");
        std::process::exit(2);
    }
}

fn parse_burn(args: &[String]) -> Result<(u64, u64), String> {
    let (mut cpu, mut mem) = (0, 0);
    let mut per_node = None;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--cpu-millicores" => cpu = number(flag, value, MAX_MILLICORES)?,
            "--memory-mib" => mem = number(flag, value, MAX_MEMORY_MIB)?,
            "--per-node" => per_node = Some(value.clone()),
            _ => {
                return Err(format!(
                    "unknown flag {flag}: expected --cpu-millicores, --memory-mib or --per-node"
                ));
            }
        }
    }
    if let (Some(spec), Ok(node)) = (per_node, std::env::var("NODE_NAME")) {
        for entry in spec.split(',').filter(|e| !e.is_empty()) {
            let bad = || format!("--per-node {entry:?}: expected NODE=MILLICORES:MIB");
            let (name, figures) = entry.split_once('=').ok_or_else(bad)?;
            let (c, m) = figures.split_once(':').ok_or_else(bad)?;
            if name == node {
                cpu = number("--per-node", c, MAX_MILLICORES)?;
                mem = number("--per-node", m, MAX_MEMORY_MIB)?;
            }
        }
    }
    Ok((cpu, mem))
}

fn number(flag: &str, value: &str, max: u64) -> Result<u64, String> {
    let n = value
        .parse::<u64>()
        .map_err(|e| format!("{flag} {value:?}: {e} (expected a whole number)"))?;
    if n > max {
        return Err(format!("{flag} {n} is too large (at most {max})"));
    }
    Ok(n)
}

fn pause() -> Result<(), String> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])
        .map_err(|e| format!("installing the signal handlers: {e}"))?;
    // returns at the first of them
    let _ = signals.forever().next();
    Ok(())
}

fn burn(millicores: u64, memory_mib: u64) -> Result<(), String> {
    println!("nodewarden-testbox: burning {millicores}m CPU, holding {memory_mib} MiB");
    let mut held: Vec<u8> = Vec::new();
    held.try_reserve_exact((memory_mib * 1024 * 1024) as usize)
        .map_err(|e| format!("allocating {memory_mib} MiB: {e}"))?;
    held.resize((memory_mib * 1024 * 1024) as usize, 0x5a);

    let threads = millicores.div_ceil(1000).max(1);
    let per_thread = millicores / threads;
    let busy = WINDOW.mul_f64(per_thread as f64 / 1000.0);
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            std::thread::spawn(move || {
                loop {
                    let start = Instant::now();
                    let mut x = 0u64;
                    while start.elapsed() < busy {
                        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                    }
                    if let Some(rest) = WINDOW.checked_sub(start.elapsed()) {
                        std::thread::sleep(rest);
                    }
                }
            })
        })
        .collect();
    // keep the memory in use, and the process alive, until the container is stopped
    let mut i = 0usize;
    loop {
        std::thread::sleep(Duration::from_secs(5));
        let len = held.len();
        if len > 0 {
            held[i % len] ^= 1;
            i = i.wrapping_add(4096);
        }
        if workers.iter().all(|w| w.is_finished()) {
            return Err("every burning thread stopped".to_string());
        }
    }
}
