//! The Rehearsal actor: renders the Rehearse prompt for one tool call (DESIGN.md §2: a fresh
//! `[system, user]` chat with the whitelist, few-shot facts, the conversation so far, the Act
//! turn's raw text and the call), asks the Engine, parses `<execution_result>`.

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::Value;

use crate::engine::EngineMsg;
use crate::environment::ToolCall;
use crate::kernels::{GenerationRequest, SamplingParams};
use crate::protocol::{
    parse_rehearse, rehearse_messages, PromptKit, RehearseParseError, ToolRendering, REHEARSE_STOP,
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
    /// Sampling; the end-of-turn token and `</execution_result>` are added as stops.
    pub params: SamplingParams,
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
        let messages = rehearse_messages(
            &request.task.tools,
            request.rendering,
            &request.facts,
            &request.history,
            &request.act_text,
            &request.call,
        );
        let prompt_ids = match state.kit.encode_chat(&messages, true) {
            Ok(ids) => ids,
            Err(e) => {
                let _ = reply.send(Err(format!("rendering the Rehearse prompt: {e}")));
                return Ok(());
            }
        };
        let mut params = request.params;
        if let Some(eos) = state.kit.eos_id() {
            if !params.stop_token_ids.contains(&eos) {
                params.stop_token_ids.push(eos);
            }
        }
        if !params.stop_strings.iter().any(|s| s == REHEARSE_STOP) {
            params.stop_strings.push(REHEARSE_STOP.to_string());
        }
        if prompt_ids.len() + params.max_new_tokens > state.info.context_len {
            let _ = reply.send(Ok(RehearseTurn::LengthExceeded {
                prompt_tokens: prompt_ids.len(),
            }));
            return Ok(());
        }
        let engine = state.engine.clone();
        let kit = state.kit.clone();
        tokio::spawn(async move {
            let request = GenerationRequest {
                prompt_ids: prompt_ids.clone(),
                params,
            };
            let out = async {
                let generated = engine
                    .ask("engine", |r| EngineMsg::Generate(request, r))
                    .await
                    .map_err(|e| e.to_string())??;
                let text = kit
                    .decode(&generated.completion_ids)
                    .map_err(|e| format!("decoding a Rehearse turn: {e}"))?;
                let parsed = parse_rehearse(&text);
                Ok(RehearseTurn::Generated {
                    row: Row {
                        role: Role::Rehearse,
                        prompt_ids,
                        completion_ids: generated.completion_ids,
                        logprobs: generated.logprobs,
                        policy_version: generated.policy_version,
                    },
                    text,
                    parsed,
                })
            }
            .await;
            let _ = reply.send(out);
        });
        Ok(())
    }
}
