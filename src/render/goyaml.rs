//! A YAML writer that produces what CAPM3's `sigs.k8s.io/yaml` (go-yaml v2 behind a JSON round
//! trip) produces for the same data, byte for byte: block style, keys in go-yaml's order, scalars
//! quoted only when go-yaml would quote them, long lines folded at 80 columns.
//!
//! Rendered secrets are compared with what CAPM3 wrote (BareMetalHost re-provisioning, GitOps
//! diffs), so "equivalent YAML" is not enough. The rules below restate go-yaml's documented
//! behaviour (YAML 1.1 resolution, libyaml's scalar analysis); the tests pin outputs recorded from
//! `sigs.k8s.io/yaml` v1.6.0.

use std::cmp::Ordering;

/// Data to write: what a JSON document can hold.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Seq(Vec<Value>),
    /// Entries in any order: they are written in go-yaml's key order.
    Map(Vec<(String, Value)>),
}

impl Value {
    pub fn str(s: impl Into<String>) -> Self {
        Value::Str(s.into())
    }

    pub fn map<K: Into<String>>(entries: impl IntoIterator<Item = (K, Value)>) -> Self {
        Value::Map(entries.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }
}

impl From<&serde_json::Value> for Value {
    fn from(json: &serde_json::Value) -> Self {
        match json {
            serde_json::Value::Null => Value::Null,
            serde_json::Value::Bool(b) => Value::Bool(*b),
            serde_json::Value::Number(n) => match n.as_i64() {
                Some(i) => Value::Int(i),
                None => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            serde_json::Value::String(s) => Value::Str(s.clone()),
            serde_json::Value::Array(items) => Value::Seq(items.iter().map(Value::from).collect()),
            serde_json::Value::Object(map) => Value::Map(
                map.iter()
                    .map(|(k, v)| (k.clone(), Value::from(v)))
                    .collect(),
            ),
        }
    }
}

/// The document, ending in a newline, as `sigs.k8s.io/yaml.Marshal` writes it.
pub fn to_string(value: &Value) -> String {
    let mut emitter = Emitter::default();
    emitter.node(value, -1, Context::Root);
    emitter.line_end();
    emitter.out
}

/// go-yaml's map key order: letters after other characters, runs of digits by number.
pub fn key_order(a: &str, b: &str) -> Ordering {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    chars_order(&a, &b)
}

fn chars_order(a: &[char], b: &[char]) -> Ordering {
    for i in 0..a.len().min(b.len()) {
        if a[i] == b[i] {
            continue;
        }
        let (a_letter, b_letter) = (a[i].is_alphabetic(), b[i].is_alphabetic());
        if a_letter && b_letter {
            return a[i].cmp(&b[i]);
        }
        if a_letter || b_letter {
            return if b_letter {
                Ordering::Less
            } else {
                Ordering::Greater
            };
        }
        // A run that continues digits before it with a non-zero digit is a plain number.
        let mut seed = 0u128;
        if a[i] == '0' || b[i] == '0' {
            let before = a[..i].iter().rev().take_while(|c| c.is_ascii_digit());
            if before.clone().any(|c| *c != '0') {
                seed = 1;
            }
        }
        let number = |s: &[char]| {
            let mut n = seed;
            let mut end = i;
            while end < s.len() && s[end].is_ascii_digit() {
                n = n
                    .wrapping_mul(10)
                    .wrapping_add(u128::from(s[end] as u8 - b'0'));
                end += 1;
            }
            (n, end)
        };
        let ((an, a_end), (bn, b_end)) = (number(a), number(b));
        if an != bn {
            return an.cmp(&bn);
        }
        if a_end != b_end {
            return a_end.cmp(&b_end);
        }
        return a[i].cmp(&b[i]);
    }
    a.len().cmp(&b.len())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    Root,
    MappingKey,
    MappingValue,
    SequenceItem,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Style {
    Plain,
    SingleQuoted,
    DoubleQuoted,
    Literal,
}

const BEST_WIDTH: usize = 80;
const BEST_INDENT: i32 = 2;

/// The parts of libyaml's emitter state that decide the output of block-style documents.
struct Emitter {
    out: String,
    column: usize,
    /// The last character written was whitespace (or nothing was written on the line).
    whitespace: bool,
    /// Only indentation has been written on the current line.
    indention: bool,
}

impl Default for Emitter {
    fn default() -> Self {
        Self {
            out: String::new(),
            column: 0,
            whitespace: true,
            indention: true,
        }
    }
}

impl Emitter {
    fn put(&mut self, c: char) {
        self.out.push(c);
        self.column += 1;
    }

    fn put_break(&mut self) {
        self.out.push('\n');
        self.column = 0;
    }

    fn write_indent(&mut self, indent: i32) {
        let indent = indent.max(0) as usize;
        if !self.indention || self.column > indent || (self.column == indent && !self.whitespace) {
            self.put_break();
        }
        while self.column < indent {
            self.put(' ');
        }
        self.whitespace = true;
        self.indention = true;
    }

    fn indicator(
        &mut self,
        text: &str,
        need_whitespace: bool,
        is_whitespace: bool,
        is_indention: bool,
    ) {
        if need_whitespace && !self.whitespace {
            self.put(' ');
        }
        for c in text.chars() {
            self.put(c);
        }
        self.whitespace = is_whitespace;
        self.indention = self.indention && is_indention;
    }

    fn write_break(&mut self, c: char) {
        if c == '\n' {
            self.put_break();
        } else {
            self.out.push(c);
            self.column = 0;
        }
    }

    fn line_end(&mut self) {
        if self.column > 0 {
            self.put_break();
        }
    }

    /// Writes `value` in a container whose indent is `indent`.
    fn node(&mut self, value: &Value, indent: i32, context: Context) {
        match value {
            Value::Map(entries) if !entries.is_empty() => self.block_mapping(entries, indent),
            Value::Seq(items) if !items.is_empty() => {
                self.block_sequence(items, indent, context == Context::MappingValue)
            }
            Value::Map(_) => self.indicator("{}", true, false, false),
            Value::Seq(_) => self.indicator("[]", true, false, false),
            // libyaml indents a scalar one step deeper than its container, for folded lines.
            Value::Str(s) => self.string(
                s,
                indent.max(0) + BEST_INDENT,
                context == Context::MappingKey,
            ),
            Value::Null => self.plain("null", 0, false),
            Value::Bool(b) => self.plain(if *b { "true" } else { "false" }, 0, false),
            Value::Int(i) => self.plain(&i.to_string(), 0, false),
            Value::Float(f) => self.plain(&go_float(*f), 0, false),
        }
    }

    fn block_mapping(&mut self, entries: &[(String, Value)], indent: i32) {
        let indent = if indent < 0 { 0 } else { indent + BEST_INDENT };
        // go-yaml's order is not a total order for some digit runs, so sort as Go's insertion
        // sort does (what Go uses for the map sizes seen here) rather than with a sort that
        // assumes one.
        let mut sorted: Vec<(Vec<char>, &(String, Value))> = entries
            .iter()
            .map(|entry| (entry.0.chars().collect(), entry))
            .collect();
        for i in 1..sorted.len() {
            let mut j = i;
            while j > 0 && chars_order(&sorted[j].0, &sorted[j - 1].0) == Ordering::Less {
                sorted.swap(j, j - 1);
                j -= 1;
            }
        }
        for (_, (key, value)) in sorted {
            self.write_indent(indent);
            self.node(&Value::Str(key.clone()), indent, Context::MappingKey);
            self.indicator(":", false, false, false);
            self.node(value, indent, Context::MappingValue);
        }
    }

    fn block_sequence(&mut self, items: &[Value], indent: i32, in_mapping: bool) {
        // A sequence that is a mapping value starts at its key's column.
        let indentless = in_mapping && !self.indention;
        let indent = if indent < 0 {
            0
        } else if indentless {
            indent
        } else {
            indent + BEST_INDENT
        };
        for item in items {
            self.write_indent(indent);
            self.indicator("-", true, false, true);
            self.node(item, indent, Context::SequenceItem);
        }
    }

    fn string(&mut self, s: &str, indent: i32, simple_key: bool) {
        let requested = if s.contains('\n') {
            Style::Literal
        } else if resolves_to_string(s) && !is_base60_float(s) {
            Style::Plain
        } else {
            Style::DoubleQuoted
        };
        let analysis = Analysis::of(s);
        let mut style = requested;
        if style == Style::Plain && (!analysis.block_plain_allowed || (s.is_empty() && simple_key))
        {
            style = Style::SingleQuoted;
        }
        if style == Style::SingleQuoted && !analysis.single_quoted_allowed {
            style = Style::DoubleQuoted;
        }
        if style == Style::Literal && (!analysis.block_allowed || simple_key) {
            style = Style::DoubleQuoted;
        }
        let allow_breaks = !simple_key;
        match style {
            Style::Plain => self.plain(s, indent, allow_breaks),
            Style::SingleQuoted => self.single_quoted(s, indent, allow_breaks),
            Style::DoubleQuoted => self.double_quoted(s, indent, allow_breaks),
            Style::Literal => self.literal(s, indent),
        }
    }

    fn plain(&mut self, s: &str, indent: i32, allow_breaks: bool) {
        if !self.whitespace && !s.is_empty() {
            self.put(' ');
        }
        let chars: Vec<char> = s.chars().collect();
        let mut spaces = false;
        for (i, &c) in chars.iter().enumerate() {
            if c == ' ' {
                let next_is_space = chars.get(i + 1) == Some(&' ');
                if allow_breaks && !spaces && self.column > BEST_WIDTH && !next_is_space {
                    self.write_indent(indent);
                } else {
                    self.put(c);
                }
                spaces = true;
            } else {
                self.put(c);
                spaces = false;
            }
        }
        self.whitespace = false;
        self.indention = false;
    }

    fn single_quoted(&mut self, s: &str, indent: i32, allow_breaks: bool) {
        self.indicator("'", true, false, false);
        let chars: Vec<char> = s.chars().collect();
        let (mut spaces, mut breaks) = (false, false);
        for (i, &c) in chars.iter().enumerate() {
            if c == ' ' {
                let next_is_space = chars.get(i + 1) == Some(&' ');
                if allow_breaks
                    && !spaces
                    && self.column > BEST_WIDTH
                    && i != 0
                    && i != chars.len() - 1
                    && !next_is_space
                {
                    self.write_indent(indent);
                } else {
                    self.put(c);
                }
                spaces = true;
            } else if is_break(c) {
                // A lone line feed would fold into a space when read back: double it.
                if !breaks && c == '\n' {
                    self.put_break();
                }
                self.write_break(c);
                self.indention = true;
                breaks = true;
            } else {
                if breaks {
                    self.write_indent(indent);
                }
                if c == '\'' {
                    self.put('\'');
                }
                self.put(c);
                self.indention = false;
                spaces = false;
                breaks = false;
            }
        }
        self.indicator("'", false, false, false);
    }

    fn double_quoted(&mut self, s: &str, indent: i32, allow_breaks: bool) {
        self.indicator("\"", true, false, false);
        let chars: Vec<char> = s.chars().collect();
        let mut spaces = false;
        for (i, &c) in chars.iter().enumerate() {
            if !is_printable(c) || c == '\u{feff}' || is_break(c) || c == '"' || c == '\\' {
                self.put('\\');
                match c {
                    '\0' => self.put('0'),
                    '\u{7}' => self.put('a'),
                    '\u{8}' => self.put('b'),
                    '\t' => self.put('t'),
                    '\n' => self.put('n'),
                    '\u{b}' => self.put('v'),
                    '\u{c}' => self.put('f'),
                    '\r' => self.put('r'),
                    '\u{1b}' => self.put('e'),
                    '"' => self.put('"'),
                    '\\' => self.put('\\'),
                    '\u{85}' => self.put('N'),
                    '\u{a0}' => self.put('_'),
                    '\u{2028}' => self.put('L'),
                    '\u{2029}' => self.put('P'),
                    _ => {
                        let code = c as u32;
                        let escaped = if code <= 0xff {
                            format!("x{code:02X}")
                        } else if code <= 0xffff {
                            format!("u{code:04X}")
                        } else {
                            format!("U{code:08X}")
                        };
                        escaped.chars().for_each(|e| self.put(e));
                    }
                }
                spaces = false;
            } else if c == ' ' {
                if allow_breaks
                    && !spaces
                    && self.column > BEST_WIDTH
                    && i != 0
                    && i != chars.len() - 1
                {
                    self.write_indent(indent);
                    if chars.get(i + 1) == Some(&' ') {
                        self.put('\\');
                    }
                } else {
                    self.put(c);
                }
                spaces = true;
            } else {
                self.put(c);
                spaces = false;
            }
        }
        self.indicator("\"", false, false, false);
    }

    fn literal(&mut self, s: &str, indent: i32) {
        self.indicator("|", true, false, false);
        let chars: Vec<char> = s.chars().collect();
        let mut hints = String::new();
        if chars.first().is_some_and(|c| *c == ' ' || is_break(*c)) {
            hints.push_str(&BEST_INDENT.to_string());
        }
        match chars.last() {
            Some(c) if !is_break(*c) => hints.push('-'),
            Some(_) if chars.len() == 1 => hints.push('+'),
            Some(_) if chars.get(chars.len() - 2).is_some_and(|c| is_break(*c)) => hints.push('+'),
            _ => {}
        }
        if !hints.is_empty() {
            self.indicator(&hints, false, false, false);
        }
        self.put_break();
        self.indention = true;
        self.whitespace = true;
        let mut breaks = true;
        for c in chars {
            if is_break(c) {
                self.write_break(c);
                self.indention = true;
                breaks = true;
            } else {
                if breaks {
                    self.write_indent(indent);
                }
                self.put(c);
                self.indention = false;
                breaks = false;
            }
        }
    }
}

fn is_break(c: char) -> bool {
    matches!(c, '\r' | '\n' | '\u{85}' | '\u{2028}' | '\u{2029}')
}

fn is_blank_or_end(c: Option<char>) -> bool {
    match c {
        None => true,
        Some(c) => c == ' ' || c == '\t' || c == '\0' || is_break(c),
    }
}

/// libyaml's printable set (four-byte UTF-8 characters are not in it).
fn is_printable(c: char) -> bool {
    matches!(c as u32, 0x0a | 0x20..=0x7e | 0xa0..=0xd7ff | 0xe000..=0xfffd) && c != '\u{feff}'
}

/// What libyaml's scalar analysis allows for one string in block context.
struct Analysis {
    block_plain_allowed: bool,
    single_quoted_allowed: bool,
    block_allowed: bool,
}

impl Analysis {
    fn of(s: &str) -> Self {
        if s.is_empty() {
            return Self {
                block_plain_allowed: true,
                single_quoted_allowed: true,
                block_allowed: false,
            };
        }
        let chars: Vec<char> = s.chars().collect();
        let mut block_indicators = s.starts_with("---") || s.starts_with("...");
        let (mut leading_space, mut leading_break) = (false, false);
        let (mut trailing_space, mut trailing_break) = (false, false);
        let (mut break_space, mut space_break) = (false, false);
        let (mut previous_space, mut previous_break) = (false, false);
        let (mut line_breaks, mut special) = (false, false);
        let mut preceded_by_whitespace = true;
        for (i, &c) in chars.iter().enumerate() {
            let followed_by_whitespace = is_blank_or_end(chars.get(i + 1).copied());
            block_indicators |=
                is_indicator(i == 0, c, preceded_by_whitespace, followed_by_whitespace);
            if !is_printable(c) {
                special = true;
            }
            let last = i + 1 == chars.len();
            if c == ' ' {
                leading_space |= i == 0;
                trailing_space |= last;
                break_space |= previous_break;
                previous_space = true;
                previous_break = false;
            } else if is_break(c) {
                line_breaks = true;
                leading_break |= i == 0;
                trailing_break |= last;
                space_break |= previous_space;
                previous_space = false;
                previous_break = true;
            } else {
                previous_space = false;
                previous_break = false;
            }
            preceded_by_whitespace = is_blank_or_end(Some(c));
        }
        let mut analysis = Self {
            block_plain_allowed: true,
            single_quoted_allowed: true,
            block_allowed: true,
        };
        if leading_space || leading_break || trailing_space || trailing_break {
            analysis.block_plain_allowed = false;
        }
        if trailing_space {
            analysis.block_allowed = false;
        }
        if break_space {
            analysis.block_plain_allowed = false;
            analysis.single_quoted_allowed = false;
        }
        if space_break || special {
            analysis = Self {
                block_plain_allowed: false,
                single_quoted_allowed: false,
                block_allowed: false,
            };
        }
        if line_breaks || block_indicators {
            analysis.block_plain_allowed = false;
        }
        analysis
    }
}

/// Whether `c` makes a scalar need quoting as an indicator: at the start, any flow or block
/// indicator (`?`, `:` and `-` only before whitespace); inside, `: ` and ` #`.
fn is_indicator(first: bool, c: char, after_whitespace: bool, before_whitespace: bool) -> bool {
    match (first, c) {
        (
            true,
            '#' | ',' | '[' | ']' | '{' | '}' | '&' | '*' | '!' | '|' | '>' | '\'' | '"' | '%'
            | '@' | '`',
        ) => true,
        (true, '?' | ':' | '-') => before_whitespace,
        (false, ':') => before_whitespace,
        (false, '#') => after_whitespace,
        _ => false,
    }
}

/// Whether go-yaml (YAML 1.1) reads `s`, unquoted, back as a string.
fn resolves_to_string(s: &str) -> bool {
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
fn is_base60_float(s: &str) -> bool {
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
fn go_float(f: f64) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(entries: &[(&str, Value)]) -> String {
        to_string(&Value::map(entries.iter().cloned()))
    }

    /// Each case was written by `sigs.k8s.io/yaml` v1.6.0 for `{"v": <string>}`.
    #[test]
    fn strings_are_quoted_exactly_where_go_yaml_quotes_them() {
        let cases = [
            ("", r#""""#),
            ("0", r#""0""#),
            ("00:5c:52:31:3a:9c", "00:5c:52:31:3a:9c"),
            ("00:11:22:33:44:55", r#""00:11:22:33:44:55""#),
            ("192.168.1.1", "192.168.1.1"),
            ("true", r#""true""#),
            ("1.5", r#""1.5""#),
            ("ffff:ffff::", "'ffff:ffff::'"),
            ("2001:db8::1", "2001:db8::1"),
            ("::1", "::1"),
            ("a: b", "'a: b'"),
            ("#x", "'#x'"),
            ("-", "'-'"),
            ("- x", "'- x'"),
            ("1e3", r#""1e3""#),
            ("0x1F", r#""0x1F""#),
            ("yes", r#""yes""#),
            ("on", r#""on""#),
            ("null", r#""null""#),
            ("~", r#""~""#),
            ("1:20", r#""1:20""#),
            ("190:20:30", r#""190:20:30""#),
            ("1:2:3", r#""1:2:3""#),
            (" lead", "' lead'"),
            ("trail ", "'trail '"),
            ("@x", "'@x'"),
            ("a #b", "'a #b'"),
            ("it's", "it's"),
            ("*x", "'*x'"),
            ("?x", "?x"),
            ("? x", "'? x'"),
            ("x,y", "x,y"),
            ("010", r#""010""#),
            ("+1", r#""+1""#),
            (".5", r#"".5""#),
            ("1_000", r#""1_000""#),
            ("0b101", r#""0b101""#),
            ("0o17", r#""0o17""#),
            (".inf", r#"".inf""#),
            ("NaN", "NaN"),
            ("metal3/node-0/m3m", "metal3/node-0/m3m"),
            ("é", "é"),
            ("\"q\"", r#"'"q"'"#),
            ("a\tb", r#""a\tb""#),
            ("x:", "'x:'"),
            ("2024-01-02", r#""2024-01-02""#),
            ("2024-1-2T10:20:30Z", r#""2024-1-2T10:20:30Z""#),
            ("2024-x", "2024-x"),
            ("255.255.255.0", "255.255.255.0"),
            ("10", r#""10""#),
            ("08", r#""08""#),
        ];
        for (input, expected) in cases {
            assert_eq!(
                doc(&[("v", Value::str(input))]),
                format!("v: {expected}\n"),
                "{input:?}"
            );
        }
    }

    #[test]
    fn keys_follow_go_yaml_order_and_quoting() {
        let value = Value::map(
            [
                "ip10", "ip9", "a_b", "aB", "a-b", "x01", "x1", "x001", "Z", "n", "y", "b",
            ]
            .map(|k| (k, Value::Int(1))),
        );
        assert_eq!(
            to_string(&value),
            "Z: 1\na-b: 1\na_b: 1\naB: 1\nb: 1\nip9: 1\nip10: 1\n\"n\": 1\nx1: 1\nx01: 1\nx001: 1\n\"y\": 1\n"
        );
    }

    /// Recorded from `sigs.k8s.io/yaml` v1.6.0 (see the module comment).
    #[test]
    fn layout_nesting_folding_and_block_scalars() {
        let long = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore et dolore magna aliqua";
        let value = Value::map([
            ("a", Value::str(long)),
            ("b", Value::map([("c", Value::str(long))])),
            (
                "d",
                Value::Seq(vec![
                    Value::str(long),
                    Value::map([("e", Value::str(format!("#{long}")))]),
                    Value::Seq(vec![Value::str("x"), Value::str("y")]),
                    Value::Seq(vec![]),
                    Value::Map(vec![]),
                ]),
            ),
            ("f", Value::str(format!("tab\there {long}"))),
            ("g", Value::str("x\n\ny\n")),
            ("h", Value::str(" lead\nx")),
            ("i", Value::str("\n")),
            ("j", Value::str("a\n\n")),
            ("k", Value::str("trail \nx")),
            ("l", Value::Null),
            ("m", Value::Bool(true)),
            ("n2", Value::Int(1500)),
            ("o", Value::Float(1.5)),
            ("p", Value::Float(1000.0)),
            ("r", Value::Float(1e21)),
            ("s", Value::Float(0.0001)),
            ("t", Value::Float(-0.5)),
            ("u", Value::Map(vec![])),
            ("v", Value::Seq(vec![])),
        ]);
        let expected = r#"a: lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt
  ut labore et dolore magna aliqua
b:
  c: lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor
    incididunt ut labore et dolore magna aliqua
d:
- lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt
  ut labore et dolore magna aliqua
- e: '#lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor
    incididunt ut labore et dolore magna aliqua'
- - x
  - "y"
- []
- {}
f: "tab\there lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod
  tempor incididunt ut labore et dolore magna aliqua"
g: |
  x

  y
h: |2-
   lead
  x
i: |2+

j: |+
  a

k: "trail \nx"
l: null
m: true
n2: 1500
o: 1.5
p: 1000
r: 1e+21
s: 0.0001
t: -0.5
u: {}
v: []
"#;
        assert_eq!(to_string(&value), expected);
        assert_eq!(to_string(&Value::Map(vec![])), "{}\n");
        assert_eq!(to_string(&Value::Seq(vec![])), "[]\n");
    }
}
