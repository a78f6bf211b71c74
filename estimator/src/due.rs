//! Whether a node's figures are due to be written again: a material change at once (the set
//! of containers, a target moved past the threshold, a request crossing a bound), otherwise
//! only at the refresh interval. Pure: the agent's publisher acts on the answer.

use crate::figures::{Entry, Figures, Snapshot};

/// Why a write is due.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Nothing was written yet and there is something to write.
    First,
    /// The set of containers changed.
    ContainersChanged,
    /// A target moved by more than the change threshold.
    TargetMoved {
        /// The container.
        container: String,
        /// `cpu` or `memory`.
        resource: &'static str,
    },
    /// The current request moved to another side of the [lower, upper] range.
    BoundCrossedRequest {
        /// The container.
        container: String,
        /// `cpu` or `memory`.
        resource: &'static str,
    },
    /// Nothing material changed, but the refresh interval passed.
    Refresh,
}

impl Reason {
    /// The reason as a metric label value (`first`, `containers-changed`, …).
    pub fn as_str(&self) -> &'static str {
        match self {
            Reason::First => "first",
            Reason::ContainersChanged => "containers-changed",
            Reason::TargetMoved { .. } => "target-moved",
            Reason::BoundCrossedRequest { .. } => "bound-crossed-request",
            Reason::Refresh => "refresh",
        }
    }
}

/// Where a request sits relative to [lower, upper].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Below,
    Within,
    Above,
}

fn side(request: Option<u64>, lower: Option<u64>, upper: Option<Option<u64>>) -> Option<Side> {
    let r = request?;
    if lower.is_some_and(|l| r < l) {
        Some(Side::Below)
    } else if upper.flatten().is_some_and(|u| r > u) {
        Some(Side::Above)
    } else {
        Some(Side::Within)
    }
}

fn moved(old: Option<u64>, new: Option<u64>, threshold: f64) -> bool {
    match (old, new) {
        (Some(o), Some(n)) => {
            let (o, n) = (o as f64, n as f64);
            if o == 0.0 {
                n != 0.0
            } else {
                ((n - o) / o).abs() > threshold
            }
        }
        (None, None) => false,
        _ => true,
    }
}

/// The resources compared, with the figure of each.
type Pick = fn(&Figures) -> Option<u64>;
const RESOURCES: [(&str, Pick); 2] = [("cpu", |f| f.cpu_milli), ("memory", |f| f.memory_bytes)];

fn request_of(e: &Entry, resource: &str) -> Option<u64> {
    if resource == "cpu" {
        e.request_cpu_milli
    } else {
        e.request_memory_bytes
    }
}

/// Whether to write `next`, given what was last written (`prev`, at `prev_ms`).
///
/// Material changes: the set of containers changed; a target moved by more than `threshold`
/// (0.1 = 10 %); or the current request moved to the other side of a bound (lower bound now
/// above the request, upper bound now below it, or back). Otherwise only once `refresh_ms`
/// passed since the last write. An empty snapshot is never written first.
pub fn decide(
    prev: Option<(&Snapshot, i64)>,
    next: &Snapshot,
    now_ms: i64,
    threshold: f64,
    refresh_ms: i64,
) -> Option<Reason> {
    let Some((prev, prev_ms)) = prev else {
        return (!next.is_empty()).then_some(Reason::First);
    };
    if prev.len() != next.len() || prev.keys().zip(next.keys()).any(|(a, b)| a != b) {
        return Some(Reason::ContainersChanged);
    }
    for (key, n) in next {
        let Some(p) = prev.get(key) else {
            return Some(Reason::ContainersChanged);
        };
        for (resource, pick) in RESOURCES {
            if moved(pick(&p.target), pick(&n.target), threshold) {
                return Some(Reason::TargetMoved {
                    container: key.container.clone(),
                    resource,
                });
            }
        }
        for (resource, pick) in RESOURCES {
            let before = side(
                request_of(p, resource),
                pick(&p.lower),
                p.upper.as_ref().map(pick),
            );
            let now = side(
                request_of(n, resource),
                pick(&n.lower),
                n.upper.as_ref().map(pick),
            );
            if before.is_some() && now.is_some() && before != now {
                return Some(Reason::BoundCrossedRequest {
                    container: key.container.clone(),
                    resource,
                });
            }
        }
    }
    (now_ms - prev_ms >= refresh_ms).then_some(Reason::Refresh)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::figures::tests::{sized as entry, snap};

    #[test]
    fn publish_decision_table() {
        const HOUR: i64 = 3_600_000;
        let base = snap(&[("app", entry(100, 1000))]);
        let with = |f: &dyn Fn(&mut Entry)| {
            let mut e = entry(100, 1000);
            f(&mut e);
            snap(&[("app", e)])
        };
        // (case, last written, now, now_ms, expected reason)
        type Case<'a> = (&'a str, Option<&'a Snapshot>, Snapshot, i64, Option<&'a str>);
        let cases: Vec<Case> = vec![
            ("nothing yet, nothing to say", None, Snapshot::new(), 0, None),
            ("first figures", None, base.clone(), 0, Some("first")),
            ("unchanged", Some(&base), base.clone(), 10, None),
            (
                "cpu target +10 % exactly",
                Some(&base),
                with(&|e| e.target.cpu_milli = Some(110)),
                10,
                None,
            ),
            (
                "cpu target +11 %",
                Some(&base),
                with(&|e| e.target.cpu_milli = Some(111)),
                10,
                Some("target-moved"),
            ),
            (
                "memory target −11 %",
                Some(&base),
                with(&|e| e.target.memory_bytes = Some(890)),
                10,
                Some("target-moved"),
            ),
            (
                "memory target −5 %",
                Some(&base),
                with(&|e| e.target.memory_bytes = Some(950)),
                10,
                None,
            ),
            (
                "lower bound rises above the request",
                Some(&base),
                with(&|e| e.lower.cpu_milli = Some(101)),
                10,
                Some("bound-crossed-request"),
            ),
            (
                "upper bound falls below the memory request",
                Some(&base),
                with(&|e| {
                    e.upper = Some(Figures {
                        cpu_milli: Some(200),
                        memory_bytes: Some(999),
                    })
                }),
                10,
                Some("bound-crossed-request"),
            ),
            (
                "bounds move but the request stays within",
                Some(&base),
                with(&|e| e.lower.cpu_milli = Some(90)),
                10,
                None,
            ),
            (
                "a resource stops being controlled",
                Some(&base),
                with(&|e| e.target.cpu_milli = None),
                10,
                Some("target-moved"),
            ),
            (
                "a container appears",
                Some(&base),
                snap(&[("app", entry(100, 1000)), ("side", entry(1, 1))]),
                10,
                Some("containers-changed"),
            ),
            (
                "all containers gone",
                Some(&base),
                Snapshot::new(),
                10,
                Some("containers-changed"),
            ),
            (
                "unchanged, refresh due",
                Some(&base),
                base.clone(),
                HOUR,
                Some("refresh"),
            ),
            (
                "unchanged, refresh not yet due",
                Some(&base),
                base.clone(),
                HOUR - 1,
                None,
            ),
        ];
        for (name, prev, next, now, want) in cases {
            let got = decide(prev.map(|p| (p, 0)), &next, now, 0.1, HOUR);
            assert_eq!(got.as_ref().map(Reason::as_str), want, "{name}");
        }
    }
}
