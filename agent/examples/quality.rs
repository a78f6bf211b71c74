//! How much better per-node sizing is than one DaemonSet-wide figure, on synthetic traces.
//!
//! ```sh
//! cargo run --release -p nodewarden-agent --example quality -- --seed 1 --svg docs/quality.svg
//! ```
//!
//! One DaemonSet container (a log shipper: template 250m / 300Mi, limits 500m / 600Mi) on
//! `--nodes` heterogeneous nodes for `--days`, one sample a minute. Four policies see the same
//! demand and set the container's request (limits keep the template's 1:2 ratio):
//!
//! - `template`: the template's requests, always;
//! - `vpa-wide`: one DaemonSet-wide figure, the agent's estimator (VPA's) fed every node's samples;
//! - `per-node (template)` and `per-node (fleet)`: nodewarden, the estimator per node; a node that
//!   joins gets the template's requests, or the fleet figure (p90 of the other nodes' targets),
//!   until its first figure.
//!
//! Requests follow the estimate every hour (as with `InPlace`). Each policy's estimator sees
//! the usage its own limits allow: CPU above the limit is throttled (that minute counts as a
//! throttled interval, usage is the limit), memory above the limit is an OOM kill (counted,
//! then five minutes of restart in which no further kill counts; the estimator gets VPA's OOM
//! bump).
//!
//! The traces (seeded, see `Node::new`): node sizes are skewed (70 % small, 20 % medium, 10 % hot
//! nodes), load follows a daily cycle with a phase per node, bursts triple CPU and add 30 % memory
//! for 5–15 minutes, and every day two nodes are replaced by new ones (churn). Figures per
//! policy: requested-but-unused CPU core-hours and memory GiB-hours, node-hours with usage above
//! the request (under-provisioned), OOM kills and throttled minutes.

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::Parser;
use nodewarden_estimator::histogram::DecayingHistogram;
use nodewarden_estimator::recommender::{EstimatorConfig, History};

#[derive(Parser)]
struct Args {
    /// Nodes the DaemonSet runs on.
    #[arg(long, default_value_t = 40, env = "NODEWARDEN_QUALITY_NODES", value_parser = clap::value_parser!(u32).range(2..=2000))]
    nodes: u32,
    /// Days simulated (after one day of warm-up that is not counted).
    #[arg(long, default_value_t = 14, env = "NODEWARDEN_QUALITY_DAYS", value_parser = clap::value_parser!(u32).range(1..=90))]
    days: u32,
    /// Seed of the traces; the same seed gives the same figures.
    #[arg(long, default_value_t = 1, env = "NODEWARDEN_QUALITY_SEED")]
    seed: u64,
    /// Also write an SVG chart of the figures here.
    #[arg(long, env = "NODEWARDEN_QUALITY_SVG")]
    svg: Option<PathBuf>,
}

const MINUTE_MS: i64 = 60_000;
const MIB: f64 = 1024.0 * 1024.0;
const GIB: f64 = 1024.0 * MIB;
const TEMPLATE_CPU: f64 = 0.25;
const TEMPLATE_MEM: f64 = 300.0 * MIB;
const LIMIT_RATIO: f64 = 2.0;

/// SplitMix64: a small deterministic generator, enough for traces.
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

    fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }
}

/// One node's load: size, phase of its daily cycle, and the burst it is in.
struct Node {
    size: f64,
    phase: f64,
    burst_left: u32,
}

impl Node {
    fn new(rng: &mut Rng) -> Self {
        let kind = rng.unit();
        let size = if kind < 0.7 {
            rng.range(0.2, 0.6)
        } else if kind < 0.9 {
            rng.range(0.6, 1.2)
        } else {
            rng.range(2.0, 3.5)
        };
        Node {
            size,
            phase: rng.range(0.0, std::f64::consts::TAU),
            burst_left: 0,
        }
    }

