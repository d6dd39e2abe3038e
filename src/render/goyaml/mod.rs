//! A YAML writer that produces what CAPM3's `sigs.k8s.io/yaml` (go-yaml v2 behind a JSON round
//! trip) produces for the same data, byte for byte: block style, keys in go-yaml's order, scalars
//! quoted only when go-yaml would quote them, long lines folded at 80 columns.
//!
//! Rendered secrets are compared with what CAPM3 wrote (BareMetalHost re-provisioning, GitOps
//! diffs), so "equivalent YAML" is not enough. The rules below restate go-yaml's documented
//! behaviour (YAML 1.1 resolution, libyaml's scalar analysis); the tests pin outputs recorded from
//! `sigs.k8s.io/yaml` v1.6.0.
//!
//! - [`emitter`]: libyaml's block-style emitter, as far as these documents need it;
//! - [`analysis`]: libyaml's analysis of a scalar, which says which styles it may take;
//! - [`resolve`]: go-yaml's YAML 1.1 resolution, which says which strings must be quoted.

mod analysis;
mod emitter;
mod resolve;

use std::cmp::Ordering;

use emitter::{Context, Emitter};

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
    /// A string value.
    pub fn str(s: impl Into<String>) -> Self {
        Value::Str(s.into())
    }

    /// A map of the entries, in the order given.
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
