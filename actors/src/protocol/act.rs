//! The Act role: its prompt, the parse of its output and the canonical Act text.
//!
//! Reference behaviour (DESIGN.md §2): the output is an optional `<think>…</think>`, then zero
//! or more `\n<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>` blocks (Hermes / Qwen
//! style), `parameters` accepted as an alias of `arguments`; no block is the final answer of the
//! user turn. A malformed block, bad JSON, missing arguments or an unknown tool becomes a
//! `{"error_tool_call": {code, message}}` tool message and ends the episode with 0 for the turn.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::tools::render_tools;
use super::ToolRendering;
use crate::kernels::{pyjson, ChatMessage};
use crate::storage::{Message, MessageRole};
use crate::ToolCall;

/// The Act role's system prompt; [`act_messages`] appends the rendered tools (and the rehearsal
/// memory, when there is one) after it.
pub const ACT_SYSTEM: &str = "You are a helpful assistant that completes the user's request by calling functions.

To call functions, write one or more blocks of this form and nothing after them:
<tool_call>
{\"name\": <function-name>, \"arguments\": <arguments-json-object>}
</tool_call>
Use only the functions listed below, with arguments that match their parameters. The result of each call comes back in a tool message inside <tool_response></tool_response> tags.
When the request is complete, or you need more information from the user, answer in plain text with no <tool_call> block.";

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";

/// The chat of one Act turn, ready for [`super::PromptKit::encode_chat`] with a generation
/// prompt.
///
/// * system: [`ACT_SYSTEM`], then `# Functions` with the rendered `tools`
///   ([`render_tools`]), then `# Rehearsal memory` with `memory` when given (test-time rehearsal,
///   DESIGN.md §1), then the content of every `System` message of `history`, in order;
/// * `history` (System messages excluded): User → `user`, Assistant → `assistant` with the raw
///   Act text as sampled, Tool → `tool` (with `name` set to the tool) whose content is wrapped
///   as `<tool_response>\n{content}\n</tool_response>` (Qwen's convention; ChatML templates
///   print the role as is).
pub fn act_messages(
    tools: &[Value],
    rendering: ToolRendering,
    history: &[Message],
    memory: Option<&str>,
) -> Vec<ChatMessage> {
    let mut system = format!(
        "{ACT_SYSTEM}\n\n# Functions\n{}",
        render_tools(tools, rendering)
    );
    if let Some(memory) = memory {
        system.push_str("\n\n# Rehearsal memory\n");
        system.push_str(memory.trim());
    }
    let mut messages = vec![ChatMessage::system(String::new())];
    for message in history {
        match message.role {
            MessageRole::System => {
                system.push_str("\n\n");
                system.push_str(&message.content);
            }
            MessageRole::User => messages.push(ChatMessage::user(message.content.clone())),
            MessageRole::Assistant => {
                messages.push(ChatMessage::assistant(message.content.clone()))
            }
            MessageRole::Tool => {
                let mut tool = ChatMessage::tool(format!(
                    "<tool_response>\n{}\n</tool_response>",
                    message.content
                ));
                tool.name = message.tool_name.clone();
                messages.push(tool);
            }
        }
    }
    messages[0].content = system;
    messages
}

/// What one Act turn said: its tool calls (in order) and its text outside `<think>` and the
/// blocks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActOutput {
    /// The calls, in the order written; empty for a final answer.
    pub calls: Vec<ToolCall>,
    /// The text outside the think block and the call blocks, trimmed (the answer to the user
    /// when there are no calls).
    pub content: String,
}

impl ActOutput {
    /// True when the turn made no call: the agent's final answer for this user turn.
    pub fn is_final_answer(&self) -> bool {
        self.calls.is_empty()
    }
}

/// Why an Act output could not be read, in the reference's categories.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ActErrorCode {
    /// An unclosed `<tool_call>` or `<think>`, a stray `</tool_call>`, or a block opened inside
    /// another block.
    MalformedToolCall,
    /// A block's body is not one JSON object.
    InvalidJson,
    /// The object has no `name` string (or it is empty).
    MissingName,
    /// The object has neither `arguments` nor `parameters` (or it is `null`).
    MissingArguments,
    /// The arguments are neither an object nor a string holding a JSON object.
    InvalidArguments,
    /// The function is not in the task's whitelist.
    UnknownTool,
}

