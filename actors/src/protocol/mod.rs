//! The turn protocol (DESIGN.md §2): Act and Rehearse prompts, their parse rules and errors.
//!
//! One policy plays two roles, switched by the prompt:
//!
//! * **Act** ([`act`]): the agent's turn. [`act_messages`] builds the chat (system prompt with
//!   the rendered tools, then the conversation); the model answers with optional
//!   `<think>…</think>`, then zero or more `<tool_call>` blocks, or a plain-text final answer;
//!   [`parse_act`] reads that back into [`ToolCall`](crate::ToolCall)s or an [`ActParseError`]
//!   whose [`ActParseError::to_tool_message`] is the `{"error_tool_call": …}` tool message the
//!   reference writes before ending the episode.
//! * **Rehearse** ([`rehearse`]): the policy predicts one tool result. [`rehearse_messages`]
//!   builds a fresh `[system, user]` chat per call (whitelist and few-shot facts first, so the
//!   shared prefix can be cached); [`parse_rehearse`] reads the `<execution_result>` block.
//! * [`facts`]: the few-shot real (tool, arguments, result) triples for the Rehearse prompt,
//!   chosen from seed trajectories without leaking a test task's ground truth.
//! * [`tools`]: tool schemas as prompt text (the Hermes `<tools>` section, or a compact
//!   one-line-per-function form).
//! * [`inline`]: the second protocol ([`RolloutProtocol::Inline`]): one append-only token
//!   stream per trajectory ([`InlineStream`]) in which Act writes assistant turns and Rehearse
//!   writes tool turns, the few-shot facts kept in a private branch of each Rehearse prompt.
//! * [`transcript`]: the two protocols as one [`Protocol`] trait; a [`Transcript`] per episode
//!   owns its history (and stream), renders both roles' prompts and reads their completions.
//!
//! [`PromptKit`] turns chats into token ids with the model's own chat template (or plain ChatML
//! when the model ships none). Everything here is text in, text out: the token ids a row trains
//! on are the sampled ones, never a re-encoding of parsed text.

pub mod act;
pub mod facts;
pub mod inline;
pub mod memory;
pub mod rehearse;
pub mod tools;
pub mod transcript;

pub use act::{
    act_messages, parse_act, render_act_target, ActErrorCode, ActOutput, ActParseError, ACT_SYSTEM,
};
pub use facts::SeedPool;
pub use inline::{
    inline_result_target, parse_inline_result, InlineFrames, InlineStream, INLINE_REHEARSE_SYSTEM,
};
pub use memory::{condense, critique_messages, CRITIQUE_SYSTEM, MEMORY_HEADER};
pub use rehearse::{
    canonical_result, parse_rehearse, rehearse_messages, render_rehearse_target, RehearseErrorCode,
    RehearseParseError, REHEARSE_STOP, REHEARSE_SYSTEM,
};
pub use tools::{render_tool, render_tools};
pub use transcript::{
    protocol_for, EpisodeContext, InlineProtocol, Protocol, ReferenceProtocol, RolePrompt,
    ToolResult, Transcript,
};

use serde::{Deserialize, Serialize};

use crate::kernels::{self, ChatMessage, ChatTemplate, Tokenizer};

/// Plain ChatML (`<|im_start|>role\ncontent<|im_end|>\n`), the fallback for models that ship no
/// chat template. It prints any role name, so `tool` turns render as they are.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Why a prompt could not be rendered, encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// The chat template failed to compile or to render a conversation.
    #[error("{context}: {source}")]
    Template {
        /// What was being done (e.g. `rendering a chat of 3 messages`).
        context: String,
        #[source]
        source: kernels::Error,
    },
    /// The tokenizer failed to encode or decode.
    #[error("{context}: {source}")]
    Tokenizer {
        /// What was being done (e.g. `decoding 12 token ids`).
        context: String,
        #[source]
        source: kernels::Error,
    },
}

/// The text side of the model the actors prompt: its tokenizer and chat template.
///
/// Built once and shared behind an `Arc` by the protocol and the Policy actors (`Send + Sync`;
/// rendering and encoding take `&self`).
#[derive(Debug)]
pub struct PromptKit {
    /// The model's tokenizer.
    pub tokenizer: Tokenizer,
    /// The model's chat template, or [`CHATML_TEMPLATE`] when it has none.
    pub template: ChatTemplate,
}

