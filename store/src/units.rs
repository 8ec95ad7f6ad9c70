//! Values people type: sizes with units (`1G`, `512MiB`, `1.5GB`), for the command line and
//! the server's token file alike.

/// A size in bytes: a number (a fraction allowed) and an optional unit, case-insensitive.
/// `K`/`KI`/`KIB` (and M, G, T) are powers of 1024; `KB` (MB, GB, TB) powers of 1000; `B` or
/// none is bytes.
pub fn size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number.parse().map_err(|_| format!("{text:?} is not a size: expected e.g. 4096, 512MiB, 1G"))?;
    let unit = unit.trim().to_ascii_uppercase();
    let scale: f64 = match unit.as_str() {
        "" | "B" => 1.0,
        "K" | "KI" | "KIB" => 1024.0,
        "M" | "MI" | "MIB" => 1024f64.powi(2),
        "G" | "GI" | "GIB" => 1024f64.powi(3),
        "T" | "TI" | "TIB" => 1024f64.powi(4),
        "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        _ => {
            return Err(format!("{text:?}: unknown unit {unit:?} (use B, K/KiB, M/MiB, G/GiB, T/TiB, or KB/MB/GB/TB)"))
        }
    };
    let bytes = value * scale;
    if !bytes.is_finite() || bytes > u64::MAX as f64 || bytes.fract() != 0.0 {
        return Err(format!("{text:?} is not a whole number of bytes"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_with_units() {
        assert_eq!(size("4096"), Ok(4096));
        assert_eq!(size("1G"), Ok(1 << 30));
        assert_eq!(size("512MiB"), Ok(512 << 20));
        assert_eq!(size("1.5g"), Ok(3 << 29));
        assert_eq!(size("2GB"), Ok(2_000_000_000));
        assert_eq!(size("64 KiB"), Ok(64 << 10));
        assert!(size("1.5").unwrap_err().contains("whole number"));
        assert!(size("12 parsecs").unwrap_err().contains("unknown unit"));
        assert!(size("G").is_err());
    }
}
