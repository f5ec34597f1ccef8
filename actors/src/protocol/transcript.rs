//! The rollout protocol as a type: a [`Protocol`] opens one [`Transcript`] per episode, and the
//! transcript owns that episode's conversation — its message history and, in the inline
//! protocol, its token stream. It renders the Act and Rehearse prompts, reads the completions
//! and appends them, so the episode driver, the warm-up's seed rows and Rehearse fidelity run
//! the same code whichever protocol a run uses (DESIGN.md §2–§3).
//!
//! Two implementations, chosen by [`ProtocolConfig::mode`] ([`protocol_for`]):
//!
//! * [`ReferenceProtocol`]: a fresh prompt per Act turn ([`act_messages`]) and per Rehearse call
//!   ([`rehearse_messages`], `<execution_result>` output), as the authors do;
//! * [`InlineProtocol`]: one [`InlineStream`] per episode; Act prompts are the stream and the
//!   assistant header, Rehearse prompts branch off it with a private block, and the stream
//!   grows by every Act turn's and every tool result's exact ids.
//!
//! The message history (what the judge and the stored trajectory see) is the same in both.

use std::fmt;
use std::sync::Arc;

use serde_json::Value;

use super::{
    act_messages, inline_result_target, parse_act, parse_inline_result, parse_rehearse,
    rehearse_messages, render_rehearse_target, ActOutput, ActParseError, InlineFrames,
    InlineStream, PromptKit, ProtocolConfig, ProtocolError, RehearseParseError, RolloutProtocol,
    ToolRendering, REHEARSE_STOP,
};
use crate::storage::{Message, MessageRole, ToolExchange};
use crate::task::EpisodeTask;
use crate::ToolCall;

/// The prompt of one generation call: token ids ready to prefill, and the stop strings the
/// protocol reads the completion up to (the end-of-turn token is added by the Policy actor).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolePrompt {
    /// Prompt token ids (at most the model's context length minus the new-token budget, or
    /// the Policy actor answers `LengthExceeded`).
    pub ids: Vec<u32>,
    /// Generation stops after any of these strings (the reference Rehearse role's
    /// `</execution_result>`); empty for the others.
    pub stop_strings: Vec<String>,
}

/// What a transcript is opened with: the parts of an episode that do not change while it runs.
#[derive(Debug, Clone)]
pub struct EpisodeContext {
    /// The task: its tools are shown in both roles' prompts and are Act's whitelist.
    pub task: Arc<EpisodeTask>,
    /// Few-shot real (tool, arguments, result) triples for the Rehearse role (never from a
    /// test task's own data; see `protocol::SeedPool`).
    pub facts: Arc<Vec<ToolExchange>>,
    /// A rehearsal memory shown to Act in its system prompt (test-time scaling).
    pub memory: Option<String>,
}

/// One answered call of an Act turn, as [`Transcript::push_results`] appends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolResult {
    /// The tool that answered.
    pub name: String,
    /// The result as the history shows it (a rehearsed one in `json.dumps` form).
    pub text: String,
    /// The Rehearse row that predicted it: its index among the episode's rows and its sampled
    /// completion ids (the inline stream takes those exact ids). `None`: a real result, which
    /// the inline stream encodes from `text`.
    pub rehearsed: Option<(u32, Vec<u32>)>,
}

/// A rollout protocol: how an episode's conversation becomes prompts and how completions are
/// read (see the module doc). `Send + Sync`, shared behind an `Arc` by every episode of a run.
pub trait Protocol: Send + Sync + fmt::Debug {
    /// Which protocol this is (what `[protocol] mode` names).
    fn mode(&self) -> RolloutProtocol;

    /// How tool schemas are rendered in both roles' prompts.
    fn tool_rendering(&self) -> ToolRendering;

    /// The transcript of a new episode: empty history (and stream).
    fn open(&self, ctx: EpisodeContext) -> Box<dyn Transcript>;

    /// Reads one Rehearse completion (decoded without special tokens) into the predicted
    /// result.
    ///
    /// # Errors
    /// [`RehearseParseError`] when the output is not a result in this protocol's format (the
    /// episode then ends as a Rehearse format error).
    fn parse_rehearse(&self, text: &str) -> Result<Value, RehearseParseError>;