    /// CPU demand (cores) and working set (bytes) at minute `m`.
    fn demand(&mut self, m: i64, rng: &mut Rng) -> (f64, f64) {
        if self.burst_left == 0 && rng.unit() < 0.002 {
            self.burst_left = 5 + (rng.next() % 11) as u32;
        }
        let burst = self.burst_left > 0;
        self.burst_left = self.burst_left.saturating_sub(1);
        let day = (m as f64 / 1440.0) * std::f64::consts::TAU + self.phase;
        let cycle = 1.0 + 0.6 * day.sin();
        let cpu = 0.08 * self.size * cycle * rng.range(0.85, 1.15) * if burst { 3.0 } else { 1.0 };
        let mem = (60.0 * MIB + 120.0 * MIB * self.size * (1.0 + 0.25 * day.sin()) + 40.0 * MIB * rng.unit())
            * if burst { 1.3 } else { 1.0 };
        (cpu, mem)
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Policy {
    Template,
    VpaWide,
    NodeTemplate,
    NodeFleet,
}

const POLICIES: [Policy; 4] = [
    Policy::Template,
    Policy::VpaWide,
    Policy::NodeTemplate,
    Policy::NodeFleet,
];

impl Policy {
    fn name(self) -> &'static str {
        match self {
            Policy::Template => "template",
            Policy::VpaWide => "vpa-wide",
            Policy::NodeTemplate => "per-node (template)",
            Policy::NodeFleet => "per-node (fleet)",
        }
    }
}

#[derive(Default, Clone, Copy)]
struct Figures {
    unused_core_hours: f64,
    unused_gib_hours: f64,
    under_hours: f64,
    oom_kills: u64,
    throttled_minutes: u64,
}

/// VPA's DaemonSet-wide aggregate: every node's CPU samples in one histogram, and one memory
/// peak per node and interval (VPA keeps the peak window per container instance and adds each
/// peak to the aggregate), with the estimator's target rule (percentile × (1 + margin), floors).
struct Wide {
    cpu: DecayingHistogram,
    memory: DecayingHistogram,
    /// Per node: (peak in the current interval, end of that interval).
    peaks: Vec<(f64, i64)>,
}

impl Wide {
    fn new(cfg: &EstimatorConfig, nodes: usize) -> anyhow::Result<Self> {
        let h = |o, half| DecayingHistogram::new(o, half).map_err(|e| anyhow::anyhow!("histogram: {e}"));
        Ok(Wide {
            cpu: h(cfg.cpu_options, cfg.cpu_half_life_ms)?,
            memory: h(cfg.memory_options, cfg.memory_half_life_ms)?,
            peaks: vec![(0.0, 0); nodes],
        })
    }

    fn add(&mut self, cfg: &EstimatorConfig, node: usize, at: i64, cpu: f64, memory: f64) {
        self.cpu.add_sample(cpu, cfg.min_cpu_sample_weight, at);
        self.add_memory(cfg, node, at, memory);
    }

    fn add_memory(&mut self, cfg: &EstimatorConfig, node: usize, at: i64, memory: f64) {
        let (peak, end) = &mut self.peaks[node];
        if at >= *end {
            *end = at - at.rem_euclid(cfg.memory_interval_ms) + cfg.memory_interval_ms;
            *peak = 0.0;
        }
        if memory > *peak {
            if *peak > 0.0 {
                self.memory.subtract_sample(*peak, 1.0, *end);
            }
            self.memory.add_sample(memory, 1.0, *end);
            *peak = memory;
        }
    }

    /// VPA's OOM bump: a memory sample of max(used + min bump, used × ratio).
    fn oom(&mut self, cfg: &EstimatorConfig, node: usize, at: i64, request: f64) {
        let used = request.max(self.peaks[node].0);
        let bumped = (used + cfg.oom_min_bump_bytes).max(used * cfg.oom_bump_ratio);
        self.add_memory(cfg, node, at, bumped);
    }

