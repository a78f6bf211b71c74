//! Resource quantities, in one place: the schemas the API server checks them by, and the codec
//! both the agent and the webhook decide by.
//!
//! - Schemas for resource quantities and resource lists. `k8s_openapi`'s `Quantity` accepts any
//!   string. Here a quantity must be a non-negative Kubernetes quantity (`100m`, `0.5`, `256Mi`,
//!   `1e9`), and a resource list may only name the resources nodewarden right-sizes
//!   ([`ResourceName`]: `cpu`, `memory`).
//! - The codec of right-sizing: integer amounts (CPU in millicores, memory in bytes, [`amount`])
//!   and the one canonical string both the agent (in `NodeRecommendation`) and the webhook (in
//!   the pods it patches) write ([`format_amount`]): CPU as whole cores (`2`) when exact, else
//!   millicores (`250m`); memory with the largest binary suffix that divides it exactly (`1Gi`,
//!   `300Mi`, `512Ki`), else plain bytes (`314572801`).

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

/// A quantity as an integer amount: millicores for CPU, bytes (rounded up) for memory.
pub fn amount(resource: ResourceName, q: &Quantity) -> Option<u64> {
    amount_of(resource, &q.0)
}

/// [`amount`] of a quantity's text.
pub fn amount_of(resource: ResourceName, text: &str) -> Option<u64> {
    if let Some(value) = plain_amount(resource, text) {
        return Some(value);
    }
    let milli = parse_milli(text)?;
    let value = match resource {
        ResourceName::Cpu => milli,
        ResourceName::Memory => milli.div_ceil(1000),
    };
    u64::try_from(value).ok()
}

/// The amount of the quantities pods nearly always carry, whole digits and at most a suffix
/// (`100m`, `2`, `64Mi`, `1G`), in 64-bit arithmetic and without the 128-bit divisions of
/// [`parse_milli`], which reads every form. `None` for every other form, and when a step would
/// overflow: the caller then takes the general path, which gives the same answer for these forms.
fn plain_amount(resource: ResourceName, text: &str) -> Option<u64> {
    let bytes = text.as_bytes();
    let digits = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
    // 19 digits always fit in 64 bits
    if digits == 0 || digits > 19 {
        return None;
    }
    let mut value: u64 = 0;
    for &b in &bytes[..digits] {
        value = value * 10 + u64::from(b - b'0');
    }
    // the amount is value × mul / div: millicores for CPU, bytes for memory
    let (mul, div): (u64, u64) = match (&bytes[digits..], resource) {
        (b"m", ResourceName::Cpu) => (1, 1),
        (b"m", ResourceName::Memory) => (1, 1000),
        (suffix, ResourceName::Cpu) => (decimal_or_binary(suffix)?.checked_mul(1000)?, 1),
        (suffix, ResourceName::Memory) => (decimal_or_binary(suffix)?, 1),
    };
    Some(value.checked_mul(mul)?.div_ceil(div))
}

/// The multiplier of no suffix, a decimal SI suffix (`k` to `E`) or a binary one (`Ki` to `Ei`).
fn decimal_or_binary(suffix: &[u8]) -> Option<u64> {
    Some(match suffix {
        b"" => 1,
        b"k" => 1_000,
        b"M" => 1_000_000,
        b"G" => 1_000_000_000,
        b"T" => 1_000_000_000_000,
        b"P" => 1_000_000_000_000_000,
        b"E" => 1_000_000_000_000_000_000,
        b"Ki" => 1 << 10,
        b"Mi" => 1 << 20,
        b"Gi" => 1 << 30,
        b"Ti" => 1 << 40,
        b"Pi" => 1 << 50,
        b"Ei" => 1 << 60,
        _ => return None,
    })
}

/// The canonical quantity string of an amount (see the module documentation).
pub fn format_amount(resource: ResourceName, value: u64) -> String {
    // written by hand, without `format!`'s machinery: a decision writes eight amounts
    let mut digits = Digits::new();
    let (number, suffix) = match resource {
        ResourceName::Cpu if value.is_multiple_of(1000) => (value / 1000, ""),
        ResourceName::Cpu => (value, "m"),
        ResourceName::Memory => {
            const UNITS: [(&str, u64); 5] = [
                ("Pi", 1 << 50),
                ("Ti", 1 << 40),
                ("Gi", 1 << 30),
                ("Mi", 1 << 20),
                ("Ki", 1 << 10),
            ];
            UNITS
                .iter()
                .find(|(_, size)| value != 0 && value.is_multiple_of(*size))
                .map_or((value, ""), |(suffix, size)| (value / size, *suffix))
        }
    };
    let number = digits.of(number);
    let mut out = String::with_capacity(number.len() + suffix.len());
    out.push_str(number);
    out.push_str(suffix);
    out
}

