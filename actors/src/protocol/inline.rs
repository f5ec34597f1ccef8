//! The inline protocol: one token stream per trajectory (`[protocol] mode = "inline"`).
//!
//! The reference protocol ([`super::act`], [`super::rehearse`]) renders a fresh prompt for every
//! Act turn and every Rehearse call. The inline protocol keeps the whole trajectory as one
//! append-only token stream in the model's own chat template:
//!
//! ```text
//! system (ACT_SYSTEM + tools [+ memory]) · user · assistant (Act) · tool (Rehearse) · tool ·
//! assistant (Act) · … · user · assistant · …
//! ```
//!
//! * **Act rows**: prompt = the public stream + the template's assistant header (its generation
//!   prompt); completion = the exact sampled ids. The stream then grows by the header, those
//!   ids (plus the end-of-turn id when generation stopped on length) and the template's
//!   end-of-message remainder (`"\n"` for ChatML). Every Act prompt is therefore a token prefix
//!   extension of the previous row's prompt + completion, and the first one equals the
//!   reference Act prompt ([`super::act_messages`] encoded with the template), so the same Act
//!   span has the same context in both protocols.
//! * **Rehearse rows** (one per call; every call of a turn against the same stream): prompt =
//!   the public stream after the Act turn + a **private block** + the template's tool header;
//!   completion = the bare JSON result and the end-of-turn token ([`parse_inline_result`]).
//!   The public stream then gets the tool header, the Rehearse row's exact sampled ids and the
//!   end-of-message remainder — *never* the private block.
//!
//! ## Private block in a branch
//!
//! The Rehearse role needs information the Act role will not have at evaluation time: the seed
//! trajectories' real results, shown as few-shot facts. The private block is a `system` message
//! holding [`INLINE_REHEARSE_SYSTEM`], the facts (the `# Known facts` format of
//! [`super::rehearse_messages`]) and the call to simulate (name, schema, arguments). It sits
//! only in the Rehearse row's prompt, so in a prefix trie of a trajectory's rows it is a branch
//! of its own: no Act row contains its tokens, and no Act token attends to them or to hidden
//! states computed from them. Act tokens see the facts neither as text nor through attention.
//!
//! Header and footer ids come from the chat template itself: a conversation is rendered with a
//! sentinel content string and the text *delta* of two renderings is split around it (always
//! with a system message first, since some templates, SmolLM2's among them, insert a default
//! system prompt otherwise). Template text is encoded with the [`PromptKit`]; sampled ids are
//! never decoded and re-encoded.

use std::fmt::Write as _;

use serde_json::Value;

use super::act::act_messages;
use super::rehearse::{canonical_result, json_result, write_call, write_facts};
use super::{PromptKit, ProtocolError, RehearseErrorCode, RehearseParseError, ToolRendering};
use crate::kernels::{self, pyjson, ChatMessage};
use crate::storage::{Message, MessageRole, ToolExchange};
use crate::ToolCall;

/// The role instruction of the inline Rehearse role: the first text of the private block.
pub const INLINE_REHEARSE_SYSTEM: &str = "Rehearsal: you now play the tool, not the assistant. Write what the real tool returns for the call below: one JSON object or array, consistent with the known facts and the conversation so far. If the call is malformed, names a function that is not available or has invalid arguments, answer {\"error\": {\"code\": \"INVALID_TOOL_CALL_FORMAT\" or \"TOOL_NOT_AVAILABLE\" or \"INVALID_PARAMETERS\", \"message\": \"<what is wrong>\"}}. Answer with the JSON only.";

/// The inline Rehearse target for a real result (warm-up rows): the canonical value
/// ([`canonical_result`]) written with Python's `json.dumps` separators ([`pyjson::compact`]), the
/// form real results take in the stream at evaluation, so Act sees one format in training and
/// in evaluation.
pub fn inline_result_target(result_json: &str) -> String {
    let canonical = canonical_result(result_json);
    serde_json::from_str::<Value>(&canonical).map_or(canonical, |v| pyjson::compact(&v))
}

