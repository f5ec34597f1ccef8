//! The model's own chat template: messages (and tools) → prompt text.
//!
//! [`ChatTemplate`] renders the Jinja source a model ships (GGUF `tokenizer.chat_template`,
//! `tokenizer_config.json`) with minijinja, set up the way HF transformers'
//! `apply_chat_template` sets up Jinja2: `trim_blocks` and `lstrip_blocks`, Python string and
//! dict methods (`.strip()`, `.startswith()`, `.items()`, via minijinja-contrib's pycompat), a
//! `tojson` filter that writes what Python's `json.dumps` writes, and `raise_exception`.
//! Encode the rendered text with [`crate::tokenizer::Tokenizer::encode`]: the special tokens the
//! template writes map to their ids there.
use std::fmt::Write as _;
use std::sync::Arc;

use minijinja::value::{Enumerator, Kwargs, Object, ObjectRepr, Value as JinjaValue, ValueKind};
use minijinja::{Environment, ErrorKind};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::pyjson::{json_float, write_container, write_string, DumpStyle};
use crate::tokenizer::Tokenizer;

/// The name the template source is registered under; it appears in error messages.
const TEMPLATE_NAME: &str = "chat_template";

/// One chat message in the OpenAI / HF shape that chat templates read.
///
/// Serialises to `{"role", "content"}` plus `tool_calls`, `name` and `tool_call_id` when set.
/// [`ChatTemplate::render`] takes these or plain `serde_json::Value` messages alike.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool` (templates decide what they accept).
    pub role: String,
    /// The message text (may be empty for an assistant turn that only calls tools).
    pub content: String,
    /// Tool calls of an assistant turn, each `{"type": "function", "function": {"name",
    /// "arguments"}}` with `arguments` a JSON object (templates serialise it with `tojson`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Value>>,
    /// Name of the tool that produced a `tool` message, or of the speaker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Id of the tool call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    /// A message with only `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            name: None,
            tool_call_id: None,
        }
    }

    /// A `system` message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }

    /// A `user` message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    /// An `assistant` message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }

    /// A `tool` message carrying a tool's result.
    pub fn tool(content: impl Into<String>) -> Self {
        Self::new("tool", content)
    }
}

/// A compiled chat template with the special tokens it may reference.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl ChatTemplate {
    /// Compiles a Jinja chat template. `bos_token` / `eos_token` are the texts the template sees
    /// as `bos_token` / `eos_token` (undefined there when `None`).
    ///
    /// # Errors
    /// [`Error::Template`] with minijinja's message and the line of a syntax error.
    pub fn new(source: &str, bos_token: Option<String>, eos_token: Option<String>) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(template_error)?;
        Ok(Self {
            env,
            bos_token,
            eos_token,
        })
    }

    /// The template a tokenizer carries, with its BOS and EOS texts.
    ///
    /// # Errors
    /// [`Error::Template`] if the tokenizer has no chat template or it does not compile.
    pub fn from_tokenizer(tokenizer: &Tokenizer) -> Result<Self> {
        let source = tokenizer
            .chat_template
            .as_deref()
            .ok_or_else(|| Error::Template("the model ships no chat template".into()))?;
        Self::new(source, tokenizer.bos_token(), tokenizer.eos_token())
    }

    /// Renders a conversation to prompt text.
    ///
    /// The template sees `messages` (each serialised to JSON: [`ChatMessage`] or any
    /// `serde_json::Value` object), `tools` (`none` when `None`, as HF passes it; each tool an
    /// OpenAI function schema), `add_generation_prompt` (open an assistant turn at the end),
    /// `bos_token` and `eos_token`. Object keys keep the order `serde_json` gives them.
    ///
    /// # Errors
    /// [`Error::Template`] if a message does not serialise, the template calls
    /// `raise_exception` (its message is kept) or rendering fails (with the line).
    pub fn render<M: Serialize>(
        &self,
        messages: &[M],
        tools: Option<&[Value]>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let messages = serde_json::to_value(messages)
            .map_err(|e| Error::Template(format!("messages do not serialise to JSON: {e}")))?;
        let tools = tools.map_or(JinjaValue::from(()), |tools| {
            JinjaValue::from(tools.iter().map(to_jinja).collect::<Vec<_>>())
        });
        let optional = |token: &Option<String>| {
            token
                .as_deref()
                .map_or(JinjaValue::UNDEFINED, JinjaValue::from)
        };
        let context = minijinja::context! {
            messages => to_jinja(&messages),
            tools => tools,
            add_generation_prompt => add_generation_prompt,
            bos_token => optional(&self.bos_token),
            eos_token => optional(&self.eos_token),
        };
        self.env
            .get_template(TEMPLATE_NAME)
            .and_then(|template| template.render(context))
            .map_err(template_error)
    }
}