    /// The Rehearse completion text that teaches a real result (`result_json` as the
    /// environment returned it): the warm-up's target, without the end-of-turn token.
    fn rehearse_target(&self, result_json: &str) -> String;
}

/// One episode's conversation under a [`Protocol`] (see the module doc).
///
/// The driver calls, per user turn, [`push_user`](Transcript::push_user); per Act turn
/// [`act_prompt`](Transcript::act_prompt) then [`push_act`](Transcript::push_act); per call of
/// that turn [`rehearse_prompt`](Transcript::rehearse_prompt) (every call against the same
/// conversation); then [`push_results`](Transcript::push_results) once for all of them.
pub trait Transcript: Send {
    /// The messages so far (user, assistant, tool; a closing error message last, if any).
    fn history(&self) -> &[Message];

    /// The history, consuming the transcript (the trajectory's `messages`).
    fn into_history(self: Box<Self>) -> Vec<Message>;

    /// Appends a user turn's messages.
    ///
    /// # Errors
    /// [`ProtocolError`] when the inline stream cannot render or encode them.
    fn push_user(&mut self, messages: &[String]) -> Result<(), ProtocolError>;

    /// The prompt of the next Act turn.
    ///
    /// # Errors
    /// [`ProtocolError`] when the chat template or the tokenizer fails.
    fn act_prompt(&self) -> Result<RolePrompt, ProtocolError>;

    /// Appends an Act turn — `row`: its row's index among the episode's rows; `completion`:
    /// its sampled ids; `text`: them decoded without special tokens — and reads it against the
    /// task's whitelist ([`parse_act`]).
    ///
    /// # Errors
    /// [`ActParseError`] for a malformed turn; the turn is in the history all the same, and the
    /// episode ends (the driver appends the error with [`Transcript::push_message`]).
    fn push_act(
        &mut self,
        row: u32,
        completion: &[u32],
        text: &str,
    ) -> Result<ActOutput, ActParseError>;

    /// The prompt of one Rehearse call of the last Act turn. The conversation is not changed.
    ///
    /// # Errors
    /// [`ProtocolError`] when the chat template or the tokenizer fails.
    fn rehearse_prompt(&self, call: &ToolCall) -> Result<RolePrompt, ProtocolError>;

    /// Appends the results of the last Act turn's calls, in call order.
    ///
    /// # Errors
    /// [`ProtocolError`] when the inline stream cannot encode a real result.
    fn push_results(&mut self, results: Vec<ToolResult>) -> Result<(), ProtocolError>;

    /// Appends a message to the history only (an error that ends the episode: the Act parse
    /// error's tool message, a simulator error); the stream, if any, is not changed.
    fn push_message(&mut self, message: Message);
}

/// The protocol `cfg` selects, over `kit` (the model's tokenizer and chat template).
///
/// # Errors
/// [`ProtocolError`] when the inline protocol cannot derive its frames from the template (see
/// [`InlineFrames::new`]): a run fails here, at start-up, not in its first episode.
pub fn protocol_for(
    cfg: &ProtocolConfig,
    kit: Arc<PromptKit>,
) -> Result<Arc<dyn Protocol>, ProtocolError> {
    Ok(match cfg.mode {
        RolloutProtocol::Reference => Arc::new(ReferenceProtocol {
            kit,
            rendering: cfg.tool_rendering,
        }),
        RolloutProtocol::Inline => Arc::new(InlineProtocol::new(kit, cfg.tool_rendering)?),
    })
}

/// The history both transcripts keep.
#[derive(Debug)]
struct Conversation {
    ctx: EpisodeContext,
    history: Vec<Message>,
    /// Index in `history` of the last Act turn's message.
    last_act: Option<usize>,
}

impl Conversation {
    fn new(ctx: EpisodeContext) -> Self {
        Self {
            ctx,
            history: Vec::new(),
            last_act: None,
        }
    }

    fn push_user(&mut self, messages: &[String]) {
        self.history.extend(
            messages
                .iter()
                .map(|m| Message::new(MessageRole::User, m.clone())),
        );
    }

