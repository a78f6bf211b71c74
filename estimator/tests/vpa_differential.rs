//! Differential test: nodewarden's estimator against VPA's own recommender code.
//!
//! Usage traces are generated here with fixed seeds; each is replayed through
//! `recommender::History` and, as JSON, through `tests/vpa/cmd/recommend` (VPA v1.8.1's
//! `model.ContainerState` / `AggregateContainerState` and the estimators that
//! `logic.CreatePodResourceRecommender` composes, built by `tests/vpa/build-recommend.sh`).
//!
//! Agreement means: the same number of CPU samples and accepted OOM kills, and every figure
//! within VPA's rounding. VPA truncates to whole millicores (CPU) and whole bytes (memory)
//! after each step: the percentile, the margin (another truncation of 15 % of it), the
//! confidence factor `f`, and the floor. nodewarden keeps fractions. So nodewarden is never
//! below VPA, and above it by less than `1.15 + 1 = 2.15` units for a target and
//! `2.15·f + 1` units for a bound (units: millicores, bytes). With no confidence nodewarden
//! has no upper bound, where VPA has its largest amount (1e14), or the floor when the
//! histogram is empty.
//!
//! What the agent publishes (`figures::entry`, here with no node allocatable and no
//! `maxAllowed`: VPA knows neither) is the estimate rounded up, except where VPA's figure is
//! absent or unbounded, and only there: a history without a CPU sample publishes nothing (VPA's
//! recommender gives no recommendation then; the program here asks its estimators directly,
//! which still give figures), and with no confidence there is no upper bound (VPA's is 1e14).
//! Those cases are checked to be exactly the departures, and skipped in the comparison of
//! published figures.
//!
//! The Go program is built on first use (the Go module proxy is the only download) and
//! cached; `NODEWARDEN_VPA_RECOMMEND` may name a prebuilt binary instead. Without Go on the
//! PATH the test is skipped, except under `CI=true`, where that is a failure.
//!
//! `NODEWARDEN_WRITE_ESTIMATOR_TABLE=1 cargo test -p nodewarden-estimator --test vpa_differential`
//! rewrites the table in `docs/estimator.md`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use nodewarden_estimator::figures::{self, Entry, Figures};
use nodewarden_estimator::policy::Policy;
use nodewarden_estimator::recommender::{Estimate, EstimatorConfig, History};
use serde::{Deserialize, Serialize};

const T0: i64 = 1_700_000_000_000;
const MIN: i64 = 60_000;
const HOUR: i64 = 60 * MIN;
const DAY: i64 = 24 * HOUR;
const MIB: i64 = 1024 * 1024;
const GIB: i64 = 1024 * MIB;
/// VPA's largest resource amount (model/types.go, MaxResourceAmount).
const VPA_MAX: i64 = 100_000_000_000_000;

#[derive(Clone, Debug, Serialize)]
struct Event {
    t: i64,
    kind: &'static str,
    #[serde(skip_serializing_if = "is_zero")]
    milli: i64,
    #[serde(skip_serializing_if = "is_zero")]
    bytes: i64,
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

fn cpu(t: i64, milli: i64) -> Event {
    Event {
        t,
        kind: "cpu",
        milli,
        bytes: 0,
    }
}

fn mem(t: i64, bytes: i64) -> Event {
    Event {
        t,
        kind: "memory",
        milli: 0,
        bytes,
    }
}

fn oom(t: i64, request_bytes: i64) -> Event {
    Event {
        t,
        kind: "oom",
        milli: 0,
        bytes: request_bytes,
    }
}

#[derive(Clone, Debug, Serialize)]
struct Trace {
    name: String,
    #[serde(skip)]
    what: &'static str,
    containers: usize,
    events: Vec<Event>,
}

#[derive(Serialize)]
struct Input<'a> {
    traces: &'a [Trace],
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Amounts {
    cpu_milli: i64,
    memory_bytes: i64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct VpaResult {
    name: String,
    target: Amounts,
    lower_bound: Amounts,
    upper_bound: Amounts,
    sample_count: u64,
    ooms_accepted: u64,
    #[allow(dead_code)]
    ooms_dropped: u64,
}

#[derive(Deserialize)]
struct Output {
    results: Vec<VpaResult>,
}

/// splitmix64: small, seedable, the same on every platform.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform whole number in [lo, hi].
    fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.unit() * (hi - lo + 1) as f64) as i64
    }
}

