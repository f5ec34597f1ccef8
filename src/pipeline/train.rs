//! `train`: self-rehearsal role-wise GRPO. Every tool call is answered by the policy's own
//! Rehearse role; the real environment is never called, which the stage counts and enforces
//! (periodic evaluations call it: their calls are left out of the stage's count and recorded
//! in each `PeriodicEval`).
//!
//! No dead steps: a group (a task's K trajectories) whose rows all have the same reward has
//! zero advantages and teaches nothing. With dynamic sampling (DAPO) a step keeps drawing
//! tasks until it has enough informative groups and trains on those only; a step with no
//! informative group takes no optimizer step and is reported as **skipped** (its loss is not a
//! loss of 0, its weights are the previous step's). Each step reports the groups drawn, the
//! zero-variance fraction, informative rows per role and the grad norm.
//!
//! The loop around the steps (resume, checkpoints, budgets, the daemon's control) is
//! [`super::train_loop`]; `envace train` checkpoints after every step, so a stopped run resumes
//! at the next step.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};

use super::train_loop::LoopOptions;
use super::{secs, Pipeline, TRAIN_RUN};
use crate::actors::episode::{run_episode_supervised, Agents, EpisodeSpec};
use crate::actors::learner_actor::{grpo_batch, LearnerMsg, RoleStats};
use crate::actors::memory_actor::MemoryMsg;
use crate::actors::protocol::SeedPool;
use crate::actors::task::EpisodeTask;
use crate::config::TrainConfig;
use crate::kernels::GrpoConfig;
use crate::report::{PeriodicEval, StageReport, StepMetrics};
use crate::storage::{Checkpoint, PolicyVersion, Role, RunId, Termination, Trajectory};

/// What one training step needs besides the pipeline: the agents (their judge swapped by the
/// run's history), the few-shot fact pool, the train task pool and the end-of-text ids.
pub(super) struct StepContext {
    pub agents: Agents,
    pub seeds: SeedPool,
    pub tasks: Vec<EpisodeTask>,
    pub run: RunId,
    pub stop_ids: Vec<u32>,
}

/// One step done (not yet committed).
pub(super) struct StepResult {
    pub metrics: StepMetrics,
    /// Every trajectory drawn (all are stored).
    pub trajectories: Vec<Trajectory>,
    /// Tasks drawn (the cursor advances by this many).
    pub tasks_drawn: usize,
}

impl Pipeline {
    /// Trains until `train.steps` steps are done, resuming after the last committed step,
    /// with a checkpoint after every step (only the last one kept); see
    /// [`Pipeline::train_loop`]. `init` is a checkpoint to start from when the run has no step
    /// yet (the CLI passes the warm-up checkpoint; the demo passes `None`, its weights are
    /// already warmed up).
    ///
    /// # Errors
    /// No seeds, an actor or learner failure, or a real environment call (a bug).
    pub async fn train(&mut self, init: Option<PathBuf>) -> Result<StageReport> {
        let options = LoopOptions::batch(self.cfg.train.steps);
        self.train_loop(init, options).await.map(|o| o.stage)
    }