/// Content no template alters (no leading or trailing whitespace, no markup).
const SENTINEL: &str = "ENVACEINLINESENTINEL";

/// How a message is closed after its content.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Close {
    /// The template's closing text, as rendered (`"<|im_end|>\n"` for ChatML).
    text: String,
    /// The closing text starts with the end-of-turn token, which sampled content ends with.
    after_eos: bool,
    /// The ids of the closing text after the end-of-turn token when `after_eos` (`"\n"`), else
    /// of the whole closing text.
    rest_ids: Vec<u32>,
}

impl Close {
    fn new(kit: &PromptKit, text: String, eos_text: &str) -> Result<Self, ProtocolError> {
        let (after_eos, rest) = match text.strip_prefix(eos_text) {
            Some(rest) => (true, rest),
            None => (false, text.as_str()),
        };
        let rest_ids = kit.encode(rest)?;
        Ok(Self {
            after_eos,
            rest_ids,
            text,
        })
    }

    /// Appends sampled content ids and this close to `out`: the end-of-turn id is added when
    /// the content does not end with it (a generation stopped on length) and the template's
    /// close starts with it; a template whose close does not start with it gets its own close
    /// instead of the sampled end token.
    fn append_sampled(&self, out: &mut Vec<u32>, content: &[u32], eos: u32) {
        let ends_with_eos = content.last() == Some(&eos);
        if self.after_eos {
            out.extend_from_slice(content);
            if !ends_with_eos {
                out.push(eos);
            }
        } else {
            let end = content.len() - usize::from(ends_with_eos);
            out.extend_from_slice(&content[..end]);
        }
        out.extend_from_slice(&self.rest_ids);
    }
}

/// The template's frames of the inline stream, derived once from a [`PromptKit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InlineFrames {
    /// The generation prompt that opens an assistant turn (`<|im_start|>assistant\n`).
    act_header: Vec<u32>,
    /// How an assistant message ends.
    act_close: Close,
    /// Text before and after a (later) user message's content.
    user: (String, String),
    /// Text before and after a non-first system message's content (the private block).
    system: (String, String),
    /// The ids opening a tool message (`<|im_start|>tool\n`).
    tool_header: Vec<u32>,
    /// How a tool message ends.
    tool_close: Close,
    /// The end-of-turn id.
    eos: u32,
}

fn template_error(context: impl Into<String>, message: impl Into<String>) -> ProtocolError {
    ProtocolError::Template {
        context: context.into(),
        source: kernels::Error::Template(message.into()),
    }
}