/// One CPU and one memory sample every `step` from `start` for `len`, values from `f(rng, t)`.
fn samples(
    rng: &mut Rng,
    start: i64,
    len: i64,
    step: i64,
    mut f: impl FnMut(&mut Rng, i64) -> (i64, i64),
) -> Vec<Event> {
    let mut out = Vec::new();
    let mut t = start;
    while t < start + len {
        let (m, b) = f(rng, t);
        out.push(cpu(t, m));
        out.push(mem(t, b));
        t += step;
    }
    out
}

fn daily(t: i64) -> f64 {
    // 0 at midnight (UTC), 1 at noon
    let phase = (t.rem_euclid(DAY)) as f64 / DAY as f64;
    0.5 - 0.5 * (2.0 * std::f64::consts::PI * phase).cos()
}

fn trace(name: &str, what: &'static str, containers: usize, events: Vec<Event>) -> Trace {
    Trace {
        name: name.to_string(),
        what,
        containers,
        events,
    }
}

fn traces() -> Vec<Trace> {
    let mut v = Vec::new();
    let mut rng = Rng(1);
    v.push(trace(
        "steady",
        "3 days, a sample a minute, 200 m ± 20 m, 300 MiB ± 10 MiB",
        1,
        samples(&mut rng, T0, 3 * DAY, MIN, |r, _| {
            (r.range(180, 220), r.range(290 * MIB, 310 * MIB))
        }),
    ));
    let mut rng = Rng(2);
    v.push(trace(
        "daily-cycle",
        "7 days, 100–800 m and 200–600 MiB following the time of day",
        1,
        samples(&mut rng, T0, 7 * DAY, MIN, |r, t| {
            let d = daily(t);
            (
                100 + (700.0 * d) as i64 + r.range(0, 30),
                200 * MIB + (400.0 * d * MIB as f64) as i64 + r.range(0, 5 * MIB),
            )
        }),
    ));
    let mut rng = Rng(3);
    v.push(trace(
        "bursts",
        "2 days at 50 m / 150 MiB with 3 % of minutes bursting to 2–4 cores / 1 GiB",
        1,
        samples(&mut rng, T0, 2 * DAY, MIN, |r, _| {
            if r.unit() < 0.03 {
                (r.range(2000, 4000), r.range(900 * MIB, GIB))
            } else {
                (r.range(40, 60), r.range(140 * MIB, 160 * MIB))
            }
        }),
    ));
    let mut rng = Rng(4);
    v.push(trace(
        "short-10min",
        "10 minutes of history",
        1,
        samples(&mut rng, T0, 10 * MIN, MIN, |r, _| {
            (r.range(300, 400), r.range(100 * MIB, 120 * MIB))
        }),
    ));
    v.push(trace(
        "one-sample",
        "a single CPU and memory sample: no confidence",
        1,
        vec![cpu(T0, 120), mem(T0, 180 * MIB)],
    ));
    v.push(trace(
        "memory-only",
        "memory samples, no CPU sample",
        1,
        (0..30).map(|i| mem(T0 + i * MIN, (200 + i) * MIB)).collect(),
    ));
    // OOM kills around the memory interval boundary: the first memory sample at T0 opens an
    // interval ending at T0 + 24 h
    let mut rng = Rng(5);
    let base = |r: &mut Rng| {
        samples(r, T0, 2 * DAY, 5 * MIN, |r, _| {
            (r.range(100, 150), r.range(400 * MIB, 450 * MIB))
        })
    };
    let two_days = base(&mut rng);
    let mut ev = samples(&mut rng, T0, DAY, 5 * MIN, |r, _| {
        (r.range(100, 150), r.range(400 * MIB, 450 * MIB))
    });
    ev.push(oom(T0 + DAY, 512 * MIB)); // exactly at the boundary: the next interval
    ev.extend(samples(&mut rng, T0 + DAY + MIN, DAY, 5 * MIN, |r, _| {
        (r.range(100, 150), r.range(400 * MIB, 450 * MIB))
    }));
    v.push(trace(
        "oom-at-boundary",
        "OOM kill exactly at the memory interval's end (512 MiB request)",
        1,
        ev,
    ));
    let mut ev = samples(&mut rng, T0, DAY + HOUR, 5 * MIN, |r, _| {
        (r.range(100, 150), r.range(400 * MIB, 450 * MIB))
    });
    ev.push(oom(T0 + DAY - MIN, 512 * MIB)); // reported an hour late, from before the boundary
    ev.extend(samples(
        &mut rng,
        T0 + DAY + HOUR + MIN,
        3 * HOUR,
        5 * MIN,
        |r, _| (r.range(100, 150), r.range(400 * MIB, 450 * MIB)),
    ));
    v.push(trace(
        "oom-just-before-boundary-late",
        "OOM kill from a minute before the boundary, reported an hour into the next interval",
        1,
        ev,
    ));
    let mut ev = samples(&mut rng, T0, DAY + 2 * HOUR, 5 * MIN, |r, _| {
        (r.range(100, 150), r.range(400 * MIB, 450 * MIB))
    });
    ev.push(oom(T0 + DAY + MIN, 512 * MIB)); // a minute after the boundary, reported late
    ev.push(oom(T0 - 2 * HOUR, 512 * MIB)); // more than an interval before the last sample: dropped
    ev.extend(samples(
        &mut rng,
        T0 + DAY + 2 * HOUR,
        6 * HOUR,
        5 * MIN,
        |r, _| (r.range(100, 150), r.range(400 * MIB, 450 * MIB)),
    ));
    v.push(trace(
        "oom-after-boundary-and-stale",
        "OOM kill a minute after the boundary reported late, and one too old to count",
        1,
        ev,
    ));
    v.push(trace(
        "oom-repeated",
        "2 days plus four OOM kills in one interval (they do not compound)",
        1,
        {
            let mut ev = two_days;
            for i in 0..4 {
                ev.push(oom(T0 + 2 * DAY + 10 * MIN + i * HOUR, 512 * MIB));
            }
            ev
        },
    ));
    v.push(trace(
        "oom-first",
        "an OOM kill before any sample, then a day of samples",
        1,
        {
            let mut ev = vec![oom(T0 - HOUR, 256 * MIB)];
            ev.extend(samples(&mut rng, T0, DAY, 5 * MIN, |r, _| {
                (r.range(10, 30), r.range(200 * MIB, 250 * MIB))
            }));
            ev
        },
    ));
    // request changes: VPA's CPU samples carry no request, so only usage shows it; the OOM
    // kills carry the memory request of their time
    let mut rng = Rng(6);
    let mut ev = samples(&mut rng, T0, 2 * DAY, MIN, |r, _| {
        (r.range(150, 250), r.range(700 * MIB, 800 * MIB))
    });
    ev.push(oom(T0 + DAY + HOUR, GIB)); // request 1 GiB
    ev.extend(samples(&mut rng, T0 + 2 * DAY, 2 * DAY, MIN, |r, _| {
        (r.range(60, 100), r.range(200 * MIB, 250 * MIB))
    }));
    ev.push(oom(T0 + 3 * DAY + HOUR, 256 * MIB)); // request resized to 256 MiB
    v.push(trace(
        "request-change",
        "request 1 core / 1 GiB, then 100 m / 256 MiB half-way (usage follows), an OOM kill at each",
        1,
        ev,
    ));
    let mut rng = Rng(7);
    v.push(trace(
        "tiny-3-containers",
        "1–3 m and 5–20 MiB in a pod of 3 containers (floors shared)",
        3,
        samples(&mut rng, T0, DAY, MIN, |r, _| {
            (r.range(1, 3), r.range(5 * MIB, 20 * MIB))
        }),
    ));
    let mut rng = Rng(8);
    v.push(trace(
        "tiny-2-containers-idle",
        "0–1 m and 1–2 MiB in a pod of 2 containers",
        2,
        samples(&mut rng, T0, 6 * HOUR, MIN, |r, _| {
            (r.range(0, 1), r.range(MIB, 2 * MIB))
        }),
    ));
    let mut rng = Rng(9);
    v.push(trace(
        "huge",
        "60–120 cores and 200–400 GiB",
        1,
        samples(&mut rng, T0, DAY, 5 * MIN, |r, _| {
            (r.range(60_000, 120_000), r.range(200 * GIB, 400 * GIB))
        }),
    ));
    let mut rng = Rng(10);
    v.push(trace(
        "beyond-the-last-bucket",
        "1500–2500 cores and 1–2 TiB (past the histograms' last bucket)",
        1,
        samples(&mut rng, T0, 6 * HOUR, 5 * MIN, |r, _| {
            (r.range(1_500_000, 2_500_000), r.range(1024 * GIB, 2048 * GIB))
        }),
    ));
    let mut rng = Rng(11);
    let mut ev = samples(&mut rng, T0, DAY, MIN, |r, _| {
        (r.range(300, 500), r.range(300 * MIB, 400 * MIB))
    });
    ev.extend(samples(&mut rng, T0 + 4 * DAY + 7 * HOUR, DAY, MIN, |r, _| {
        (r.range(100, 200), r.range(150 * MIB, 200 * MIB))
    }));
    v.push(trace(
        "gap",
        "a day, a gap of 3 days and 7 hours, another day at half the usage",
        1,
        ev,
    ));
    let mut rng = Rng(12);
    let mut ev = samples(&mut rng, T0, 2 * DAY, MIN, |r, _| {
        (r.range(200, 600), r.range(300 * MIB, 600 * MIB))
    });
    // swap 5 % of neighbouring events (both kinds) and repeat 2 % of them
    let mut i = 0;
    while i + 2 < ev.len() {
        if rng.unit() < 0.05 {
            ev.swap(i, i + 2);
        }
        if rng.unit() < 0.02 {
            let dup = ev[i].clone();
            ev.insert(i + 1, dup);
            i += 1;
        }
        i += 1;
    }
    v.push(trace(
        "out-of-order",
        "2 days with 5 % of samples swapped with a neighbour and 2 % repeated",
        1,
        ev,
    ));
    let mut rng = Rng(13);
    let mut ev = vec![mem(T0, 2 * GIB)];
    ev.extend(samples(&mut rng, T0 + MIN, 12 * DAY, 10 * MIN, |r, _| {
        (r.range(200, 300), r.range(300 * MIB, 320 * MIB))
    }));
    v.push(trace(
        "old-peak-decays",
        "a 2 GiB peak on day 0, then 12 days at about 300 MiB",
        1,
        ev,
    ));
    let mut rng = Rng(14);
    let mut ev = vec![mem(T0, 0)];
    ev.extend(samples(&mut rng, T0 + MIN, 2 * DAY, MIN, |r, _| {
        (r.range(200, 300), r.range(500 * MIB, 600 * MIB))
    }));
    v.push(trace(
        "zero-first-memory-sample",
        "the first memory sample is 0 bytes (VPA keeps that interval's peak at 0)",
        1,
        ev,
    ));
    let mut rng = Rng(15);
    v.push(trace(
        "sample-every-10s",
        "1 day at the agent's default 10 s interval (6 samples a minute)",
        1,
        samples(&mut rng, T0, DAY, 10_000, |r, t| {
            let d = daily(t);
            (
                50 + (100.0 * d) as i64 + r.range(0, 10),
                100 * MIB + r.range(0, 20 * MIB),
            )
        }),
    ));
    v
}