    /// Plays step `step` from the pool position `cursor`: draws its groups (self-rehearsal,
    /// dynamic sampling), trains on the informative ones through the Learner actor, and
    /// returns its numbers and trajectories (not committed: the loop commits them with the
    /// next checkpoint). A step without an informative group takes no optimizer step and is
    /// reported as skipped.
    ///
    /// # Errors
    /// A real environment call during the step (a bug), every episode failed, or the learner
    /// failed or timed out.
    pub(super) async fn train_step(
        &self,
        ctx: &StepContext,
        step: u64,
        cursor: usize,
    ) -> Result<StepResult> {
        let step_start = Instant::now();
        let calls_before = self.topology.real_env_calls();
        let draw = self.draw_step(ctx, step, cursor).await;
        let rollout_s = secs(step_start);
        let calls = self.topology.real_env_calls() - calls_before;
        if calls != 0 {
            bail!(
                "train: {calls} real environment calls during self-rehearsal training (must be 0)"
            );
        }
        let trajectories = draw.all;
        if trajectories
            .iter()
            .all(|t| t.termination == Termination::ActorFailed)
        {
            bail!(
                "train step {step}: every episode failed: {}",
                trajectories
                    .first()
                    .and_then(|t| t.messages.first())
                    .map_or("", |m| m.content.as_str())
            );
        }
        let mut failures: std::collections::BTreeMap<String, u64> = Default::default();
        for t in trajectories
            .iter()
            .filter(|t| t.termination == Termination::ActorFailed)
        {
            let reason = t.messages.first().map_or("unknown", |m| m.content.as_str());
            let reason = reason.lines().next().unwrap_or_default().to_string();
            *failures.entry(reason).or_default() += 1;
        }
        if !failures.is_empty() {
            tracing::warn!(step, ?failures, "rollouts failed; their rows are lost");
        }
        let (step_tokens, generated) = super::row_tokens(&trajectories);
        // Rewards over every rollout of the step (trained or not).
        let rollouts = grpo_batch(&trajectories, &self.cfg.train.learner.grpo, &ctx.stop_ids);
        let rewards: Vec<f64> = trajectories.iter().map(|t| f64::from(t.reward)).collect();
        let reward_mean = rewards.iter().sum::<f64>() / rewards.len().max(1) as f64;
        let trainable = draw
            .train
            .iter()
            .flat_map(|t| &t.rows)
            .any(|r| !r.completion_ids.is_empty());
        let learner_start = Instant::now();
        let (trained_tokens, _) = super::row_tokens(&draw.train);
        let out = if trainable {
            let batch = draw.train.clone();
            Some(
                self.topology
                    .learner
                    .ask("learner", |r| LearnerMsg::GrpoStep(batch, r))
                    .await?
                    .with_context(|| format!("train step {step}: learner"))?,
            )
        } else {
            None
        };
        let skipped = out.as_ref().is_none_or(|o| o.skipped);
        // Throughput per actor kind: the policy workers' generation, the learner's update.
        metrics::gauge!("actor_tokens_per_second", "actor" => "policy")
            .set(generated as f64 / rollout_s.max(1e-9));
        if trainable {
            metrics::gauge!("actor_tokens_per_second", "actor" => "learner")
                .set(trained_tokens as f64 / secs(learner_start).max(1e-9));
        }
        let version = out.as_ref().map_or_else(
            || self.topology.worker.policy_version(),
            |o| o.policy_version,
        );
        if skipped {
            tracing::warn!(
                step,
                groups = draw.groups,
                "no group with a reward spread: step skipped, weights unchanged"
            );
        }
        let (informative_act, informative_rehearse) = out
            .as_ref()
            .map_or((0, 0), |o| informative_rows(&draw.train, &o.advantages));
        let all_role = |r: Role| {
            rollouts.per_role.get(&r).copied().unwrap_or(RoleStats {
                reward_mean: f64::NAN,
                ..RoleStats::default()
            })
        };
        let trained_role = |r: Role| {
            out.as_ref()
                .and_then(|o| o.per_role.get(&r).copied())
                .unwrap_or_default()
        };
        // A skipped step has no loss, KL or gradient: NaN (`null` in report.json), never 0.
        let stats = out.as_ref().filter(|_| !skipped).map(|o| o.stats);
        let (act, reh) = (trained_role(Role::Act), trained_role(Role::Rehearse));
        let metrics = StepMetrics {
            step,
            policy_version: version.0,
            reward_mean,
            reward_mean_act: all_role(Role::Act).reward_mean,
            reward_mean_rehearse: all_role(Role::Rehearse).reward_mean,
            adv_mean_act: act.adv_mean,
            adv_std_act: act.adv_std,
            adv_mean_rehearse: reh.adv_mean,
            adv_std_rehearse: reh.adv_std,
            loss: stats.map_or(f64::NAN, |s| s.loss),
            kl: stats.map_or(f64::NAN, |s| s.ref_kl),
            approx_kl: stats.map_or(f64::NAN, |s| s.approx_kl),
            clip_frac: stats.map_or(f64::NAN, |s| s.clip_frac),
            grad_norm: stats.map_or(f64::NAN, |s| s.grad_norm),
            tokens: step_tokens,
            generated_tokens: generated,
            tokens_per_s: step_tokens as f64 / secs(step_start).max(1e-9),
            rows_act: all_role(Role::Act).rows,
            rows_rehearse: all_role(Role::Rehearse).rows,
            trajectories: trajectories.len() as u64,
            real_env_calls: calls,
            wall_s: secs(step_start),
            skipped,
            groups: draw.groups as u64,
            zero_variance_groups: draw.zero_variance as u64,
            zero_variance_fraction: draw.zero_variance as f64 / draw.groups.max(1) as f64,
            informative_rows_act: informative_act,
            informative_rows_rehearse: informative_rehearse,
            draw_rounds: draw.rounds as u64,
            failed_trajectories: failures.values().sum(),
            failures,
        };
        record_step_metrics(&metrics);
        Ok(StepResult {
            metrics,
            trajectories,
            tasks_drawn: draw.tasks,
        })
    }

