//! Human-readable byte sizes: `"16MB"`, `"16 MB"`, `"4GiB"`, `"1024"`.
//!
//! Upstream's Python `setup(config_dict)` accepts such strings and refuses percentages; the CLI
//! uses the same parser for `--segment-size`. Both decimal (`KB` = 1000) and binary (`KiB` = 1024)
//! suffixes are accepted; like upstream, the bare `K`/`M`/`G`/`T` forms and `KB`/`MB`/`GB`/`TB` are
//! binary (1024-based), because that is what every Mooncake config in the wild assumes.

use thiserror::Error;

/// Why a size string was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SizeParseError {
    #[error("empty size")]
    Empty,
    #[error("percentages are not sizes: {0:?}")]
    Percentage(String),
    #[error("not a size: {0:?} (expected e.g. \"16MB\", \"4 GiB\", \"1048576\")")]
    Malformed(String),
    #[error("size overflows u64: {0:?}")]
    Overflow(String),
}

/// Parses a byte size. Accepts an integer or decimal number, optional spaces, and an optional unit
/// (`B`, `K`/`KB`/`KiB`, `M`/`MB`/`MiB`, `G`/`GB`/`GiB`, `T`/`TB`/`TiB`, case-insensitive).
pub fn parse_size(text: &str) -> Result<u64, SizeParseError> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(SizeParseError::Empty);
    }
    if trimmed.contains('%') {
        return Err(SizeParseError::Percentage(text.to_string()));
    }
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let multiplier: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(SizeParseError::Malformed(text.to_string())),
    };
    if number.is_empty() || number.matches('.').count() > 1 {
        return Err(SizeParseError::Malformed(text.to_string()));
    }
    if let Ok(whole) = number.parse::<u64>() {
        return whole
            .checked_mul(multiplier)
            .ok_or_else(|| SizeParseError::Overflow(text.to_string()));
    }
    let value: f64 = number
        .parse()
        .map_err(|_| SizeParseError::Malformed(text.to_string()))?;
    let bytes = value * multiplier as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(SizeParseError::Overflow(text.to_string()));
    }
    Ok(bytes.round() as u64)
}

/// Why a duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("not a duration: {0:?} (expected milliseconds or a number with ms, s, m or h, e.g. \"10000\", \"10s\")")]
pub struct DurationParseError(pub String);

/// Parses a duration in milliseconds the way upstream's master flags do: raw milliseconds
/// (`"10000"`) or a whole number with an `ms`, `s`, `m` or `h` suffix (`"10s"`, `"30m"`).
pub fn parse_duration_ms(text: &str) -> Result<u64, DurationParseError> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let error = || DurationParseError(text.to_string());
    let value: u64 = number.parse().map_err(|_| error())?;
    let multiplier: u64 = match unit.trim() {
        "" | "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(error()),
    };
    value.checked_mul(multiplier).ok_or_else(error)
}

/// Formats a byte count for people: `1.5 GiB`, `16 MiB`, `512 B`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else if (value - value.round()).abs() < 0.005 {
        format!("{:.0} {}", value, UNITS[unit])
    } else {
        format!("{:.2} {}", value, UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_upstream_spellings() {
        assert_eq!(parse_size("16MB"), Ok(16 << 20));
        assert_eq!(parse_size("16 MB"), Ok(16 << 20));
        assert_eq!(parse_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_size("1024"), Ok(1024));
        assert_eq!(parse_size("1.5 KiB"), Ok(1536));
        assert_eq!(parse_size("2t"), Ok(2 << 40));
    }

    #[test]
    fn refuses_percentages_and_garbage() {
        assert!(matches!(
            parse_size("50%"),
            Err(SizeParseError::Percentage(_))
        ));
        assert_eq!(parse_size(""), Err(SizeParseError::Empty));
        assert!(matches!(
            parse_size("MB"),
            Err(SizeParseError::Malformed(_))
        ));
        assert!(matches!(
            parse_size("12 parsecs"),
            Err(SizeParseError::Malformed(_))
        ));
        assert!(matches!(
            parse_size("1.2.3MB"),
            Err(SizeParseError::Malformed(_))
        ));
        assert!(matches!(
            parse_size("-5"),
            Err(SizeParseError::Malformed(_))
        ));
        assert!(matches!(
            parse_size("99999999999TB"),
            Err(SizeParseError::Overflow(_))
        ));
    }

    #[test]
    fn parses_upstream_durations() {
        assert_eq!(parse_duration_ms("10000"), Ok(10_000));
        assert_eq!(parse_duration_ms("250ms"), Ok(250));
        assert_eq!(parse_duration_ms("10s"), Ok(10_000));
        assert_eq!(parse_duration_ms("30m"), Ok(1_800_000));
        assert_eq!(parse_duration_ms("24h"), Ok(86_400_000));
        assert!(parse_duration_ms("").is_err());
        assert!(parse_duration_ms("10 parsecs").is_err());
        assert!(parse_duration_ms("-1s").is_err());
        assert!(parse_duration_ms("1.5s").is_err());
        assert!(parse_duration_ms("99999999999999999999h").is_err());
    }

    #[test]
    fn formats_for_people() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(16 << 20), "16 MiB");
        assert_eq!(format_size(1536 << 20), "1.50 GiB");
    }
}
