//! The Acting actor: renders the Act prompt from the history, asks the Engine for one turn and
//! parses it (Hermes `<tool_call>` blocks or a final answer; DESIGN.md §2).

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::engine::EngineMsg;
use crate::kernels::{GenerationRequest, SamplingParams};
use crate::protocol::{
    act_messages, parse_act, ActOutput, ActParseError, PromptKit, ToolRendering,
};
use crate::slot::Slot;
use crate::storage::{Message, Role, Row};
use crate::task::EpisodeTask;
use crate::worker::ModelInfo;

/// One Act request.
pub struct ActRequest {
    /// The task: its tools are the whitelist shown and parsed against.
    pub task: Arc<EpisodeTask>,
    /// The conversation so far (user, assistant, tool messages).
    pub history: Vec<Message>,
    /// A rehearsal memory to show in the system prompt (test-time scaling), if any.
    pub memory: Option<String>,
    /// How the tools are shown.
    pub rendering: ToolRendering,
    /// Sampling for this turn: `max_new_tokens` and the seed are used as given; the end-of-turn
    /// token is added to the stop ids.
    pub params: SamplingParams,
}

/// The outcome of one Act generation call.
#[derive(Debug, Clone)]
pub enum ActTurn {
    /// The policy produced a turn (the row holds its exact ids and log-probs).
    Generated {
        row: Row,
        /// The completion decoded without special tokens.
        text: String,
        parsed: Result<ActOutput, ActParseError>,
    },
    /// Prompt plus `max_new_tokens` exceed the context: the episode ends as length-exceeded.
    LengthExceeded { prompt_tokens: usize },
}

/// Messages of the Acting actor.
pub enum ActingMsg {
    Act(ActRequest, RpcReplyPort<Result<ActTurn, String>>),
}

/// What an Acting worker needs.
#[derive(Clone)]
pub struct ActingArgs {
    /// Where generation requests go.
    pub engine: Slot<EngineMsg>,
    /// Tokenizer and chat template.
    pub kit: Arc<PromptKit>,
    /// The model's context length (the context cap).
    pub info: ModelInfo,
}

/// The Acting actor.
#[derive(Debug, Clone, Copy, Default)]
pub struct ActingActor;

impl Actor for ActingActor {
    type Msg = ActingMsg;
    type State = ActingArgs;
    type Arguments = ActingArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: ActingArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(args)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut ActingArgs,
    ) -> Result<(), ActorProcessingErr> {
        let ActingMsg::Act(request, reply) = msg;
        // Rendering is cheap and stays in the handler; generation is awaited off the mailbox.
        let messages = act_messages(
            &request.task.tools,
            request.rendering,
            &request.history,
            request.memory.as_deref(),
        );
        let prompt_ids = match state.kit.encode_chat(&messages, true) {
            Ok(ids) => ids,
            Err(e) => {
                let _ = reply.send(Err(format!("rendering the Act prompt: {e}")));
                return Ok(());
            }
        };
        let mut params = request.params;
        if let Some(eos) = state.kit.eos_id() {
            if !params.stop_token_ids.contains(&eos) {
                params.stop_token_ids.push(eos);
            }
        }
        if prompt_ids.len() + params.max_new_tokens > state.info.context_len {
            let _ = reply.send(Ok(ActTurn::LengthExceeded {
                prompt_tokens: prompt_ids.len(),
            }));
            return Ok(());
        }
        let engine = state.engine.clone();
        let kit = state.kit.clone();
        tokio::spawn(async move {
            let out = generate_turn(&engine, &kit, &request.task, prompt_ids, params).await;
            let _ = reply.send(out);
        });
        Ok(())
    }
}

async fn generate_turn(
    engine: &Slot<EngineMsg>,
    kit: &PromptKit,
    task: &EpisodeTask,
    prompt_ids: Vec<u32>,
    params: SamplingParams,
) -> Result<ActTurn, String> {
    let request = GenerationRequest {
        prompt_ids: prompt_ids.clone(),
        params,
    };
    let generated = engine
        .ask("engine", |r| EngineMsg::Generate(request, r))
        .await
        .map_err(|e| e.to_string())??;
    let text = kit
        .decode(&generated.completion_ids)
        .map_err(|e| format!("decoding an Act turn: {e}"))?;
    let parsed = parse_act(&text, &task.tool_names());
    Ok(ActTurn::Generated {
        row: Row {
            role: Role::Act,
            prompt_ids,
            completion_ids: generated.completion_ids,
            logprobs: generated.logprobs,
            policy_version: generated.policy_version,
        },
        text,
        parsed,
    })
}