impl ActErrorCode {
    /// The code as written in the error tool message: `MALFORMED_TOOL_CALL`, `INVALID_JSON`,
    /// `MISSING_NAME`, `MISSING_ARGUMENTS`, `INVALID_ARGUMENTS`, `UNKNOWN_TOOL`.
    pub fn as_str(self) -> &'static str {
        match self {
            ActErrorCode::MalformedToolCall => "MALFORMED_TOOL_CALL",
            ActErrorCode::InvalidJson => "INVALID_JSON",
            ActErrorCode::MissingName => "MISSING_NAME",
            ActErrorCode::MissingArguments => "MISSING_ARGUMENTS",
            ActErrorCode::InvalidArguments => "INVALID_ARGUMENTS",
            ActErrorCode::UnknownTool => "UNKNOWN_TOOL",
        }
    }
}

impl std::fmt::Display for ActErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An Act output that breaks the protocol. The reference turns it into a tool message
/// ([`ActParseError::to_tool_message`]), ends the episode and scores the turn 0.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ActParseError {
    /// The category.
    pub code: ActErrorCode,
    /// What was wrong, naming the block (1-based) and the offending value.
    pub message: String,
    /// The complete, valid calls written before the offending block, in order. They are never
    /// executed (the episode ends), but a dense judge credits them (the transcript records
    /// them as [`crate::TurnCalls::unexecuted_calls`]).
    pub calls_before: Vec<ToolCall>,
}

impl ActParseError {
    fn new(code: ActErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            calls_before: Vec::new(),
        }
    }

    fn after(mut self, calls: Vec<ToolCall>) -> Self {
        self.calls_before = calls;
        self
    }

    /// The tool message the agent sees: `{"error_tool_call": {"code": "…", "message": "…"}}`.
    pub fn to_tool_message(&self) -> String {
        serde_json::json!({
            "error_tool_call": {"code": self.code.as_str(), "message": self.message}
        })
        .to_string()
    }
}

/// Reads one Act output.
///
/// Rules (DESIGN.md §2): leading whitespace and an optional leading `<think>…</think>` are
/// skipped (a `</think>` with no opening tag is taken as the end of a think block the chat
/// template opened in the prompt), and so is any later think block, with the blocks drafted
/// inside it; then every `<tool_call>…</tool_call>` block is one call, a JSON object
/// `{"name": str, "arguments": {…}}` where `parameters` is an alias of `arguments` (when both
/// are given, an empty one yields to the other) and `arguments` may be a JSON string holding an
/// object. A block whose body is one JSON object ends at the `</tool_call>` after that object,
/// so a string argument may contain the tag's text. Text outside the blocks and think blocks
/// is [`ActOutput::content`]. Every name must be in `whitelist` (an empty whitelist allows
/// none).
///
/// # Errors
/// The first problem found, in text order: [`ActErrorCode::MalformedToolCall`] for an unclosed
/// `<think>` or `<tool_call>`, a nested `<tool_call>` or a stray `</tool_call>`;
/// [`ActErrorCode::InvalidJson`], [`ActErrorCode::MissingName`],
/// [`ActErrorCode::MissingArguments`], [`ActErrorCode::InvalidArguments`] for a bad block body;
/// [`ActErrorCode::UnknownTool`] for a name outside `whitelist`. The error carries the valid
/// calls before the offending block ([`ActParseError::calls_before`]).
pub fn parse_act(text: &str, whitelist: &[&str]) -> Result<ActOutput, ActParseError> {
    let mut calls = Vec::new();
    parse_blocks(text, whitelist, &mut calls).map_err(|e| e.after(calls))
}

