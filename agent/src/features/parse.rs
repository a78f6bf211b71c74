//! The pure part: Prometheus text (or OpenMetrics) → gates, and the report built from them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use nodewarden_api::features::{ComponentReport, GateState, NodeFeatureReportSpec};

use super::scrape::ScrapeError;
use super::{AGENT, AGENT_GATES, METRIC};

/// A line of the exposition that mentions the gate metric but cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {why} (expected {METRIC}{{name=\"Gate\",stage=\"BETA\"}} 1)")]
pub struct ParseError {
    /// Line number in the exposition, from 1.
    pub line: usize,
    /// What is wrong with the line.
    pub why: String,
}

/// The feature gates in a Prometheus text exposition (or OpenMetrics text), sorted by name.
/// Other metrics, comments, `# HELP`/`# TYPE`/`# EOF` lines and timestamps are skipped. A gate
/// listed twice keeps its last value.
pub fn parse(text: &str) -> Result<Vec<GateState>, ParseError> {
    let mut gates: std::collections::BTreeMap<String, GateState> = std::collections::BTreeMap::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        let Some(rest) = line.strip_prefix(METRIC) else {
            continue;
        };
        // not another metric that merely starts with the same name
        if !(rest.starts_with('{') || rest.starts_with(' ') || rest.starts_with('\t')) {
            continue;
        }
        let err = |why: String| ParseError { line: i + 1, why };
        let (labels, after) = if let Some(body) = rest.strip_prefix('{') {
            let (labels, consumed) = parse_labels(body).map_err(err)?;
            (labels, &body[consumed..])
        } else {
            (Vec::new(), rest)
        };
        let mut fields = after.split_whitespace();
        let value = fields.next().ok_or_else(|| err("no value".into()))?;
        let value: f64 = value
            .parse()
            .map_err(|_| err(format!("value {value:?} is not a number")))?;
        if let Some(ts) = fields.next()
            && ts.parse::<f64>().is_err()
        {
            return Err(err(format!("timestamp {ts:?} is not a number")));
        }
        let label = |k: &str| labels.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let name = label("name")
            .filter(|n| !n.is_empty())
            .ok_or_else(|| err("no name label".into()))?;
        let stage = match label("stage").unwrap_or_default().as_str() {
            "" | "GA" => "GA".to_string(),
            other => other.to_string(),
        };
        let enabled = if value == 1.0 {
            true
        } else if value == 0.0 {
            false
        } else {
            return Err(err(format!("value {value} is neither 1 nor 0")));
        };
        gates.insert(name.clone(), GateState { name, enabled, stage });
    }
    Ok(gates.into_values().collect())
}

/// Parses `name="value",...}` (after the opening brace); returns the labels and the bytes read,
/// closing brace included.
fn parse_labels(body: &str) -> Result<(Vec<(String, String)>, usize), String> {
    let bytes = body.as_bytes();
    let mut labels = Vec::new();
    let mut i = 0;
    loop {
        while i < bytes.len() && (bytes[i] == b' ' || bytes[i] == b',') {
            i += 1;
        }
        if i >= bytes.len() {
            return Err("labels are not closed with }".into());
        }
        if bytes[i] == b'}' {
            return Ok((labels, i + 1));
        }
        let start = i;
        while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
            i += 1;
        }
        let key = &body[start..i];
        if key.is_empty() {
            // the quoted text is cut by characters: a byte count may fall inside one
            let near: String = body[start..].chars().take(10).collect();
            return Err(format!("bad label name at {near:?}"));
        }
        while i < bytes.len() && bytes[i] == b' ' {
            i += 1;
        }
        if bytes.get(i) != Some(&b'=') {
            return Err(format!("label {key} has no =\"value\""));
        }
        i += 1;
        while i < bytes.len() && bytes[i] == b' ' {
            i += 1;
        }
        if bytes.get(i) != Some(&b'"') {
            return Err(format!("the value of label {key} is not quoted"));
        }
        i += 1;
        let mut value = String::new();
        let mut chars = body[i..].char_indices();
        let mut closed = None;
        while let Some((at, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, other)) => value.push(other),
                    None => break,
                },
                '"' => {
                    closed = Some(at);
                    break;
                }
                c => value.push(c),
            }
        }
        let Some(at) = closed else {
            return Err(format!("the value of label {key} is not closed"));
        };
        i += at + 1;
        labels.push((key.to_string(), value));
    }
}

/// nodewarden's own gates as a component report.
pub fn agent_component(now: Timestamp) -> ComponentReport {
    ComponentReport {
        name: AGENT.to_string(),
        observed_time: Some(Time(now)),
        error: None,
        error_reason: None,
        gates: AGENT_GATES
            .iter()
            .map(|(name, enabled, stage)| GateState {
                name: name.to_string(),
                enabled: *enabled,
                stage: stage.to_string(),
            })
            .collect(),
    }
}

/// A component's report from a scrape: its gates, or the error and what kind it is.
pub fn component(name: &str, scraped: Result<String, ScrapeError>, now: Timestamp) -> ComponentReport {
    let parsed = scraped.and_then(|text| parse(&text).map_err(|e| ScrapeError::from(e.to_string())));
    let (gates, error, error_reason) = match parsed {
        Ok(gates) => (gates, None, None),
        Err(why) => (Vec::new(), Some(why.message), Some(why.reason)),
    };
    ComponentReport {
        name: name.to_string(),
        observed_time: Some(Time(now)),
        error,
        error_reason,
        gates,
    }
}

/// Whether two reports differ in anything but their observed times.
pub fn changed(old: Option<&NodeFeatureReportSpec>, new: &NodeFeatureReportSpec) -> bool {
    let strip = |s: &NodeFeatureReportSpec| {
        s.components
            .iter()
            .map(|c| (c.name.clone(), c.error.clone(), c.error_reason, c.gates.clone()))
            .collect::<Vec<_>>()
    };
    old.is_none_or(|old| strip(old) != strip(new))
}
