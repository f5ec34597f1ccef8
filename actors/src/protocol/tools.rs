//! Tool schemas as prompt text, for both roles.
//!
//! Chat templates without tool support (SmolLM2's plain ChatML, DESIGN.md §4) ignore the
//! `tools` argument, so the protocol writes the whitelist into the prompt itself:
//!
//! * [`ToolRendering::Full`] (reference): the Hermes / Qwen convention, a `<tools>` section
//!   holding one JSON schema per line, serialised as Python's `json.dumps` writes it (what
//!   Qwen's template's `tojson` prints);
//! * [`ToolRendering::Compact`]: one line per function,
//!   `name(param: type, opt?: type = default) - First sentence of the description.`

use serde_json::Value;

use super::ToolRendering;
use crate::kernels::pyjson;
use crate::tool_name;

/// Longest description kept by the compact rendering, in characters (after cutting to the
/// first sentence).
const MAX_COMPACT_DESCRIPTION: usize = 200;

/// Renders a whitelist of OpenAI function schemas (`{"type": "function", "function": {name,
/// description, parameters}}`, or the bare `{name, description, parameters}`).
///
/// * `Full`: `"<tools>\n"` + one JSON schema per line + `"\n</tools>"`;
/// * `Compact`: one [`render_tool`] line per function, no surrounding tags.
///
/// An empty whitelist renders as an empty `<tools>` section (`Full`) or the empty string.
pub fn render_tools(tools: &[Value], rendering: ToolRendering) -> String {
    let lines: Vec<String> = tools.iter().map(|t| render_tool(t, rendering)).collect();
    match rendering {
        ToolRendering::Full => format!("<tools>\n{}\n</tools>", lines.join("\n")),
        ToolRendering::Compact => lines.join("\n"),
    }
}

/// Renders one tool schema: its JSON on one line (`Full`, Python `json.dumps` spacing, keys in
/// schema order) or its compact signature line (`Compact`). Schemas that are not objects or
/// lack a name still render (the name shows as `?`); nothing here fails.
pub fn render_tool(tool: &Value, rendering: ToolRendering) -> String {
    match rendering {
        ToolRendering::Full => pyjson::compact(tool),
        ToolRendering::Compact => compact_tool(tool),
    }
}

/// `name(param: type, opt?: type = default) - First sentence.`
fn compact_tool(tool: &Value) -> String {
    let function = tool.get("function").unwrap_or(tool);
    let name = tool_name(tool).unwrap_or("?");
    let parameters = function.get("parameters");
    let required: Vec<&str> = parameters
        .and_then(|p| p.get("required"))
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let params: Vec<String> = parameters
        .and_then(|p| p.get("properties"))
        .and_then(Value::as_object)
        .map(|props| {
            props
                .iter()
                .map(|(param, schema)| {
                    let optional = !required.contains(&param.as_str());
                    let mut s = format!(
                        "{param}{}: {}",
                        if optional { "?" } else { "" },
                        type_str(schema)
                    );
                    if let (true, Some(default)) = (optional, schema.get("default")) {
                        s.push_str(" = ");
                        s.push_str(&default.to_string());
                    }
                    s
                })
                .collect()
        })
        .unwrap_or_default();
    let mut line = format!("{name}({})", params.join(", "));
    let description = function
        .get("description")
        .and_then(Value::as_str)
        .map(first_sentence)
        .unwrap_or_default();
    if !description.is_empty() {
        line.push_str(" - ");
        line.push_str(&description);
    }
    line
}

/// A short type for a JSON-schema property: `str`, `int`, `float`, `bool`, `list[int]`, `dict`,
/// enum values as `"a"|"b"`, unions as `int|None`; `any` when untyped.
fn type_str(schema: &Value) -> String {
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        if !values.is_empty() {
            return values
                .iter()
                .map(Value::to_string)
                .collect::<Vec<_>>()
                .join("|");
        }
    }
    let items = schema.get("items");
    match schema.get("type") {
        Some(Value::String(t)) => scalar_type(t, items),
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .map(|t| scalar_type(t, items))
            .collect::<Vec<_>>()
            .join("|"),
        _ => match schema.get("anyOf").or_else(|| schema.get("oneOf")) {
            Some(Value::Array(alts)) => alts.iter().map(type_str).collect::<Vec<_>>().join("|"),
            _ => "any".into(),
        },
    }
}