/// Formats a minijinja error with its line and the chain of causes.
fn template_error(err: minijinja::Error) -> Error {
    let mut message = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(cause) = source {
        let _ = write!(message, ": {cause}");
        source = cause.source();
    }
    Error::Template(message)
}

/// `raise_exception(message)`: HF's way for a template to reject a conversation.
fn raise_exception(message: String) -> std::result::Result<JinjaValue, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

/// A JSON object whose keys keep their order (minijinja's own maps sort keys unless built with
/// `preserve_order`; Python dicts, which templates were written for, keep insertion order).
#[derive(Debug)]
struct OrderedMap(Vec<(String, JinjaValue)>);

impl Object for OrderedMap {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &JinjaValue) -> Option<JinjaValue> {
        let key = key.as_str()?;
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(
            self.0
                .iter()
                .map(|(k, _)| JinjaValue::from(k.as_str()))
                .collect(),
        )
    }
}

/// JSON → template value. Done by hand rather than through serde: numbers must stay numbers
/// even when serde_json's `arbitrary_precision` is on (it is, through a dependency), and
/// objects must keep their key order.
fn to_jinja(value: &Value) -> JinjaValue {
    match value {
        Value::Null => JinjaValue::from(()),
        Value::Bool(b) => JinjaValue::from(*b),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                JinjaValue::from(i)
            } else if let Some(u) = n.as_u64() {
                JinjaValue::from(u)
            } else {
                JinjaValue::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Value::String(s) => JinjaValue::from(s.as_str()),
        Value::Array(items) => JinjaValue::from(items.iter().map(to_jinja).collect::<Vec<_>>()),
        Value::Object(map) => JinjaValue::from_object(OrderedMap(
            map.iter().map(|(k, v)| (k.clone(), to_jinja(v))).collect(),
        )),
    }
}

/// `tojson(indent=None, separators=None, sort_keys=False, ensure_ascii=False)`: HF's override
/// of Jinja's filter, i.e. Python `json.dumps` with these options. Unlike minijinja's own
/// filter it does not HTML-escape and uses Python's separators (`", "`, `": "`), which is the
/// text models were trained on.
fn tojson(value: &JinjaValue, kwargs: Kwargs) -> std::result::Result<JinjaValue, minijinja::Error> {
    let indent = match kwargs.get::<Option<JinjaValue>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(match v.as_str() {
            Some(s) => s.to_string(),
            None => " ".repeat(usize::try_from(v)?),
        }),
    };
    let (item_separator, key_separator) = match kwargs.get::<Option<Vec<String>>>("separators")? {
        Some(pair) => match <[String; 2]>::try_from(pair) {
            Ok([item, key]) => (item, key),
            Err(_) => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be a pair (item_separator, key_separator)",
                ))
            }
        },
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let style = DumpStyle {
        indent,
        item_separator,
        key_separator,
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(&mut out, value, &style, 0)?;
    Ok(JinjaValue::from(out))
}

