//! Supervised actor references and request/reply helpers.
//!
//! A [`Slot`] holds the current reference of a supervised actor: when the [`crate::Supervisor`]
//! restarts a failed actor it swaps the new reference in, so callers that look it up per request
//! reach the replacement.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{ActorRef, RpcReplyPort};

/// The current reference of a supervised actor.
pub struct Slot<M: ractor::Message> {
    current: Arc<RwLock<ActorRef<M>>>,
    /// Woken when a replacement is swapped in ([`Slot::set`]) or none will come.
    replaced: Arc<tokio::sync::Notify>,
    /// Set when the supervisor stopped restarting the actor ([`Slot::mark_gone`]).
    gone: Arc<std::sync::atomic::AtomicBool>,
    /// Longest wait for a reply ([`Slot::ask`]); `None`: no limit.
    timeout: Option<Duration>,
}

/// Longest wait of a request for the replacement of a failed actor: the supervisor's longest
/// backoff and a margin for the restart itself.
pub const RESTART_WAIT: Duration = Duration::from_secs(12);

impl<M: ractor::Message> Clone for Slot<M> {
    fn clone(&self) -> Self {
        Self {
            current: self.current.clone(),
            replaced: self.replaced.clone(),
            gone: self.gone.clone(),
            timeout: self.timeout,
        }
    }
}

impl<M: ractor::Message> Slot<M> {
    /// A slot serving `actor`.
    pub fn new(actor: ActorRef<M>) -> Self {
        Self {
            current: Arc::new(RwLock::new(actor)),
            replaced: Arc::default(),
            gone: Arc::default(),
            timeout: None,
        }
    }

    /// This slot with replies awaited at most `timeout` (`None`: no limit); clones made from
    /// the result share the limit. A request past it is an [`ActorCallError::Timeout`], never
    /// a hang (the actor may still finish the work; its late reply is dropped).
    pub fn with_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.timeout = timeout;
        self
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
        self.replaced.notify_waiters();
    }

    /// No replacement will come (the restart limit is reached): requests fail at once
    /// instead of waiting for one.
    pub fn mark_gone(&self) {
        self.gone.store(true, std::sync::atomic::Ordering::SeqCst);
        self.replaced.notify_waiters();
    }

    /// The serving actor, once one is alive: while the current one has stopped (it failed and
    /// the supervisor is restarting it after a backoff), waits for the replacement, at most
    /// [`RESTART_WAIT`]; then the stopped one (the request fails as it would have).
    async fn alive(&self) -> ActorRef<M> {
        let down = |a: &ActorRef<M>| {
            matches!(
                a.get_status(),
                ractor::ActorStatus::Stopping | ractor::ActorStatus::Stopped
            )
        };
        let deadline = tokio::time::Instant::now() + RESTART_WAIT;
        loop {
            // Registered before the check, so a swap between the two is not missed.
            let swapped = self.replaced.notified();
            let actor = self.get();
            let gone = self.gone.load(std::sync::atomic::Ordering::SeqCst);
            if !down(&actor) || gone || tokio::time::Instant::now() >= deadline {
                return actor;
            }
            let _ = tokio::time::timeout_at(deadline, swapped).await;
        }
    }

    /// Sends `make(reply)` to the current actor and awaits the reply; `what` names the actor
    /// in errors (`"judge"`). A request made while the actor is being restarted waits for
    /// the replacement (at most [`RESTART_WAIT`]).
    ///
    /// # Errors
    /// [`ActorCallError`] when the actor is not running, or stopped or failed before replying
    /// (the reply port was dropped), or no reply came within the slot's timeout
    /// ([`Slot::with_timeout`]): the caller decides whether to retry.
    pub async fn ask<T: Send + 'static>(
        &self,
        what: &str,
        make: impl FnOnce(RpcReplyPort<T>) -> M,
    ) -> Result<T, ActorCallError> {
        let actor = self.alive().await;
        let (what, id) = (what.to_string(), actor.get_id().to_string());
        // Requests awaiting a reply, per actor role: the depth of its mailbox as callers see it.
        let depth = metrics::gauge!("actor_requests_in_flight", "actor" => what.clone());
        depth.increment(1.0);
        let reply = actor.call(make, self.timeout).await;
        depth.decrement(1.0);
        match reply {
            Ok(CallResult::Success(v)) => Ok(v),
            Ok(CallResult::Timeout) => Err(ActorCallError::Timeout { what }),
            Ok(CallResult::SenderError) => {
                // The actor died with the request. Return once it has stopped, so that a retry
                // by this caller waits for the replacement rather than reach the dying one.
                let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
                while actor.get_status() != ractor::ActorStatus::Stopped
                    && tokio::time::Instant::now() < deadline
                {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err(ActorCallError::Stopped { what, id })
            }
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
    /// No reply within the slot's timeout ([`Slot::with_timeout`]).
    #[error("{what}: no reply within the request timeout (topology.request_timeout_s)")]
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
