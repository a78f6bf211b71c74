//! VPA's own recommender model, for differential checks: `tests/vpa/cmd/recommend` (VPA's
//! `model.ContainerState`, `AggregateContainerState` and the estimators of
//! `logic.CreatePodResourceRecommender` with the recommender's defaults) replays usage traces
//! given as JSON and prints its figures, exactly as VPA's model holds them (whole millicores and
//! bytes, before any rendering). Built (or found cached) by `tests/vpa/build-recommend.sh`.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, ensure};
use serde::{Deserialize, Serialize};

/// One sample or event of a trace, fed to VPA's model in the order given.
#[derive(Clone, Debug, Serialize)]
pub struct Event {
    /// Unix milliseconds.
    pub t: i64,
    /// `cpu` (`milli`: usage in millicores), `memory` (`bytes`: the working set) or `oom`
    /// (`bytes`: the container's memory request).
    pub kind: &'static str,
    /// Millicores, for `cpu`.
    pub milli: i64,
    /// Bytes, for `memory` and `oom`.
    pub bytes: i64,
}

impl Event {
    /// A CPU sample of `milli` millicores at `t`.
    pub fn cpu(t: i64, milli: i64) -> Self {
        Event {
            t,
            kind: "cpu",
            milli,
            bytes: 0,
        }
    }

    /// A working-set sample of `bytes` at `t`.
    pub fn memory(t: i64, bytes: i64) -> Self {
        Event {
            t,
            kind: "memory",
            milli: 0,
            bytes,
        }
    }

    /// An OOM kill at `t` of a container that requested `request_bytes`.
    pub fn oom(t: i64, request_bytes: i64) -> Self {
        Event {
            t,
            kind: "oom",
            milli: 0,
            bytes: request_bytes,
        }
    }
}

/// One container's history, as one `ContainerState` of one `AggregateContainerState`.
#[derive(Clone, Debug, Serialize)]
pub struct Trace {
    /// Its name, echoed in the result.
    pub name: String,
    /// Containers in the pod (VPA shares the per-pod floors among them).
    pub containers: usize,
    /// Its events, in the order fed.
    pub events: Vec<Event>,
}

/// Whole millicores and bytes.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Amounts {
    /// CPU, millicores.
    pub cpu_milli: i64,
    /// Memory, bytes.
    pub memory_bytes: i64,
}

/// VPA's figures for one trace.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Recommendation {
    /// The trace's name.
    pub name: String,
    /// The target.
    pub target: Amounts,
    /// The lower bound.
    pub lower_bound: Amounts,
    /// The upper bound.
    pub upper_bound: Amounts,
    /// CPU samples the model took.
    pub sample_count: u64,
    /// OOM kills the model took.
    pub ooms_accepted: u64,
}

#[derive(Serialize)]
struct Input<'a> {
    traces: &'a [Trace],
}

#[derive(Deserialize)]
struct Output {
    results: Vec<Recommendation>,
}

/// The `vpa-recommend` program, built (or found cached) by `tests/vpa/build-recommend.sh`.
pub fn program() -> Result<PathBuf> {
    Ok(crate::process::cached_build("vpa/build-recommend.sh", &["vpa-recommend"])?.join("vpa-recommend"))
}

/// VPA's figures for each of `traces`, in their order.
pub fn recommend(traces: &[Trace]) -> Result<Vec<Recommendation>> {
    let program = program()?;
    let mut child = Command::new(&program)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", program.display()))?;
    let input = serde_json::to_vec(&Input { traces })?;
    let mut stdin = child.stdin.take().context("no stdin")?;
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output()?;
    writer
        .join()
        .map_err(|_| anyhow::anyhow!("the stdin writer panicked"))?
        .context("writing the traces")?;
    ensure!(
        out.status.success(),
        "{} failed ({}): {}",
        program.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let parsed: Output = serde_json::from_slice(&out.stdout).context("reading VPA's results")?;
    ensure!(
        parsed.results.len() == traces.len(),
        "{} results for {} traces",
        parsed.results.len(),
        traces.len()
    );
    Ok(parsed.results)
}
