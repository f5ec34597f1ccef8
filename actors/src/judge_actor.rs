//! The Judge actor: hosts one [`Judge`] implementation, chosen by configuration.

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::judge::{Judge, JudgeTask, TurnCalls, Verdict};

/// Messages of the Judge actor.
pub enum JudgeMsg {
    /// Score a (possibly partial) transcript: one entry per user turn reached.
    Judge(Arc<JudgeTask>, Vec<TurnCalls>, RpcReplyPort<Verdict>),
}

/// The Judge actor; its argument is the judge it hosts.
#[derive(Debug, Clone, Copy, Default)]
pub struct JudgeActor;

impl Actor for JudgeActor {
    type Msg = JudgeMsg;
    type State = Arc<dyn Judge>;
    type Arguments = Arc<dyn Judge>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        judge: Arc<dyn Judge>,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(judge)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        judge: &mut Arc<dyn Judge>,
    ) -> Result<(), ActorProcessingErr> {
        let JudgeMsg::Judge(task, transcript, reply) = msg;
        // A judge that panics fails this actor; the supervisor restarts it and the caller's
        // dropped reply becomes a retry.
        let verdict = judge.judge(&task, &transcript);
        let _ = reply.send(verdict);
        Ok(())
    }
}