impl PromptKit {
    /// A kit from a loaded model's tokenizer and chat template. When `template` is `None` (the
    /// checkpoint ships none) plain ChatML ([`CHATML_TEMPLATE`]) is used, with the tokenizer's
    /// BOS/EOS texts.
    ///
    /// # Errors
    /// [`ProtocolError::Template`] if the fallback template does not compile (it does).
    pub fn new(
        tokenizer: Tokenizer,
        template: Option<ChatTemplate>,
    ) -> Result<Self, ProtocolError> {
        let template = match template {
            Some(t) => t,
            None => ChatTemplate::new(
                CHATML_TEMPLATE,
                tokenizer.bos_token(),
                tokenizer.eos_token(),
            )
            .map_err(|source| ProtocolError::Template {
                context: "compiling the fallback ChatML template".into(),
                source,
            })?,
        };
        Ok(Self {
            tokenizer,
            template,
        })
    }

    /// Renders `messages` with the chat template (no `tools` argument: the protocol renders
    /// tools into the system prompt itself, see [`tools`]) and encodes the text to token ids.
    /// `add_generation_prompt` opens an assistant turn at the end (for a prompt to sample from).
    ///
    /// # Errors
    /// [`ProtocolError::Template`] when the template rejects the chat;
    /// [`ProtocolError::Tokenizer`] when encoding fails.
    pub fn encode_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, ProtocolError> {
        let text = self
            .template
            .render(messages, None, add_generation_prompt)
            .map_err(|source| ProtocolError::Template {
                context: format!("rendering a chat of {} messages", messages.len()),
                source,
            })?;
        self.encode(&text)
    }

    /// Encodes text to token ids (no BOS/EOS added; special tokens in the text map to their ids).
    ///
    /// # Errors
    /// [`ProtocolError::Tokenizer`] when the tokenizer fails.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ProtocolError> {
        self.tokenizer
            .encode(text)
            .map_err(|source| ProtocolError::Tokenizer {
                context: format!("encoding {} bytes of text", text.len()),
                source,
            })
    }

    /// Decodes token ids to text, leaving special tokens (`<|im_end|>`) out.
    ///
    /// # Errors
    /// [`ProtocolError::Tokenizer`] when an id is outside the vocabulary.
    pub fn decode(&self, ids: &[u32]) -> Result<String, ProtocolError> {
        self.tokenizer
            .decode(ids, true)
            .map_err(|source| ProtocolError::Tokenizer {
                context: format!("decoding {} token ids", ids.len()),
                source,
            })
    }

    /// The model's declared end-of-sequence id (the first of its EOS ids), if any.
    pub fn eos_id(&self) -> Option<u32> {
        self.tokenizer.eos_token_ids.first().copied()
    }
}

/// How tool schemas are written into prompts (see [`render_tools`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolRendering {
    /// The Hermes / Qwen convention: a `<tools>` section with one JSON schema per line (the
    /// reference behaviour).
    #[default]
    Full,
    /// One short line per function: `name(param: type, opt?: type) - First sentence.`
    /// (several times fewer tokens, for small context windows).
    Compact,
}

/// How a trajectory is turned into prompts and rows (DESIGN.md §3: two protocols for the same
/// method; rows, roles and advantages are the same in both).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RolloutProtocol {
    /// A fresh prompt per Act turn ([`act_messages`]) and per Rehearse call
    /// ([`rehearse_messages`], `<execution_result>` output), as the authors do.
    #[default]
    Reference,
    /// One token stream per trajectory in the chat template: Act rows extend it, Rehearse rows
    /// branch off it with a private block and write the tool turn as bare JSON ([`inline`]).
    Inline,
}

/// Protocol settings of a run (TOML section; every field has a default).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProtocolConfig {
    /// Which protocol rollouts and evaluations use: `mode = "reference"` (default) or
    /// `mode = "inline"` (one token stream per trajectory; the training learner packs each
    /// trajectory's rows by shared prefix: inline mode sets `train.learner.pack_prefixes`).
    pub mode: RolloutProtocol,
    /// How tools are rendered in both roles' prompts. Default [`ToolRendering::Full`].
    pub tool_rendering: ToolRendering,
    /// Most few-shot facts in a Rehearse prompt. Default 6.
    pub max_facts: usize,
    /// Longest arguments / result text of one fact, in characters (longer ones are cut with
    /// `…`). Default 400.
    pub max_fact_chars: usize,
}

impl Default for ProtocolConfig {
    fn default() -> Self {
        Self {
            mode: RolloutProtocol::Reference,
            tool_rendering: ToolRendering::Full,
            max_facts: 6,
            max_fact_chars: 400,
        }
    }
}

/// Helpers shared by the protocol's unit tests.
#[cfg(test)]
pub(crate) mod test_support {
    use serde_json::{json, Value};

    use super::PromptKit;
    use crate::kernels::gguf::GgufFile;
    use crate::kernels::loader::embedded_gguf_path;
    use crate::kernels::{ChatTemplate, Tokenizer};

