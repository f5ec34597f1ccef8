//! The Rehearse role: the policy predicts one tool result.
//!
//! Reference behaviour (DESIGN.md §2): a fresh `[system, user]` chat per tool call. The system
//! prompt makes the model a precise, silent tool executor that checks format, whitelist and
//! argument schema (required, types, enums) in that order, answers a failed check with a
//! structured error (`INVALID_TOOL_CALL_FORMAT`, `TOOL_NOT_AVAILABLE`, `INVALID_PARAMETERS`) and
//! otherwise a plausible JSON result consistent with the few-shot facts. The user message holds
//! the whitelist, the facts, the conversation as `User:`/`Assistant:`/`Tool[name]:` lines, the
//! Act turn's raw text and the call to simulate. The answer is
//! `\n<execution_result>\n<JSON object or array>\n</execution_result>`; anything else is a
//! simulator error that ends the episode with 0 for the turn.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::tools::{render_tool, render_tools};
use super::ToolRendering;
use crate::kernels::{pyjson, ChatMessage};
use crate::storage::{Message, MessageRole, ToolExchange};
use crate::{tool_name, ToolCall};

/// The Rehearse role's system prompt (the same for every call, so it is part of the cacheable
/// prefix).
pub const REHEARSE_SYSTEM: &str = "You are a precise, silent tool executor. You receive one tool call and answer only with what the tool returns; you never talk to the user.

