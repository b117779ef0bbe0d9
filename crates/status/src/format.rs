//! Short human forms of durations, sizes and states, shared by the page and the terminal.

/// `12s`, `3m05s`, `1h02m`, `2d03h`.
pub fn duration(secs: f64) -> String {
    let s = if secs.is_finite() && secs > 0.0 {
        secs as u64
    } else {
        0
    };
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86400, (s % 86400) / 3600),
    }
}

/// An amount of money: four decimals below 1 (a job's cost is often a fraction of a cent),
/// two above.
pub fn money(amount: f64, currency: &str) -> String {
    if amount.abs() < 1.0 {
        format!("{amount:.4} {currency}")
    } else {
        format!("{amount:.2} {currency}")
    }
}

/// `512 B`, `3.2 KiB`, `120 MiB`, `1.5 GiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = UNITS[0];
    for u in &UNITS[1..] {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    if v < 10.0 {
        format!("{v:.1} {unit}")
    } else {
        format!("{v:.0} {unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_at_a_glance() {
        assert_eq!(duration(0.4), "0s");
        assert_eq!(duration(59.9), "59s");
        assert_eq!(duration(185.0), "3m05s");
        assert_eq!(duration(3720.0), "1h02m");
        assert_eq!(duration(2.0 * 86400.0 + 3.0 * 3600.0), "2d03h");
        assert_eq!(duration(f64::NAN), "0s");
    }

    #[test]
    fn sizes_use_binary_units() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3277), "3.2 KiB");
        assert_eq!(bytes(120 << 20), "120 MiB");
        assert_eq!(bytes(3 << 29), "1.5 GiB");
    }
}