    /// The SmolLM2 tokenizer and its ChatML template, read from the installed GGUF.
    pub(crate) fn smollm2_kit() -> PromptKit {
        let gguf = GgufFile::open(&embedded_gguf_path())
            .expect("SmolLM2 GGUF missing: run `make setup` (or set ENVACE_ASSETS)");
        let tokenizer = Tokenizer::from_gguf_metadata(gguf.metadata()).expect("tokenizer");
        let template = ChatTemplate::from_tokenizer(&tokenizer).expect("template");
        PromptKit::new(tokenizer, Some(template)).expect("kit")
    }

    /// A realistic file-system whitelist: BFCL-like schemas with several parameters (required,
    /// optional, enum, array) and long descriptions.
    pub(crate) fn file_system_tools() -> Vec<Value> {
        vec![
            json!({"type": "function", "function": {
                "name": "cd",
                "description": "Change the current working directory to the specified folder. The folder must be a direct child of the current directory or '..' to move to the parent directory; absolute paths are not supported by this file system.",
                "parameters": {"type": "object", "properties": {
                    "folder": {"type": "string", "description": "The folder of the directory to change to. You can only change one folder at a time."}
                }, "required": ["folder"]}
            }}),
            json!({"type": "function", "function": {
                "name": "ls",
                "description": "List the contents of the current directory. Hidden files are only listed when the caller asks for them explicitly with the a flag.",
                "parameters": {"type": "object", "properties": {
                    "a": {"type": "boolean", "description": "Show hidden files and directories. Defaults to False.", "default": false}
                }, "required": []}
            }}),
            json!({"type": "function", "function": {
                "name": "sort",
                "description": "Sort the contents of a file line by line. The sorted contents replace nothing on disk; they are returned to the caller as a string for further processing.",
                "parameters": {"type": "object", "properties": {
                    "file_name": {"type": "string", "description": "The name of the file appeared in the current directory to sort."},
                    "order": {"type": "string", "enum": ["asc", "desc"], "description": "The direction of the sort: ascending or descending order of the lines."},
                    "keys": {"type": "array", "items": {"type": "integer"}, "description": "Optional column indices to sort by, in priority order; when omitted the whole line is the key."}
                }, "required": ["file_name", "order"]}
            }}),
            json!({"type": "function", "function": {
                "name": "post_tweet",
                "description": "Post a tweet for the authenticated user. The content is checked against the maximum tweet length and tags and mentions are attached as metadata.",
                "parameters": {"type": "object", "properties": {
                    "content": {"type": "string", "description": "The content of the tweet, at most 280 characters long."},
                    "tags": {"type": "array", "items": {"type": "string"}, "description": "A list of tags for the tweet. Tag name should start with #. This is only relevant if the user wants to add tags to the tweet.", "default": []},
                    "mentions": {"type": "array", "items": {"type": "string"}, "description": "A list of users mentioned in the tweet. Mention name should start with @. This is only relevant if the user wants to add mentions to the tweet.", "default": []}
                }, "required": ["content"]}
            }}),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::smollm2_kit;
    use super::*;

    #[test]
    fn prompt_kit_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<PromptKit>();
    }

    #[test]
    fn fallback_template_is_chatml_and_encodes_special_tokens() {
        let kit = smollm2_kit();
        let fallback = PromptKit::new(kit.tokenizer.clone(), None).expect("fallback kit");
        let messages = [ChatMessage::system("sys"), ChatMessage::user("hi")];
        let ids = fallback.encode_chat(&messages, true).expect("encode");
        let text = fallback.tokenizer.decode(&ids, false).expect("decode");
        assert_eq!(
            text,
            "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
        let im_start = fallback
            .tokenizer
            .token_id("<|im_start|>")
            .expect("im_start");
        assert_eq!(ids[0], im_start);
        assert_eq!(fallback.eos_id(), Some(2));
        assert!(!fallback
            .decode(&ids)
            .expect("decode")
            .contains("<|im_start|>"));
    }

    #[test]
    fn protocol_config_defaults_and_rejects_unknown_fields() {
        let c: ProtocolConfig = serde_json::from_str("{}").expect("defaults");
        assert_eq!(c, ProtocolConfig::default());
        assert_eq!(c.max_facts, 6);
        assert_eq!(c.max_fact_chars, 400);
        let c: ProtocolConfig =
            serde_json::from_str(r#"{"tool_rendering": "compact"}"#).expect("compact");
        assert_eq!(c.tool_rendering, ToolRendering::Compact);
        assert!(serde_json::from_str::<ProtocolConfig>(r#"{"max_fact": 1}"#).is_err());
        assert_eq!(c.mode, RolloutProtocol::Reference);
        let c: ProtocolConfig = serde_json::from_str(r#"{"mode": "inline"}"#).expect("inline");
        assert_eq!(c.mode, RolloutProtocol::Inline);
        assert!(serde_json::from_str::<ProtocolConfig>(r#"{"mode": "stream"}"#).is_err());
    }
}