Check the call in this order and stop at the first check that fails:
1. Format: the call names a function and its arguments form a JSON object. Otherwise answer {\"error\": {\"code\": \"INVALID_TOOL_CALL_FORMAT\", \"message\": \"<what is wrong>\"}}.
2. Whitelist: the function is one of the available tools. Otherwise answer {\"error\": {\"code\": \"TOOL_NOT_AVAILABLE\", \"message\": \"<what is wrong>\"}}.
3. Arguments: every required parameter is present, every value has the declared type and every enum parameter takes one of its allowed values. Otherwise answer {\"error\": {\"code\": \"INVALID_PARAMETERS\", \"message\": \"<what is wrong>\"}}.
If every check passes, answer with the result the real tool would return: a plausible JSON object or array, consistent with the known facts and the conversation so far.

Write exactly this and nothing else:
<execution_result>
<the JSON result>
</execution_result>";

/// The string that ends a Rehearse generation (use it as a stop string; the engine keeps it in
/// the completion, which [`parse_rehearse`] requires).
pub const REHEARSE_STOP: &str = "</execution_result>";

const RESULT_OPEN: &str = "<execution_result>";
const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";

/// The chat of one Rehearse call: `[system, user]`, ready for
/// [`super::PromptKit::encode_chat`] with a generation prompt.
///
/// The user message has these sections, in this order (the first two, with the system prompt,
/// are the same for every call of a task, so a prefix KV cache can be reused across calls):
///
/// 1. `# Available tools`: the whitelist, [`render_tools`];
/// 2. `# Known facts`: real results as `Tool: name\nArguments: {json}\nResult: {json}` entries
///    separated by blank lines (`(none)` when `facts` is empty);
/// 3. `# Conversation so far`: `history` as `User: …`, `Assistant: …` (raw Act text) and
///    `Tool[name]: …` lines (System messages are left out: the Rehearse role has its own);
/// 4. `# Latest assistant turn`: `act_text`, the raw text of the Act turn that made the call;
/// 5. `# Call to simulate`: the name, its schema ([`render_tool`], or a note that it is not in
///    the whitelist) and the arguments JSON (plus positional arguments, when the call has any).
pub fn rehearse_messages(
    tools: &[Value],
    rendering: ToolRendering,
    facts: &[ToolExchange],
    history: &[Message],
    act_text: &str,
    call: &ToolCall,
) -> Vec<ChatMessage> {
    let mut user = format!(
        "# Available tools\n{}\n\n# Known facts\n",
        render_tools(tools, rendering)
    );
    write_facts(&mut user, facts);

    user.push_str("\n# Conversation so far\n");
    for message in history {
        match message.role {
            MessageRole::System => {}
            MessageRole::User => {
                let _ = writeln!(user, "User: {}", message.content);
            }
            MessageRole::Assistant => {
                let _ = writeln!(user, "Assistant: {}", message.content);
            }
            MessageRole::Tool => {
                let _ = writeln!(
                    user,
                    "Tool[{}]: {}",
                    message.tool_name.as_deref().unwrap_or("unknown"),
                    message.content
                );
            }
        }
    }

    let _ = write!(user, "\n# Latest assistant turn\n{}\n\n", act_text.trim());
    write_call(&mut user, tools, rendering, call);
    user.push_str("\nAnswer with the <execution_result> block only.");

    vec![
        ChatMessage::system(REHEARSE_SYSTEM),
        ChatMessage::user(user),
    ]
}

/// Appends the few-shot facts as `Tool: name\nArguments: {json}\nResult: {json}` entries
/// separated by blank lines, or `(none)\n` when there are none (the `# Known facts` body of
/// both protocols' Rehearse prompts).
pub(crate) fn write_facts(out: &mut String, facts: &[ToolExchange]) {
    if facts.is_empty() {
        out.push_str("(none)\n");
    }
    for (i, fact) in facts.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let _ = writeln!(
            out,
            "Tool: {}\nArguments: {}\nResult: {}",
            fact.name, fact.arguments_json, fact.result_json
        );
    }
}

/// Appends the `# Call to simulate` section: the name, its schema ([`render_tool`], or a note
/// that it is not in the whitelist), the arguments JSON and any positional arguments.
pub(crate) fn write_call(
    out: &mut String,
    tools: &[Value],
    rendering: ToolRendering,
    call: &ToolCall,
) {
    let _ = write!(
        out,
        "# Call to simulate\nTool: {}\nSchema: {}\nArguments: {}\n",
        call.name,
        tools
            .iter()
            .find(|t| tool_name(t) == Some(call.name.as_str()))
            .map_or_else(
                || "(not in the available tools)".to_string(),
                |t| render_tool(t, rendering)
            ),
        pyjson::compact(&Value::Object(call.arguments.clone())),
    );
    if !call.positional.is_empty() {
        let _ = writeln!(
            out,
            "Positional arguments: {}",
            pyjson::compact(&Value::Array(call.positional.clone()))
        );
    }
}

/// Why a Rehearse output could not be read. Each ends the episode with 0 for the turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RehearseErrorCode {
    /// The output does not start with `<execution_result>` (after whitespace and an optional
    /// think block).
    MissingBlock,
    /// `<execution_result>` is never closed (e.g. the generation hit its token budget).
    UnclosedBlock,
    /// The block's body is not JSON.
    InvalidJson,
    /// The body is JSON but neither an object nor an array.
    NotObjectOrArray,
}

impl RehearseErrorCode {
    /// `MISSING_BLOCK`, `UNCLOSED_BLOCK`, `INVALID_JSON` or `NOT_OBJECT_OR_ARRAY`.
    pub fn as_str(self) -> &'static str {
        match self {
            RehearseErrorCode::MissingBlock => "MISSING_BLOCK",
            RehearseErrorCode::UnclosedBlock => "UNCLOSED_BLOCK",
            RehearseErrorCode::InvalidJson => "INVALID_JSON",
            RehearseErrorCode::NotObjectOrArray => "NOT_OBJECT_OR_ARRAY",
        }
    }
}