impl InlineFrames {
    /// Derives the frames from `kit`'s chat template.
    ///
    /// # Errors
    /// [`ProtocolError::Template`] when the template fails to render, is not append-only (the
    /// rendering of a conversation is not a prefix of the rendering of a longer one), drops a
    /// message's content, or the tokenizer declares no end-of-turn token;
    /// [`ProtocolError::Tokenizer`] when a frame does not encode.
    pub fn new(kit: &PromptKit) -> Result<Self, ProtocolError> {
        let eos = kit
            .eos_id()
            .ok_or_else(|| template_error("inline frames", "the tokenizer declares no EOS id"))?;
        let eos_text = kit.tokenizer.eos_token().ok_or_else(|| {
            template_error("inline frames", format!("EOS id {eos} has no token text"))
        })?;
        let render = |messages: &[ChatMessage], generation: bool| {
            kit.template
                .render(messages, None, generation)
                .map_err(|source| ProtocolError::Template {
                    context: format!(
                        "deriving the inline frames (a chat of {} messages)",
                        messages.len()
                    ),
                    source,
                })
        };
        let base = [ChatMessage::system("S"), ChatMessage::user("U")];
        let base_text = render(&base, false)?;
        let header = render(&base, true)?;
        let header = header.strip_prefix(&base_text).ok_or_else(|| {
            template_error(
                "inline frames",
                "the generation prompt is not appended to the conversation",
            )
        })?;
        // Splits the delta `base + next` minus `base` around the sentinel.
        let frame = |base: &[ChatMessage], next: ChatMessage| {
            let role = next.role.clone();
            let before = render(base, false)?;
            let mut all = base.to_vec();
            all.push(next);
            let after = render(&all, false)?;
            let delta = after.strip_prefix(&before).ok_or_else(|| {
                template_error(
                    "inline frames",
                    format!("appending a {role} message changes the earlier rendering"),
                )
            })?;
            let at = delta.find(SENTINEL).ok_or_else(|| {
                template_error(
                    "inline frames",
                    format!("the template drops the content of a {role} message"),
                )
            })?;
            Ok::<_, ProtocolError>((
                delta[..at].to_string(),
                delta[at + SENTINEL.len()..].to_string(),
            ))
        };
        let (_, act_close) = frame(&base, ChatMessage::assistant(SENTINEL))?;
        let turn = [
            base[0].clone(),
            base[1].clone(),
            ChatMessage::assistant("A"),
        ];
        let user = frame(&turn, ChatMessage::user(SENTINEL))?;
        let system = frame(&turn, ChatMessage::system(SENTINEL))?;
        let (tool_open, tool_close) = frame(&turn, ChatMessage::tool(SENTINEL))?;
        Ok(Self {
            act_header: kit.encode(header)?,
            act_close: Close::new(kit, act_close, &eos_text)?,
            user,
            system,
            tool_header: kit.encode(&tool_open)?,
            tool_close: Close::new(kit, tool_close, &eos_text)?,
            eos,
        })
    }

    /// The ids that open an assistant turn (the template's generation prompt).
    pub fn act_header(&self) -> &[u32] {
        &self.act_header
    }

    /// The ids that open a tool turn.
    pub fn tool_header(&self) -> &[u32] {
        &self.tool_header
    }
}

/// One trajectory's public token stream (see the module doc).
///
/// Append-only: every method that grows it only appends, so each row built from it extends
/// the previous rows' prompts. Rehearse prompts branch off it and never join it.
#[derive(Debug, Clone)]
pub struct InlineStream {
    ids: Vec<u32>,
    frames: InlineFrames,
}

impl InlineStream {
    /// The stream of a new trajectory: the chat template's rendering of the Act role's system
    /// message (exactly the one [`act_messages`] builds from `tools`, `rendering` and `memory`)
    /// and the first user turn's messages, without a generation prompt.
    ///
    /// # Errors
    /// The template or tokenizer fails (see [`InlineFrames::new`]).
    pub fn new(
        kit: &PromptKit,
        tools: &[Value],
        rendering: ToolRendering,
        memory: Option<&str>,
        first_user: &[String],
    ) -> Result<Self, ProtocolError> {
        Self::with_frames(
            InlineFrames::new(kit)?,
            kit,
            tools,
            rendering,
            memory,
            first_user,
        )
    }

    /// [`InlineStream::new`] with frames derived before (one derivation serves every stream of
    /// a run).
    ///
    /// # Errors
    /// [`ProtocolError`] when the template or tokenizer fails.
    pub fn with_frames(
        frames: InlineFrames,
        kit: &PromptKit,
        tools: &[Value],
        rendering: ToolRendering,
        memory: Option<&str>,
        first_user: &[String],
    ) -> Result<Self, ProtocolError> {
        let history: Vec<Message> = first_user
            .iter()
            .map(|content| Message {
                role: MessageRole::User,
                content: content.clone(),
                tool_name: None,
                row: None,
            })
            .collect();
        let ids = kit.encode_chat(&act_messages(tools, rendering, &history, memory), false)?;
        Ok(Self { ids, frames })
    }

    /// The public stream so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// The frames the stream is built with.
    pub fn frames(&self) -> &InlineFrames {
        &self.frames
    }

