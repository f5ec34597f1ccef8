//! The Rehearsal actor: renders the Rehearse prompt for one tool call (DESIGN.md §2: a fresh
//! `[system, user]` chat with the whitelist, few-shot facts, the conversation so far, the Act
//! turn's raw text and the call), asks the Engine, parses `<execution_result>`. In the inline
//! protocol the prompt comes ready (the trajectory's stream and a private block) and the
//! output is a bare JSON result.

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::Value;

use crate::engine::EngineMsg;
use crate::environment::ToolCall;
use crate::generation::{generate_row, prepare, prepare_ids, reply_later, Prepared};
use crate::kernels::SamplingParams;
use crate::protocol::{
    parse_inline_result, parse_rehearse, rehearse_messages, PromptKit, RehearseParseError,
    ToolRendering, REHEARSE_STOP,
};
use crate::slot::Slot;
use crate::storage::{Message, Role, Row, ToolExchange};
use crate::task::EpisodeTask;
use crate::worker::ModelInfo;

/// One Rehearse request: simulate `call`.
pub struct RehearseRequest {
    /// The task: its tools are the whitelist the simulator checks the call against.
    pub task: Arc<EpisodeTask>,
    /// Few-shot real (tool, arguments, result) triples (never from a test task's own data).
    pub facts: Arc<Vec<ToolExchange>>,
    /// The conversation before the Act turn that made the call.
    pub history: Vec<Message>,
    /// The Act turn's raw text.
    pub act_text: String,
    /// The call to simulate.
    pub call: ToolCall,
    /// How the tools are shown.
    pub rendering: ToolRendering,
    /// Sampling; the end-of-turn token (and, in the reference protocol, `</execution_result>`)
    /// are added as stops.
    pub params: SamplingParams,
    /// The inline protocol's prompt ([`crate::protocol::InlineStream::rehearse_prompt`]): when
    /// given, it is used as is (`facts`, `history`, `act_text` and `rendering` are not
    /// rendered), generation stops on the end-of-turn token only, and the output is read as a
    /// bare JSON result ([`parse_inline_result`]). `None`: the reference protocol's
    /// [`rehearse_messages`] prompt and `<execution_result>` block.
    pub prompt_ids: Option<Vec<u32>>,
}

/// The outcome of one Rehearse generation call.
#[derive(Debug, Clone)]
pub enum RehearseTurn {
    /// The policy predicted a result.
    Generated {
        /// The Rehearse row (exact ids and log-probs).
        row: Row,
        /// The completion decoded without special tokens.
        text: String,
        /// The predicted result (a JSON object or array) or the simulator error.
        parsed: Result<Value, RehearseParseError>,
    },
    /// Prompt plus `max_new_tokens` exceed the context.
    LengthExceeded {
        /// Length of the rendered prompt, tokens.
        prompt_tokens: usize,
    },
}

/// Messages of the Rehearsal actor.
pub enum RehearsalMsg {
    Rehearse(RehearseRequest, RpcReplyPort<Result<RehearseTurn, String>>),
}

/// What a Rehearsal worker needs.
#[derive(Clone)]
pub struct RehearsalArgs {
    /// Where generation requests go.
    pub engine: Slot<EngineMsg>,
    /// Tokenizer and chat template.
    pub kit: Arc<PromptKit>,
    /// The model's context length (the context cap).
    pub info: ModelInfo,
}

/// The Rehearsal actor.
#[derive(Debug, Clone, Copy, Default)]
pub struct RehearsalActor;

impl Actor for RehearsalActor {
    type Msg = RehearsalMsg;
    type State = RehearsalArgs;
    type Arguments = RehearsalArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: RehearsalArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(args)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut RehearsalArgs,
    ) -> Result<(), ActorProcessingErr> {
        let RehearsalMsg::Rehearse(request, reply) = msg;
        let inline = request.prompt_ids.is_some();
        let prepared = match request.prompt_ids {
            Some(ids) => Ok(prepare_ids(
                &state.kit,
                state.info,
                ids,
                request.params,
                None,
            )),
            None => {
                let messages = rehearse_messages(
                    &request.task.tools,
                    request.rendering,
                    &request.facts,
                    &request.history,
                    &request.act_text,
                    &request.call,
                );
                prepare(
                    &state.kit,
                    state.info,
                    &messages,
                    request.params,
                    Some(REHEARSE_STOP),
                    "Rehearse",
                )
            }
        };
        let generation = match prepared {
            Err(e) => {
                let _ = reply.send(Err(e));
                return Ok(());
            }
            Ok(Prepared::TooLong { prompt_tokens }) => {
                let _ = reply.send(Ok(RehearseTurn::LengthExceeded { prompt_tokens }));
                return Ok(());
            }
            Ok(Prepared::Ready(generation)) => generation,
        };
        let (engine, kit) = (state.engine.clone(), state.kit.clone());
        reply_later(reply, async move {
            let (row, text) = generate_row(&engine, &kit, Role::Rehearse, generation).await?;
            let parsed = if inline {
                parse_inline_result(&text)
            } else {
                parse_rehearse(&text)
            };
            Ok(RehearseTurn::Generated { row, text, parsed })
        });
        Ok(())
    }
}
