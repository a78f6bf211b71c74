//! The quantity codec of right-sizing: integer amounts (CPU in millicores, memory in bytes) and
//! the one canonical string both the agent (in `NodeRecommendation`) and the webhook (in the pods
//! it patches) write: CPU as whole cores (`2`) when exact, else millicores (`250m`); memory with
//! the largest binary suffix that divides it exactly (`1Gi`, `300Mi`, `512Ki`), else plain bytes
//! (`314572801`).

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::quantity::parse_milli;
use crate::rightsizing::ResourceName;

/// A quantity as an integer amount: millicores for CPU, bytes (rounded up) for memory.
pub fn amount(resource: ResourceName, q: &Quantity) -> Option<u64> {
    let milli = parse_milli(&q.0)?;
    let value = match resource {
        ResourceName::Cpu => milli,
        ResourceName::Memory => milli.div_ceil(1000),
    };
    u64::try_from(value).ok()
}

/// The canonical quantity string of an amount (see the module documentation).
pub fn format_amount(resource: ResourceName, value: u64) -> String {
    match resource {
        ResourceName::Cpu => {
            if value.is_multiple_of(1000) {
                format!("{}", value / 1000)
            } else {
                format!("{value}m")
            }
        }
        ResourceName::Memory => {
            const UNITS: [(&str, u64); 5] = [
                ("Pi", 1 << 50),
                ("Ti", 1 << 40),
                ("Gi", 1 << 30),
                ("Mi", 1 << 20),
                ("Ki", 1 << 10),
            ];
            if value == 0 {
                return "0".to_string();
            }
            for (suffix, size) in UNITS {
                if value.is_multiple_of(size) {
                    return format!("{}{suffix}", value / size);
                }
            }
            value.to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
