//! The Acting actor: renders the Act prompt from the history (or takes the inline protocol's
//! stream prompt), asks the Engine for one turn and parses it (Hermes `<tool_call>` blocks or
//! a final answer; DESIGN.md §2).

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::engine::EngineMsg;
use crate::generation::{generate_row, prepare, prepare_ids, reply_later, Prepared};
use crate::kernels::SamplingParams;
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
    /// The inline protocol's prompt ([`crate::protocol::InlineStream::act_prompt`]): when
    /// given, it is used as is and `history`, `memory` and `rendering` are not rendered
    /// (`None`: the reference protocol's [`act_messages`] prompt).
    pub prompt_ids: Option<Vec<u32>>,
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
        let prepared = match request.prompt_ids {
            Some(ids) => Ok(prepare_ids(
                &state.kit,
                state.info,
                ids,
                request.params,
                None,
            )),
            None => {
                let messages = act_messages(
                    &request.task.tools,
                    request.rendering,
                    &request.history,
                    request.memory.as_deref(),
                );
                prepare(
                    &state.kit,
                    state.info,
                    &messages,
                    request.params,
                    None,
                    "Act",
                )
            }
        };
        let generation = match prepared {
            Err(e) => {
                let _ = reply.send(Err(e));
                return Ok(());
            }
            Ok(Prepared::TooLong { prompt_tokens }) => {
                let _ = reply.send(Ok(ActTurn::LengthExceeded { prompt_tokens }));
                return Ok(());
            }
            Ok(Prepared::Ready(generation)) => generation,
        };
        let (engine, kit, task) = (state.engine.clone(), state.kit.clone(), request.task);
        reply_later(reply, async move {
            let (row, text) = generate_row(&engine, &kit, Role::Act, generation).await?;
            let parsed = parse_act(&text, &task.tool_names());
            Ok(ActTurn::Generated { row, text, parsed })
        });
        Ok(())
    }
}