    fn push_act(&mut self, row: u32, text: &str) -> Result<ActOutput, ActParseError> {
        self.last_act = Some(self.history.len());
        self.history
            .push(Message::new(MessageRole::Assistant, text).with_row(Some(row)));
        parse_act(text, &self.ctx.task.tool_names())
    }

    fn push_results(&mut self, results: &[ToolResult]) {
        for r in results {
            let row = r.rehearsed.as_ref().map(|(row, _)| *row);
            self.history.push(
                Message::new(MessageRole::Tool, r.text.clone())
                    .with_row(row)
                    .with_tool(r.name.clone()),
            );
        }
    }

    /// The history before the last Act turn and that turn's raw text.
    fn before_last_act(&self) -> (&[Message], &str) {
        match self.last_act {
            Some(i) => (&self.history[..i], self.history[i].content.as_str()),
            None => (&self.history, ""),
        }
    }
}

/// The authors' protocol: a fresh chat per Act turn and per Rehearse call.
#[derive(Debug, Clone)]
pub struct ReferenceProtocol {
    /// Tokenizer and chat template.
    pub kit: Arc<PromptKit>,
    /// How tools are shown.
    pub rendering: ToolRendering,
}

impl Protocol for ReferenceProtocol {
    fn mode(&self) -> RolloutProtocol {
        RolloutProtocol::Reference
    }

    fn tool_rendering(&self) -> ToolRendering {
        self.rendering
    }

    fn open(&self, ctx: EpisodeContext) -> Box<dyn Transcript> {
        Box::new(ReferenceTranscript {
            kit: self.kit.clone(),
            rendering: self.rendering,
            conversation: Conversation::new(ctx),
        })
    }

    fn parse_rehearse(&self, text: &str) -> Result<Value, RehearseParseError> {
        parse_rehearse(text)
    }

    fn rehearse_target(&self, result_json: &str) -> String {
        render_rehearse_target(result_json)
    }
}

/// [`ReferenceProtocol`]'s transcript: the history, rendered afresh for every prompt.
struct ReferenceTranscript {
    kit: Arc<PromptKit>,
    rendering: ToolRendering,
    conversation: Conversation,
}

impl Transcript for ReferenceTranscript {
    fn history(&self) -> &[Message] {
        &self.conversation.history
    }

    fn into_history(self: Box<Self>) -> Vec<Message> {
        self.conversation.history
    }

    fn push_user(&mut self, messages: &[String]) -> Result<(), ProtocolError> {
        self.conversation.push_user(messages);
        Ok(())
    }

    fn act_prompt(&self) -> Result<RolePrompt, ProtocolError> {
        let c = &self.conversation;
        let messages = act_messages(
            &c.ctx.task.tools,
            self.rendering,
            &c.history,
            c.ctx.memory.as_deref(),
        );
        Ok(RolePrompt {
            ids: self.kit.encode_chat(&messages, true)?,
            stop_strings: Vec::new(),
        })
    }

    fn push_act(
        &mut self,
        row: u32,
        _completion: &[u32],
        text: &str,
    ) -> Result<ActOutput, ActParseError> {
        self.conversation.push_act(row, text)
    }

    fn rehearse_prompt(&self, call: &ToolCall) -> Result<RolePrompt, ProtocolError> {
        let c = &self.conversation;
        let (history, act_text) = c.before_last_act();
        let messages = rehearse_messages(
            &c.ctx.task.tools,
            self.rendering,
            &c.ctx.facts,
            history,
            act_text,
            call,
        );
        Ok(RolePrompt {
            ids: self.kit.encode_chat(&messages, true)?,
            stop_strings: vec![REHEARSE_STOP.to_string()],
        })
    }

    fn push_results(&mut self, results: Vec<ToolResult>) -> Result<(), ProtocolError> {
        self.conversation.push_results(&results);
        Ok(())
    }

    fn push_message(&mut self, message: Message) {
        self.conversation.history.push(message);
    }
}

/// The inline protocol: one token stream per episode (see `protocol::inline`).
#[derive(Debug, Clone)]
pub struct InlineProtocol {
    kit: Arc<PromptKit>,
    rendering: ToolRendering,
    /// Derived once from the template; every episode's stream is built with them.
    frames: InlineFrames,
}