    /// Evaluates the current weights on `train.eval_tasks` tasks spread over the eval split
    /// (with Rehearse fidelity) and records it after `step` training steps; returns the real
    /// environment calls it made and the checklist score (0–1).
    ///
    /// # Errors
    /// As [`Pipeline::eval`].
    pub(super) async fn periodic_eval(&mut self, step: u64) -> Result<(u64, f64)> {
        let before = self.topology.real_env_calls();
        let (split, tasks) = self.eval_tasks(Some(self.cfg.train.eval_tasks))?;
        let e = self
            .evaluate(
                &format!("train-step{step}"),
                split,
                tasks,
                self.cfg.eval.fidelity_calls_per_task,
            )
            .await?;
        let fidelity = e
            .fidelity
            .as_ref()
            .map_or(crate::stats::Interval::NAN, |f| f.equal_values);
        eprintln!(
            "train: evaluation after step {step} on {} {} tasks: checklist score {} %, \
             rehearse fidelity (exact) {} %",
            e.tasks,
            split.name(),
            e.metrics.checklist_score.display(true),
            fidelity.display(true)
        );
        let score = e.metrics.checklist_score.estimate;
        metrics::gauge!("eval_checklist_score").set(score);
        metrics::gauge!("eval_fidelity_equal_values").set(fidelity.estimate);
        metrics::gauge!("eval_step").set(step as f64);
        self.report.train.evals.push(PeriodicEval {
            step,
            policy_version: self.topology.worker.policy_version().0,
            metrics: e.metrics,
            fidelity_equal_values: fidelity,
            tasks: e.tasks,
            wall_s: e.wall_s,
            real_env_calls: self.topology.real_env_calls() - before,
        });
        Ok((self.topology.real_env_calls() - before, score))
    }

    /// The last committed checkpoint of the training run, if any.
    ///
    /// # Errors
    /// The store cannot be read.
    pub async fn latest_checkpoint(&self) -> Result<Option<Checkpoint>> {
        self.last_checkpoint_of(TRAIN_RUN).await
    }

    /// The last committed checkpoint of `run` (`envace` or `sft`), if any.
    ///
    /// # Errors
    /// The store cannot be read.
    pub async fn last_checkpoint_of(&self, run: &str) -> Result<Option<Checkpoint>> {
        let run = RunId::from(run);
        let all = self
            .memory()
            .ask("memory", |r| MemoryMsg::Checkpoints(run, r))
            .await??;
        Ok(all.into_iter().max_by_key(|c| c.step))
    }

    /// Writes the shared weights to `path`, durably and atomically
    /// ([`Model::save_weights`](crate::kernels::Model::save_weights): a fsynced temporary file
    /// renamed over `path`), so a record committed after this names a complete file.
    ///
    /// # Errors
    /// The file cannot be written.
    pub async fn save_weights(&self, path: PathBuf) -> Result<()> {
        let p = path.clone();
        self.topology
            .learner
            .ask("learner", |r| LearnerMsg::SaveWeights(p, r))
            .await?
            .map_err(|e| anyhow!("saving weights to {}: {e}", path.display()))
    }

    /// Replaces the shared weights with a saved checkpoint and sets the policy version.
    ///
    /// # Errors
    /// The file is missing or does not fit the model.
    pub async fn load_weights(&self, path: PathBuf, version: PolicyVersion) -> Result<()> {
        let p = path.clone();
        self.topology
            .learner
            .ask("learner", |r| LearnerMsg::LoadWeights(p, version, r))
            .await?
            .map_err(|e| anyhow!("loading weights from {}: {e}", path.display()))
    }
}

