//! libyaml's analysis of a scalar: which styles a string may be written in, in block context.

/// A line break, as libyaml counts them.
pub(super) fn is_break(c: char) -> bool {
    matches!(c, '\r' | '\n' | '\u{85}' | '\u{2028}' | '\u{2029}')
}

fn is_blank_or_end(c: Option<char>) -> bool {
    match c {
        None => true,
        Some(c) => c == ' ' || c == '\t' || c == '\0' || is_break(c),
    }
}

/// libyaml's printable set (four-byte UTF-8 characters are not in it).
pub(super) fn is_printable(c: char) -> bool {
    matches!(c as u32, 0x0a | 0x20..=0x7e | 0xa0..=0xd7ff | 0xe000..=0xfffd) && c != '\u{feff}'
}

/// What libyaml's scalar analysis allows for one string in block context.
pub(super) struct Analysis {
    pub(super) block_plain_allowed: bool,
    pub(super) single_quoted_allowed: bool,
    pub(super) block_allowed: bool,
}

impl Analysis {
    /// The analysis of `s`.
    pub(super) fn of(s: &str) -> Self {
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