/// [`parse_act`]'s loop; `calls` holds the blocks parsed so far when it fails.
fn parse_blocks(
    text: &str,
    whitelist: &[&str],
    calls: &mut Vec<ToolCall>,
) -> Result<ActOutput, ActParseError> {
    let mut rest = strip_think(text)?;
    let mut content = String::new();
    loop {
        let next = [THINK_OPEN, CALL_OPEN, CALL_CLOSE]
            .into_iter()
            .filter_map(|tag| rest.find(tag).map(|at| (at, tag)))
            .min();
        let Some((at, tag)) = next else {
            content.push_str(rest);
            break;
        };
        content.push_str(&rest[..at]);
        let after = &rest[at + tag.len()..];
        rest = match tag {
            // A draft inside a later think block is not a call.
            THINK_OPEN => match after.find(THINK_CLOSE) {
                Some(end) => &after[end + THINK_CLOSE.len()..],
                None => {
                    return Err(ActParseError::new(
                        ActErrorCode::MalformedToolCall,
                        format!("{THINK_OPEN} is never closed by {THINK_CLOSE}"),
                    ))
                }
            },
            CALL_OPEN => {
                let index = calls.len() + 1;
                let (body, used) = block_body(after, index)?;
                calls.push(parse_call(body, index, whitelist)?);
                &after[used..]
            }
            _ => {
                return Err(ActParseError::new(
                    ActErrorCode::MalformedToolCall,
                    format!("stray {CALL_CLOSE} without an opening {CALL_OPEN}"),
                ));
            }
        };
    }
    Ok(ActOutput {
        calls: std::mem::take(calls),
        content: content.trim().to_string(),
    })
}

/// The body of the block that opened just before `after`, and the bytes of `after` it uses
/// with its closing tag. A body that is one JSON object followed by `</tool_call>` ends there,
/// so a string argument may hold the text `</tool_call>` or `<tool_call>`; any other body ends
/// at the first `</tool_call>`.
fn block_body(after: &str, index: usize) -> Result<(&str, usize), ActParseError> {
    let lead = after.len() - after.trim_start().len();
    if after[lead..].starts_with('{') {
        let mut values =
            serde_json::Deserializer::from_str(&after[lead..]).into_iter::<serde::de::IgnoredAny>();
        if let Some(Ok(_)) = values.next() {
            let end = lead + values.byte_offset();
            let tail = &after[end..];
            let gap = tail.len() - tail.trim_start().len();
            if tail[gap..].starts_with(CALL_CLOSE) {
                return Ok((&after[..end], end + gap + CALL_CLOSE.len()));
            }
        }
    }
    let Some(end) = after.find(CALL_CLOSE) else {
        return Err(ActParseError::new(
            ActErrorCode::MalformedToolCall,
            format!("tool call {index}: {CALL_OPEN} is never closed by {CALL_CLOSE}"),
        ));
    };
    let body = &after[..end];
    if body.contains(CALL_OPEN) {
        return Err(ActParseError::new(
            ActErrorCode::MalformedToolCall,
            format!("tool call {index}: {CALL_OPEN} opened inside another block"),
        ));
    }
    Ok((body, end + CALL_CLOSE.len()))
}

/// The text after an optional leading think block.
fn strip_think(text: &str) -> Result<&str, ActParseError> {
    let trimmed = text.trim_start();
    if let Some(inner) = trimmed.strip_prefix(THINK_OPEN) {
        return match inner.find(THINK_CLOSE) {
            Some(end) => Ok(&inner[end + THINK_CLOSE.len()..]),
            None => Err(ActParseError::new(
                ActErrorCode::MalformedToolCall,
                format!("{THINK_OPEN} is never closed by {THINK_CLOSE}"),
            )),
        };
    }
    // A template may open the think block in the prompt (generation starts inside it): then
    // the output holds only the closing tag, before any call.
    match (trimmed.find(THINK_CLOSE), trimmed.find(CALL_OPEN)) {
        (Some(end), call)
            if call.is_none_or(|c| end < c) && !trimmed[..end].contains(THINK_OPEN) =>
        {
            Ok(&trimmed[end + THINK_CLOSE.len()..])
        }
        _ => Ok(trimmed),
    }
}