/// Where the learner state (AdamW moments, f32 masters, step counts) of the weights file
/// `weights` lives: `NAME.learner.safetensors` beside `NAME.safetensors`.
pub(super) fn learner_state_path(weights: &std::path::Path) -> PathBuf {
    weights.with_extension("learner.safetensors")
}

/// The first 12 hex digits of a config hash, for messages.
pub(super) fn short(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

impl Pipeline {
    /// One step's rollouts ([`draw_groups`] over the context's train pool from `cursor`).
    async fn draw_step(&self, ctx: &StepContext, step: u64, cursor: usize) -> StepDraw {
        draw_groups(
            &self.cfg.train,
            ctx.tasks.len(),
            &ctx.stop_ids,
            |offset, n| {
                self.rollout_group(
                    &ctx.agents,
                    &ctx.seeds,
                    &ctx.tasks,
                    &ctx.run,
                    step,
                    cursor + offset,
                    n,
                    offset,
                )
            },
        )
        .await
    }

    /// `train.k` self-rehearsal episodes for each of `n` tasks of `train` from `cursor` (wrapping),
    /// run concurrently; sampling seeds derive from `train.seed`, the step, the task's draw
    /// index in the step (`offset + i`) and the sample, so the same config gives the same
    /// rollouts. Returned sorted by (task, sample); a failed episode is kept as an
    /// `ActorFailed` trajectory, never dropped.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn rollout_group(
        &self,
        agents: &Agents,
        pool: &SeedPool,
        train: &[EpisodeTask],
        run: &RunId,
        step: u64,
        cursor: usize,
        n: usize,
        offset: usize,
    ) -> Vec<Trajectory> {
        let mut set = tokio::task::JoinSet::new();
        for i in 0..n {
            let task = Arc::new(train[(cursor + i) % train.len()].clone());
            let facts = Arc::new(pool.facts_for(
                &task,
                self.cfg.protocol.max_facts,
                self.cfg.protocol.max_fact_chars,
            ));
            for sample in 0..self.cfg.train.k {
                let spec = EpisodeSpec {
                    task: task.clone(),
                    facts: facts.clone(),
                    memory: None,
                    run: run.clone(),
                    step,
                    sample,
                    seed: self.cfg.train.seed
                        ^ (step << 32)
                        ^ (((offset + i) as u64) << 16)
                        ^ u64::from(sample),
                };
                let (agents, ep) = (agents.clone(), self.cfg.rollout.clone());
                set.spawn(async move { run_episode_supervised(&agents, &ep, &spec).await });
            }
        }
        let mut trajectories: Vec<Trajectory> = set.join_all().await;
        trajectories.sort_by(|a, b| (&a.task, a.sample).cmp(&(&b.task, b.sample)));
        trajectories
    }
}

/// Draws one step's groups with dynamic sampling (see [`crate::config::TrainConfig`]):
/// `rollout(offset, n)` plays the `n` tasks after the first `offset` of the step (K
/// trajectories each, sorted by task). Rounds continue until the step has
/// `cfg.tasks_per_step` informative groups or has drawn `cfg.max_tasks()` tasks — never more
/// than `available`, so no task is drawn twice in a step. Without dynamic sampling: one round
/// of `tasks_per_step` tasks, all trained.
pub async fn draw_groups<F, Fut>(
    cfg: &TrainConfig,
    available: usize,
    stop_ids: &[u32],
    mut rollout: F,
) -> StepDraw
where
    F: FnMut(usize, usize) -> Fut,
    Fut: std::future::Future<Output = Vec<Trajectory>>,
{
    let max = cfg.max_tasks().min(available);
    let mut draw = StepDraw::default();
    let mut informative = 0;
    loop {
        let want = if cfg.dynamic_sampling {
            cfg.tasks_per_step.saturating_sub(informative)
        } else {
            cfg.tasks_per_step
        };
        let n = want.min(max - draw.tasks);
        if n == 0 {
            break;
        }
        let trajectories = rollout(draw.tasks, n).await;
        draw.rounds += 1;
        draw.tasks += n;
        for group in trajectories.chunk_by(|a, b| a.task == b.task) {
            draw.groups += 1;
            let signal = is_informative(group, &cfg.learner.grpo, stop_ids);
            if signal {
                informative += 1;
            } else {
                draw.zero_variance += 1;
            }
            if signal || !cfg.dynamic_sampling {
                draw.train.extend(group.iter().cloned());
            }
        }
        draw.all.extend(trajectories);
        if !cfg.dynamic_sampling || informative >= cfg.tasks_per_step {
            break;
        }
    }
    draw
}

