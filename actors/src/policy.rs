//! The Policy actor: one generation call for either role (DESIGN.md §2). It takes a prompt a
//! [`crate::protocol::Transcript`] rendered, adds the end-of-turn stop, applies the context cap,
//! asks the Engine and returns the [`Row`] (exact ids, log-probs, policy version) with the
//! completion decoded. It knows no protocol: what a completion means is read by the transcript
//! that asked for it.

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::engine_actor::EngineMsg;
use crate::kernels::{GenerationRequest, SamplingParams};
use crate::protocol::{PromptKit, ProtocolError, RolePrompt};
use crate::slot::{ActorCallError, Slot};
use crate::storage::{Role, Row};
use crate::worker::{ModelInfo, WorkerError};

/// One generation call.
#[derive(Debug, Clone)]
pub struct PolicyRequest {
    /// Which role the completion is for (stored on its row).
    pub role: Role,
    /// The prompt and the protocol's stop strings.
    pub prompt: RolePrompt,
    /// Sampling: `max_new_tokens` and the seed as given; the end-of-turn token and the
    /// prompt's stop strings are added to the stops.
    pub params: SamplingParams,
}

/// The outcome of one generation call.
#[derive(Debug, Clone)]
pub enum PolicyTurn {
    /// The policy generated a completion.
    Generated {
        /// The row: prompt and completion ids, one log-prob per completion token, the policy
        /// version that sampled it.
        row: Row,
        /// The completion decoded without special tokens.
        text: String,
    },
    /// Prompt plus `max_new_tokens` exceed the context: the episode ends as length-exceeded.
    LengthExceeded {
        /// Length of the prompt, tokens.
        prompt_tokens: usize,
    },
}

/// Why a generation call failed.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The Engine actor failed or stopped before answering.
    #[error(transparent)]
    Engine(#[from] ActorCallError),
    /// The model thread failed the request (see [`WorkerError`]).
    #[error("generating a {role} turn: {source}")]
    Generation {
        role: Role,
        #[source]
        source: WorkerError,
    },
    /// The completion's ids do not decode (an id outside the tokenizer's vocabulary).
    #[error("decoding a {role} turn: {message}")]
    Decode { role: Role, message: String },
}

/// Messages of the Policy actor.
pub enum PolicyMsg {
    Generate(PolicyRequest, RpcReplyPort<Result<PolicyTurn, PolicyError>>),
}

/// What a Policy worker needs.
#[derive(Clone)]
pub struct PolicyArgs {
    /// Where generation requests go.
    pub engine: Slot<EngineMsg>,
    /// Tokenizer (decoding) and its end-of-turn id (the stop).
    pub kit: std::sync::Arc<PromptKit>,
    /// The model's context length (the context cap).
    pub info: ModelInfo,
}

/// The Policy actor.
#[derive(Debug, Clone, Copy, Default)]
pub struct PolicyActor;

impl Actor for PolicyActor {
    type Msg = PolicyMsg;
    type State = PolicyArgs;
    type Arguments = PolicyArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: PolicyArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(args)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut PolicyArgs,
    ) -> Result<(), ActorProcessingErr> {
        let PolicyMsg::Generate(request, reply) = msg;
        let role = request.role;
        let generation = match prepare(&state.kit, state.info, request) {
            Ok(g) => g,
            Err(prompt_tokens) => {
                let _ = reply.send(Ok(PolicyTurn::LengthExceeded { prompt_tokens }));
                return Ok(());
            }
        };
        // Generation is awaited off the mailbox, so the actor takes its next request while
        // the Engine works (the Engine batches them).
        let (engine, kit) = (state.engine.clone(), state.kit.clone());
        tokio::spawn(async move {
            let _ = reply.send(generate(&engine, &kit, role, generation).await);
        });
        Ok(())
    }
}

/// Adds the end-of-turn token and the prompt's stop strings to the stops and checks prompt
/// plus `max_new_tokens` against the context; `Err(prompt tokens)` when it does not fit.
fn prepare(
    kit: &PromptKit,
    info: ModelInfo,
    request: PolicyRequest,
) -> Result<GenerationRequest, usize> {
    let PolicyRequest {
        prompt, mut params, ..
    } = request;
    if let Some(eos) = kit.eos_id() {
        if !params.stop_token_ids.contains(&eos) {
            params.stop_token_ids.push(eos);
        }
    }
    for stop in prompt.stop_strings {
        if !params.stop_strings.contains(&stop) {
            params.stop_strings.push(stop);
        }
    }
    if prompt.ids.len() + params.max_new_tokens > info.context_len {
        return Err(prompt.ids.len());
    }
    Ok(GenerationRequest {
        prompt_ids: prompt.ids,
        params,
    })
}

async fn generate(
    engine: &Slot<EngineMsg>,
    kit: &PromptKit,
    role: Role,
    request: GenerationRequest,
) -> Result<PolicyTurn, PolicyError> {
    let prompt_ids = request.prompt_ids.clone();
    let generated = engine
        .ask("engine", |r| EngineMsg::Generate(request, r))
        .await?
        .map_err(|source| PolicyError::Generation { role, source })?;
    let text = kit
        .decode(&generated.completion_ids)
        .map_err(|e: ProtocolError| PolicyError::Decode {
            role,
            message: e.to_string(),
        })?;
    let row = Row {
        role,
        prompt_ids,
        completion_ids: generated.completion_ids,
        logprobs: generated.logprobs,
        policy_version: generated.policy_version,
    };
    Ok(PolicyTurn::Generated { row, text })
}
