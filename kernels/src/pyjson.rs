//! JSON text exactly as Python's `json.dumps` writes it, and Python's `repr` of a float.
//!
//! One writer for everything that must look like Python output: tool schemas and
//! `<tool_call>` bodies in prompts (the spacing Hermes-style models were trained on), the
//! chat template's `tojson` filter, and BFCL results (what the reference environment prints).
//! Python's defaults differ from serde_json's compact form in three ways: separators `", "` and
//! `": "`, floats as `repr(float)` (`1e-05`, `2.0`), and non-finite floats as `NaN` /
//! `Infinity`.

use std::convert::Infallible;
use std::fmt::Write as _;

use serde_json::Value;

/// The options of `json.dumps` that matter for text (`skipkeys`, `default`, … do not apply to
/// JSON values).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpStyle {
    /// `indent`: `None` writes one line; `Some(s)` puts each item on its own line, `s` per level.
    pub indent: Option<String>,
    /// Between items (`", "` by default, `","` when indenting).
    pub item_separator: String,
    /// Between a key and its value.
    pub key_separator: String,
    /// `sort_keys`: object keys in code-point order instead of insertion order.
    pub sort_keys: bool,
    /// `ensure_ascii`: non-ASCII characters as `\uXXXX` (UTF-16 units).
    pub ensure_ascii: bool,
}

impl DumpStyle {
    /// `json.dumps(v, ensure_ascii=False)`: one line, `", "` and `": "`, characters kept as
    /// they are. The form of prompts (schemas, tool calls, rehearsed results).
    pub fn compact() -> Self {
        Self {
            indent: None,
            item_separator: ", ".into(),
            key_separator: ": ".into(),
            sort_keys: false,
            ensure_ascii: false,
        }
    }

    /// `json.dumps(v)` with every default, `ensure_ascii=True` included.
    pub fn python_default() -> Self {
        Self {
            ensure_ascii: true,
            ..Self::compact()
        }
    }
}

/// `value` as `json.dumps` with `style` writes it. Object keys keep their order (serde_json's
/// `preserve_order`) unless `style.sort_keys`.
pub fn dumps(value: &Value, style: &DumpStyle) -> String {
    let mut out = String::new();
    write_value(&mut out, value, style, 0);
    out
}

/// [`dumps`] with [`DumpStyle::compact`]: the text of tool schemas, tool calls and results in
/// prompts.
pub fn compact(value: &Value) -> String {
    dumps(value, &DumpStyle::compact())
}

fn write_value(out: &mut String, value: &Value, style: &DumpStyle, depth: usize) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            let text = n.to_string();
            if n.is_i64() || n.is_u64() || !text.contains(['.', 'e', 'E']) {
                // An integer, exact however long (serde_json's `arbitrary_precision` keeps the
                // digits), as Python's `int` prints.
                out.push_str(&text);
            } else {
                out.push_str(&json_float(n.as_f64().unwrap_or(f64::NAN)));
            }
        }
        Value::String(s) => write_string(out, s, style.ensure_ascii),
        Value::Array(items) => {
            let items: Vec<&Value> = items.iter().collect();
            let Ok(()) = write_container::<_, Infallible>(
                out,
                ('[', ']'),
                &items,
                style,
                depth,
                |out, item| {
                    write_value(out, item, style, depth + 1);
                    Ok(())
                },
            );
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            let Ok(()) = write_container::<_, Infallible>(
                out,
                ('{', '}'),
                &entries,
                style,
                depth,
                |out, (k, v)| {
                    write_string(out, k, style.ensure_ascii);
                    out.push_str(&style.key_separator);
                    write_value(out, v, style, depth + 1);
                    Ok(())
                },
            );
        }
    }
}

