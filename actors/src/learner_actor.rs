//! The Learner actor: turns a step's judged trajectories into a [`Batch`] of role-wise GRPO
//! rows ([`grpo_batch`]) and has the model thread take one optimizer [`Step`] on the shared
//! weights (no copy); also runs supervised warm-up steps and saves and loads the weights and
//! the optimizer state, so every change of the weights goes through this actor.

use std::collections::BTreeMap;
use std::path::PathBuf;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};

use crate::kernels::{
    role_wise_advantages, GrpoConfig, Learner, LearnerConfig, RowMeta, ScoreRow, SftStats,
    StepStats, TrainRow,
};
use crate::storage::{PolicyVersion, Role, TaskId, Trajectory};
use crate::worker::{Job, JobResult, WorkerError, WorkerHandle};

/// Mean and standard deviation (population) of a role's advantages, with its row count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct RoleStats {
    /// Rows of the role in the step.
    pub rows: u64,
    /// Mean trajectory reward over the role's rows.
    pub reward_mean: f64,
    /// Mean advantage over the role's rows.
    pub adv_mean: f64,
    /// Standard deviation (population) of the role's advantages.
    pub adv_std: f64,
}

/// One step's training rows with their bookkeeping: what [`grpo_batch`] makes of a step's
/// trajectories and the model thread trains on.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// Rows to train, in trajectory order, then row order.
    pub rows: Vec<TrainRow>,
    /// Per trajectory, per row: the advantage it trains with (same shape as the trajectories'
    /// `rows`; rows that cannot be trained, with no completion tokens, get `None`).
    pub advantages: Vec<Vec<Option<f32>>>,
    /// Statistics per role (`act`, `rehearse`).
    pub per_role: BTreeMap<Role, RoleStats>,
    /// Rows skipped because they had no completion tokens.
    pub skipped_rows: u64,
}

/// Builds the GRPO rows of a step (DESIGN.md §1): every row of trajectory i carries R_i (or the
/// empty-row reward when its completion is only end tokens in `stop_ids`); advantages are
/// role-wise over the rows of the same task and role; the learner trains on the exact sampled
/// ids against their sampling log-probs. Prompt positions are never trained.
pub fn grpo_batch(trajectories: &[Trajectory], cfg: &GrpoConfig, stop_ids: &[u32]) -> Batch {
    let mut metas: Vec<RowMeta<&TaskId, Role>> = Vec::new();
    let mut index = Vec::new();
    for (t, traj) in trajectories.iter().enumerate() {
        for (r, row) in traj.rows.iter().enumerate() {
            if row.completion_ids.is_empty() {
                continue;
            }
            metas.push(RowMeta {
                task: &traj.task,
                role: row.role,
                reward: traj.reward,
                empty: row.completion_ids.iter().all(|id| stop_ids.contains(id)),
            });
            index.push((t, r));
        }
    }
    let adv = role_wise_advantages(&metas, cfg);
    let mut advantages: Vec<Vec<Option<f32>>> = trajectories
        .iter()
        .map(|t| vec![None; t.rows.len()])
        .collect();
    let mut rows = Vec::with_capacity(adv.len());
    let mut sums: BTreeMap<Role, (u64, f64, f64, f64)> = BTreeMap::new();
    for ((meta, &(t, r)), &a) in metas.iter().zip(&index).zip(&adv) {
        let row = &trajectories[t].rows[r];
        advantages[t][r] = Some(a);
        rows.push(TrainRow {
            prompt_ids: row.prompt_ids.clone(),
            completion_ids: row.completion_ids.clone(),
            old_logprobs: row.logprobs.clone(),
            advantage: a,
        });
        let s = sums.entry(meta.role).or_default();
        s.0 += 1;
        s.1 += f64::from(meta.reward);
        s.2 += f64::from(a);
        s.3 += f64::from(a) * f64::from(a);
    }
    let per_role = sums
        .into_iter()
        .map(|(role, (n, r, a, aa))| {
            let n_f = n as f64;
            let mean = a / n_f;
            (
                role,
                RoleStats {
                    rows: n,
                    reward_mean: r / n_f,
                    adv_mean: mean,
                    adv_std: (aa / n_f - mean * mean).max(0.0).sqrt(),
                },
            )
        })
        .collect();
    let skipped_rows = trajectories
        .iter()
        .flat_map(|t| &t.rows)
        .filter(|r| r.completion_ids.is_empty())
        .count() as u64;
    Batch {
        rows,
        advantages,
        per_role,
        skipped_rows,
    }
}

/// One role-wise GRPO step on the model thread, with the settings of its `learner`
/// ([`grpo_batch`] with `learner.config().grpo`, then [`Learner::step`]); `before_step` runs
/// just before the optimizer step (the model thread frees its KV cache there). A step whose
/// advantages are all 0 takes no optimizer step and returns `skipped: true`; the caller
/// sets `policy_version`.
///
/// # Errors
/// [`WorkerError::Kernel`] with [`crate::kernels::Error::InvalidRequest`] when no row has
/// completion tokens, or the learner's own error.
pub(crate) fn grpo_step(
    learner: &mut Learner<'_>,
    trajectories: &[Trajectory],
    stop_ids: &[u32],
    before_step: impl FnOnce(),
) -> JobResult<Step> {
    let Batch {
        rows,
        advantages,
        per_role,
        skipped_rows,
    } = grpo_batch(trajectories, &learner.config().grpo, stop_ids);
    if rows.is_empty() {
        return Err(WorkerError::Kernel(crate::kernels::Error::InvalidRequest(
            "no trainable rows in the step".into(),
        )));
    }
    let skipped = rows.iter().all(|r| r.advantage == 0.0);
    let stats = if skipped {
        StepStats::default()
    } else {
        before_step();
        learner.step(&rows)?
    };
    Ok(Step {
        stats,
        per_role,
        advantages,
        skipped_rows,
        skipped,
        policy_version: PolicyVersion::default(),
    })
}

