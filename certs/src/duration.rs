//! Durations as operators write them: `90d`, `2160h`, `30m`, `45s`, `1h30m`.

use std::time::Duration;

use crate::CertError;

/// Parses `90d`, `2160h`, `30m`, `45s` or a sequence of such parts (`1d12h`). Whole numbers only.
/// Usable directly as a clap `value_parser`.
pub fn parse_duration(input: &str) -> Result<Duration, CertError> {
    let fail = |reason: String| CertError::Duration {
        input: input.to_owned(),
        reason,
    };
    let mut rest = input.trim();
    if rest.is_empty() {
        return Err(fail("it is empty".to_owned()));
    }
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let (number, after) = rest.split_at(digits);
        if number.is_empty() {
            return Err(fail(format!("expected a number at {rest:?}")));
        }
        let unit_len = after.find(|c: char| c.is_ascii_digit()).unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let seconds_per_unit: u64 = match unit {
            "d" => 86_400,
            "h" => 3_600,
            "m" => 60,
            "s" => 1,
            "" => return Err(fail(format!("{number} has no unit"))),
            other => return Err(fail(format!("unknown unit {other:?}"))),
        };
        total = number
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(seconds_per_unit))
            .and_then(|s| total.checked_add(s))
            .ok_or_else(|| fail("it is too large".to_owned()))?;
        rest = after;
    }
    Ok(Duration::from_secs(total))
}

/// Renders a duration the way [`parse_duration`] reads it, largest units first (`89d23h59m`, `0s`).
pub fn format_duration(d: Duration) -> String {
    let mut secs = d.as_secs();
    let mut out = String::new();
    for (unit, size) in [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)] {
        let n = secs / size;
        secs %= size;
        if n > 0 {
            out.push_str(&format!("{n}{unit}"));
        }
    }
    if out.is_empty() {
        out.push_str("0s");
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_sequences() {
        let h = 3600;
        for (text, secs) in [
            ("90d", 90 * 24 * h),
            ("2160h", 2160 * h),
            ("30m", 30 * 60),
            ("45s", 45),
            ("1h30m", h + 30 * 60),
            (" 8760h ", 8760 * h),
            ("0s", 0),
        ] {
            assert_eq!(parse_duration(text).unwrap(), Duration::from_secs(secs), "{text}");
        }
    }

    #[test]
    fn rejects_what_it_cannot_read() {
        for bad in [
            "",
            "10",
            "h",
            "1y",
            "1.5h",
            "-1h",
            "1h 30m",
            "99999999999999999999d",
            "1H",
        ] {
            let msg = parse_duration(bad).expect_err(bad).to_string();
            assert!(
                msg.contains("expected a whole number followed by a unit"),
                "{msg}"
            );
        }
    }

    #[test]
    fn formats_round_trip() {
        for text in ["90d", "1d12h", "1h30m", "45s", "0s", "2d3h4m5s"] {
            let d = parse_duration(text).unwrap();
            assert_eq!(format_duration(d), text);
        }
    }
}
