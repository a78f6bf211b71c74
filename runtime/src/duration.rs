//! The one duration syntax of nodewarden's flags: humantime's (`500ms`, `10s`, `1m`, `1h30m`, `24h`).

use std::time::Duration;

/// What a message suggests when a duration cannot be read.
const EXAMPLES: &str = "use e.g. 500ms, 10s, 1m, 24h";

/// Shortest interval a loop may be given.
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// A duration in humantime syntax; `0s` is allowed. Usable as a clap `value_parser`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("{e} ({EXAMPLES})"))
}

/// A loop's interval: a [`parse_duration`] of at least [`MIN_INTERVAL`] (100 ms).
pub fn parse_interval(s: &str) -> Result<Duration, String> {
    parse_at_least(s, MIN_INTERVAL)
}

/// A [`parse_duration`] of at least `min`; the message names the minimum.
pub fn parse_at_least(s: &str, min: Duration) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < min {
        return Err(format!(
            "{s} is too short: at least {}",
            humantime::format_duration(min)
        ));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_humantime_and_says_what_is_accepted() {
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_interval("500ms"), Ok(Duration::from_millis(500)));
        let err = parse_duration("soon").expect_err("not a duration");
        assert!(err.contains("use e.g. 500ms"), "{err}");
        let err = parse_interval("10ms").expect_err("too short");
        assert!(err.contains("at least 100ms"), "{err}");
        let err = parse_at_least("500ms", Duration::from_secs(1)).expect_err("too short");
        assert!(err.contains("at least 1s"), "{err}");
    }
}
