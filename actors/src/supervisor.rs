//! The supervisor: restarts failed actors and swaps the replacement into their [`Slot`].
//!
//! A failure is logged (tracing, and the `actor_restarts` counter of the metrics crate), the
//! actor is started again with fresh arguments after a backoff that doubles with each of its
//! failures (`restart_backoff` × 2^failures, at most [`MAX_BACKOFF`]); past `max_restarts` it
//! stays down and [`SupervisorMsg::GaveUp`] names it, so a long run can stop with an error
//! naming the actor instead of failing every request. Requests in flight at the failure get an
//! error ([`crate::slot::ActorCallError`]) that the episode driver turns into a retry or a
//! trajectory recorded as failed with its reason.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use ractor::{Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent};

use crate::slot::Slot;

type Spawned = Pin<Box<dyn Future<Output = Result<ActorId, String>> + Send>>;

/// How to (re)start one child.
pub trait Respawn: Send + Sync {
    /// The child's name, for logs.
    fn name(&self) -> &str;
    /// Starts a new instance linked to `supervisor`, updates the slot, returns its id.
    fn respawn(&self, supervisor: ActorCell) -> Spawned;
    /// The child will not be restarted again: callers waiting for a replacement stop waiting.
    fn give_up(&self) {}
}

/// A child built by `actor` with arguments from `args` (called per start).
pub struct Child<A: Actor> {
    /// Name for logs and the `actor_restarts` metric.
    pub name: String,
    /// The actor (its behaviour; state comes from `args`).
    pub actor: A,
    /// Fresh start-up arguments, per start.
    pub args: Arc<dyn Fn() -> A::Arguments + Send + Sync>,
    /// The slot callers reach the child through.
    pub slot: Slot<A::Msg>,
}

impl<A: Actor + Clone> Respawn for Child<A> {
    fn name(&self) -> &str {
        &self.name
    }

    fn respawn(&self, supervisor: ActorCell) -> Spawned {
        let actor = self.actor.clone();
        let args = (self.args)();
        let slot = self.slot.clone();
        Box::pin(async move {
            let (r, _) = Actor::spawn_linked(None, actor, args, supervisor)
                .await
                .map_err(|e| e.to_string())?;
            let id = r.get_id();
            slot.set(r);
            Ok(id)
        })
    }

    fn give_up(&self) {
        self.slot.mark_gone();
    }
}

/// Starts `actor` under `supervisor` and returns the slot serving it.
///
/// # Errors
/// [`StartError`] naming the actor (e.g. its `pre_start` failed, or the supervisor is gone).
pub async fn start_child<A: Actor + Clone>(
    supervisor: &ActorRef<SupervisorMsg>,
    name: &str,
    actor: A,
    args: Arc<dyn Fn() -> A::Arguments + Send + Sync>,
) -> Result<Slot<A::Msg>, StartError> {
    let (r, _) = Actor::spawn_linked(None, actor.clone(), args(), supervisor.get_cell())
        .await
        .map_err(|e| StartError::Spawn {
            actor: name.to_string(),
            reason: e.to_string(),
        })?;
    let id = r.get_id();
    let slot = Slot::new(r);
    let child = Child {
        name: name.to_string(),
        actor,
        args,
        slot: slot.clone(),
    };
    // Registered by a call (not a cast) so the supervisor knows the child before this returns.
    ractor::call!(supervisor, |reply| SupervisorMsg::Adopt(
        id,
        Box::new(child),
        reply
    ))
    .map_err(|e| StartError::Register {
        actor: name.to_string(),
        reason: e.to_string(),
    })?;
    Ok(slot)
}

/// An actor could not be started under the supervisor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartError {
    /// Spawning failed (its `pre_start` returned an error).
    #[error("starting {actor}: {reason}")]
    Spawn { actor: String, reason: String },
    /// The supervisor did not take it (the supervisor is gone).
    #[error("registering {actor} with the supervisor: {reason}")]
    Register { actor: String, reason: String },
}