/// Writes `[…]` / `{…}` in Python's layout: an empty container stays `[]` / `{}`; with an
/// indent, every item sits on its own line. `write_item` writes one item.
///
/// # Errors
/// The first error of `write_item`.
pub fn write_container<T, E>(
    out: &mut String,
    (open, close): (char, char),
    items: &[T],
    style: &DumpStyle,
    depth: usize,
    mut write_item: impl FnMut(&mut String, &T) -> Result<(), E>,
) -> Result<(), E> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    let newline = |out: &mut String, depth: usize| {
        if let Some(indent) = &style.indent {
            out.push('\n');
            out.push_str(&indent.repeat(depth));
        }
    };
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&style.item_separator);
        }
        newline(out, depth + 1);
        write_item(out, item)?;
    }
    newline(out, depth);
    out.push(close);
    Ok(())
}

/// A JSON string as Python writes it: `"`, `\`, `\n`, `\r`, `\t`, `\b`, `\f` escaped, other
/// control characters as `\u00XX`; other characters as they are, or as `\uXXXX` (UTF-16 units)
/// with `ensure_ascii`.
pub fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !c.is_ascii()) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A float as `json.dumps` writes it: [`float_repr`], with `NaN`, `Infinity` and `-Infinity`
/// for the non-finite values (`allow_nan=True`).
pub fn json_float(f: f64) -> String {
    if f.is_nan() {
        "NaN".into()
    } else if f.is_infinite() {
        if f > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else {
        float_repr(f)
    }
}

/// CPython's `repr(float)`: the shortest digits that round-trip, `.0` on whole numbers, and
/// exponent form with at least two exponent digits when the decimal exponent is below −4 or
/// from 16 on (`1e-05`, `1e+16`); `nan`, `inf`, `-inf`.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    // `{:e}` has the shortest round-trip digits: "-1.2345e-7".
    let scientific = format!("{f:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if !(-4..16).contains(&exponent) {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exponent.abs())
    } else {
        // Display writes the same digits without an exponent in this range.
        let plain = f.to_string();
        if plain.contains('.') {
            plain
        } else {
            plain + ".0"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn compact_uses_python_separators_and_keeps_key_order() {
        let v = json!({"b": [1, 2.5, "x"], "a": {"k": null, "t": true}});
        assert_eq!(
            compact(&v),
            r#"{"b": [1, 2.5, "x"], "a": {"k": null, "t": true}}"#
        );
    }

    #[test]
    fn floats_follow_python_repr() {
        for (f, want) in [
            (2.0, "2.0"),
            (-0.0, "-0.0"),
            (0.1, "0.1"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456789.125, "123456789.125"),
            (-1.5e-7, "-1.5e-07"),
        ] {
            assert_eq!(float_repr(f), want, "{f}");
        }
        assert_eq!(float_repr(f64::NAN), "nan");
        assert_eq!(json_float(f64::NAN), "NaN");
        assert_eq!(json_float(f64::NEG_INFINITY), "-Infinity");
        assert_eq!(compact(&json!([1e-5, 3.0])), "[1e-05, 3.0]");
    }

    #[test]
    fn strings_escape_like_python() {
        let v = json!("é\"\\\n\u{1}😀");
        assert_eq!(compact(&v), "\"é\\\"\\\\\\n\\u0001😀\"");
        assert_eq!(
            dumps(&v, &DumpStyle::python_default()),
            "\"\\u00e9\\\"\\\\\\n\\u0001\\ud83d\\ude00\""
        );
    }

    #[test]
    fn indent_and_sort_keys_match_json_dumps() {
        // json.dumps({"b": [1, {}], "a": []}, indent=2, sort_keys=True)
        let style = DumpStyle {
            indent: Some("  ".into()),
            item_separator: ",".into(),
            sort_keys: true,
            ..DumpStyle::compact()
        };
        assert_eq!(
            dumps(&json!({"b": [1, {}], "a": []}), &style),
            "{\n  \"a\": [],\n  \"b\": [\n    1,\n    {}\n  ]\n}"
        );
    }
}
