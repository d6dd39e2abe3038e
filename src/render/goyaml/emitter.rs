//! libyaml's block-style emitter, as far as the documents rendered here need it: indentation,
//! the choice of scalar style and the writing of each style, folded at [`BEST_WIDTH`] columns.

use std::cmp::Ordering;

use super::analysis::{Analysis, is_break, is_printable};
use super::resolve::{go_float, is_base60_float, resolves_to_string};
use super::{Value, chars_order};

/// Where a node stands.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Context {
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
pub(super) struct Emitter {
    /// What has been written.
    pub(super) out: String,
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

    /// Ends the current line, if anything is on it.
    pub(super) fn line_end(&mut self) {
        if self.column > 0 {
            self.put_break();
        }
    }

    /// Writes `value` in a container whose indent is `indent`.
    pub(super) fn node(&mut self, value: &Value, indent: i32, context: Context) {
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