    /// Appends a later user turn's messages, each in the template's user frame.
    ///
    /// # Errors
    /// [`ProtocolError::Tokenizer`] when encoding fails.
    pub fn push_user(&mut self, kit: &PromptKit, messages: &[String]) -> Result<(), ProtocolError> {
        let (open, close) = &self.frames.user;
        for m in messages {
            let ids = kit.encode(&format!("{open}{m}{close}"))?;
            self.ids.extend(ids);
        }
        Ok(())
    }

    /// The prompt of the next Act turn: the stream and the assistant header.
    pub fn act_prompt(&self) -> Vec<u32> {
        let mut ids = Vec::with_capacity(self.ids.len() + self.frames.act_header.len());
        ids.extend_from_slice(&self.ids);
        ids.extend_from_slice(&self.frames.act_header);
        ids
    }

    /// Appends an Act turn: the assistant header, the exact sampled `completion` ids (with the
    /// end-of-turn id added when generation stopped on length) and the end-of-message rest.
    pub fn push_act(&mut self, completion: &[u32]) {
        self.ids.extend_from_slice(&self.frames.act_header);
        self.frames
            .act_close
            .append_sampled(&mut self.ids, completion, self.frames.eos);
    }

    /// The text of the private block of one Rehearse call: [`INLINE_REHEARSE_SYSTEM`], the
    /// `# Known facts` (as in [`super::rehearse_messages`]) and the `# Call to simulate`.
    pub fn private_text(
        tools: &[Value],
        rendering: ToolRendering,
        facts: &[ToolExchange],
        call: &ToolCall,
    ) -> String {
        let mut text = format!("{INLINE_REHEARSE_SYSTEM}\n\n# Known facts\n");
        write_facts(&mut text, facts);
        text.push('\n');
        write_call(&mut text, tools, rendering, call);
        let _ = write!(text, "\nAnswer with the JSON result only.");
        text
    }

    /// The prompt of one Rehearse call: the stream, the private block (a system message, see
    /// [`InlineStream::private_text`]) and the tool header. The stream itself is not changed.
    ///
    /// # Errors
    /// [`ProtocolError::Tokenizer`] when encoding fails.
    pub fn rehearse_prompt(
        &self,
        kit: &PromptKit,
        tools: &[Value],
        rendering: ToolRendering,
        facts: &[ToolExchange],
        call: &ToolCall,
    ) -> Result<Vec<u32>, ProtocolError> {
        let (open, close) = &self.frames.system;
        let private = kit.encode(&format!(
            "{open}{}{close}",
            Self::private_text(tools, rendering, facts, call)
        ))?;
        let mut ids =
            Vec::with_capacity(self.ids.len() + private.len() + self.frames.tool_header.len());
        ids.extend_from_slice(&self.ids);
        ids.extend(private);
        ids.extend_from_slice(&self.frames.tool_header);
        Ok(ids)
    }

    /// Appends a rehearsed tool result: the tool header, the Rehearse row's exact sampled ids
    /// (the JSON and its end token) and the end-of-message rest.
    pub fn push_tool_result_ids(&mut self, result: &[u32]) {
        self.ids.extend_from_slice(&self.frames.tool_header);
        self.frames
            .tool_close
            .append_sampled(&mut self.ids, result, self.frames.eos);
    }

    /// Appends a real tool result (evaluation): `text` encoded in the same tool frame (it did
    /// not come from the model, so it is encoded).
    ///
    /// # Errors
    /// [`ProtocolError::Tokenizer`] when encoding fails.
    pub fn push_tool_result_text(
        &mut self,
        kit: &PromptKit,
        text: &str,
    ) -> Result<(), ProtocolError> {
        let ids = kit.encode(&format!("{text}{}", self.frames.tool_close.text))?;
        self.ids.extend_from_slice(&self.frames.tool_header);
        self.ids.extend(ids);
        Ok(())
    }
}

