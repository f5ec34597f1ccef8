//! The Engine actor: the mailbox every actor sends generation and scoring requests to.
//!
//! It forwards each request to the model thread ([`WorkerHandle`]) and lets the reply travel
//! straight back to the caller, so its mailbox never waits on tensor work; concurrent requests
//! from all Policy workers (both roles) meet in the model thread's continuous batch.

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::kernels::{GenerationRequest, ScoreRow};
use crate::worker::{Generated, Job, JobResult, WorkerHandle};

/// Messages of the Engine actor.
pub enum EngineMsg {
    /// Generate one completion (exact ids, log-probs, policy version).
    Generate(GenerationRequest, RpcReplyPort<JobResult<Generated>>),
    /// Log-probs of completions given prompts, no gradients: one vector per row.
    Score(Vec<ScoreRow>, RpcReplyPort<JobResult<Vec<Vec<f32>>>>),
}

/// The Engine actor; its argument is the model thread's handle.
#[derive(Debug, Clone, Copy, Default)]
pub struct EngineActor;

impl Actor for EngineActor {
    type Msg = EngineMsg;
    type State = WorkerHandle;
    type Arguments = WorkerHandle;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        worker: WorkerHandle,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(worker)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        worker: &mut WorkerHandle,
    ) -> Result<(), ActorProcessingErr> {
        let worker = worker.clone();
        match msg {
            EngineMsg::Generate(request, reply) => {
                tokio::spawn(async move {
                    let out = worker.generate(request).await;
                    let _ = reply.send(out);
                });
            }
            EngineMsg::Score(rows, reply) => {
                tokio::spawn(async move {
                    let out = worker.request(|tx| Job::Score(rows, tx)).await;
                    let _ = reply.send(out);
                });
            }
        }
        Ok(())
    }
}