impl std::fmt::Display for RehearseErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Rehearse output that breaks the protocol (a simulator error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct RehearseParseError {
    /// The category.
    pub code: RehearseErrorCode,
    /// What was wrong, with an excerpt of the offending text.
    pub message: String,
}

impl RehearseParseError {
    pub(crate) fn new(code: RehearseErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// Reads one Rehearse output: after optional whitespace (and an optional leading
/// `<think>…</think>`), `<execution_result>`, a JSON object or array, `</execution_result>`.
/// Text after the closing tag is ignored (a stop string can end inside a token).
///
/// # Errors
/// [`RehearseErrorCode::MissingBlock`] when the output does not start with the block (or a
/// think block is unclosed); [`RehearseErrorCode::UnclosedBlock`] when the closing tag is
/// missing, even if the JSON itself is complete; [`RehearseErrorCode::InvalidJson`] and
/// [`RehearseErrorCode::NotObjectOrArray`] for a bad body.
pub fn parse_rehearse(text: &str) -> Result<Value, RehearseParseError> {
    let mut rest = text.trim_start();
    if let Some(inner) = rest.strip_prefix(THINK_OPEN) {
        let end = inner.find(THINK_CLOSE).ok_or_else(|| {
            RehearseParseError::new(
                RehearseErrorCode::MissingBlock,
                format!("{THINK_OPEN} is never closed, so no {RESULT_OPEN} block follows"),
            )
        })?;
        rest = inner[end + THINK_CLOSE.len()..].trim_start();
    }
    let Some(body) = rest.strip_prefix(RESULT_OPEN) else {
        return Err(RehearseParseError::new(
            RehearseErrorCode::MissingBlock,
            format!("expected {RESULT_OPEN}, found {:?}", excerpt(rest)),
        ));
    };
    let Some(end) = body.find(REHEARSE_STOP) else {
        return Err(RehearseParseError::new(
            RehearseErrorCode::UnclosedBlock,
            format!("{RESULT_OPEN} is never closed by {REHEARSE_STOP}"),
        ));
    };
    json_result(body[..end].trim())
}

/// `body` as a tool result: a JSON object or array, else `INVALID_JSON` /
/// `NOT_OBJECT_OR_ARRAY` (shared by both protocols' parsers).
pub(crate) fn json_result(body: &str) -> Result<Value, RehearseParseError> {
    let value: Value = serde_json::from_str(body).map_err(|e| {
        RehearseParseError::new(
            RehearseErrorCode::InvalidJson,
            format!("invalid JSON ({e}) in {:?}", excerpt(body)),
        )
    })?;
    match value {
        Value::Object(_) | Value::Array(_) => Ok(value),
        other => Err(RehearseParseError::new(
            RehearseErrorCode::NotObjectOrArray,
            format!(
                "expected a JSON object or array, found {}",
                excerpt(&other.to_string())
            ),
        )),
    }
}

/// The first 80 characters of `text`, for error messages.
pub(crate) fn excerpt(text: &str) -> String {
    const MAX: usize = 80;
    if text.chars().count() > MAX {
        format!("{}…", text.chars().take(MAX).collect::<String>())
    } else {
        text.to_string()
    }
}

/// The canonical Rehearse text for a real result (supervised warm-up targets):
/// `"\n<execution_result>\n" + JSON + "\n</execution_result>"`, the JSON compact
/// (`serde_json`'s form, keys in their order).
///
/// A `result_json` that parses to an object or array is re-serialised as is. Since the
/// protocol only admits objects and arrays, anything else — a JSON scalar, or text that is not
/// JSON (BFCL's `None`, an exception message) — is wrapped as `{"result": <value or text as a
/// JSON string>}`, so [`parse_rehearse`] of the target always succeeds (a `</execution_result>`
/// inside a string is written `<\/execution_result>`, the same string in JSON).
pub fn render_rehearse_target(result_json: &str) -> String {
    // The closing tag can only occur inside a JSON string; `\/` keeps it from ending the block.
    let json = canonical_result(result_json).replace(REHEARSE_STOP, "<\\/execution_result>");
    format!("\n{RESULT_OPEN}\n{json}\n{REHEARSE_STOP}")
}

/// A real result as the protocol admits it: compact JSON (`serde_json`'s form, keys in their
/// order) of an object or array; anything else (a JSON scalar, or text that is not JSON) is
/// wrapped as `{"result": <value or text as a JSON string>}`. The body of
/// [`render_rehearse_target`], and the whole target of the inline protocol
/// ([`super::inline`]).
pub fn canonical_result(result_json: &str) -> String {
    let value = match serde_json::from_str::<Value>(result_json.trim()) {
        Ok(v @ (Value::Object(_) | Value::Array(_))) => v,
        Ok(scalar) => serde_json::json!({ "result": scalar }),
        Err(_) => serde_json::json!({ "result": result_json }),
    };
    value.to_string()
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Map};

    use super::*;
    use crate::protocol::test_support::{file_system_tools, smollm2_kit};

    fn code(text: &str) -> RehearseErrorCode {
        parse_rehearse(text).expect_err(text).code
    }

    #[test]
    fn parses_object_and_array_results() {
        let v = parse_rehearse("\n<execution_result>\n{\"a\": 1}\n</execution_result>")
            .expect("object");
        assert_eq!(v, json!({"a": 1}));
        let v = parse_rehearse("  <execution_result>[1, 2]</execution_result>\n<|im_end|>")
            .expect("array, trailing text ignored");
        assert_eq!(v, json!([1, 2]));
        let v = parse_rehearse("<think>easy</think>\n<execution_result>\n{}\n</execution_result>")
            .expect("think");
        assert_eq!(v, json!({}));
    }

    #[test]
    fn every_error_code() {
        use RehearseErrorCode::*;
        assert_eq!(code("{\"a\": 1}"), MissingBlock);
        assert_eq!(
            code("Sure! <execution_result>{}</execution_result>"),
            MissingBlock
        );
        assert_eq!(
            code("<think>hmm <execution_result>{}</execution_result>"),
            MissingBlock
        );
        assert_eq!(code(""), MissingBlock);
        assert_eq!(code("\n<execution_result>\n{\"a\": 1}\n"), UnclosedBlock);
        assert_eq!(code("<execution_result>\n{\"a\": 1"), UnclosedBlock);
        assert_eq!(
            code("<execution_result>\n{\"a\": }\n</execution_result>"),
            InvalidJson
        );
        assert_eq!(
            code("<execution_result>\n\n</execution_result>"),
            InvalidJson
        );
        assert_eq!(
            code("<execution_result>\n\"done\"\n</execution_result>"),
            NotObjectOrArray
        );
        assert_eq!(
            code("<execution_result>42</execution_result>"),
            NotObjectOrArray
        );
        assert_eq!(
            [MissingBlock, UnclosedBlock, InvalidJson, NotObjectOrArray]
                .map(RehearseErrorCode::as_str),
            [
                "MISSING_BLOCK",
                "UNCLOSED_BLOCK",
                "INVALID_JSON",
                "NOT_OBJECT_OR_ARRAY"
            ]
        );
        let err = parse_rehearse("<execution_result>42</execution_result>").expect_err("scalar");
        assert!(err.to_string().starts_with("NOT_OBJECT_OR_ARRAY: "));
    }

    #[test]
    fn render_rehearse_target_round_trips() {
        let target = render_rehearse_target("{ \"current_working_directory\" : \"docs\" }");
        assert_eq!(
            target,
            "\n<execution_result>\n{\"current_working_directory\":\"docs\"}\n</execution_result>"
        );
        assert_eq!(
            parse_rehearse(&target).expect("object"),
            json!({"current_working_directory": "docs"})
        );
        assert_eq!(
            parse_rehearse(&render_rehearse_target("[1,2]")).expect("array"),
            json!([1, 2])
        );
        assert_eq!(
            parse_rehearse(&render_rehearse_target("None")).expect("text"),
            json!({"result": "None"})
        );
        assert_eq!(
            parse_rehearse(&render_rehearse_target("3.5")).expect("scalar"),
            json!({"result": 3.5})
        );
        let odd = "Error during execution: </execution_result> \"quoted\"";
        assert_eq!(
            parse_rehearse(&render_rehearse_target(odd)).expect("stop string inside"),
            json!({"result": odd})
        );
        assert!(render_rehearse_target("x").ends_with(REHEARSE_STOP));
    }

    fn message(role: MessageRole, content: &str, tool: Option<&str>) -> Message {
        Message {
            role,
            content: content.into(),
            tool_name: tool.map(str::to_string),
            row: None,
        }
    }

    #[test]
    fn rehearse_messages_sections_in_order() {
        let tools = file_system_tools();
        let facts = vec![ToolExchange {
            name: "ls".into(),
            arguments_json: "{\"a\": false}".into(),
            result_json: "{\"current_directory_content\": [\"a.txt\"]}".into(),
        }];
        let history = vec![
            message(MessageRole::System, "ignored system", None),
            message(MessageRole::User, "Sort a.txt please.", None),
            message(
                MessageRole::Assistant,
                "<tool_call>\n{\"name\": \"ls\", \"arguments\": {}}\n</tool_call>",
                None,
            ),
            message(
                MessageRole::Tool,
                "{\"current_directory_content\": [\"a.txt\"]}",
                Some("ls"),
            ),
        ];
        let act_text = "<tool_call>\n{\"name\": \"sort\", \"arguments\": {\"file_name\": \"a.txt\", \"order\": \"asc\"}}\n</tool_call>";
        let mut arguments = Map::new();
        arguments.insert("file_name".into(), json!("a.txt"));
        arguments.insert("order".into(), json!("asc"));
        let call = ToolCall::new("sort", arguments);
        let messages = rehearse_messages(
            &tools,
            ToolRendering::Full,
            &facts,
            &history,
            act_text,
            &call,
        );
        assert_eq!(messages.len(), 2);
        assert_eq!(messages[0].role, "system");
        assert_eq!(messages[0].content, REHEARSE_SYSTEM);
        assert_eq!(messages[1].role, "user");
        let user = &messages[1].content;
        assert!(user.starts_with("# Available tools\n<tools>\n"));
        let order = [
            "# Available tools",
            "# Known facts\nTool: ls\nArguments: {\"a\": false}\nResult: {\"current_directory_content\": [\"a.txt\"]}\n",
            "# Conversation so far\nUser: Sort a.txt please.\nAssistant: <tool_call>",
            "Tool[ls]: {\"current_directory_content\": [\"a.txt\"]}\n",
            "# Latest assistant turn\n<tool_call>\n{\"name\": \"sort\"",
            "# Call to simulate\nTool: sort\nSchema: {\"type\": \"function\", \"function\": {\"name\": \"sort\"",
            "Arguments: {\"file_name\": \"a.txt\", \"order\": \"asc\"}\n",
        ];
        let mut at = 0;
        for section in order {
            let found = user[at..]
                .find(section)
                .unwrap_or_else(|| panic!("{section:?} after byte {at} in\n{user}"));
            at += found + section.len();
        }
        assert!(!user.contains("ignored system"));

        // The shared prefix (system, whitelist, facts) does not depend on the call or history.
        let other = rehearse_messages(
            &tools,
            ToolRendering::Full,
            &facts,
            &[],
            "x",
            &ToolCall::new("rm", Map::new()),
        );
        let prefix_end = user.find("# Conversation so far").expect("section");
        assert_eq!(other[1].content[..prefix_end], user[..prefix_end]);
        assert!(other[1]
            .content
            .contains("Schema: (not in the available tools)"));
        assert!(other[1].content.contains("Arguments: {}\n"));

        let empty = rehearse_messages(&tools, ToolRendering::Compact, &[], &[], "", &call);
        assert!(empty[1].content.contains("# Known facts\n(none)\n"));
        assert!(empty[1].content.contains("Schema: sort(file_name: str"));

        let kit = smollm2_kit();
        let ids = kit.encode_chat(&messages, true).expect("encode");
        let text = kit.tokenizer.decode(&ids, false).expect("decode");
        assert!(text.starts_with("<|im_start|>system\nYou are a precise, silent tool executor."));
        assert!(text.ends_with("<|im_start|>assistant\n"));
    }
}