/// What one step drew.
#[derive(Debug, Default)]
pub struct StepDraw {
    /// Every trajectory rolled out (all stored).
    pub all: Vec<Trajectory>,
    /// The trajectories the step trains on: the informative groups' (with dynamic sampling),
    /// or all of them.
    pub train: Vec<Trajectory>,
    /// Tasks drawn, groups, groups without a reward spread, sampling rounds.
    pub tasks: usize,
    pub groups: usize,
    pub zero_variance: usize,
    pub rounds: usize,
}

/// True when some row of the group has a non-zero role-wise advantage: its rewards differ
/// (within a role, the empty-row penalty included), so the group carries a training signal.
pub fn is_informative(group: &[Trajectory], grpo: &GrpoConfig, stop_ids: &[u32]) -> bool {
    grpo_batch(group, grpo, stop_ids)
        .advantages
        .iter()
        .flatten()
        .any(|a| a.is_some_and(|a| a != 0.0))
}

/// Rows with a non-zero advantage per role (Act, Rehearse), given the advantages the learner
/// trained `trajectories` with.
fn informative_rows(trajectories: &[Trajectory], advantages: &[Vec<Option<f32>>]) -> (u64, u64) {
    let (mut act, mut rehearse) = (0, 0);
    for (t, adv) in trajectories.iter().zip(advantages) {
        for (row, a) in t.rows.iter().zip(adv) {
            if a.is_some_and(|a| a != 0.0) {
                match row.role {
                    Role::Act => act += 1,
                    Role::Rehearse => rehearse += 1,
                }
            }
        }
    }
    (act, rehearse)
}