/// Reads one inline Rehearse output (decoded without special tokens): after an optional
/// leading `<think>…</think>`, the trimmed text must be one JSON object or array.
///
/// # Errors
/// [`RehearseErrorCode::MissingBlock`] for an unclosed think block;
/// [`RehearseErrorCode::InvalidJson`] when the text is empty or not JSON (e.g. prose, or JSON
/// cut off by the token budget); [`RehearseErrorCode::NotObjectOrArray`] for a JSON scalar.
pub fn parse_inline_result(text: &str) -> Result<Value, RehearseParseError> {
    let mut rest = text.trim();
    if let Some(inner) = rest.strip_prefix("<think>") {
        let end = inner.find("</think>").ok_or_else(|| {
            RehearseParseError::new(
                RehearseErrorCode::MissingBlock,
                "<think> is never closed, so no JSON result follows",
            )
        })?;
        rest = inner[end + "</think>".len()..].trim();
    }
    if rest.is_empty() {
        return Err(RehearseParseError::new(
            RehearseErrorCode::InvalidJson,
            "empty result: expected a JSON object or array",
        ));
    }
    json_result(rest)
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Map};

    use super::*;
    use crate::protocol::test_support::{file_system_tools, smollm2_kit};

    fn user(content: &str) -> Message {
        Message {
            role: MessageRole::User,
            content: content.into(),
            tool_name: None,
            row: None,
        }
    }

    fn fact(result: &str) -> ToolExchange {
        ToolExchange {
            name: "ls".into(),
            arguments_json: "{\"a\": false}".into(),
            result_json: result.into(),
        }
    }

    fn sort_call() -> ToolCall {
        let mut arguments = Map::new();
        arguments.insert("file_name".into(), json!("a.txt"));
        arguments.insert("order".into(), json!("asc"));
        ToolCall::new("sort", arguments)
    }

    #[test]
    fn chatml_frames_come_from_the_template() {
        let kit = smollm2_kit();
        let frames = InlineFrames::new(&kit).expect("frames");
        let text = |ids: &[u32]| kit.tokenizer.decode(ids, false).expect("decode");
        assert_eq!(text(frames.act_header()), "<|im_start|>assistant\n");
        assert_eq!(text(frames.tool_header()), "<|im_start|>tool\n");
        assert!(frames.act_close.after_eos && frames.tool_close.after_eos);
        assert_eq!(text(&frames.act_close.rest_ids), "\n");
        assert_eq!(
            frames.user,
            ("<|im_start|>user\n".to_string(), "<|im_end|>\n".to_string())
        );
        assert_eq!(
            frames.system,
            (
                "<|im_start|>system\n".to_string(),
                "<|im_end|>\n".to_string()
            )
        );
    }

    #[test]
    fn the_first_act_prompt_is_the_reference_prompt_and_later_ones_extend_it() {
        let kit = smollm2_kit();
        let tools = file_system_tools();
        for (rendering, memory) in [
            (ToolRendering::Full, None),
            (ToolRendering::Compact, Some("Check the folder first.")),
        ] {
            let first = ["Sort a.txt please.".to_string()];
            let mut stream =
                InlineStream::new(&kit, &tools, rendering, memory, &first).expect("stream");
            let reference = kit
                .encode_chat(
                    &act_messages(&tools, rendering, &[user(&first[0])], memory),
                    true,
                )
                .expect("reference");
            let prompt = stream.act_prompt();
            assert_eq!(prompt, reference, "identical Act context in both protocols");

            // Act turn 1 (sampled ids, ending with the end token), then a rehearsed result.
            let mut act = kit
                .encode("<tool_call>\n{\"name\": \"ls\", \"arguments\": {}}\n</tool_call>")
                .expect("encode");
            act.extend(kit.eos_id());
            stream.push_act(&act);
            let rehearse = stream
                .rehearse_prompt(&kit, &tools, rendering, &[fact("{\"x\": 1}")], &sort_call())
                .expect("rehearse prompt");
            assert!(rehearse.starts_with(stream.ids()));
            let mut result = kit
                .encode("{\"current_directory_content\": [\"a.txt\"]}")
                .unwrap();
            result.extend(kit.eos_id());
            stream.push_tool_result_ids(&result);
            let second = stream.act_prompt();
            let mut row1 = prompt.clone();
            row1.extend(&act);
            assert!(second.starts_with(&row1), "turn 2 extends turn 1's row");

            // An Act turn cut off by length (no end token) is closed with one.
            let cut = kit.encode("I sorted").unwrap();
            stream.push_act(&cut);
            stream
                .push_user(&kit, &["Now list it.".to_string()])
                .expect("user");
            stream
                .push_tool_result_text(&kit, "{\"ok\": true}")
                .unwrap();
            let third = stream.act_prompt();
            let mut row2 = second.clone();
            row2.extend(&cut);
            assert!(third.starts_with(&row2));
            let text = kit.tokenizer.decode(&third, false).unwrap();
            assert!(text.ends_with(
                "<|im_start|>assistant\nI sorted<|im_end|>\n<|im_start|>user\nNow list it.<|im_end|>\n<|im_start|>tool\n{\"ok\": true}<|im_end|>\n<|im_start|>assistant\n"
            ), "{text}");
            assert!(text.contains(
                "</tool_call><|im_end|>\n<|im_start|>tool\n{\"current_directory_content\": [\"a.txt\"]}<|im_end|>\n<|im_start|>assistant\n"
            ));
            // The private block never joins the public stream.
            assert!(!text.contains("# Known facts"));
        }
    }

    #[test]
    fn the_private_block_differs_with_the_facts_and_stays_in_the_branch() {
        let kit = smollm2_kit();
        let tools = file_system_tools();
        let stream = InlineStream::new(
            &kit,
            &tools,
            ToolRendering::Compact,
            None,
            &["Sort a.txt.".to_string()],
        )
        .expect("stream");
        let a = stream
            .rehearse_prompt(
                &kit,
                &tools,
                ToolRendering::Compact,
                &[fact("{\"a\": 1}")],
                &sort_call(),
            )
            .unwrap();
        let b = stream
            .rehearse_prompt(&kit, &tools, ToolRendering::Compact, &[], &sort_call())
            .unwrap();
        assert_ne!(a, b);
        assert!(a.starts_with(stream.ids()) && b.starts_with(stream.ids()));
        let text = kit
            .tokenizer
            .decode(&a[stream.ids().len()..], false)
            .unwrap();
        assert!(text.starts_with(&format!("<|im_start|>system\n{INLINE_REHEARSE_SYSTEM}")));
        assert!(text
            .contains("# Known facts\nTool: ls\nArguments: {\"a\": false}\nResult: {\"a\": 1}\n"));
        assert!(text.contains("# Call to simulate\nTool: sort\nSchema: sort("));
        assert!(text.ends_with("Answer with the JSON result only.<|im_end|>\n<|im_start|>tool\n"));
        let none = kit.tokenizer.decode(&b, false).unwrap();
        assert!(none.contains("# Known facts\n(none)\n"));
    }

    #[test]
    fn inline_results_parse_as_bare_json() {
        assert_eq!(parse_inline_result("{\"a\": 1}").unwrap(), json!({"a": 1}));
        assert_eq!(parse_inline_result("\n [1, 2] \n").unwrap(), json!([1, 2]));
        assert_eq!(
            parse_inline_result("<think>easy</think>\n{}").unwrap(),
            json!({})
        );
        let code = |t: &str| parse_inline_result(t).expect_err(t).code;
        assert_eq!(code(""), RehearseErrorCode::InvalidJson);
        assert_eq!(code("the file was listed"), RehearseErrorCode::InvalidJson);
        assert_eq!(code("{\"a\": 1"), RehearseErrorCode::InvalidJson);
        assert_eq!(
            code("<execution_result>\n{}\n</execution_result>"),
            RehearseErrorCode::InvalidJson
        );
        assert_eq!(code("\"done\""), RehearseErrorCode::NotObjectOrArray);
        assert_eq!(code("<think>hmm {}"), RehearseErrorCode::MissingBlock);
    }
}