/// One named JSON-schema (or BFCL: `dict`, `float`, `tuple`, `any`) type, Python-style.
fn scalar_type(t: &str, items: Option<&Value>) -> String {
    match t {
        "string" => "str".into(),
        "integer" => "int".into(),
        "number" | "float" => "float".into(),
        "boolean" => "bool".into(),
        "null" => "None".into(),
        "object" | "dict" => "dict".into(),
        "array" | "list" | "tuple" => match items {
            Some(items) if items.is_object() => format!("list[{}]", type_str(items)),
            _ => "list".into(),
        },
        other => other.into(),
    }
}

/// The first sentence of a description (up to the first `.` followed by whitespace, or the
/// first line break), cut to [`MAX_COMPACT_DESCRIPTION`] characters with `…`.
fn first_sentence(description: &str) -> String {
    let text = description.trim();
    let mut end = text.len();
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c == '\n' {
            end = i;
            break;
        }
        if c == '.' && chars.peek().is_none_or(|&(_, next)| next.is_whitespace()) {
            end = i + 1;
            break;
        }
    }
    let sentence = text[..end].trim_end();
    if sentence.chars().count() > MAX_COMPACT_DESCRIPTION {
        let cut: String = sentence.chars().take(MAX_COMPACT_DESCRIPTION - 1).collect();
        format!("{cut}…")
    } else {
        sentence.to_string()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::protocol::test_support::file_system_tools;

    #[test]
    fn full_is_a_hermes_tools_section_with_one_schema_per_line() {
        let tools = file_system_tools();
        let text = render_tools(&tools, ToolRendering::Full);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.first(), Some(&"<tools>"));
        assert_eq!(lines.last(), Some(&"</tools>"));
        assert_eq!(lines.len(), tools.len() + 2);
        for (line, tool) in lines[1..lines.len() - 1].iter().zip(&tools) {
            let parsed: Value = serde_json::from_str(line).expect("one JSON schema per line");
            assert_eq!(&parsed, tool);
        }
        // Python json.dumps spacing, keys in schema order.
        assert!(lines[1].starts_with(r#"{"type": "function", "function": {"name": "cd", "#));
    }

    #[test]
    fn compact_lines_show_optional_enum_array_and_first_sentence() {
        let tools = file_system_tools();
        let text = render_tools(&tools, ToolRendering::Compact);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "cd(folder: str) - Change the current working directory to the specified folder.",
                "ls(a?: bool = false) - List the contents of the current directory.",
                r#"sort(file_name: str, order: "asc"|"desc", keys?: list[int]) - Sort the contents of a file line by line."#,
                "post_tweet(content: str, tags?: list[str] = [], mentions?: list[str] = []) - Post a tweet for the authenticated user.",
            ]
        );
    }

    #[test]
    fn compact_is_less_than_half_of_full() {
        let tools = file_system_tools();
        let full = render_tools(&tools, ToolRendering::Full).chars().count();
        let compact = render_tools(&tools, ToolRendering::Compact).chars().count();
        assert!(compact * 2 < full, "compact {compact} chars vs full {full}");
    }

    #[test]
    fn compact_handles_bare_and_odd_schemas() {
        let bare = json!({"name": "now", "description": "Current time\nin UTC."});
        assert_eq!(
            render_tool(&bare, ToolRendering::Compact),
            "now() - Current time"
        );
        let odd = json!({"name": "f", "parameters": {"properties": {
            "x": {"type": ["integer", "null"]},
            "y": {},
            "z": {"type": "dict"}
        }, "required": ["x"]}});
        assert_eq!(
            render_tool(&odd, ToolRendering::Compact),
            "f(x: int|None, y?: any, z?: dict)"
        );
        assert_eq!(render_tool(&json!(3), ToolRendering::Compact), "?()");
        let long = "word ".repeat(100);
        let line = render_tool(
            &json!({"name": "g", "description": long}),
            ToolRendering::Compact,
        );
        assert!(line.ends_with('…'));
        assert_eq!(
            line.chars().count(),
            "g() - ".len() + MAX_COMPACT_DESCRIPTION
        );
    }

    #[test]
    fn python_json_spacing() {
        let v = json!({"a": [1, 2, {"b": "é"}], "c": null});
        assert_eq!(
            pyjson::compact(&v),
            r#"{"a": [1, 2, {"b": "é"}], "c": null}"#
        );
    }
}