/// Messages of the supervisor.
pub enum SupervisorMsg {
    /// Take responsibility for a started child; replies once registered.
    Adopt(ActorId, Box<dyn Respawn>, ractor::RpcReplyPort<()>),
    /// How many restarts happened so far.
    Restarts(ractor::RpcReplyPort<u64>),
    /// The children that reached their restart limit and stay down, with their last failure.
    GaveUp(ractor::RpcReplyPort<Vec<GaveUp>>),
    /// A failed child's backoff is over: start it again (sent by the supervisor to itself, so
    /// that a backoff never blocks its mailbox). The count is its failures so far; the text
    /// its last failure.
    Restart(Box<dyn Respawn>, u32, String),
}

/// A child the supervisor stopped restarting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GaveUp {
    /// The child's name (`learner`, `policy-3`, a user's actor).
    pub actor: String,
    /// Failures it had (restarts + the last one).
    pub failures: u32,
    /// The last failure's reason.
    pub reason: String,
}

/// The longest wait before a restart.
pub const MAX_BACKOFF: std::time::Duration = std::time::Duration::from_secs(10);

/// Restart limits.
#[derive(Debug, Clone, Copy)]
pub struct SupervisorArgs {
    /// Restarts allowed per child; past it the child stays down and calls to it fail.
    pub max_restarts: u32,
    /// Wait before a child's first restart; doubled for each further failure of that child,
    /// at most [`MAX_BACKOFF`].
    pub restart_backoff: std::time::Duration,
}

/// The children and their restart counts.
pub struct SupervisorState {
    children: HashMap<ActorId, (Box<dyn Respawn>, u32)>,
    restarts: u64,
    max_restarts: u32,
    restart_backoff: std::time::Duration,
    gave_up: Vec<GaveUp>,
}

/// The supervisor actor.
#[derive(Debug, Clone, Copy, Default)]
pub struct Supervisor;

impl Actor for Supervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = SupervisorArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: SupervisorArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(SupervisorState {
            children: HashMap::new(),
            restarts: 0,
            max_restarts: args.max_restarts,
            restart_backoff: args.restart_backoff,
            gave_up: Vec::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::Adopt(id, child, reply) => {
                state.children.insert(id, (child, 0));
                let _ = reply.send(());
            }
            SupervisorMsg::Restarts(reply) => {
                let _ = reply.send(state.restarts);
            }
            SupervisorMsg::GaveUp(reply) => {
                let _ = reply.send(state.gave_up.clone());
            }
            SupervisorMsg::Restart(child, failures, reason) => {
                match child.respawn(myself.get_cell()).await {
                    Ok(id) => {
                        state.restarts += 1;
                        tracing::warn!(actor = child.name(), "actor restarted");
                        state.children.insert(id, (child, failures));
                    }
                    Err(e) => {
                        // It stays down: named like a child past its limit.
                        tracing::error!(actor = child.name(), error = %e, "restart failed");
                        child.give_up();
                        state.gave_up.push(GaveUp {
                            actor: child.name().to_string(),
                            failures,
                            reason: format!("{reason}; restarting it failed: {e}"),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, reason) = match event {
            SupervisionEvent::ActorFailed(cell, err) => (cell, err.to_string()),
            // A clean stop is a shutdown, not a failure: forget the child.
            SupervisionEvent::ActorTerminated(cell, _, _) => {
                state.children.remove(&cell.get_id());
                return Ok(());
            }
            _ => return Ok(()),
        };
        let Some((child, count)) = state.children.remove(&cell.get_id()) else {
            return Ok(());
        };
        tracing::error!(actor = child.name(), %reason, restarts = count, "actor failed");
        metrics::counter!("actor_restarts", "actor" => child.name().to_string()).increment(1);
        if count >= state.max_restarts {
            tracing::error!(
                actor = child.name(),
                "restart limit reached; not restarting"
            );
            child.give_up();
            state.gave_up.push(GaveUp {
                actor: child.name().to_string(),
                failures: count + 1,
                reason,
            });
            return Ok(());
        }
        // Backoff: a child that fails at once again does not spin. Requests meanwhile wait
        // for the replacement (`Slot::ask`). The wait runs outside the mailbox, so other
        // children's failures and queries are handled meanwhile.
        let backoff = state
            .restart_backoff
            .saturating_mul(1u32 << count.min(16))
            .min(MAX_BACKOFF);
        tokio::spawn(async move {
            tokio::time::sleep(backoff).await;
            let _ = myself.cast(SupervisorMsg::Restart(child, count + 1, reason));
        });
        Ok(())
    }
}
