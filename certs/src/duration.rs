//! Durations as operators write them, in the one syntax of every nodewarden flag (humantime's):
//! `90d`, `2160h`, `30m`, `45s`, `1h30m`, `1h 30m`.

use std::time::Duration;

use crate::CertError;

/// Parses `90d`, `2160h`, `30m`, `45s` or a sequence of such parts (`1d12h`, `1h 30m`), as
/// humantime reads them. Usable directly as a clap `value_parser`.
pub fn parse_duration(input: &str) -> Result<Duration, CertError> {
    let trimmed = input.trim();
    if trimmed.is_empty() {
        return Err(CertError::Duration {
            input: input.to_owned(),
            reason: "it is empty".to_owned(),
        });
    }
    humantime::parse_duration(trimmed).map_err(|e| CertError::Duration {
        input: input.to_owned(),
        reason: e.to_string(),
    })
}

/// Renders a duration in whole seconds the way [`parse_duration`] reads it, largest units first
/// (`89days 23h 59m`, `0s`).
pub fn format_duration(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
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
            ("1h 30m", h + 30 * 60),
            ("1.5h", h + 30 * 60),
            (" 8760h ", 8760 * h),
            ("0s", 0),
        ] {
            assert_eq!(parse_duration(text).unwrap(), Duration::from_secs(secs), "{text}");
        }
    }

    #[test]
    fn rejects_what_it_cannot_read() {
        for bad in ["", "10", "h", "-1h", "99999999999999999999d", "1H", "soon"] {
            let msg = parse_duration(bad).expect_err(bad).to_string();
            assert!(msg.contains("expected a number followed by a unit"), "{msg}");
        }
    }

    #[test]
    fn formats_round_trip() {
        for text in ["90d", "1d12h", "1h30m", "45s", "0s", "2d3h4m5s"] {
            let d = parse_duration(text).unwrap();
            assert_eq!(parse_duration(&format_duration(d)).unwrap(), d, "{text}");
        }
        assert_eq!(format_duration(Duration::from_millis(90_500)), "1m 30s");
    }
}