/// Room for the decimal digits of any `u64`.
struct Digits([u8; 20]);

impl Digits {
    fn new() -> Self {
        Digits([0; 20])
    }

    /// The decimal digits of `value`.
    fn of(&mut self, mut value: u64) -> &str {
        let mut at = self.0.len();
        loop {
            at -= 1;
            // a digit: below 10 by the remainder
            self.0[at] = b'0' + (value % 10) as u8;
            value /= 10;
            if value == 0 {
                break;
            }
        }
        std::str::from_utf8(&self.0[at..]).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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

    const RESOURCES: [ResourceName; 2] = [ResourceName::Cpu, ResourceName::Memory];

    /// The general path alone, as [`amount_of`] was before its fast path.
    fn general(resource: ResourceName, text: &str) -> Option<u64> {
        let milli = parse_milli(text)?;
        u64::try_from(match resource {
            ResourceName::Cpu => milli,
            ResourceName::Memory => milli.div_ceil(1000),
        })
        .ok()
    }

    #[test]
    fn amounts_are_written_as_format_writes_them() {
        let old = |r: ResourceName, value: u64| match r {
            ResourceName::Cpu if value.is_multiple_of(1000) => format!("{}", value / 1000),
            ResourceName::Cpu => format!("{value}m"),
            ResourceName::Memory => {
                for (suffix, size) in [
                    ("Pi", 1u64 << 50),
                    ("Ti", 1 << 40),
                    ("Gi", 1 << 30),
                    ("Mi", 1 << 20),
                    ("Ki", 1 << 10),
                ] {
                    if value != 0 && value.is_multiple_of(size) {
                        return format!("{}{suffix}", value / size);
                    }
                }
                value.to_string()
            }
        };
        let values = [
            0,
            1,
            9,
            10,
            999,
            1000,
            1001,
            1024,
            1536 << 10,
            300 << 20,
            1 << 50,
            5 << 50,
            u64::MAX,
            u64::MAX - 1,
            10u64.pow(19),
        ];
        for r in RESOURCES {
            for v in values {
                assert_eq!(format_amount(r, v), old(r, v), "{r:?} {v}");
            }
        }
    }

    #[test]
    fn the_fast_path_agrees_at_its_edges() {
        let texts = [
            "0",
            "1",
            "100m",
            "1m",
            "999m",
            "64Mi",
            "1Ei",
            "15Ei",
            "16Ei",
            "1E",
            "18E",
            "19E",
            "18446744073709551615",
            "18446744073709551616",
            "9999999999999999999",
            "99999999999999999999",
            "18446744073709551615m",
            "18446744073709551m",
            "1k",
            "1K",
            "1Ki",
            "",
            "m",
            "Mi",
            " 1",
            "1 ",
            "1.5",
            "01",
            "1e3",
            "1E3",
            "+1",
            "-1",
            "1mi",
            "1kb",
        ];
        for resource in RESOURCES {
            for text in texts {
                assert_eq!(
                    amount_of(resource, text),
                    general(resource, text),
                    "{resource:?} {text:?}"
                );
            }
        }
    }

    proptest! {
        #[test]
        fn the_fast_path_gives_what_the_general_path_gives(
            digits in "[0-9]{1,21}",
            suffix in "(|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|K|e3|\\.5|x)",
        ) {
            let text = format!("{digits}{suffix}");
            for resource in RESOURCES {
                prop_assert_eq!(amount_of(resource, &text), general(resource, &text), "{:?} {}", resource, text);
            }
        }
    }

    #[test]
    fn formats_canonical_quantities() {
        let cases = [
            (ResourceName::Cpu, 250, "250m"),
            (ResourceName::Cpu, 2000, "2"),
            (ResourceName::Cpu, 0, "0"),
            (ResourceName::Memory, 300 << 20, "300Mi"),
            (ResourceName::Memory, 1 << 30, "1Gi"),
            (ResourceName::Memory, 1536 << 10, "1536Ki"),
            (ResourceName::Memory, (300 << 20) + 1, "314572801"),
        ];
        for (r, v, want) in cases {
            assert_eq!(format_amount(r, v), want);
            assert_eq!(
                amount(r, &Quantity(want.to_string())),
                Some(v),
                "round trip of {want}"
            );
        }
    }
}