/// One block body → a call.
fn parse_call(body: &str, index: usize, whitelist: &[&str]) -> Result<ToolCall, ActParseError> {
    let err = |code, what: String| ActParseError::new(code, format!("tool call {index}: {what}"));
    let value: Value = serde_json::from_str(body.trim())
        .map_err(|e| err(ActErrorCode::InvalidJson, format!("invalid JSON: {e}")))?;
    let Value::Object(mut object) = value else {
        return Err(err(
            ActErrorCode::InvalidJson,
            format!("expected a JSON object, found {}", json_kind(&value)),
        ));
    };
    let name = match object.get("name") {
        Some(Value::String(name)) if !name.trim().is_empty() => name.trim().to_string(),
        Some(other) => {
            return Err(err(
                ActErrorCode::MissingName,
                format!("\"name\" must be a non-empty string, found {other}"),
            ))
        }
        None => return Err(err(ActErrorCode::MissingName, "no \"name\" field".into())),
    };
    let arguments = match (object.remove("arguments"), object.remove("parameters")) {
        // An empty `arguments` beside a filled `parameters` (or the reverse) is a template's
        // placeholder: the filled one is the call.
        (Some(a), Some(p)) if no_arguments(&a) => Some(p),
        (Some(a), Some(p)) if no_arguments(&p) || a == p => Some(a),
        (Some(_), Some(_)) => {
            return Err(err(
                ActErrorCode::InvalidArguments,
                format!(
                "call of {name:?} has both \"arguments\" and \"parameters\", with different values"
            ),
            ))
        }
        (a, p) => a.or(p),
    };
    let arguments = match arguments {
        None | Some(Value::Null) => {
            return Err(err(
                ActErrorCode::MissingArguments,
                format!("call of {name:?} has no \"arguments\" (or \"parameters\")"),
            ))
        }
        Some(Value::Object(arguments)) => arguments,
        Some(Value::String(text)) => match serde_json::from_str::<Value>(&text) {
            Ok(Value::Object(arguments)) => arguments,
            _ => {
                return Err(err(
                    ActErrorCode::InvalidArguments,
                    format!(
                        "arguments of {name:?} are a string that is not a JSON object: {text:?}"
                    ),
                ))
            }
        },
        Some(other) => {
            return Err(err(
                ActErrorCode::InvalidArguments,
                format!(
                    "arguments of {name:?} must be a JSON object, found {}",
                    json_kind(&other)
                ),
            ))
        }
    };
    if !whitelist.contains(&name.as_str()) {
        return Err(err(
            ActErrorCode::UnknownTool,
            format!(
                "unknown tool {name:?} (available: {})",
                if whitelist.is_empty() {
                    "none".to_string()
                } else {
                    whitelist.join(", ")
                }
            ),
        ));
    }
    Ok(ToolCall::new(name, arguments))
}

/// `null`, `{}`, or a string that is blank or `{}`: a call's arguments left unfilled.
fn no_arguments(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(map) => map.is_empty(),
        Value::String(text) => matches!(text.trim(), "" | "{}"),
        _ => false,
    }
}

