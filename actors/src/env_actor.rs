//! The Environment actor: wraps real [`Environment`]s, one instance per open episode.
//!
//! Used by seed collection, evaluation and baselines, never by self-rehearsal training. Every
//! executed call increments a shared counter, so a stage can report (and assert) how many real
//! environment calls it made.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::Value;

use crate::environment::{EnvTask, Environment, Observation, ToolCall};

/// Identifies one episode's environment instance.
pub type EpisodeId = u64;

/// Builds a fresh environment.
pub type EnvFactory = Arc<dyn Fn() -> Box<dyn Environment> + Send + Sync>;

/// Messages of the Environment actor.
pub enum EnvMsg {
    /// Start a fresh instance for `episode` and reset it to `task`; replies with its tools.
    Open(EpisodeId, EnvTask, RpcReplyPort<Result<Vec<Value>, String>>),
    /// The episode starts user turn `turn` (0-based).
    BeginTurn(EpisodeId, usize),
    /// Execute one call (counted).
    Execute(
        EpisodeId,
        ToolCall,
        RpcReplyPort<Result<Observation, String>>,
    ),
    /// Snapshot of the episode's environment state.
    Snapshot(EpisodeId, RpcReplyPort<Result<Value, String>>),
    /// Drop the episode's instance.
    Close(EpisodeId),
}

/// Arguments: the factory and the shared call counter.
#[derive(Clone)]
pub struct EnvArgs {
    /// Builds one environment per episode.
    pub factory: EnvFactory,
    /// Real calls executed so far (shared with the topology for reporting).
    pub calls: Arc<AtomicU64>,
}

/// The open environments, by episode.
pub struct EnvState {
    args: EnvArgs,
    open: HashMap<EpisodeId, Box<dyn Environment>>,
}

/// The Environment actor.
#[derive(Debug, Clone, Copy, Default)]
pub struct EnvironmentActor;

impl Actor for EnvironmentActor {
    type Msg = EnvMsg;
    type State = EnvState;
    type Arguments = EnvArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: EnvArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(EnvState {
            args,
            open: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut EnvState,
    ) -> Result<(), ActorProcessingErr> {
        let missing = |id: EpisodeId| format!("episode {id} has no open environment");
        match msg {
            EnvMsg::Open(id, task, reply) => {
                let mut env = (state.args.factory)();
                let out = env.reset(&task).map(|()| env.tools());
                if out.is_ok() {
                    state.open.insert(id, env);
                }
                let _ = reply.send(out.map_err(|e| e.to_string()));
            }
            EnvMsg::BeginTurn(id, turn) => {
                if let Some(env) = state.open.get_mut(&id) {
                    env.begin_turn(turn);
                }
            }
            EnvMsg::Execute(id, call, reply) => {
                let out = match state.open.get_mut(&id) {
                    Some(env) => {
                        state.args.calls.fetch_add(1, Ordering::SeqCst);
                        metrics::counter!("real_env_calls").increment(1);
                        Ok(env.execute(&call))
                    }
                    None => Err(missing(id)),
                };
                let _ = reply.send(out);
            }
            EnvMsg::Snapshot(id, reply) => {
                let out = state
                    .open
                    .get(&id)
                    .map(|e| e.snapshot())
                    .ok_or_else(|| missing(id));
                let _ = reply.send(out);
            }
            EnvMsg::Close(id) => {
                state.open.remove(&id);
            }
        }
        Ok(())
    }
}
