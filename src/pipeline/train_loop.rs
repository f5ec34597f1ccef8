//! The training loop around [`Pipeline::train_step`]: resume, budgets, periodic evaluation,
//! checkpoints with retention, the run's control history, a graceful stop.
//!
//! * **Resume.** The run state committed in sled names the step and data cursor; the newest
//!   committed checkpoint at that step is loaded (weights, then AdamW moments, f32 masters and
//!   step counts). A checkpoint that is missing or does not load (truncated, corrupt) is
//!   reported and the one before it is used, with the data cursor it recorded: the steps after
//!   it are played again, and give the same trajectories (sampling seeds derive from the
//!   config's seed, the step, the task's draw index and the sample).
//! * **Commits.** A step's trajectories are committed with the next checkpoint, in one atomic
//!   sled write with the checkpoint record and the run state: after a SIGKILL nothing
//!   acknowledged is lost, and a step played again overwrites its own records (same keys), so
//!   nothing is stored twice. The report is saved after each commit, never ahead of the
//!   database.
//! * **Retention.** The last `keep_last` checkpoints and (with `keep_best`) the one with the
//!   best periodic evaluation are kept; other training checkpoint files are removed.
//! * **Control.** At every step boundary the run's history ([`super::control`]) may swap the
//!   judge or add task batches; a stop request (a signal, `ctl stop`) or the end of the budget
//!   ends the loop after the step in flight, with a checkpoint.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};

use super::control::{Control, RunStatus};
use super::train::{learner_state_path, short, StepContext, StepResult};
use super::{progress, secs, Pipeline, TRAIN_RUN};
use crate::actors::learner_actor::LearnerMsg;
use crate::actors::memory_actor::MemoryMsg;
use crate::actors::protocol::SeedPool;
use crate::actors::task::{EpisodeTask, Split};
use crate::kernels::fault::crash_point;
use crate::registry::JudgeContext;
use crate::report::{StageReport, StepMetrics};
use crate::storage::{Checkpoint, PolicyVersion, RunId, RunState, SeedTrajectory, Trajectory};

/// Key of the policy version in a training checkpoint's metrics.
pub(super) const POLICY_VERSION_KEY: &str = "policy_version";
/// Key of the data cursor (position in the train pool after the checkpoint's step).
const CURSOR_KEY: &str = "data_cursor";
/// Key of the periodic evaluation's checklist score at the checkpoint's step, when one ran.
pub const EVAL_SCORE_KEY: &str = "eval_score";

/// When checkpoints are written and how many are kept.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CheckpointPolicy {
    /// After every this many steps (at least 1).
    pub every_steps: u64,
    /// … and when this long passed since the last one.
    pub every: Option<Duration>,
    /// The last this many are kept (at least 1).
    pub keep_last: usize,
    /// The checkpoint with the best periodic evaluation is kept too (and a checkpoint is
    /// written after every periodic evaluation, so that the best one exists).
    pub keep_best: bool,
}

impl CheckpointPolicy {
    /// After every step, only the last kept (`envace train`).
    pub const EVERY_STEP: Self = Self {
        every_steps: 1,
        every: None,
        keep_last: 1,
        keep_best: false,
    };

    /// The `[daemon]` section's policy.
    pub fn daemon(cfg: &crate::config::DaemonConfig) -> Self {
        Self {
            every_steps: cfg.checkpoint_every_steps.max(1),
            every: cfg.checkpoint_interval(),
            keep_last: cfg.keep_last.max(1),
            keep_best: cfg.keep_best,
        }
    }
}

/// How [`Pipeline::train_loop`] runs.
pub struct LoopOptions {
    /// Stop once this many steps are done (`None`: no step budget).
    pub until_step: Option<u64>,
    /// Stop at the first step boundary after this instant.
    pub deadline: Option<Instant>,
    pub checkpoints: CheckpointPolicy,
    /// Set by a signal or `ctl stop`: the step in flight finishes, a checkpoint is written and
    /// the loop returns.
    pub stop: Arc<AtomicBool>,
    /// The run's control (shared with the ctl server); `None`: one is opened for the loop.
    pub control: Option<Arc<Control>>,
    /// One line of progress per step on stderr (the daemon) instead of a progress bar.
    pub live_line: bool,
    /// When the process started: the first step reports how long the start (model load,
    /// resume) took.
    pub started: Option<Instant>,
}