/// `an array`, `a string`, … for error messages.
fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The canonical Act text for `calls` (supervised warm-up targets, seed replays):
/// `content` (when not empty) followed by one block per call,
/// `<tool_call>\n{"name": "…", "arguments": {…}}\n</tool_call>`, joined by `\n`; with no calls,
/// just `content` (a final answer). JSON uses Python `json.dumps` spacing, as Hermes models
/// were trained on.
///
/// JSON tool calls have no positional arguments: a call's [`ToolCall::positional`] values are
/// left out (name them into `arguments` first, e.g. with the judge's parameter order).
/// [`parse_act`] of the result gives back the keyword calls and the trimmed content.
pub fn render_act_target(calls: &[ToolCall], content: &str) -> String {
    let mut parts: Vec<String> = Vec::with_capacity(calls.len() + 1);
    let content = content.trim();
    if !content.is_empty() || calls.is_empty() {
        parts.push(content.to_string());
    }
    for call in calls {
        let mut object = Map::new();
        object.insert("name".into(), Value::String(call.name.clone()));
        object.insert("arguments".into(), Value::Object(call.arguments.clone()));
        parts.push(format!(
            "{CALL_OPEN}\n{}\n{CALL_CLOSE}",
            pyjson::compact(&Value::Object(object))
        ));
    }
    parts.join("\n")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::protocol::test_support::{file_system_tools, smollm2_kit};

    const TOOLS: &[&str] = &["cd", "ls", "sort", "post_tweet"];

    fn code(text: &str) -> ActErrorCode {
        parse_act(text, TOOLS).expect_err(text).code
    }

    fn args(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => panic!("not an object"),
        }
    }

    #[test]
    fn several_calls_in_one_turn_with_think_and_text() {
        let text = "<think>I should go to the folder first.</think>\nLet me look.\n<tool_call>\n{\"name\": \"cd\", \"arguments\": {\"folder\": \"docs\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"ls\", \"arguments\": {\"a\": true}}\n</tool_call>";
        let out = parse_act(text, TOOLS).expect("parse");
        assert_eq!(
            out.calls,
            vec![
                ToolCall::new("cd", args(json!({"folder": "docs"}))),
                ToolCall::new("ls", args(json!({"a": true}))),
            ]
        );
        assert_eq!(out.content, "Let me look.");
        assert!(!out.is_final_answer());
    }

    #[test]
    fn final_answer_has_no_calls() {
        let out = parse_act("<think>done</think>\n\n The file is sorted. ", TOOLS).expect("parse");
        assert!(out.is_final_answer());
        assert_eq!(out.content, "The file is sorted.");
        let out = parse_act("", TOOLS).expect("empty");
        assert!(out.is_final_answer());
        assert_eq!(out.content, "");
    }

    #[test]
    fn parameters_alias_and_string_arguments() {
        let out = parse_act(
            "<tool_call>{\"name\": \"cd\", \"parameters\": {\"folder\": \"a\"}}</tool_call><tool_call>{\"name\": \"sort\", \"arguments\": \"{\\\"file_name\\\": \\\"x.txt\\\"}\"}</tool_call>",
            TOOLS,
        )
        .expect("parse");
        assert_eq!(
            out.calls[0],
            ToolCall::new("cd", args(json!({"folder": "a"})))
        );
        assert_eq!(
            out.calls[1],
            ToolCall::new("sort", args(json!({"file_name": "x.txt"})))
        );
        assert!(out.content.is_empty());
    }

    #[test]
    fn closing_think_only_is_accepted() {
        let out = parse_act(
            "planning…</think>\n<tool_call>\n{\"name\": \"ls\", \"arguments\": {}}\n</tool_call>",
            TOOLS,
        )
        .expect("parse");
        assert_eq!(out.calls.len(), 1);
        assert!(out.content.is_empty());
    }

    #[test]
    fn a_call_drafted_inside_a_later_think_block_is_not_made() {
        // Public bug reports: the draft inside `<think>` executed as a second call.
        let call = "<tool_call>{\"name\": \"ls\", \"arguments\": {\"a\": true}}</tool_call>";
        let text = format!("Sure.\n<think>{call}</think>{call}");
        let out = parse_act(&text, TOOLS).expect("parse");
        assert_eq!(
            out.calls,
            vec![ToolCall::new("ls", args(json!({"a": true})))]
        );
        assert_eq!(out.content, "Sure.");
        assert_eq!(
            code(&format!("{call}\n<think>unfinished {call}")),
            ActErrorCode::MalformedToolCall
        );
    }

    #[test]
    fn a_string_argument_may_hold_the_closing_tag() {
        let text = "<tool_call>\n{\"name\": \"post_tweet\", \"arguments\": {\"content\": \"use </tool_call> and <tool_call> tags\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"ls\", \"arguments\": {}}\n</tool_call>";
        let out = parse_act(text, TOOLS).expect("parse");
        assert_eq!(
            out.calls,
            vec![
                ToolCall::new(
                    "post_tweet",
                    args(json!({"content": "use </tool_call> and <tool_call> tags"}))
                ),
                ToolCall::new("ls", args(json!({}))),
            ]
        );
        assert!(out.content.is_empty());
        // Text after the object inside the block is still bad JSON.
        assert_eq!(
            code("<tool_call>{\"name\": \"ls\", \"arguments\": {}} extra</tool_call>"),
            ActErrorCode::InvalidJson
        );
    }

    #[test]
    fn an_empty_arguments_beside_filled_parameters_yields_to_them() {
        let out = parse_act(
            "<tool_call>{\"name\": \"cd\", \"arguments\": {}, \"parameters\": {\"folder\": \"a\"}}</tool_call><tool_call>{\"name\": \"cd\", \"arguments\": {\"folder\": \"b\"}, \"parameters\": null}</tool_call>",
            TOOLS,
        )
        .expect("parse");
        assert_eq!(
            out.calls,
            vec![
                ToolCall::new("cd", args(json!({"folder": "a"}))),
                ToolCall::new("cd", args(json!({"folder": "b"}))),
            ]
        );
        assert_eq!(
            code("<tool_call>{\"name\": \"cd\", \"arguments\": {\"folder\": \"a\"}, \"parameters\": {\"folder\": \"b\"}}</tool_call>"),
            ActErrorCode::InvalidArguments
        );
    }

    #[test]
    fn every_error_code() {
        use ActErrorCode::*;
        assert_eq!(code("<think>never closed"), MalformedToolCall);
        assert_eq!(
            code("<tool_call>\n{\"name\": \"ls\", \"arguments\": {}}"),
            MalformedToolCall
        );
        assert_eq!(code("text </tool_call>"), MalformedToolCall);
        assert_eq!(
            code("<tool_call><tool_call>{\"name\": \"ls\", \"arguments\": {}}</tool_call>"),
            MalformedToolCall
        );
        assert_eq!(
            code("<tool_call>{\"name\": \"ls\", \"arguments\": {}}</tool_call></tool_call>"),
            MalformedToolCall
        );
        assert_eq!(
            code("<tool_call>{\"name\": \"ls\", \"arguments\": {</tool_call>"),
            InvalidJson
        );
        assert_eq!(code("<tool_call>[1, 2]</tool_call>"), InvalidJson);
        assert_eq!(
            code("<tool_call>{\"arguments\": {}}</tool_call>"),
            MissingName
        );
        assert_eq!(
            code("<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>"),
            MissingName
        );
        assert_eq!(
            code("<tool_call>{\"name\": \"ls\"}</tool_call>"),
            MissingArguments
        );
        assert_eq!(
            code("<tool_call>{\"name\": \"ls\", \"arguments\": null}</tool_call>"),
            MissingArguments
        );
        assert_eq!(
            code("<tool_call>{\"name\": \"ls\", \"arguments\": [1]}</tool_call>"),
            InvalidArguments
        );
        assert_eq!(
            code("<tool_call>{\"name\": \"ls\", \"arguments\": \"not json\"}</tool_call>"),
            InvalidArguments
        );
        assert_eq!(
            code("<tool_call>{\"name\": \"rm\", \"arguments\": {\"file\": \"x\"}}</tool_call>"),
            UnknownTool
        );
        let names = [
            MalformedToolCall,
            InvalidJson,
            MissingName,
            MissingArguments,
            InvalidArguments,
            UnknownTool,
        ]
        .map(ActErrorCode::as_str);
        assert_eq!(
            names,
            [
                "MALFORMED_TOOL_CALL",
                "INVALID_JSON",
                "MISSING_NAME",
                "MISSING_ARGUMENTS",
                "INVALID_ARGUMENTS",
                "UNKNOWN_TOOL"
            ]
        );
        assert_eq!(
            serde_json::to_value(UnknownTool).expect("ser"),
            json!("UNKNOWN_TOOL")
        );
    }

    #[test]
    fn complete_calls_before_a_malformed_block_are_kept_in_the_error() {
        // The warm-up model's typical turn: two closed blocks, then one cut by the budget.
        let text = "<tool_call>\n{\"name\": \"cd\", \"arguments\": {\"folder\": \"a\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"ls\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"sort\", \"argu";
        let err = parse_act(text, TOOLS).expect_err("unclosed");
        assert_eq!(err.code, ActErrorCode::MalformedToolCall);
        assert_eq!(
            err.calls_before,
            vec![
                ToolCall::new("cd", args(json!({"folder": "a"}))),
                ToolCall::new("ls", args(json!({}))),
            ]
        );
        // An error in the first block has none; the tool message does not carry them.
        let err = parse_act("<tool_call>{oops}</tool_call>", TOOLS).expect_err("json");
        assert!(err.calls_before.is_empty());
        assert!(!err.to_tool_message().contains("calls_before"));
    }

    #[test]
    fn the_first_error_in_text_order_wins() {
        let err = parse_act(
            "<tool_call>{\"name\": \"rm\", \"arguments\": {}}</tool_call><tool_call>oops</tool_call>",
            TOOLS,
        )
        .expect_err("unknown");
        assert_eq!(err.code, ActErrorCode::UnknownTool);
        assert!(
            err.message.starts_with("tool call 1: unknown tool \"rm\""),
            "{}",
            err.message
        );
    }

    #[test]
    fn error_tool_message_shape() {
        let err =
            parse_act("<tool_call>{\"name\": \"ls\"}</tool_call>", TOOLS).expect_err("missing");
        let message: Value = serde_json::from_str(&err.to_tool_message()).expect("json");
        assert_eq!(message["error_tool_call"]["code"], "MISSING_ARGUMENTS");
        assert_eq!(message["error_tool_call"]["message"], err.message.as_str());
        assert!(err
            .to_string()
            .starts_with("MISSING_ARGUMENTS: tool call 1:"));
    }

    #[test]
    fn render_act_target_round_trips() {
        let calls = vec![
            ToolCall::new("cd", args(json!({"folder": "döcs"}))),
            ToolCall::new(
                "sort",
                args(json!({"file_name": "a.txt", "order": "asc", "keys": [2, 1]})),
            ),
            ToolCall::new("ls", Map::new()),
        ];
        let text = render_act_target(&calls, "");
        assert!(text.starts_with(
            "<tool_call>\n{\"name\": \"cd\", \"arguments\": {\"folder\": \"döcs\"}}\n</tool_call>\n<tool_call>\n"
        ));
        let out = parse_act(&text, TOOLS).expect("parse");
        assert_eq!(out.calls, calls);
        assert_eq!(out.content, "");

        let text = render_act_target(&calls[..1], "  Going there. ");
        let out = parse_act(&text, TOOLS).expect("parse");
        assert_eq!(out.calls, calls[..1]);
        assert_eq!(out.content, "Going there.");

        let text = render_act_target(&[], "All done.");
        assert_eq!(text, "All done.");
        let out = parse_act(&text, TOOLS).expect("parse");
        assert!(out.is_final_answer());
        assert_eq!(out.content, "All done.");
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
    fn act_messages_render_through_smollm2_chatml() {
        let tools = file_system_tools();
        let history = vec![
            message(MessageRole::System, "Today is Monday.", None),
            message(MessageRole::User, "Go to docs and list it.", None),
            message(
                MessageRole::Assistant,
                "<tool_call>\n{\"name\": \"cd\", \"arguments\": {\"folder\": \"docs\"}}\n</tool_call>",
                None,
            ),
            message(MessageRole::Tool, "{\"current_working_directory\": \"docs\"}", Some("cd")),
        ];
        let messages = act_messages(&tools, ToolRendering::Full, &history, Some("Try cd first."));
        let roles: Vec<&str> = messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"]);
        let system = &messages[0].content;
        assert!(system.starts_with(ACT_SYSTEM));
        let tools_at = system.find("<tools>\n").expect("tools section");
        let memory_at = system
            .find("# Rehearsal memory\nTry cd first.")
            .expect("memory");
        let extra_at = system
            .find("Today is Monday.")
            .expect("history system message");
        assert!(tools_at < memory_at && memory_at < extra_at);
        assert_eq!(messages[3].name.as_deref(), Some("cd"));

        let kit = smollm2_kit();
        let ids = kit.encode_chat(&messages, true).expect("encode");
        let text = kit.tokenizer.decode(&ids, false).expect("decode");
        assert!(text.starts_with("<|im_start|>system\nYou are a helpful assistant"));
        assert!(text.contains(
            "<|im_start|>tool\n<tool_response>\n{\"current_working_directory\": \"docs\"}\n</tool_response><|im_end|>"
        ));
        assert!(text.ends_with("<|im_start|>assistant\n"));
        assert_eq!(kit.tokenizer.token_id("<|im_start|>"), ids.first().copied());

        let compact = act_messages(&tools, ToolRendering::Compact, &history, None);
        assert!(compact[0].content.contains("cd(folder: str) - "));
        assert!(!compact[0].content.contains("Rehearsal memory"));
    }
}