fn write_json(
    out: &mut String,
    value: &JinjaValue,
    style: &DumpStyle,
    depth: usize,
) -> std::result::Result<(), minijinja::Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number if value.is_integer() => out.push_str(&value.to_string()),
        ValueKind::Number => out.push_str(&json_float(f64::try_from(value.clone())?)),
        ValueKind::String => {
            write_string(out, value.as_str().unwrap_or_default(), style.ensure_ascii)
        }
        ValueKind::Map => {
            let mut keys: Vec<JinjaValue> = value.try_iter()?.collect();
            if style.sort_keys {
                keys.sort_by_key(|k| k.to_string());
            }
            let entries = keys
                .into_iter()
                .map(|key| {
                    let item = value.get_item(&key)?;
                    Ok((key, item))
                })
                .collect::<std::result::Result<Vec<_>, minijinja::Error>>()?;
            write_container(
                out,
                ('{', '}'),
                &entries,
                style,
                depth,
                |out, (key, item)| {
                    // Python turns non-string keys into strings.
                    let key = key.as_str().map_or_else(|| key.to_string(), str::to_string);
                    write_string(out, &key, style.ensure_ascii);
                    out.push_str(&style.key_separator);
                    write_json(out, item, style, depth + 1)
                },
            )?;
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<JinjaValue> = value.try_iter()?.collect();
            write_container(out, ('[', ']'), &items, style, depth, |out, item| {
                write_json(out, item, style, depth + 1)
            })?;
        }
        _ => {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a {} value is not JSON serialisable", value.kind()),
            ))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::tests::{reference, smollm2};
    use serde_json::json;

    #[test]
    fn smollm2_template_renders_reference_prompts() {
        let tok = smollm2();
        let template = ChatTemplate::from_tokenizer(&tok).unwrap();
        let reference = reference();
        let cases = reference["generation_cases"].as_array().unwrap();
        assert!(!cases.is_empty());
        for case in cases {
            let messages = case["messages"].as_array().unwrap();
            let text = template.render(messages, None, true).unwrap();
            assert_eq!(text, case["prompt_text"].as_str().unwrap());
            let ids: Vec<u32> = serde_json::from_value(case["prompt_ids"].clone()).unwrap();
            assert_eq!(tok.encode(&text).unwrap(), ids);

            // Typed messages render the same.
            let typed: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).unwrap();
            assert_eq!(template.render(&typed, None, true).unwrap(), text);
        }
        let no_prompt = template
            .render(&[ChatMessage::user("Hi")], None, false)
            .unwrap();
        assert!(
            no_prompt.ends_with("<|im_start|>user\nHi<|im_end|>\n"),
            "{no_prompt:?}"
        );
    }

    /// A cut-down Qwen2.5 template: tools listed with `tojson`, assistant tool calls, tool
    /// results grouped into one user turn, Python string methods.
    const QWEN_LIKE: &str = r#"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'].strip() }}
    {%- else %}
        {{- 'You are Qwen, a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools><|im_end|>\n" }}
{%- elif messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {%- if message.content.startswith('{') %}
            {{- message.content | trim }}
        {%- else %}
            {{- message.content.upper() }}
        {%- endif %}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"#;

    /// Rendered by Python Jinja2 3.1.6 the way transformers sets it up (trim_blocks,
    /// lstrip_blocks, `tojson` = `json.dumps`), from the same messages and tools.
    const QWEN_LIKE_EXPECTED: &str = "<|im_start|>system\nYou are a weather bot.\n\n# Tools\n\n<tools>\n{\"function\": {\"description\": \"Current weather in a city\", \"name\": \"get_weather\", \"parameters\": {\"properties\": {\"city\": {\"type\": \"string\"}, \"unit\": {\"enum\": [\"C\", \"F\"], \"type\": \"string\"}}, \"required\": [\"city\"], \"type\": \"object\"}}, \"type\": \"function\"}\n</tools><|im_end|>\n<|im_start|>user\nWeather in Zürich and Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"C\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{\"temp\": 21.5}\n</tool_response>\n<tool_response>\nSUNNY\n</tool_response><|im_end|>\n<|im_start|>assistant\n";

    #[test]
    fn qwen_like_template_renders_tools_and_tool_calls() {
        let template = ChatTemplate::new(QWEN_LIKE, None, Some("<|im_end|>".into())).unwrap();
        // Keys in sorted order at every level, so the expected text holds whether or not
        // serde_json preserves insertion order.
        let tools = [json!({
            "function": {
                "description": "Current weather in a city",
                "name": "get_weather",
                "parameters": {
                    "properties": {
                        "city": {"type": "string"},
                        "unit": {"enum": ["C", "F"], "type": "string"}
                    },
                    "required": ["city"],
                    "type": "object"
                }
            },
            "type": "function"
        })];
        let call = |args: Value| json!({"function": {"arguments": args, "name": "get_weather"}, "type": "function"});
        let messages = vec![
            ChatMessage::system("  You are a weather bot.\n"),
            ChatMessage::user("Weather in Zürich and Paris?"),
            ChatMessage {
                tool_calls: Some(vec![
                    call(json!({"city": "Zürich"})),
                    call(json!({"city": "Paris", "unit": "C"})),
                ]),
                ..ChatMessage::assistant("")
            },
            ChatMessage {
                tool_call_id: Some("call_0".into()),
                ..ChatMessage::tool("{\"temp\": 21.5}\n")
            },
            ChatMessage::tool("sunny"),
        ];
        let text = template.render(&messages, Some(&tools), true).unwrap();
        assert_eq!(text, QWEN_LIKE_EXPECTED);

        // Without tools the template takes its other branch (`tools` is none, as in HF).
        let text = template.render(&messages[..2], None, false).unwrap();
        assert_eq!(
            text,
            "<|im_start|>system\n  You are a weather bot.\n<|im_end|>\n<|im_start|>user\nWeather in Zürich and Paris?<|im_end|>\n"
        );
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let template = ChatTemplate::new(
            "{{ messages[0] | tojson }}|{{ messages[0] | tojson(indent=2) }}|{{ messages[0] | tojson(sort_keys=true, separators=[',', ':'], ensure_ascii=true) }}|{{ [] | tojson(indent=2) }}",
            None,
            None,
        )
        .unwrap();
        let message =
            json!({"b": [1, 2.5, 1e-7, 1e20, true, null], "a": "é\"\\\n\u{1}<&>🚀", "c": {}});
        let text = template.render(&[message], None, false).unwrap();
        // Python: json.dumps(m), json.dumps(m, indent=2), json.dumps(m, sort_keys=True,
        // separators=(',', ':'), ensure_ascii=True) with m's keys in serde_json's order.
        let keys_in_order: Vec<String> =
            serde_json::from_str::<serde_json::Map<String, Value>>(r#"{"b": 0, "a": 0, "c": 0}"#)
                .unwrap()
                .keys()
                .cloned()
                .collect();
        let field = |key: &str, indent: bool| match (key, indent) {
            ("a", _) => r#""a": "é\"\\\n\u0001<&>🚀""#.to_string(),
            ("b", false) => r#""b": [1, 2.5, 1e-07, 1e+20, true, null]"#.to_string(),
            ("b", true) => {
                "\"b\": [\n    1,\n    2.5,\n    1e-07,\n    1e+20,\n    true,\n    null\n  ]"
                    .to_string()
            }
            _ => r#""c": {}"#.to_string(),
        };
        let plain = keys_in_order
            .iter()
            .map(|k| field(k, false))
            .collect::<Vec<_>>()
            .join(", ");
        let indented = keys_in_order
            .iter()
            .map(|k| format!("  {}", field(k, true)))
            .collect::<Vec<_>>()
            .join(",\n");
        let expected = format!(
            "{{{plain}}}|{{\n{indented}\n}}|{}|[]",
            r#"{"a":"\u00e9\"\\\n\u0001<&>\ud83d\ude80","b":[1,2.5,1e-07,1e+20,true,null],"c":{}}"#
        );
        assert_eq!(text, expected);
    }

    #[test]
    fn raise_exception_becomes_a_template_error() {
        let template = ChatTemplate::new(
            "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation roles must start with user') }}{% endif %}ok",
            None,
            None,
        )
        .unwrap();
        assert_eq!(
            template
                .render(&[ChatMessage::user("x")], None, false)
                .unwrap(),
            "ok"
        );
        let err = template
            .render(&[ChatMessage::assistant("x")], None, false)
            .unwrap_err();
        assert!(matches!(err, Error::Template(_)));
        assert!(
            err.to_string()
                .contains("Conversation roles must start with user"),
            "{err}"
        );
    }

    #[test]
    fn syntax_errors_name_the_line() {
        let err = ChatTemplate::new(
            "{% for m in messages %}\n{{ m.content }\n{% endfor %}",
            None,
            None,
        )
        .unwrap_err();
        assert!(matches!(err, Error::Template(_)));
        let message = err.to_string();
        assert!(
            message.contains("syntax error") && message.contains(":2"),
            "{message}"
        );
    }

    #[test]
    fn bos_and_eos_tokens_reach_the_template() {
        let template = ChatTemplate::new(
            "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}{{ tools is none }}",
            Some("<s>".into()),
            Some("</s>".into()),
        )
        .unwrap();
        let text = template
            .render(&[ChatMessage::user("hi")], None, false)
            .unwrap();
        // minijinja prints booleans the Python way, as Jinja2 does.
        assert_eq!(text, "<s>hi</s>True");
    }
}