/// What nodewarden makes of a trace.
struct Ours {
    estimate: Estimate,
    /// What the agent would publish, with no cap known.
    published: Option<Entry>,
    confidence: f64,
    sample_count: u64,
    ooms_accepted: u64,
}

fn replay(cfg: &EstimatorConfig, t: &Trace) -> anyhow::Result<Ours> {
    let mut h = History::new(cfg)?;
    let mut ooms = 0;
    for e in &t.events {
        match e.kind {
            "cpu" => {
                h.add_cpu(cfg, e.t, e.milli as f64 / 1000.0);
            }
            "memory" => {
                h.add_memory(cfg, e.t, e.bytes as f64);
            }
            "oom" => {
                if h.record_oom(cfg, e.t, e.bytes as f64).is_some() {
                    ooms += 1;
                }
            }
            k => anyhow::bail!("unknown kind {k}"),
        }
    }
    let estimate = h.estimate(cfg, t.containers);
    Ok(Ours {
        published: figures::entry(
            &estimate,
            &h,
            &Policy::default(),
            (None, None),
            Figures::default(),
        ),
        estimate,
        confidence: h.confidence(cfg),
        sample_count: h.sample_count,
        ooms_accepted: ooms,
    })
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The VPA program: `$NODEWARDEN_VPA_RECOMMEND`, else built (or found cached) by
/// `tests/vpa/build-recommend.sh`. `None`: no Go here and not under CI.
fn vpa_program() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NODEWARDEN_VPA_RECOMMEND") {
        return Some(PathBuf::from(p));
    }
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let has_go = Command::new("go")
        .arg("version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_go {
        assert!(
            !ci,
            "vpa_differential: `go` is not on the PATH; the differential test against VPA needs Go \
             (the version in tests/vpa/go.mod or newer) to build tests/vpa/cmd/recommend"
        );
        eprintln!("vpa_differential: SKIPPED, `go` is not on the PATH (under CI=true this fails)");
        return None;
    }
    let script = repo_root().join("tests/vpa/build-recommend.sh");
    let started = Instant::now();
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("vpa_differential: cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "vpa_differential: building VPA's recommender with {} failed ({}); see the Go errors above",
        script.display(),
        out.status
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let dir = stdout
        .lines()
        .last()
        .unwrap_or_else(|| panic!("vpa_differential: {} printed no folder", script.display()));
    eprintln!(
        "vpa_differential: VPA program ready in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Some(Path::new(dir.trim()).join("vpa-recommend"))
}

fn run_vpa(program: &Path, traces: &[Trace]) -> anyhow::Result<Vec<VpaResult>> {
    use anyhow::Context as _;
    let mut child = Command::new(program)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("cannot start {}", program.display()))?;
    let input = serde_json::to_vec(&Input { traces })?;
    let mut stdin = child.stdin.take().context("no stdin")?;
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output()?;
    writer
        .join()
        .map_err(|_| anyhow::anyhow!("the stdin writer panicked"))?
        .context("writing the traces")?;
    anyhow::ensure!(
        out.status.success(),
        "{} failed ({})",
        program.display(),
        out.status
    );
    let parsed: Output = serde_json::from_slice(&out.stdout).context("reading VPA's results")?;
    Ok(parsed.results)
}