impl InlineProtocol {
    /// The inline protocol over `kit`, showing tools as `rendering`.
    ///
    /// # Errors
    /// [`ProtocolError`] when the template's frames cannot be derived ([`InlineFrames::new`]).
    pub fn new(kit: Arc<PromptKit>, rendering: ToolRendering) -> Result<Self, ProtocolError> {
        let frames = InlineFrames::new(&kit)?;
        Ok(Self {
            kit,
            rendering,
            frames,
        })
    }
}

impl Protocol for InlineProtocol {
    fn mode(&self) -> RolloutProtocol {
        RolloutProtocol::Inline
    }

    fn tool_rendering(&self) -> ToolRendering {
        self.rendering
    }

    fn open(&self, ctx: EpisodeContext) -> Box<dyn Transcript> {
        Box::new(InlineTranscript {
            kit: self.kit.clone(),
            rendering: self.rendering,
            frames: self.frames.clone(),
            conversation: Conversation::new(ctx),
            stream: None,
        })
    }

    fn parse_rehearse(&self, text: &str) -> Result<Value, RehearseParseError> {
        parse_inline_result(text)
    }

    fn rehearse_target(&self, result_json: &str) -> String {
        inline_result_target(result_json)
    }
}

/// [`InlineProtocol`]'s transcript: the history and the stream, which starts with the first
/// user turn (its system message holds the tools and the memory).
struct InlineTranscript {
    kit: Arc<PromptKit>,
    rendering: ToolRendering,
    frames: InlineFrames,
    conversation: Conversation,
    stream: Option<InlineStream>,
}

impl InlineTranscript {
    /// The stream; before the first user turn a template error (a driver bug, not input).
    fn stream(&self) -> Result<&InlineStream, ProtocolError> {
        self.stream.as_ref().ok_or_else(|| ProtocolError::Template {
            context: "an inline prompt before the first user turn".into(),
            source: crate::kernels::Error::Template("the stream has not started".into()),
        })
    }
}

impl Transcript for InlineTranscript {
    fn history(&self) -> &[Message] {
        &self.conversation.history
    }

    fn into_history(self: Box<Self>) -> Vec<Message> {
        self.conversation.history
    }

    fn push_user(&mut self, messages: &[String]) -> Result<(), ProtocolError> {
        match &mut self.stream {
            Some(s) => s.push_user(&self.kit, messages)?,
            None => {
                let ctx = &self.conversation.ctx;
                self.stream = Some(InlineStream::with_frames(
                    self.frames.clone(),
                    &self.kit,
                    &ctx.task.tools,
                    self.rendering,
                    ctx.memory.as_deref(),
                    messages,
                )?);
            }
        }
        self.conversation.push_user(messages);
        Ok(())
    }

    fn act_prompt(&self) -> Result<RolePrompt, ProtocolError> {
        Ok(RolePrompt {
            ids: self.stream()?.act_prompt(),
            stop_strings: Vec::new(),
        })
    }

    fn push_act(
        &mut self,
        row: u32,
        completion: &[u32],
        text: &str,
    ) -> Result<ActOutput, ActParseError> {
        if let Some(s) = &mut self.stream {
            s.push_act(completion);
        }
        self.conversation.push_act(row, text)
    }

    fn rehearse_prompt(&self, call: &ToolCall) -> Result<RolePrompt, ProtocolError> {
        let ctx = &self.conversation.ctx;
        let ids = self.stream()?.rehearse_prompt(
            &self.kit,
            &ctx.task.tools,
            self.rendering,
            &ctx.facts,
            call,
        )?;
        Ok(RolePrompt {
            ids,
            stop_strings: Vec::new(),
        })
    }

    fn push_results(&mut self, results: Vec<ToolResult>) -> Result<(), ProtocolError> {
        if let Some(s) = &mut self.stream {
            // A rehearsed result joins the stream as the exact sampled ids; a real one
            // (evaluation) as encoded text in the same tool frame.
            for r in &results {
                match &r.rehearsed {
                    Some((_, ids)) => s.push_tool_result_ids(ids),
                    None => s.push_tool_result_text(&self.kit, &r.text)?,
                }
            }
        }
        self.conversation.push_results(&results);
        Ok(())
    }

    fn push_message(&mut self, message: Message) {
        self.conversation.history.push(message);
    }
}