impl LoopOptions {
    /// `envace train`: to `steps` steps, a checkpoint after each, a progress bar.
    pub fn batch(steps: u64) -> Self {
        Self {
            until_step: Some(steps),
            deadline: None,
            checkpoints: CheckpointPolicy::EVERY_STEP,
            stop: Arc::default(),
            control: None,
            live_line: false,
            started: None,
        }
    }
}

/// Why the loop ended, and its numbers.
#[derive(Debug, Clone)]
pub struct LoopOutcome {
    pub stage: StageReport,
    /// Steps done when it ended (all committed).
    pub steps: u64,
    pub reason: EndReason,
}

/// Why a training loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    /// The step budget is spent.
    Steps,
    /// The time budget is spent.
    Deadline,
    /// A stop was asked for (signal, `ctl stop`).
    Stopped,
}

/// The resumed position: the first step to play, the cursor, and the checkpoint loaded.
struct Resumed {
    first_step: u64,
    cursor: usize,
    checkpoint: Option<PathBuf>,
    resumed: bool,
}

impl Pipeline {
    /// Self-rehearsal role-wise GRPO in a loop ([`super::train_loop`]): resumes after the last
    /// committed step, plays steps until the budget is spent or a stop is asked for, evaluates
    /// every `train.eval_every` steps, and checkpoints by `options.checkpoints`. `init` is a
    /// checkpoint to start from when the run has no step yet.
    ///
    /// # Errors
    /// No seeds; the database lost committed steps; the run was trained with another config
    /// (unless allowed); no checkpoint of the run loads; an actor or learner failure or
    /// timeout; a real environment call (a bug); an actor past its restart limit (after a
    /// checkpoint of the steps done, the error names the actor).
    pub async fn train_loop(
        &mut self,
        init: Option<PathBuf>,
        options: LoopOptions,
    ) -> Result<LoopOutcome> {
        let start = Instant::now();
        let run = RunId::from(TRAIN_RUN);
        let position = self.resume(&run, init).await?;
        let control = match &options.control {
            Some(c) => c.clone(),
            None => self.open_control()?,
        };
        // Until the loop starts, the committed steps are the resumed ones (an early error
        // keeps the report's steps up to there).
        control.update(|s| {
            s.steps_done = position.first_step;
            s.committed_steps = position.first_step;
        });
        let outcome = self
            .run_loop(&run, position, &options, &control, start)
            .await;
        if outcome.is_err() {
            // Steps after the last commit are played again on resume: the report must not
            // hold them (it is saved by the caller after an error too).
            let committed = control.status().committed_steps;
            self.report.train.steps.retain(|s| s.step < committed);
            self.report.train.evals.retain(|e| e.step <= committed);
        }
        outcome
    }