/// Publishes a step's numbers as `metrics` gauges and a tracing event.
fn record_step_metrics(m: &StepMetrics) {
    for (name, v) in [
        ("reward_mean", m.reward_mean),
        ("loss", m.loss),
        ("kl", m.kl),
        ("clip_frac", m.clip_frac),
        ("grad_norm", m.grad_norm),
        ("approx_kl", m.approx_kl),
        ("tokens_per_s", m.tokens_per_s),
        ("zero_variance_fraction", m.zero_variance_fraction),
    ] {
        metrics::gauge!(format!("train_{name}")).set(v);
    }
    for (r, reward, adv, std, rows) in [
        (
            "act",
            m.reward_mean_act,
            m.adv_mean_act,
            m.adv_std_act,
            m.rows_act,
        ),
        (
            "rehearse",
            m.reward_mean_rehearse,
            m.adv_mean_rehearse,
            m.adv_std_rehearse,
            m.rows_rehearse,
        ),
    ] {
        metrics::gauge!("train_reward_mean_role", "role" => r).set(reward);
        metrics::gauge!("train_adv_mean", "role" => r).set(adv);
        metrics::gauge!("train_adv_std", "role" => r).set(std);
        metrics::gauge!("train_rows", "role" => r).set(rows as f64);
    }
    metrics::counter!("train_steps").increment(1);
    metrics::gauge!("train_step").set((m.step + 1) as f64);
    metrics::gauge!("train_policy_version").set(m.policy_version as f64);
    metrics::gauge!("train_informative_groups").set((m.groups - m.zero_variance_groups) as f64);
    metrics::counter!("train_skipped_steps").increment(u64::from(m.skipped));
    metrics::counter!("train_real_env_calls").increment(m.real_env_calls);
    tracing::info!(
        step = m.step,
        reward = m.reward_mean,
        loss = m.loss,
        grad_norm = m.grad_norm,
        skipped = m.skipped,
        groups = m.groups,
        zero_variance = m.zero_variance_groups,
        "train step"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{ExecutionMode, PolicyVersion, Row, TaskId, Timings};

    /// K trajectories of `task` with `rewards`, one Act row each.
    fn group(task: usize, rewards: &[f32]) -> Vec<Trajectory> {
        rewards
            .iter()
            .enumerate()
            .map(|(sample, &reward)| Trajectory {
                run: RunId::from("t"),
                step: 0,
                task: TaskId(format!("task_{task:03}")),
                sample: sample as u32,
                mode: ExecutionMode::Rehearsal,
                rows: vec![Row {
                    role: Role::Act,
                    prompt_ids: vec![1],
                    completion_ids: vec![5, 6],
                    logprobs: vec![-1.0, -1.0],
                    policy_version: PolicyVersion(0),
                }],
                messages: Vec::new(),
                reward,
                verdicts: Vec::new(),
                termination: Termination::Completed,
                timings: Timings::default(),
            })
            .collect()
    }

    /// Draws with task `i` informative exactly when `informative(i)`.
    async fn draw(cfg: &TrainConfig, informative: fn(usize) -> bool) -> (StepDraw, Vec<usize>) {
        let mut asked = Vec::new();
        let d = draw_groups(cfg, 150, &[2], |offset, n| {
            asked.push(n);
            let out: Vec<Trajectory> = (offset..offset + n)
                .flat_map(|i| {
                    group(
                        i,
                        if informative(i) {
                            &[0.0, 0.5]
                        } else {
                            &[0.2, 0.2]
                        },
                    )
                })
                .collect();
            async move { out }
        })
        .await;
        (d, asked)
    }

    fn cfg(dynamic: bool) -> TrainConfig {
        TrainConfig {
            tasks_per_step: 2,
            dynamic_sampling: dynamic,
            max_tasks_per_step: Some(6),
            ..TrainConfig::default()
        }
    }

    fn tasks(ts: &[Trajectory]) -> Vec<String> {
        let mut ids: Vec<String> = ts.iter().map(|t| t.task.0.clone()).collect();
        ids.dedup();
        ids
    }

    #[test]
    fn dynamic_sampling_draws_past_zero_variance_groups() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("rt");
        // Tasks 0, 1, 2 give equal rewards; 3 and 4 differ.
        let (d, asked) = rt.block_on(draw(&cfg(true), |i| i >= 3));
        // Round 1: tasks 0-1 (none informative); round 2: 2-3 (one); round 3: task 4.
        assert_eq!(asked, vec![2, 2, 1]);
        assert_eq!((d.tasks, d.groups, d.zero_variance, d.rounds), (5, 5, 3, 3));
        assert_eq!(tasks(&d.train), ["task_003", "task_004"]);
        assert_eq!(d.all.len(), 10, "every trajectory drawn is kept");
    }

    #[test]
    fn dynamic_sampling_stops_at_its_bound() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("rt");
        let (d, asked) = rt.block_on(draw(&cfg(true), |_| false));
        assert_eq!(asked, vec![2, 2, 2]);
        assert_eq!((d.tasks, d.zero_variance), (6, 6));
        assert!(
            d.train.is_empty(),
            "no informative group: nothing to train, a skipped step"
        );
        // Informative from the start: one round.
        let (d, asked) = rt.block_on(draw(&cfg(true), |_| true));
        assert_eq!((asked, d.rounds, d.train.len()), (vec![2], 1, 4));
    }

    #[test]
    fn without_dynamic_sampling_one_round_is_trained_whole() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("rt");
        let (d, asked) = rt.block_on(draw(&cfg(false), |i| i == 1));
        assert_eq!(asked, vec![2]);
        assert_eq!((d.groups, d.zero_variance), (2, 1));
        assert_eq!(tasks(&d.train), ["task_000", "task_001"]);
    }

    #[test]
    fn an_empty_row_penalty_alone_makes_a_group_informative() {
        let grpo = GrpoConfig::default();
        let mut g = group(0, &[0.0, 0.0]);
        assert!(!is_informative(&g, &grpo, &[2]));
        // Equal rewards, but one row's text is only the end token: −0.1 on it.
        g[1].rows[0].completion_ids = vec![2];
        g[1].rows[0].logprobs = vec![-1.0];
        assert!(is_informative(&g, &grpo, &[2]));
    }
}