    fn target(&self, cfg: &EstimatorConfig) -> (f64, f64) {
        let margin = 1.0 + cfg.safety_margin;
        (
            (self.cpu.percentile(cfg.target_percentile) * margin).max(cfg.pod_min_cpu_cores),
            (self.memory.percentile(cfg.target_percentile) * margin).max(cfg.pod_min_memory_bytes),
        )
    }
}

/// One policy's state on one node.
struct Slot {
    request: (f64, f64),
    history: Option<History>,
    restart_left: u32,
}

fn fresh_history(cfg: &EstimatorConfig) -> anyhow::Result<History> {
    History::new(cfg).map_err(|e| anyhow::anyhow!("estimator settings: {e}"))
}

fn p90(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64) * 0.9).ceil() as usize;
    v.get(i.saturating_sub(1).min(v.len() - 1)).copied()
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let cfg = EstimatorConfig::default();
    let mut rng = Rng(args.seed);
    let n = args.nodes as usize;
    let mut nodes: Vec<Node> = (0..n).map(|_| Node::new(&mut rng)).collect();
    let mut slots: Vec<Vec<Slot>> = Vec::with_capacity(POLICIES.len());
    for p in POLICIES {
        let mut row = Vec::with_capacity(n);
        for _ in 0..n {
            let history = match p {
                Policy::NodeTemplate | Policy::NodeFleet => Some(fresh_history(&cfg)?),
                _ => None,
            };
            row.push(Slot {
                request: (TEMPLATE_CPU, TEMPLATE_MEM),
                history,
                restart_left: 0,
            });
        }
        slots.push(row);
    }
    let mut wide = Wide::new(&cfg, n)?;
    let mut figures = [Figures::default(); 4];
    let warmup = 1440_i64;
    let total = warmup + 1440 * i64::from(args.days);
    let t0 = 1_700_000_000_000_i64;

    for m in 0..total {
        let at = t0 + m * MINUTE_MS;
        // churn: two nodes replaced at every midnight after the first
        if m > 0 && m % 1440 == 0 {
            for _ in 0..2 {
                let i = (rng.next() % n as u64) as usize;
                nodes[i] = Node::new(&mut rng);
                for (pi, p) in POLICIES.iter().enumerate() {
                    let request = match p {
                        Policy::Template | Policy::NodeTemplate => (TEMPLATE_CPU, TEMPLATE_MEM),
                        Policy::VpaWide => slots[pi][(i + 1) % n].request,
                        Policy::NodeFleet => {
                            let row = &slots[pi];
                            let others = |f: fn(&(f64, f64)) -> f64| {
                                p90((0..n).filter(|&j| j != i).map(|j| f(&row[j].request)).collect())
                            };
                            (
                                others(|r| r.0).unwrap_or(TEMPLATE_CPU),
                                others(|r| r.1).unwrap_or(TEMPLATE_MEM),
                            )
                        }
                    };
                    let slot = &mut slots[pi][i];
                    slot.restart_left = 0;
                    slot.request = request;
                    if slot_has_history(*p) {
                        slot.history = Some(fresh_history(&cfg)?);
                    }
                }
            }
        }
        // requests follow the estimates every hour
        if m % 60 == 0 && m > 0 {
            let w = wide.target(&cfg);
            for (pi, p) in POLICIES.iter().enumerate() {
                for slot in slots[pi].iter_mut() {
                    match p {
                        Policy::Template => {}
                        Policy::VpaWide => slot.request = w,
                        Policy::NodeTemplate | Policy::NodeFleet => {
                            if let Some(h) = slot.history.as_ref().filter(|h| !h.is_empty()) {
                                let e = h.estimate(&cfg, 1).target;
                                slot.request = (e.cpu_cores, e.memory_bytes);
                            }
                        }
                    }
                }
            }
        }
        for (i, node) in nodes.iter_mut().enumerate() {
            let (cpu, mem) = node.demand(m, &mut rng);
            for (pi, p) in POLICIES.iter().enumerate() {
                let slot = &mut slots[pi][i];
                let (req_cpu, req_mem) = slot.request;
                let (lim_cpu, lim_mem) = (req_cpu * LIMIT_RATIO, req_mem * LIMIT_RATIO);
                let used_cpu = cpu.min(lim_cpu);
                let throttled = cpu > lim_cpu;
                let mut oom = false;
                let used_mem = if mem > lim_mem {
                    oom = slot.restart_left == 0;
                    if oom {
                        slot.restart_left = 5;
                    }
                    lim_mem
                } else {
                    mem
                };
                slot.restart_left = slot.restart_left.saturating_sub(1);
                if *p == Policy::VpaWide {
                    wide.add(&cfg, i, at, used_cpu, used_mem);
                    if oom {
                        wide.oom(&cfg, i, at, req_mem);
                    }
                }
                if let Some(h) = slot.history.as_mut() {
                    h.add_cpu(&cfg, at, used_cpu);
                    h.add_memory(&cfg, at, used_mem);
                    if oom {
                        h.record_oom(&cfg, at, req_mem);
                    }
                }
                if m >= warmup {
                    let f = &mut figures[pi];
                    f.unused_core_hours += (req_cpu - used_cpu).max(0.0) / 60.0;
                    f.unused_gib_hours += (req_mem - used_mem).max(0.0) / GIB / 60.0;
                    if cpu > req_cpu || mem > req_mem {
                        f.under_hours += 1.0 / 60.0;
                    }
                    f.oom_kills += u64::from(oom);
                    f.throttled_minutes += u64::from(throttled);
                }
            }
        }
    }

    println!(
        "nodes {}, days {} (+1 warm-up), seed {}, one sample a minute; template {}m / {}Mi, limits ×{LIMIT_RATIO}",
        args.nodes,
        args.days,
        args.seed,
        (TEMPLATE_CPU * 1000.0) as u64,
        (TEMPLATE_MEM / MIB) as u64
    );
    println!(
        "{:<22} {:>18} {:>18} {:>16} {:>10} {:>16}",
        "policy", "unused CPU core-h", "unused mem GiB-h", "under-prov. h", "OOM kills", "throttled min"
    );
    for (p, f) in POLICIES.iter().zip(&figures) {
        println!(
            "{:<22} {:>18.1} {:>18.1} {:>16.1} {:>10} {:>16}",
            p.name(),
            f.unused_core_hours,
            f.unused_gib_hours,
            f.under_hours,
            f.oom_kills,
            f.throttled_minutes
        );
    }
    if let Some(path) = &args.svg {
        std::fs::write(path, svg(&args, &figures))
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

fn slot_has_history(p: Policy) -> bool {
    matches!(p, Policy::NodeTemplate | Policy::NodeFleet)
}

/// A chart panel: its title and the figure it shows.
type Panel = (&'static str, fn(&Figures) -> f64);

/// One panel per figure, one bar per policy, each panel scaled to its own largest value.
fn svg(args: &Args, figures: &[Figures; 4]) -> String {
    let colors = ["#9e9e9e", "#ff7f0e", "#1f77b4", "#2ca02c"];
    let panels: [Panel; 5] = [
        ("unused CPU core-h", |f| f.unused_core_hours),
        ("unused memory GiB-h", |f| f.unused_gib_hours),
        ("under-provisioned h", |f| f.under_hours),
        ("OOM kills", |f| f.oom_kills as f64),
        ("throttled minutes", |f| f.throttled_minutes as f64),
    ];
    let (pw, ph, top) = (170.0, 190.0, 70.0);
    let width = pw * panels.len() as f64 + 20.0;
    let height = top + ph + 60.0;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(
        s,
        r#"<text x="10" y="18" font-size="14" font-weight="600">Per-node vs DaemonSet-wide sizing: {} nodes, {} days, seed {} (lower is better)</text>"#,
        args.nodes, args.days, args.seed
    );
    for (i, p) in POLICIES.iter().enumerate() {
        let x = 10.0 + 170.0 * i as f64;
        let _ = write!(
            s,
            r#"<rect x="{x}" y="30" width="10" height="10" fill="{}"/><text x="{}" y="39">{}</text>"#,
            colors[i],
            x + 14.0,
            p.name()
        );
    }
    for (pi, (title, get)) in panels.iter().enumerate() {
        let x0 = 10.0 + pw * pi as f64;
        let max = figures.iter().map(get).fold(0.0_f64, f64::max).max(1e-9);
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" font-weight="600">{title}</text>"#,
            x0,
            top - 8.0
        );
        let bw = (pw - 30.0) / 4.0;
        for (i, f) in figures.iter().enumerate() {
            let v = get(f);
            let h = (ph - 20.0) * v / max;
            let x = x0 + i as f64 * bw;
            let y = top + ph - 20.0 - h;
            let _ = write!(
                s,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{h:.1}" fill="{}"><title>{}: {v:.1}</title></rect>"#,
                bw - 4.0,
                colors[i],
                POLICIES[i].name()
            );
            let label = if v >= 100.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.1}")
            };
            let _ = write!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="9">{label}</text>"#,
                x + (bw - 4.0) / 2.0,
                y - 3.0
            );
        }
        let _ = write!(
            s,
            r##"<line x1="{x0}" x2="{}" y1="{}" y2="{}" stroke="#333"/>"##,
            x0 + pw - 30.0,
            top + ph - 20.0,
            top + ph - 20.0
        );
    }
    let _ = write!(
        s,
        r#"<text x="10" y="{}" font-size="10">cargo run --release -p nodewarden-agent --example quality -- --nodes {} --days {} --seed {}</text>"#,
        height - 12.0,
        args.nodes,
        args.days,
        args.seed
    );
    s.push_str("</svg>\n");
    s
}