    /// Finds where the run stands and loads its weights and optimizer state.
    async fn resume(&mut self, run: &RunId, init: Option<PathBuf>) -> Result<Resumed> {
        let state = self
            .memory()
            .ask("memory", |r| MemoryMsg::RunState(run.clone(), r))
            .await??;
        // The report is saved after each commit, so it never runs ahead of the database: if
        // it does, the database lost committed steps (damaged or replaced), and going on
        // would silently redo them.
        let committed = state.as_ref().map_or(0, |s| s.step);
        let reported = self
            .report
            .train
            .steps
            .iter()
            .map(|s| s.step + 1)
            .max()
            .unwrap_or(0);
        if reported > committed {
            bail!(
                "run {TRAIN_RUN} in {}: its report.json has {reported} training step(s) but the \
                 database only {committed} committed: the database lost records (damaged or \
                 replaced). Nothing was changed; restore db/ from a copy, inspect it with \
                 `envace inspect --db {}` (which never modifies it), or start over with --fresh",
                self.dir.display(),
                self.dir.join("db").display()
            );
        }
        let Some(state) = state else {
            if let Some(path) = init {
                self.load_weights(path, PolicyVersion(0)).await?;
            }
            self.report.train.steps.clear();
            self.report.train.evals.clear();
            self.report.train.judges.clear();
            self.sweep_checkpoints(&BTreeSet::new());
            return Ok(Resumed {
                first_step: 0,
                cursor: 0,
                checkpoint: None,
                resumed: false,
            });
        };
        if !state.config_hash.is_empty()
            && state.config_hash != self.config_hash
            && !self.allow_config_change
        {
            bail!(
                "run {TRAIN_RUN} in {} was trained with another config (hash {} in its run \
                 state, {} now) although config.toml matches: pass --allow-config-change to go \
                 on, or --fresh to start over",
                self.dir.display(),
                short(&state.config_hash),
                short(&self.config_hash)
            );
        }
        let mut records = self
            .memory()
            .ask("memory", |r| MemoryMsg::Checkpoints(run.clone(), r))
            .await??;
        records.retain(|c| c.step <= state.step);
        records.sort_by_key(|c| std::cmp::Reverse(c.step));
        if records.first().is_none_or(|c| c.step != state.step) {
            bail!(
                "run {TRAIN_RUN}: the run state is at step {} but the last checkpoint record at {}",
                state.step,
                records
                    .first()
                    .map_or_else(|| "none".to_string(), |c| c.step.to_string())
            );
        }
        let mut problems = Vec::new();
        let mut failed_files: BTreeSet<PathBuf> = BTreeSet::new();
        for (i, record) in records.iter().enumerate() {
            let file = self.checkpoint_file(record);
            // Records of skipped steps share their file: a file that failed fails for all.
            if failed_files.contains(&file) {
                continue;
            }
            let cursor = if i == 0 {
                Some(state.data_cursor)
            } else {
                record.metrics.get(CURSOR_KEY).map(|c| *c as u64)
            };
            let Some(cursor) = cursor else {
                problems.push(format!(
                    "step {}: the record has no data cursor (an older envace)",
                    record.step
                ));
                break;
            };
            match self.load_checkpoint(record, &file).await {
                Ok(version) => {
                    for p in &problems {
                        eprintln!("train: checkpoint skipped: {p}");
                    }
                    if record.step < state.step {
                        eprintln!(
                            "train: resuming from the checkpoint of step {} instead: steps {}..{} \
                             are played again",
                            record.step, record.step, state.step
                        );
                        self.report.train.steps.retain(|s| s.step < record.step);
                        self.report.train.evals.retain(|e| e.step <= record.step);
                    }
                    eprintln!(
                        "train: resuming run {TRAIN_RUN} after step {} (policy version {version})",
                        record.step
                    );
                    // The loaded file is kept whatever the retention says.
                    let mut keep = self.kept_files(&records, &self.cfg_policy());
                    keep.insert(file.clone());
                    self.sweep_checkpoints(&keep);
                    return Ok(Resumed {
                        first_step: record.step,
                        cursor: cursor as usize,
                        checkpoint: Some(file),
                        resumed: true,
                    });
                }
                Err(e) => {
                    problems.push(format!("step {} ({}): {e:#}", record.step, file.display()));
                    failed_files.insert(file);
                }
            }
        }
        problems.truncate(20);
        bail!(
            "run {TRAIN_RUN} in {}: no checkpoint loads:\n  {}\nrestore checkpoints/ from a copy \
             or start over with --fresh",
            self.dir.display(),
            problems.join("\n  ")
        )
    }

    /// The daemon's retention for the sweep at resume (the batch policy keeps one; a daemon's
    /// folder resumed by `train` keeps what the daemon kept until the next checkpoint).
    fn cfg_policy(&self) -> CheckpointPolicy {
        CheckpointPolicy::daemon(&self.cfg.daemon)
    }

    /// Loads a checkpoint's weights and learner state; returns its policy version.
    async fn load_checkpoint(&self, record: &Checkpoint, file: &Path) -> Result<u64> {
        if !file.exists() {
            bail!("the file is missing");
        }
        let version = record
            .metrics
            .get(POLICY_VERSION_KEY)
            .map_or(record.step, |v| *v as u64);
        self.load_weights(file.to_path_buf(), PolicyVersion(version))
            .await?;
        self.configure_learner(self.cfg.train.learner.clone())
            .await?;
        let state = learner_state_path(file);
        if state.exists() {
            let s = state.clone();
            self.topology
                .learner
                .ask("learner", |r| LearnerMsg::LoadState(s, r))
                .await?
                .map_err(|e| anyhow!("restoring the optimizer from {}: {e}", state.display()))?;
        } else {
            eprintln!(
                "train: no optimizer state beside {} (a run of an older envace): the AdamW \
                 moments start afresh",
                file.display()
            );
        }
        Ok(version)
    }

