//! go-yaml's YAML 1.1 resolution of plain scalars (which strings it would read back as
//! something else, and so quotes), and Go's way of writing floats.

/// Whether go-yaml (YAML 1.1) reads `s`, unquoted, back as a string.
pub(super) fn resolves_to_string(s: &str) -> bool {
    const SPECIAL: &[&str] = &[
        "", "~", "null", "Null", "NULL", "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO",
        "true", "True", "TRUE", "false", "False", "FALSE", "on", "On", "ON", "off", "Off", "OFF",
        ".nan", ".NaN", ".NAN", ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF", "-.inf",
        "-.Inf", "-.INF",
    ];
    let Some(first) = s.chars().next() else {
        return false;
    };
    let hinted = first.is_ascii_digit() || "+-.yYnNtTfFoO~".contains(first);
    if !hinted {
        return true;
    }
    if SPECIAL.contains(&s) {
        return false;
    }
    match first {
        '.' => !is_go_float(s),
        c if c.is_ascii_digit() || c == '+' || c == '-' => {
            if is_timestamp(s) {
                return false;
            }
            let plain = s.replace('_', "");
            !(is_go_int(&plain) || (is_yaml_style_float(&plain) && is_go_float(&plain)))
        }
        _ => true,
    }
}

/// Go's `strconv.ParseInt(s, 0, 64)` or `ParseUint` accepts `s` (underscores already removed).
fn is_go_int(s: &str) -> bool {
    let unsigned = s.strip_prefix(['+', '-']).unwrap_or(s);
    let (digits, radix) = if let Some(rest) = unsigned
        .strip_prefix("0x")
        .or_else(|| unsigned.strip_prefix("0X"))
    {
        (rest, 16)
    } else if let Some(rest) = unsigned
        .strip_prefix("0b")
        .or_else(|| unsigned.strip_prefix("0B"))
    {
        (rest, 2)
    } else if let Some(rest) = unsigned
        .strip_prefix("0o")
        .or_else(|| unsigned.strip_prefix("0O"))
    {
        (rest, 8)
    } else if unsigned.len() > 1 && unsigned.starts_with('0') {
        (&unsigned[1..], 8)
    } else {
        (unsigned, 10)
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return false;
    }
    // Out-of-range values fail both parses (a sign rules out ParseUint).
    match u128::from_str_radix(digits, radix) {
        Ok(n) if s.starts_with('-') => n <= 1u128 << 63,
        Ok(n) if s.starts_with('+') => n < 1u128 << 63,
        Ok(n) => n <= u128::from(u64::MAX),
        Err(_) => false,
    }
}

fn is_yaml_style_float(s: &str) -> bool {
    let s = s.strip_prefix(['+', '-']).unwrap_or(s);
    let (mantissa, exponent) = match s.find(['e', 'E']) {
        Some(at) => (&s[..at], Some(&s[at + 1..])),
        None => (s, None),
    };
    let mantissa_ok = match mantissa.split_once('.') {
        Some(("", frac)) => !frac.is_empty() && frac.chars().all(|c| c.is_ascii_digit()),
        Some((int, frac)) => {
            !int.is_empty()
                && int.chars().all(|c| c.is_ascii_digit())
                && frac.chars().all(|c| c.is_ascii_digit())
        }
        None => !mantissa.is_empty() && mantissa.chars().all(|c| c.is_ascii_digit()),
    };
    let exponent_ok = exponent.is_none_or(|e| {
        let e = e.strip_prefix(['+', '-']).unwrap_or(e);
        !e.is_empty() && e.chars().all(|c| c.is_ascii_digit())
    });
    mantissa_ok && exponent_ok
}

/// Go's `strconv.ParseFloat` accepts `s` (decimal forms; hex floats and words are not expected
/// after the callers' checks, except the `inf`/`nan` spellings handled here).
fn is_go_float(s: &str) -> bool {
    let lower = s.to_ascii_lowercase();
    let bare = lower.strip_prefix(['+', '-']).unwrap_or(&lower);
    if matches!(bare, "inf" | "infinity" | "nan") {
        return true;
    }
    is_yaml_style_float(s)
}

/// go-yaml's quick timestamp check: `YYYY-M-D`, optionally with a time.
fn is_timestamp(s: &str) -> bool {
    let bytes = s.as_bytes();
    if bytes.len() < 8 || !bytes[..4].iter().all(u8::is_ascii_digit) || bytes[4] != b'-' {
        return false;
    }
    let rest = &s[5..];
    let (date, time) = match rest.find(['T', 't', ' ']) {
        Some(at) => (&rest[..at], Some(&rest[at + 1..])),
        None => (rest, None),
    };
    let Some((month, day)) = date.split_once('-') else {
        return false;
    };
    let number = |p: &str, max: u32| {
        (1..=2).contains(&p.len())
            && p.chars().all(|c| c.is_ascii_digit())
            && p.parse::<u32>().is_ok_and(|n| (1..=max).contains(&n))
    };
    if !number(month, 12) || !number(day, 31) {
        return false;
    }
    match time {
        None => true,
        Some(time) => {
            let clock = time.split(['Z', '+', '-', '.']).next().unwrap_or("");
            let parts: Vec<&str> = clock.split(':').collect();
            parts.len() == 3
                && parts
                    .iter()
                    .all(|p| (1..=2).contains(&p.len()) && p.chars().all(|c| c.is_ascii_digit()))
        }
    }
}

/// YAML 1.1 sexagesimal numbers, which go-yaml quotes (`1:20`, `190:20:30`).
pub(super) fn is_base60_float(s: &str) -> bool {
    let s = s.strip_prefix(['+', '-']).unwrap_or(s);
    let (s, fraction) = match s.split_once('.') {
        Some((head, frac)) => (head, Some(frac)),
        None => (s, None),
    };
    if fraction.is_some_and(|f| !f.chars().all(|c| c.is_ascii_digit() || c == '_')) {
        return false;
    }
    let mut parts = s.split(':');
    let Some(head) = parts.next() else {
        return false;
    };
    let head_ok = head.chars().next().is_some_and(|c| c.is_ascii_digit())
        && head.chars().all(|c| c.is_ascii_digit() || c == '_');
    let mut sexagesimal = 0;
    for part in parts {
        let ok = match part.as_bytes() {
            [d] => d.is_ascii_digit(),
            [t, d] => (b'0'..=b'5').contains(t) && d.is_ascii_digit(),
            _ => false,
        };
        if !ok {
            return false;
        }
        sexagesimal += 1;
    }
    head_ok && sexagesimal > 0
}

/// A float as go-yaml writes it (`strconv.FormatFloat(f, 'g', -1, 64)`), for the values a JSON
/// round trip leaves as floats.
pub(super) fn go_float(f: f64) -> String {
    if f.is_nan() {
        return ".nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { ".inf" } else { "-.inf" }.into();
    }
    if f.fract() == 0.0 && f.abs() < 1e21 {
        return format!("{f}");
    }
    let scientific = format!("{f:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if !(-4..21).contains(&exponent) || (exponent >= 6 && f.fract() != 0.0) {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exponent.abs())
    } else {
        format!("{f}")
    }
}