/// Checks one figure: `ours` (fractional units) against VPA's whole `vpa` units, given the
/// confidence factor applied after the margin (`None` for a target).
fn check(what: &str, ours: f64, vpa: i64, factor: Option<f64>, problems: &mut Vec<String>) {
    let vpa = vpa as f64;
    // float noise of the products, relative
    let noise = 1e-9 * vpa.abs().max(1.0);
    let tol = match factor {
        None => 2.15,
        Some(f) => 2.15 * f + 1.0,
    };
    if ours < vpa - noise || ours - vpa >= tol + noise {
        problems.push(format!(
            "{what}: nodewarden {ours:.3}, VPA {vpa} (allowed: VPA ≤ nodewarden < VPA + {tol:.3})"
        ));
    }
}

/// The published entry departs from the estimate only where VPA's figure is absent (no CPU
/// sample: no entry) or unbounded (no confidence: no upper bound); elsewhere it is the estimate
/// rounded up, with nothing capped.
fn check_published(ours: &Ours, problems: &mut Vec<String>) {
    let Some(published) = &ours.published else {
        if ours.sample_count != 0 {
            problems.push(format!(
                "nothing published with {} CPU samples",
                ours.sample_count
            ));
        }
        // skipped: VPA's recommender has no recommendation without a CPU sample
        return;
    };
    if ours.sample_count == 0 && published.oom_count == 0 {
        problems.push("published without a CPU sample or an OOM kill".to_string());
    }
    let up = |v: f64| Some(v.ceil() as u64);
    let e = &ours.estimate;
    let figures = |r: nodewarden_estimator::recommender::Resources| Figures {
        cpu_milli: up(r.cpu_cores * 1000.0).filter(|_| ours.sample_count > 0),
        memory_bytes: up(r.memory_bytes),
    };
    if published.target != figures(e.target) || published.lower != figures(e.lower_bound) {
        problems.push(format!(
            "published target/lower {:?}/{:?} are not the estimate's {:?}/{:?}",
            published.target, published.lower, e.target, e.lower_bound
        ));
    }
    // skipped where VPA's upper bound is unbounded (no confidence): nodewarden has none
    let want_upper = e.upper_bound.map(figures);
    if published.upper != want_upper || published.capped.is_some() {
        problems.push(format!(
            "published upper {:?} (capped {:?}) is not the estimate's {want_upper:?}",
            published.upper, published.capped
        ));
    }
}