    async fn run_loop(
        &mut self,
        run: &RunId,
        position: Resumed,
        options: &LoopOptions,
        control: &Arc<Control>,
        start: Instant,
    ) -> Result<LoopOutcome> {
        let Resumed {
            first_step,
            mut cursor,
            checkpoint: last_checkpoint,
            resumed,
        } = position;
        let base_seeds = self.memory().ask("memory", MemoryMsg::Seeds).await??;
        if base_seeds.is_empty() {
            bail!(
                "train: no seed trajectories in {}; run `envace collect` first",
                self.dir.display()
            );
        }
        if !resumed {
            self.configure_learner(self.cfg.train.learner.clone())
                .await?;
        }
        let history = control.history();
        // Batches in force before the first step played; later ones join at their step.
        let mut pending = BTreeSet::new();
        for batch in history.task_batches.iter().filter(|b| b.step >= first_step) {
            pending.extend(control.batch_tasks(batch)?.into_iter().map(|t| t.task.id.0));
        }
        let mut seeds: Vec<(Split, SeedTrajectory)> = base_seeds
            .into_iter()
            .filter(|s| !pending.contains(&s.task.0))
            .map(|s| (crate::suite::split_of(self.suite.as_ref(), &s.task), s))
            .collect();
        let mut tasks: Vec<EpisodeTask> = self.suite.tasks(Split::Train).to_vec();
        for batch in history.task_batches.iter().filter(|b| b.step < first_step) {
            self.add_batch(control, batch, &mut tasks, &mut seeds)
                .await?;
        }
        let mut judge = self.cfg.judge.as_str().to_string();
        if let Some(change) = history.judge_at(first_step) {
            if change.step < first_step {
                self.swap_judge(&change.judge).await?;
                judge = change.judge.clone();
            }
        }
        self.report.train.judges = history
            .judges
            .iter()
            .filter(|j| j.step < first_step)
            .cloned()
            .collect();
        let mut ctx = StepContext {
            agents: self.topology.rehearsal_agents(),
            seeds: SeedPool::new(seeds.clone()),
            tasks,
            run: run.clone(),
            stop_ids: self.topology.kit.eos_id().into_iter().collect(),
        };
        let last_eval = self
            .report
            .train
            .evals
            .last()
            .map(|e| (e.step, e.metrics.checklist_score.estimate));
        // A resumed run starts from its checkpoint: its age, size and the last evaluation
        // carry over to the status and the gauges.
        let resumed_from = last_checkpoint.as_ref().filter(|_| resumed).map(|path| {
            let written = std::fs::metadata(path)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs());
            (
                written,
                file_bytes(path) + file_bytes(&learner_state_path(path)),
            )
        });
        if let Some((step, score)) = last_eval.filter(|_| resumed) {
            metrics::gauge!("eval_checklist_score").set(score);
            metrics::gauge!("eval_step").set(step as f64);
        }
        let disk = dir_bytes(&self.dir.join("checkpoints")) + dir_bytes(&self.dir.join("db"));
        metrics::gauge!("run_disk_bytes").set(disk as f64);
        control.start(first_step, first_step);
        control.update(|s| {
            s.disk_bytes = disk;
            if let Some((written, bytes)) = resumed_from {
                s.checkpoint_step = Some(first_step);
                s.checkpoint_unix_s = written;
                s.checkpoint_bytes = bytes;
                s.last_eval = last_eval;
                metrics::gauge!("checkpoint_step").set(first_step as f64);
                metrics::gauge!("checkpoint_bytes").set(bytes as f64);
            }
            s.policy_version = self.topology.worker.policy_version().0;
            s.judge = judge.clone();
            s.train_tasks = ctx.tasks.len();
        });
        if self.cfg.train.eval_every.is_some() && first_step == 0 && !resumed {
            self.periodic_eval(0).await?;
        }
        let policy = options.checkpoints;
        let bar = (!options.live_line).then(|| {
            progress(
                options
                    .until_step
                    .map_or(0, |n| n.saturating_sub(first_step)),
                "train",
            )
        });
        let (mut tokens, mut generated) = (0u64, 0u64);
        let mut pending = Pending {
            trajectories: Vec::new(),
            steps: Vec::new(),
            dirty: false,
            since: Instant::now(),
            checkpoint: last_checkpoint,
        };
        let mut step = first_step;
        let reason = loop {
            let stop = options.stop.load(Ordering::SeqCst);
            let end = if stop {
                Some(EndReason::Stopped)
            } else if options.until_step.is_some_and(|n| step >= n) {
                Some(EndReason::Steps)
            } else if options.deadline.is_some_and(|d| Instant::now() >= d) {
                Some(EndReason::Deadline)
            } else {
                None
            };
            if let Some(reason) = end {
                // A stop that came after the last step's checkpoint decision: its steps too.
                if !pending.steps.is_empty() {
                    self.commit_checkpoint(
                        run,
                        step,
                        cursor,
                        None,
                        &mut pending,
                        &policy,
                        control,
                        options.live_line,
                    )
                    .await?;
                }
                break reason;
            }
            if step == first_step {
                if let Some(t) = options.started {
                    eprintln!(
                        "train: step {} starts {:.1} s after the process started",
                        step + 1,
                        secs(t)
                    );
                }
            }
            let (change, batches) = control.begin_step(step);
            if let Some(change) = change {
                self.swap_judge(&change.judge).await?;
                // Counted where a swap takes effect, not where a resume replays one.
                metrics::counter!("judge_swaps").increment(1);
                ctx.agents.judge = self.topology.judge.clone();
                eprintln!(
                    "train: judge {} in force from step {step} (was {judge})",
                    change.judge
                );
                judge = change.judge.clone();
                self.report.train.judges.push(change);
            }
            if !batches.is_empty() {
                let first_new = ctx.tasks.len();
                for batch in &batches {
                    self.add_batch(control, batch, &mut ctx.tasks, &mut seeds)
                        .await?;
                }
                ctx.seeds = SeedPool::new(seeds.clone());
                // The new tasks are drawn first.
                cursor = first_new;
                eprintln!(
                    "train: {} task(s) added from step {step}; the train pool has {}",
                    ctx.tasks.len() - first_new,
                    ctx.tasks.len()
                );
            }
            control.update(|s| {
                s.judge = judge.clone();
                s.train_tasks = ctx.tasks.len();
            });
            let played = match self.train_step(&ctx, step, cursor).await {
                Ok(played) => played,
                Err(e) => {
                    // An actor past its restart limit: keep the steps played since the last
                    // checkpoint, and name the actor.
                    let gave_up = self.topology.gave_up().await.unwrap_or_default();
                    let Some(actor) = gave_up.first() else {
                        return Err(e);
                    };
                    if !pending.steps.is_empty() {
                        self.commit_checkpoint(
                            run,
                            step,
                            cursor,
                            None,
                            &mut pending,
                            &policy,
                            control,
                            options.live_line,
                        )
                        .await?;
                    }
                    return Err(e.context(gave_up_message(actor, step)));
                }
            };
            let StepResult {
                metrics: m,
                trajectories,
                tasks_drawn,
            } = played;
            crash_point("train-step-played");
            cursor = (cursor + tasks_drawn) % ctx.tasks.len();
            tokens += m.tokens;
            generated += m.generated_tokens;
            pending.dirty |= !m.skipped;
            pending.trajectories.extend(trajectories);
            let done = step + 1;
            let eval_due =
                self.cfg.train.eval_every.is_some_and(|every| {
                    done % every.max(1) == 0 || options.until_step == Some(done)
                });
            let mut eval_score = None;
            if eval_due {
                eval_score = Some(self.periodic_eval(done).await?.1);
            }
            control.end_step(step);
            control.update(|s| status_after_step(s, &m, eval_score.map(|e| (done, e))));
            if options.live_line {
                eprintln!("{}", live_line(&control.status(), &m));
            }
            if let Some(bar) = &bar {
                bar.inc(1);
            }
            pending.steps.push(m);
            let gave_up = self.topology.gave_up().await.unwrap_or_default();
            let stopping = options.stop.load(Ordering::SeqCst)
                || options.until_step.is_some_and(|n| done >= n)
                || options.deadline.is_some_and(|d| Instant::now() >= d)
                || !gave_up.is_empty();
            let due = done % policy.every_steps == 0
                || policy.every.is_some_and(|t| pending.since.elapsed() >= t)
                || (policy.keep_best && eval_score.is_some())
                || stopping;
            if due {
                self.commit_checkpoint(
                    run,
                    done,
                    cursor,
                    eval_score,
                    &mut pending,
                    &policy,
                    control,
                    options.live_line,
                )
                .await?;
            }
            if let Some(actor) = gave_up.first() {
                bail!("{}", gave_up_message(actor, done));
            }
            step = done;
        };
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        let done = step;
        eprintln!(
            "train: {done} steps done, real environment calls during training: 0\n{}",
            self.report.train.summary()
        );
        let previous = self.report.stages.get("train").cloned().unwrap_or_default();
        let carry = |v: f64| if resumed { v } else { 0.0 };
        let stage = StageReport {
            wall_s: secs(start) + carry(previous.wall_s),
            tokens: tokens + if resumed { previous.tokens } else { 0 },
            generated_tokens: generated
                + if resumed {
                    previous.generated_tokens
                } else {
                    0
                },
            real_env_calls: 0,
            items: self.report.train.steps.len() as u64,
        };
        self.record_stage("train", stage.clone());
        Ok(LoopOutcome {
            stage,
            steps: done,
            reason,
        })
    }

    /// Writes a checkpoint after `done` steps: the weights and learner state (unless no step
    /// since the last one updated them), then one sled commit of the pending trajectories, the
    /// checkpoint record and the run state; prunes by `policy`, saves the report.
    #[allow(clippy::too_many_arguments)]
    async fn commit_checkpoint(
        &mut self,
        run: &RunId,
        done: u64,
        cursor: usize,
        eval_score: Option<f64>,
        pending: &mut Pending,
        policy: &CheckpointPolicy,
        control: &Control,
        live_line: bool,
    ) -> Result<()> {
        let write = Instant::now();
        let path = match (&pending.checkpoint, pending.dirty) {
            (Some(previous), false) => previous.clone(),
            _ => self.write_checkpoint_files(done).await?,
        };
        let last = pending.steps.last().cloned().unwrap_or_default();
        let record = Checkpoint {
            run: run.clone(),
            step: done,
            path: super::recorded_path(&path),
            metrics: [
                ("reward_mean".to_string(), last.reward_mean),
                ("loss".to_string(), last.loss),
                (POLICY_VERSION_KEY.to_string(), last.policy_version as f64),
                (CURSOR_KEY.to_string(), cursor as f64),
            ]
            .into_iter()
            .chain(eval_score.map(|s| (EVAL_SCORE_KEY.to_string(), s)))
            .collect(),
        };
        let state = RunState {
            run: run.clone(),
            step: done,
            data_cursor: cursor as u64,
            // Rollout seeds derive from (seed, step, task, sample): no RNG state.
            rng_state: Vec::new(),
            config_hash: self.config_hash.clone(),
        };
        let trajectories = std::mem::take(&mut pending.trajectories);
        self.memory()
            .ask("memory", |r| MemoryMsg::CommitStep {
                trajectories,
                checkpoint: Some(record),
                state,
                reply: r,
            })
            .await??;
        crash_point("train-committed");
        let write_s = secs(write);
        pending.since = Instant::now();
        pending.dirty = false;
        pending.checkpoint = Some(path.clone());
        self.report.train.steps.append(&mut pending.steps);
        self.report.train.real_env_calls = 0;
        let records = self
            .memory()
            .ask("memory", |r| MemoryMsg::Checkpoints(run.clone(), r))
            .await??;
        self.sweep_checkpoints(&self.kept_files(&records, policy));
        let bytes = file_bytes(&path) + file_bytes(&learner_state_path(&path));
        let disk = dir_bytes(&self.dir.join("checkpoints")) + dir_bytes(&self.dir.join("db"));
        control.update(|s| {
            s.committed_steps = done;
            s.checkpoint_step = Some(done);
            s.checkpoint_unix_s = super::control::unix_now();
            s.checkpoint_bytes = bytes;
            s.checkpoint_write_s = write_s;
            s.disk_bytes = disk;
        });
        metrics::gauge!("checkpoint_step").set(done as f64);
        metrics::gauge!("checkpoint_bytes").set(bytes as f64);
        // The daemon's ticker advances it from here.
        metrics::gauge!("checkpoint_age_seconds").set(0.0);
        metrics::gauge!("checkpoint_write_seconds").set(write_s);
        metrics::gauge!("run_disk_bytes").set(disk as f64);
        metrics::counter!("checkpoints_written").increment(1);
        self.save_report()?;
        if live_line {
            eprintln!(
                "train: checkpoint after step {done} ({:.1} MB, written in {write_s:.1} s); run \
                 folder {:.1} MB",
                bytes as f64 / 1e6,
                disk as f64 / 1e6
            );
        }
        Ok(())
    }

    /// Writes the weights and learner state after `done` steps; returns the weights file.
    async fn write_checkpoint_files(&self, done: u64) -> Result<PathBuf> {
        let path = self.checkpoint_path(&format!("{TRAIN_RUN}-step{done}"));
        self.save_weights(path.clone()).await?;
        crash_point("train-weights-saved");
        let state = learner_state_path(&path);
        let s = state.clone();
        self.topology
            .learner
            .ask("learner", |r| LearnerMsg::SaveState(s, r))
            .await?
            .map_err(|e| anyhow!("saving the optimizer to {}: {e}", state.display()))?;
        crash_point("train-state-saved");
        Ok(path)
    }

    /// The checkpoint files `policy` keeps among the committed `records`: the newest
    /// `keep_last` distinct files and the one with the best evaluation score.
    fn kept_files(&self, records: &[Checkpoint], policy: &CheckpointPolicy) -> BTreeSet<PathBuf> {
        let mut by_step: Vec<&Checkpoint> = records.iter().collect();
        by_step.sort_by_key(|c| std::cmp::Reverse(c.step));
        let mut keep = BTreeSet::new();
        for c in &by_step {
            if keep.len() >= policy.keep_last {
                break;
            }
            keep.insert(self.checkpoint_file(c));
        }
        if policy.keep_best {
            let best = by_step
                .iter()
                .filter_map(|c| c.metrics.get(EVAL_SCORE_KEY).map(|s| (*s, c)))
                .filter(|(s, _)| s.is_finite())
                // Ties: the later step.
                .max_by(|a, b| a.0.total_cmp(&b.0).then(a.1.step.cmp(&b.1.step)));
            if let Some((_, c)) = best {
                keep.insert(self.checkpoint_file(c));
            }
        }
        keep
    }

    /// Removes from `DIR/checkpoints` what an interrupted save left (`*.tmp*`) and every
    /// training checkpoint file not in `keep` (weights and their learner state). A file that
    /// cannot be removed is logged and left.
    fn sweep_checkpoints(&self, keep: &BTreeSet<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(self.dir.join("checkpoints")) else {
            return;
        };
        for path in entries.filter_map(|e| e.ok().map(|e| e.path())) {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            let kept = keep
                .iter()
                .any(|k| &path == k || path == learner_state_path(k));
            let stale = name.ends_with(".tmp")
                || name.contains(".tmp.")
                || (name.starts_with(&format!("{TRAIN_RUN}-step")) && !kept);
            if stale {
                match std::fs::remove_file(&path) {
                    Ok(()) => tracing::debug!(path = %path.display(), "checkpoint file removed"),
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "checkpoint file kept")
                    }
                }
            }
        }
    }

    /// Replaces the self-rehearsal judge by the registered judge `name`: a new Judge actor
    /// under the supervisor serves `topology.judge`; the old one is stopped.
    ///
    /// # Errors
    /// The name is not registered, or the actor does not start.
    pub async fn swap_judge(&mut self, name: &str) -> Result<()> {
        let judge = crate::registry::installed().judge(
            name,
            &JudgeContext {
                suite: self.suite.as_ref(),
            },
        )?;
        let slot = self
            .topology
            .start_judge(&format!("judge-{name}"), judge)
            .await?;
        let old = std::mem::replace(&mut self.topology.judge, slot);
        old.get().stop(Some("replaced".into()));
        Ok(())
    }

    /// Adds a batch's tasks to the pool and its seeds to the seed list (and to the store,
    /// so later stages see them; the writes are idempotent).
    async fn add_batch(
        &self,
        control: &Control,
        batch: &super::control::TaskBatch,
        tasks: &mut Vec<EpisodeTask>,
        seeds: &mut Vec<(Split, SeedTrajectory)>,
    ) -> Result<()> {
        let added = control.batch_tasks(batch)?;
        let records: Vec<crate::storage::Task> = added
            .iter()
            .map(|a| crate::storage::Task {
                id: a.task.id.clone(),
                category: "added".into(),
                split: Split::Train.name().into(),
                payload_json: serde_json::to_string(&a.task).unwrap_or_default(),
            })
            .collect();
        self.memory()
            .ask("memory", |r| MemoryMsg::PutTasks(records, r))
            .await??;
        let new_seeds: Vec<SeedTrajectory> = added.iter().filter_map(|a| a.seed.clone()).collect();
        if !new_seeds.is_empty() {
            let s = new_seeds.clone();
            self.memory()
                .ask("memory", |r| MemoryMsg::PutSeeds(s, r))
                .await??;
        }
        // A resumed run has them from the store already (read as another split: the suite
        // does not know the ids): one copy each, of the train split.
        seeds.retain(|(_, s)| {
            !new_seeds
                .iter()
                .any(|n| n.task == s.task && n.index == s.index)
        });
        seeds.extend(new_seeds.into_iter().map(|s| (Split::Train, s)));
        for a in added {
            let mut task = a.task;
            task.split = Split::Train;
            tasks.push(task);
        }
        Ok(())
    }
}

