//! Quantities as they arrive in pods, autoscalers, LimitRanges and NodeRecommendations:
//! `parse_milli` (the schema's quantity syntax) and the right-sizing codec `amount` /
//! `format_amount`.
//!
//! Invariants: an amount that parses re-formats to the canonical string, which parses back to
//! the same amount, and the canonical string is a fixed point of format ∘ parse; the canonical
//! form matches the CRD schema's quantity pattern (what the API server accepts).
#![no_main]

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use libfuzzer_sys::fuzz_target;
use nodewarden_api::quantity::{amount, format_amount, parse_milli};
use nodewarden_api::rightsizing::ResourceName;

/// The schema's quantity pattern, checked by hand (no regex engine in the target).
fn matches_schema(q: &str) -> bool {
    let digits = q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len());
    if digits == 0 {
        return false;
    }
    let rest = &q[digits..];
    let rest = match rest.strip_prefix('.') {
        Some(frac) => {
            let n = frac.find(|c: char| !c.is_ascii_digit()).unwrap_or(frac.len());
            if n == 0 {
                return false;
            }
            &frac[n..]
        }
        None => rest,
    };
    matches!(
        rest,
        "" | "m" | "k" | "M" | "G" | "T" | "P" | "E" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei"
    ) || (rest.len() > 1 && rest.starts_with(['e', 'E']) && rest[1..].bytes().all(|b| b.is_ascii_digit()))
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let milli = parse_milli(text);
    for resource in [ResourceName::Cpu, ResourceName::Memory] {
        let Some(value) = amount(resource, &Quantity(text.to_string())) else {
            continue;
        };
        assert!(milli.is_some(), "amount of {text:?} without parse_milli");
        let canonical = format_amount(resource, value);
        assert!(
            matches_schema(&canonical),
            "{canonical:?} is not a schema quantity"
        );
        let back = amount(resource, &Quantity(canonical.clone()));
        assert_eq!(
            back,
            Some(value),
            "{resource:?} {text:?} -> {value} -> {canonical:?}"
        );
        assert_eq!(format_amount(resource, value), canonical);
    }
});
