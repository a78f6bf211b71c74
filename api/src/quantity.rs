//! Schemas for resource quantities and resource lists, validated by the API server.
//!
//! `k8s_openapi`'s `Quantity` accepts any string. Here a quantity must be a non-negative
//! Kubernetes quantity (`100m`, `0.5`, `256Mi`, `1e9`), and a resource list may only name
//! the resources nodewarden right-sizes ([`ResourceName`]: `cpu`, `memory`).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// A resource nodewarden can right-size.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
pub enum ResourceName {
    /// CPU (`cpu`), in millicores.
    #[serde(rename = "cpu")]
    Cpu,
    /// Memory (`memory`), in bytes.
    #[serde(rename = "memory")]
    Memory,
}

impl ResourceName {
    /// The resource's name in a resource list: `cpu` or `memory`.
    pub fn as_str(self) -> &'static str {
        match self {
            ResourceName::Cpu => "cpu",
            ResourceName::Memory => "memory",
        }
    }
}

/// A non-negative Kubernetes quantity: digits, optional fraction, optional suffix
/// (decimal SI, binary SI or an exponent).
pub const QUANTITY_PATTERN: &str = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|[eE][0-9]+)?$";

/// The resources nodewarden controls.
pub const RESOURCES: [&str; 2] = ["cpu", "memory"];

/// A map of resource name to quantity, restricted to [`RESOURCES`].
pub type ResourceList = BTreeMap<String, Quantity>;

fn quantity_value() -> serde_json::Value {
    serde_json::json!({
        "x-kubernetes-int-or-string": true,
        "anyOf": [
            {"type": "integer", "minimum": 0},
            {"type": "string", "pattern": QUANTITY_PATTERN}
        ],
        "description": "A non-negative Kubernetes quantity, for example 100m, 0.5, 256Mi."
    })
}

/// Schema of one quantity.
pub fn quantity_schema(_: &mut SchemaGenerator) -> Schema {
    Schema::try_from(quantity_value()).unwrap_or_default()
}

/// Schema of an optional [`ResourceList`]: a map of quantities whose keys must be `cpu` or
/// `memory` (a CEL rule, so an unknown resource is rejected with a message instead of pruned).
pub fn resource_list_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "nullable": true,
        "additionalProperties": quantity_value(),
        "maxProperties": 2,
        "x-kubernetes-validations": [{
            "rule": "self.all(r, r == 'cpu' || r == 'memory')",
            "message": "only the resources cpu and memory can be named here"
        }],
        "description": "Quantities by resource; only cpu and memory are accepted."
    })
}

/// Parses a quantity into its value in the resource's base unit as a rational approximation:
/// millicores for `cpu`, bytes for `memory`. Returns `None` for anything that is not a
/// non-negative quantity. Values are rounded up, as the API server rounds up to the next
/// milli-unit.
pub fn parse_milli(q: &str) -> Option<u128> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    if num.is_empty() || num.starts_with('.') || num.ends_with('.') || num.matches('.').count() > 1 {
        return None;
    }
    let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
    // value = digits / 10^frac_len, scaled by the suffix; everything in milli-units
    let mut digits: u128 = 0;
    for b in int_part.bytes().chain(frac_part.bytes()) {
        digits = digits.checked_mul(10)?.checked_add(u128::from(b - b'0'))?;
    }
    let frac_len = u32::try_from(frac_part.len()).ok()?;
    // (multiplier numerator, power of ten of the multiplier) so that milli = digits * mult / 10^frac_len
    let (mult, pow10): (u128, i32) = match suffix {
        "" => (1, 3),
        "m" => (1, 0),
        "k" => (1, 6),
        "M" => (1, 9),
        "G" => (1, 12),
        "T" => (1, 15),
        "P" => (1, 18),
        "E" => (1, 21),
        "Ki" => (1 << 10, 3),
        "Mi" => (1 << 20, 3),
        "Gi" => (1 << 30, 3),
        "Ti" => (1 << 40, 3),
        "Pi" => (1 << 50, 3),
        "Ei" => (1 << 60, 3),
        s if s.starts_with(['e', 'E']) => {
            let exp: i32 = s[1..].parse().ok()?;
            (1, exp.checked_add(3)?)
        }
        _ => return None,
    };
    let scale = pow10 - i32::try_from(frac_len).ok()?;
    let base = digits.checked_mul(mult)?;
    if scale >= 0 {
        base.checked_mul(10u128.checked_pow(u32::try_from(scale).ok()?)?)
    } else {
        let div = 10u128.checked_pow(u32::try_from(-scale).ok()?)?;
        Some(base.div_ceil(div))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_common_quantities_to_milli_units() {
        let cases: &[(&str, Option<u128>)] = &[
            ("100m", Some(100)),
            ("1", Some(1000)),
            ("0.5", Some(500)),
            ("1.5", Some(1500)),
            ("256Mi", Some(256 * 1024 * 1024 * 1000)),
            ("1Gi", Some(1024 * 1024 * 1024 * 1000)),
            ("1k", Some(1_000_000)),
            ("1e3", Some(1_000_000)),
            ("0.0001", Some(1)), // rounds up to the next milli-unit
            ("", None),
            ("-1", None),
            ("1.", None),
            ("abc", None),
            ("1Xi", None),
            ("1.2.3", None),
        ];
        for (q, want) in cases {
            assert_eq!(parse_milli(q), *want, "quantity {q:?}");
        }
    }

    #[test]
    fn pattern_agrees_with_parser_on_examples() {
        // the schema pattern is what the API server enforces; keep the parser at least as strict
        for q in ["100m", "1", "0.5", "256Mi", "1e9", "2Gi", "1k"] {
            assert!(parse_milli(q).is_some(), "{q}");
        }
    }
}