/// What was played since the last checkpoint.
struct Pending {
    trajectories: Vec<Trajectory>,
    steps: Vec<StepMetrics>,
    /// Weights changed since the last checkpoint (a run of skipped steps reuses its file).
    dirty: bool,
    /// When the last checkpoint was written (or the loop started).
    since: Instant,
    /// The last checkpoint's weights file.
    checkpoint: Option<PathBuf>,
}

/// The error of a run stopped by an actor past its restart limit.
fn gave_up_message(actor: &crate::actors::supervisor::GaveUp, done: u64) -> String {
    format!(
        "actor {} failed {} times (restart limit topology.max_restarts reached; last: {}); \
         the steps done are checkpointed (step {done}); fix the cause and run the same command \
         to resume",
        actor.actor, actor.failures, actor.reason
    )
}

/// The status after a step.
fn status_after_step(s: &mut RunStatus, m: &StepMetrics, eval: Option<(u64, f64)>) {
    s.policy_version = m.policy_version;
    s.reward_act = m.reward_mean_act;
    s.reward_rehearse = m.reward_mean_rehearse;
    s.groups = m.groups;
    s.informative_groups = m.groups - m.zero_variance_groups;
    s.tokens_per_s = m.tokens_per_s;
    s.skipped = m.skipped;
    if eval.is_some() {
        s.last_eval = eval;
    }
}

/// One line of progress: step, policy version, reward per role, informative groups,
/// tokens/s, the last evaluation and checkpoint.
pub fn live_line(s: &RunStatus, m: &StepMetrics) -> String {
    let eval = s.last_eval.map_or_else(
        || "-".to_string(),
        |(step, score)| format!("{:.1} % @{step}", 100.0 * score),
    );
    let ckpt = s
        .checkpoint_step
        .map_or_else(|| "-".to_string(), |c| format!("@{c}"));
    format!(
        "step {:>5} | v{:<5} | reward act {:.3} rehearse {:.3} | informative {}/{}{} | {:>6.0} tok/s | {:.1} s | eval {eval} | ckpt {ckpt} | judge {}",
        m.step + 1,
        s.policy_version,
        m.reward_mean_act,
        m.reward_mean_rehearse,
        s.informative_groups,
        s.groups,
        if m.skipped { " (skipped)" } else { "" },
        m.tokens_per_s,
        m.wall_s,
        s.judge
    )
}

/// Bytes of a file (0 when missing).
fn file_bytes(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// Bytes of the files under `dir`, recursively (0 when missing).
pub fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok())
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(_) => e.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
}
