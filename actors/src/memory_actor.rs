//! The Memory actor: the one owner of the sled store (tasks, seeds, trajectories, rehearsal
//! memories, run state, checkpoints).

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::storage::{
    Checkpoint, Prefix, RehearsalMemory, RunId, RunState, SampleKey, SeedTrajectory, Store, Task,
    TaskId, Trajectory, WriteSet,
};

/// What a Memory request returns: the store's own error ([`crate::storage::Error`]: a locked,
/// corrupt or full database, a record that does not decode), for callers to match on.
pub type StoreResult<T> = Result<T, crate::storage::Error>;

/// Messages of the Memory actor.
pub enum MemoryMsg {
    PutTasks(Vec<Task>, RpcReplyPort<StoreResult<()>>),
    PutSeeds(Vec<SeedTrajectory>, RpcReplyPort<StoreResult<()>>),
    /// Every stored seed.
    Seeds(RpcReplyPort<StoreResult<Vec<SeedTrajectory>>>),
    /// A step's trajectories, its checkpoint record and the run state, in one atomic write.
    CommitStep {
        trajectories: Vec<Trajectory>,
        checkpoint: Option<Checkpoint>,
        state: RunState,
        reply: RpcReplyPort<StoreResult<()>>,
    },
    PutTrajectories(Vec<Trajectory>, RpcReplyPort<StoreResult<()>>),
    RunState(RunId, RpcReplyPort<StoreResult<Option<RunState>>>),
    /// A run's checkpoints, oldest first.
    Checkpoints(RunId, RpcReplyPort<StoreResult<Vec<Checkpoint>>>),
    PutMemory(Box<RehearsalMemory>, RpcReplyPort<StoreResult<()>>),
    /// The stored rehearsal memory of (run, step 0, task, sample 0), if any.
    GetMemory(
        RunId,
        TaskId,
        RpcReplyPort<StoreResult<Option<RehearsalMemory>>>,
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
        match msg {
            MemoryMsg::PutTasks(tasks, reply) => {
                let _ = reply.send(store.put_many(&tasks).map(drop));
            }
            MemoryMsg::PutSeeds(seeds, reply) => {
                let _ = reply.send(store.put_many(&seeds).map(drop));
            }
            MemoryMsg::Seeds(reply) => {
                let out = store
                    .scan::<SeedTrajectory>(&Prefix::all())
                    .map(|r| r.map(|(_, v)| v))
                    .collect::<Result<Vec<_>, _>>();
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
                let _ = reply.send(out);
            }
            MemoryMsg::PutTrajectories(ts, reply) => {
                let _ = reply.send(store.put_many(&ts).map(drop));
            }
            MemoryMsg::RunState(run, reply) => {
                let _ = reply.send(store.get::<RunState>(&run));
            }
            MemoryMsg::Checkpoints(run, reply) => {
                let out = store
                    .scan::<Checkpoint>(&crate::storage::CheckpointKey::run_prefix(&run))
                    .map(|r| r.map(|(_, v)| v))
                    .collect::<Result<Vec<_>, _>>();
                let _ = reply.send(out);
            }
            MemoryMsg::PutMemory(m, reply) => {
                let _ = reply.send(store.put(&*m).map(drop));
            }
            MemoryMsg::GetMemory(run, task, reply) => {
                let key = SampleKey {
                    run,
                    step: 0,
                    task,
                    sample: 0,
                };
                let _ = reply.send(store.get::<RehearsalMemory>(&key));
            }
        }
        Ok(())
    }
}
