//! The Memory actor: the one owner of the sled store (tasks, seeds, trajectories, rehearsal
//! memories, run state, checkpoints).

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::storage::{
    Checkpoint, Prefix, RehearsalMemory, RunId, RunState, SampleKey, SeedTrajectory, Store, Task,
    TaskId, Trajectory, WriteSet,
};

/// Messages of the Memory actor. Replies carry storage errors as text.
pub enum MemoryMsg {
    PutTasks(Vec<Task>, RpcReplyPort<Result<(), String>>),
    PutSeeds(Vec<SeedTrajectory>, RpcReplyPort<Result<(), String>>),
    /// Every stored seed.
    Seeds(RpcReplyPort<Result<Vec<SeedTrajectory>, String>>),
    /// A step's trajectories, its checkpoint record and the run state, in one atomic write.
    CommitStep {
        trajectories: Vec<Trajectory>,
        checkpoint: Option<Checkpoint>,
        state: RunState,
        reply: RpcReplyPort<Result<(), String>>,
    },
    PutTrajectories(Vec<Trajectory>, RpcReplyPort<Result<(), String>>),
    RunState(RunId, RpcReplyPort<Result<Option<RunState>, String>>),
    /// A run's checkpoints, oldest first.
    Checkpoints(RunId, RpcReplyPort<Result<Vec<Checkpoint>, String>>),
    PutMemory(Box<RehearsalMemory>, RpcReplyPort<Result<(), String>>),
    /// The stored rehearsal memory of (run, step 0, task, sample 0), if any.
    GetMemory(
        RunId,
        TaskId,
        RpcReplyPort<Result<Option<RehearsalMemory>, String>>,
    ),
}

/// The Memory actor; its argument is the open store.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryActor;

impl Actor for MemoryActor {
    type Msg = MemoryMsg;
    type State = Arc<Store>;
    type Arguments = Arc<Store>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        store: Arc<Store>,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(store)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        store: &mut Arc<Store>,
    ) -> Result<(), ActorProcessingErr> {
        let text = |e: crate::storage::Error| e.to_string();
        match msg {
            MemoryMsg::PutTasks(tasks, reply) => {
                let _ = reply.send(store.put_many(&tasks).map(drop).map_err(text));
            }
            MemoryMsg::PutSeeds(seeds, reply) => {
                let _ = reply.send(store.put_many(&seeds).map(drop).map_err(text));
            }
            MemoryMsg::Seeds(reply) => {
                let out = store
                    .scan::<SeedTrajectory>(&Prefix::all())
                    .map(|r| r.map(|(_, v)| v))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(text);
                let _ = reply.send(out);
            }
            MemoryMsg::CommitStep {
                trajectories,
                checkpoint,
                state,
                reply,
            } => {
                let out = (|| {
                    let mut w = WriteSet::new();
                    for t in &trajectories {
                        w.put(t)?;
                    }
                    if let Some(c) = &checkpoint {
                        w.put(c)?;
                    }
                    w.put(&state)?;
                    store.commit(w)
                })();
                let _ = reply.send(out.map_err(text));
            }
            MemoryMsg::PutTrajectories(ts, reply) => {
                let _ = reply.send(store.put_many(&ts).map(drop).map_err(text));
            }
            MemoryMsg::RunState(run, reply) => {
                let _ = reply.send(store.get::<RunState>(&run).map_err(text));
            }
            MemoryMsg::Checkpoints(run, reply) => {
                let out = store
                    .scan::<Checkpoint>(&crate::storage::CheckpointKey::run_prefix(&run))
                    .map(|r| r.map(|(_, v)| v))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(text);
                let _ = reply.send(out);
            }
            MemoryMsg::PutMemory(m, reply) => {
                let _ = reply.send(store.put(&*m).map(drop).map_err(text));
            }
            MemoryMsg::GetMemory(run, task, reply) => {
                let key = SampleKey {
                    run,
                    step: 0,
                    task,
                    sample: 0,
                };
                let _ = reply.send(store.get::<RehearsalMemory>(&key).map_err(text));
            }
        }
        Ok(())
    }
}
