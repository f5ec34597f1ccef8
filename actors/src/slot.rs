//! Supervised actor references and request/reply helpers.
//!
//! A [`Slot`] holds the current reference of a supervised actor: when the [`crate::Supervisor`]
//! restarts a failed actor it swaps the new reference in, so callers that look it up per request
//! reach the replacement.

use std::sync::{Arc, RwLock};

use ractor::rpc::CallResult;
use ractor::{ActorRef, RpcReplyPort};

/// The current reference of a supervised actor.
pub struct Slot<M: ractor::Message> {
    current: Arc<RwLock<ActorRef<M>>>,
}

impl<M: ractor::Message> Clone for Slot<M> {
    fn clone(&self) -> Self {
        Self {
            current: self.current.clone(),
        }
    }
}

impl<M: ractor::Message> Slot<M> {
    /// A slot serving `actor`.
    pub fn new(actor: ActorRef<M>) -> Self {
        Self {
            current: Arc::new(RwLock::new(actor)),
        }
    }

    /// The actor serving this slot now.
    pub fn get(&self) -> ActorRef<M> {
        match self.current.read() {
            Ok(a) => a.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Swaps in a restarted actor.
    pub fn set(&self, actor: ActorRef<M>) {
        match self.current.write() {
            Ok(mut a) => *a = actor,
            Err(poisoned) => *poisoned.into_inner() = actor,
        }
    }

    /// Sends `make(reply)` to the current actor and awaits the reply; `what` names the actor
    /// in errors (`"judge"`).
    ///
    /// # Errors
    /// [`ActorCallError`] when the actor is not running, or stopped or failed before replying
    /// (the reply port was dropped): the caller decides whether to retry.
    pub async fn ask<T: Send + 'static>(
        &self,
        what: &str,
        make: impl FnOnce(RpcReplyPort<T>) -> M,
    ) -> Result<T, ActorCallError> {
        let actor = self.get();
        let (what, id) = (what.to_string(), actor.get_id().to_string());
        match actor.call(make, None).await {
            Ok(CallResult::Success(v)) => Ok(v),
            Ok(CallResult::Timeout) => Err(ActorCallError::Timeout { what }),
            Ok(CallResult::SenderError) => Err(ActorCallError::Stopped { what, id }),
            Err(e) => Err(ActorCallError::Unreachable {
                what,
                id,
                reason: e.to_string(),
            }),
        }
    }
}

/// A request could not be delivered or was never answered (the actor failed or stopped).
/// `what` names the actor's role (`"judge"`), `id` the ractor id of the instance asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ActorCallError {
    /// No reply within the call's timeout.
    #[error("{what}: timed out")]
    Timeout { what: String },
    /// The actor stopped or failed before replying (its reply port was dropped).
    #[error("{what}: actor {id} stopped before replying")]
    Stopped { what: String, id: String },
    /// The request could not be delivered (the actor is not running).
    #[error("{what}: actor {id} is not reachable: {reason}")]
    Unreachable {
        what: String,
        id: String,
        reason: String,
    },
}

/// Round-robin over a pool of equivalent worker slots.
pub struct Pool<M: ractor::Message> {
    slots: Vec<Slot<M>>,
    next: std::sync::atomic::AtomicUsize,
}

impl<M: ractor::Message> Pool<M> {
    /// A pool over `slots` (at least one).
    pub fn new(slots: Vec<Slot<M>>) -> Self {
        Self {
            slots,
            next: Default::default(),
        }
    }

    /// The next worker, round-robin.
    pub fn pick(&self) -> &Slot<M> {
        let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        &self.slots[i % self.slots.len()]
    }

    /// Number of workers.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// True for a pool without workers.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}