/// What one GRPO step did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// The optimizer step's numbers (loss, grad norm, clip fraction, KL, tokens, seconds).
    pub stats: StepStats,
    /// Reward and advantage statistics per role.
    pub per_role: BTreeMap<Role, RoleStats>,
    /// Per trajectory, per row: the advantage trained with.
    pub advantages: Vec<Vec<Option<f32>>>,
    /// Rows without completion tokens (not trained).
    pub skipped_rows: u64,
    /// True when every advantage was 0 (all groups had equal rewards): no optimizer step was
    /// taken, since it could only have changed the weights through the KL term or weight
    /// decay, never towards a higher reward; `stats` are zeros and the version is unchanged.
    pub skipped: bool,
    /// The policy version after the step.
    pub policy_version: PolicyVersion,
}

/// Messages of the Learner actor: every change of the shared weights and optimizer goes
/// through it (the model thread runs it).
pub enum LearnerMsg {
    /// (Re)build the optimizer (fresh AdamW state) with this configuration.
    Configure(Box<LearnerConfig>, RpcReplyPort<JobResult<()>>),
    /// One role-wise GRPO step on a step's trajectories (all K samples of each task).
    GrpoStep(Vec<Trajectory>, RpcReplyPort<JobResult<Step>>),
    /// One supervised warm-up step.
    SftStep(Vec<ScoreRow>, RpcReplyPort<JobResult<SftStats>>),
    /// Write the shared weights to a safetensors file, durably and atomically.
    SaveWeights(PathBuf, RpcReplyPort<JobResult<()>>),
    /// Replace the shared weights with a saved file and set the policy version.
    LoadWeights(PathBuf, PolicyVersion, RpcReplyPort<JobResult<()>>),
    /// Write the optimizer state (AdamW moments, f32 masters, step counts) to a file.
    SaveState(PathBuf, RpcReplyPort<JobResult<()>>),
    /// Restore an optimizer state written by `SaveState`, after the weights it belongs to.
    LoadState(PathBuf, RpcReplyPort<JobResult<()>>),
}

/// Arguments of the Learner actor.
#[derive(Debug, Clone)]
pub struct LearnerArgs {
    /// The model thread whose weights the steps update.
    pub worker: WorkerHandle,
    /// Ids that end a turn: a row whose completion is only these is an empty row.
    pub stop_ids: Vec<u32>,
}

impl LearnerArgs {
    /// Arguments for a learner over `worker`'s weights. The learner settings (advantages,
    /// loss, optimizer) have one owner, the model thread's learner: `Configure` sets them
    /// there, and each step reads them there.
    pub fn new(worker: WorkerHandle, stop_ids: Vec<u32>) -> Self {
        Self { worker, stop_ids }
    }
}

/// The Learner actor's state: its arguments.
pub struct LearnerState {
    args: LearnerArgs,
}

/// The Learner actor.
#[derive(Debug, Clone, Copy, Default)]
pub struct LearnerActor;

/// Sends the job `make` builds to the model thread and its result to `reply`, on a task of its
/// own.
fn forward<T: Send + 'static>(
    worker: WorkerHandle,
    reply: RpcReplyPort<JobResult<T>>,
    make: impl FnOnce(tokio::sync::oneshot::Sender<JobResult<T>>) -> Job + Send + 'static,
) {
    tokio::spawn(async move {
        let _ = reply.send(worker.request(make).await);
    });
}

impl Actor for LearnerActor {
    type Msg = LearnerMsg;
    type State = LearnerState;
    type Arguments = LearnerArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: LearnerArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(LearnerState { args })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut LearnerState,
    ) -> Result<(), ActorProcessingErr> {
        let worker = state.args.worker.clone();
        // Each request runs on its own task, so the actor's mailbox never waits on the model
        // thread; the model thread itself runs jobs one at a time, in arrival order.
        match msg {
            LearnerMsg::Configure(cfg, reply) => {
                forward(worker, reply, move |tx| Job::SetLearner(cfg, tx))
            }
            LearnerMsg::GrpoStep(trajectories, reply) => {
                let stop_ids = state.args.stop_ids.clone();
                forward(worker, reply, |tx| {
                    Job::GrpoStep(trajectories, stop_ids, tx)
                });
            }
            LearnerMsg::SftStep(rows, reply) => {
                forward(worker, reply, move |tx| Job::Sft(rows, tx))
            }
            LearnerMsg::SaveWeights(path, reply) => {
                forward(worker, reply, move |tx| Job::Save(path, tx))
            }
            LearnerMsg::LoadWeights(path, version, reply) => {
                forward(worker, reply, move |tx| Job::Load(path, version, tx));
            }
            LearnerMsg::SaveState(path, reply) => {
                forward(worker, reply, move |tx| Job::SaveLearner(path, tx));
            }
            LearnerMsg::LoadState(path, reply) => {
                forward(worker, reply, move |tx| Job::LoadLearner(path, tx));
            }
        }
        Ok(())
    }
}