fn ceil_i64(v: f64) -> i64 {
    v.ceil() as i64
}

const BEGIN: &str = "<!-- vpa-differential:begin -->";
const END: &str = "<!-- vpa-differential:end -->";

#[test]
fn nodewarden_agrees_with_vpa_recommender() {
    let Some(program) = vpa_program() else { return };
    let cfg = EstimatorConfig::default();
    let traces = traces();
    let started = Instant::now();
    let vpa = run_vpa(&program, &traces).expect("vpa_differential: running VPA's program");
    let vpa_secs = started.elapsed().as_secs_f64();
    assert_eq!(vpa.len(), traces.len(), "one VPA result per trace");
    let mut problems = Vec::new();
    let mut rows = Vec::new();
    for (t, v) in traces.iter().zip(&vpa) {
        assert_eq!(t.name, v.name);
        let ours = replay(&cfg, t).expect("replaying through nodewarden");
        let e = ours.estimate;
        let mut p = Vec::new();
        if ours.sample_count != v.sample_count {
            p.push(format!(
                "CPU samples taken: nodewarden {}, VPA {}",
                ours.sample_count, v.sample_count
            ));
        }
        if ours.ooms_accepted != v.ooms_accepted {
            p.push(format!(
                "OOM kills taken: nodewarden {}, VPA {}",
                ours.ooms_accepted, v.ooms_accepted
            ));
        }
        let c = ours.confidence;
        check_published(&ours, &mut p);
        let (up_f, low_f) = if c > 0.0 {
            (1.0 + 1.0 / c, (1.0 + 0.001 / c).powi(-2))
        } else {
            (f64::INFINITY, 0.0)
        };
        check(
            "CPU target (m)",
            e.target.cpu_cores * 1000.0,
            v.target.cpu_milli,
            None,
            &mut p,
        );
        check(
            "memory target (B)",
            e.target.memory_bytes,
            v.target.memory_bytes,
            None,
            &mut p,
        );
        check(
            "CPU lower bound (m)",
            e.lower_bound.cpu_cores * 1000.0,
            v.lower_bound.cpu_milli,
            Some(low_f),
            &mut p,
        );
        check(
            "memory lower bound (B)",
            e.lower_bound.memory_bytes,
            v.lower_bound.memory_bytes,
            Some(low_f),
            &mut p,
        );
        let share = 1.0 / t.containers as f64;
        match e.upper_bound {
            Some(u) => {
                check(
                    "CPU upper bound (m)",
                    u.cpu_cores * 1000.0,
                    v.upper_bound.cpu_milli,
                    Some(up_f),
                    &mut p,
                );
                check(
                    "memory upper bound (B)",
                    u.memory_bytes,
                    v.upper_bound.memory_bytes,
                    Some(up_f),
                    &mut p,
                );
            }
            None => {
                // VPA: the largest amount, or the floor when that histogram is empty
                let cpu_floor = (25.0 * share) as i64;
                let mem_floor = (250.0 * MIB as f64 * share) as i64;
                if c != 0.0
                    || ![VPA_MAX, cpu_floor].contains(&v.upper_bound.cpu_milli)
                    || ![VPA_MAX, mem_floor].contains(&v.upper_bound.memory_bytes)
                {
                    p.push(format!(
                        "no upper bound from nodewarden (confidence {c}), VPA's is {:?}",
                        v.upper_bound
                    ));
                }
            }
        }
        for msg in &p {
            problems.push(format!("{}: {msg}", t.name));
        }
        let cell = |ours: i64, vpa: i64| {
            if ours == vpa {
                format!("{ours}")
            } else {
                format!("{ours} / {vpa}")
            }
        };
        let vpa_up = |x: i64| {
            if x == VPA_MAX {
                "1e14".to_string()
            } else {
                x.to_string()
            }
        };
        let (cpu_up, mem_up) = match e.upper_bound {
            Some(u) => (
                cell(ceil_i64(u.cpu_cores * 1000.0), v.upper_bound.cpu_milli),
                cell(ceil_i64(u.memory_bytes), v.upper_bound.memory_bytes),
            ),
            None => (
                format!("— / {}", vpa_up(v.upper_bound.cpu_milli)),
                format!("— / {}", vpa_up(v.upper_bound.memory_bytes)),
            ),
        };
        let ooms = t.events.iter().filter(|e| e.kind == "oom").count();
        rows.push(format!(
            "| `{}` | {} | {} | {} of {ooms} | {:.3} | {} | {} | {} | {} | {} | {} |",
            t.name,
            t.what,
            ours.sample_count,
            cell(ours.ooms_accepted as i64, v.ooms_accepted as i64),
            c,
            cell(ceil_i64(e.target.cpu_cores * 1000.0), v.target.cpu_milli),
            cell(
                ceil_i64(e.lower_bound.cpu_cores * 1000.0),
                v.lower_bound.cpu_milli
            ),
            cpu_up,
            cell(ceil_i64(e.target.memory_bytes), v.target.memory_bytes),
            cell(ceil_i64(e.lower_bound.memory_bytes), v.lower_bound.memory_bytes),
            mem_up,
        ));
    }
    let events: usize = traces.iter().map(|t| t.events.len()).sum();
    eprintln!(
        "vpa_differential: {} traces, {events} events; VPA's program took {vpa_secs:.2} s",
        traces.len()
    );
    let table = format!(
        "{BEGIN}\n| trace | what | CPU samples | OOM kills taken | confidence (days) | CPU target (m) | CPU lower (m) | CPU upper (m) \
         | memory target (B) | memory lower (B) | memory upper (B) |\n|---|---|---|---|---|---|---|---|---|---|---|\n{}\n{END}",
        rows.join("\n")
    );
    eprintln!("{table}");
    if std::env::var("NODEWARDEN_WRITE_ESTIMATOR_TABLE").is_ok_and(|v| v == "1") {
        let doc = repo_root().join("docs/estimator.md");
        let text = std::fs::read_to_string(&doc).unwrap();
        let (a, b) = (text.find(BEGIN).unwrap(), text.find(END).unwrap() + END.len());
        let new = format!("{}{}{}", &text[..a], table, &text[b..]);
        std::fs::write(&doc, new).unwrap();
        eprintln!("vpa_differential: wrote the table into {}", doc.display());
    }
    assert!(
        problems.is_empty(),
        "nodewarden's estimator and VPA's recommender disagree:\n{}",
        problems.join("\n")
    );
}
