//! `train`: self-rehearsal role-wise GRPO. Every tool call is answered by the policy's own
//! Rehearse role; the real environment is never called, which the stage counts and enforces.
//! After every step the weights, the step's trajectories and the run state are committed, so
//! a stopped run resumes at the next step.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, Result};

use super::{progress, secs, Pipeline, TRAIN_RUN};
use crate::actors::episode::{run_episode_supervised, Agents, EpisodeSpec};
use crate::actors::learner::LearnerMsg;
use crate::actors::memory::MemoryMsg;
use crate::actors::protocol::SeedPool;
use crate::actors::worker::Job;
use crate::report::{StageReport, StepMetrics};
use crate::storage::{Checkpoint, PolicyVersion, Role, RunId, RunState, Termination, Trajectory};

/// Key of the policy version in a training checkpoint's metrics.
pub(super) const POLICY_VERSION_KEY: &str = "policy_version";

impl Pipeline {
    /// Trains until `train.steps` steps are done, resuming after the last committed step.
    /// `init` is a checkpoint to start from when the run has no step yet (the CLI passes the
    /// warm-up checkpoint; the demo passes `None`, its weights are already warmed up).
    ///
    /// # Errors
    /// No seeds, an actor or learner failure, or a real environment call (a bug).
    pub async fn train(&mut self, init: Option<PathBuf>) -> Result<StageReport> {
        let start = Instant::now();
        let run = RunId::from(TRAIN_RUN);
        let resumed = self
            .memory()
            .ask("memory", |r| MemoryMsg::RunState(run.clone(), r))
            .await?
            .map_err(|e| anyhow!(e))?;
        let (first_step, mut cursor) = match &resumed {
            Some(state) => {
                // The checkpoint committed with the run state, never a newer file on disk.
                let checkpoint = self.latest_checkpoint().await?.ok_or_else(|| {
                    anyhow!("run {TRAIN_RUN} has a run state but no checkpoint record")
                })?;
                if checkpoint.step != state.step {
                    bail!(
                        "run {TRAIN_RUN}: the run state is at step {} but the last checkpoint at {}",
                        state.step,
                        checkpoint.step
                    );
                }
                let version = checkpoint
                    .metrics
                    .get(POLICY_VERSION_KEY)
                    .map_or(state.step, |v| *v as u64);
                self.load_weights(checkpoint.path.clone(), PolicyVersion(version))
                    .await?;
                eprintln!(
                    "train: resuming run {TRAIN_RUN} after step {} (policy version {version}; \
                     the AdamW moments start afresh)",
                    state.step
                );
                (state.step, state.data_cursor as usize)
            }
            None => {
                if let Some(path) = init {
                    self.load_weights(path, PolicyVersion(0)).await?;
                }
                (0, 0)
            }
        };
        if resumed.is_none() {
            self.report.train.steps.clear();
        }
        let pool = self.seed_pool().await?;
        if pool.is_empty() {
            bail!(
                "train: no seed trajectories in {}; run `envace collect` first",
                self.dir.display()
            );
        }
        let learner = self.topology.learner.clone();
        self.configure_learner(self.cfg.train.learner.clone())
            .await?;
        let calls_before = self.topology.real_env_calls();
        let agents = self.topology.rehearsal_agents();
        let bar = progress(self.cfg.train.steps.saturating_sub(first_step), "train");
        let (mut tokens, mut generated) = (0u64, 0u64);
        for step in first_step..self.cfg.train.steps {
            let step_start = Instant::now();
            let trajectories = self.rollout_group(&agents, &pool, &run, step, cursor).await;
            cursor = (cursor + self.cfg.train.tasks_per_step) % self.suite.train.len();
            let calls = self.topology.real_env_calls() - calls_before;
            if calls != 0 {
                bail!("train: {calls} real environment calls during self-rehearsal training (must be 0)");
            }
            let step_tokens: u64 = trajectories
                .iter()
                .flat_map(|t| &t.rows)
                .map(|r| (r.prompt_ids.len() + r.completion_ids.len()) as u64)
                .sum();
            generated += trajectories
                .iter()
                .flat_map(|t| &t.rows)
                .map(|r| r.completion_ids.len() as u64)
                .sum::<u64>();
            tokens += step_tokens;
            let rewards: Vec<f64> = trajectories.iter().map(|t| f64::from(t.reward)).collect();
            let reward_mean = rewards.iter().sum::<f64>() / rewards.len().max(1) as f64;
            if trajectories
                .iter()
                .all(|t| t.termination == Termination::ActorFailed)
            {
                bail!(
                    "train step {step}: every episode failed: {}",
                    trajectories[0]
                        .messages
                        .first()
                        .map_or("", |m| m.content.as_str())
                );
            }
            let trainable = trajectories
                .iter()
                .flat_map(|t| &t.rows)
                .any(|r| !r.completion_ids.is_empty());
            let (stats, per_role, version) = if trainable {
                let out = learner
                    .ask("learner", |r| LearnerMsg::GrpoStep(trajectories.clone(), r))
                    .await?
                    .map_err(|e| anyhow!("train step {step}: learner: {e}"))?;
                (out.stats, out.per_role, out.policy_version)
            } else {
                // Only failed episodes without rows: keep them, no update this step.
                tracing::warn!(step, "no trainable rows; no optimizer step");
                (
                    Default::default(),
                    Default::default(),
                    self.topology.worker.policy_version(),
                )
            };
            let path = self.checkpoint_path(&format!("{TRAIN_RUN}-step{}", step + 1));
            self.save_weights(path.clone()).await?;
            let role = |r: Role| per_role.get(&r.to_string()).copied().unwrap_or_default();
            let (act, reh) = (role(Role::Act), role(Role::Rehearse));
            let m = StepMetrics {
                step,
                policy_version: version.0,
                reward_mean,
                reward_mean_act: act.reward_mean,
                reward_mean_rehearse: reh.reward_mean,
                adv_mean_act: act.adv_mean,
                adv_std_act: act.adv_std,
                adv_mean_rehearse: reh.adv_mean,
                adv_std_rehearse: reh.adv_std,
                loss: stats.loss,
                kl: stats.ref_kl,
                approx_kl: stats.approx_kl,
                clip_frac: stats.clip_frac,
                grad_norm: stats.grad_norm,
                tokens: step_tokens,
                tokens_per_s: step_tokens as f64 / secs(step_start).max(1e-9),
                rows_act: act.rows,
                rows_rehearse: reh.rows,
                trajectories: trajectories.len() as u64,
                real_env_calls: calls,
                wall_s: secs(step_start),
            };
            for (name, v) in [
                ("reward_mean", m.reward_mean),
                ("loss", m.loss),
                ("kl", m.kl),
                ("clip_frac", m.clip_frac),
                ("tokens_per_s", m.tokens_per_s),
            ] {
                metrics::gauge!(format!("train_{name}")).set(v);
            }
            for (r, s) in [("act", act), ("rehearse", reh)] {
                metrics::gauge!("train_reward_mean_role", "role" => r).set(s.reward_mean);
                metrics::gauge!("train_adv_mean", "role" => r).set(s.adv_mean);
                metrics::gauge!("train_adv_std", "role" => r).set(s.adv_std);
                metrics::gauge!("train_rows", "role" => r).set(s.rows as f64);
            }
            metrics::counter!("train_real_env_calls").increment(calls);
            tracing::info!(
                step,
                reward = m.reward_mean,
                loss = m.loss,
                rows_act = m.rows_act,
                rows_rehearse = m.rows_rehearse,
                "train step"
            );
            let state = RunState {
                run: run.clone(),
                step: step + 1,
                data_cursor: cursor as u64,
                rng_state: Vec::new(),
                config_hash: String::new(),
            };
            let checkpoint = Checkpoint {
                run: run.clone(),
                step: step + 1,
                path,
                metrics: [
                    ("reward_mean".to_string(), m.reward_mean),
                    ("loss".to_string(), m.loss),
                    (POLICY_VERSION_KEY.to_string(), version.0 as f64),
                ]
                .into_iter()
                .collect(),
            };
            self.memory()
                .ask("memory", |r| MemoryMsg::CommitStep {
                    trajectories,
                    checkpoint: Some(checkpoint),
                    state,
                    reply: r,
                })
                .await?
                .map_err(|e| anyhow!(e))?;
            // The previous step's weights are no longer the committed checkpoint.
            if step > 0 {
                let old = self.checkpoint_path(&format!("{TRAIN_RUN}-step{step}"));
                if let Err(e) = std::fs::remove_file(&old) {
                    tracing::debug!(path = %old.display(), error = %e, "old checkpoint kept");
                }
            }
            self.report.train.steps.push(m);
            self.report.train.real_env_calls = self.topology.real_env_calls() - calls_before;
            self.save_report()?;
            bar.inc(1);
        }
        bar.finish_and_clear();
        let calls = self.topology.real_env_calls() - calls_before;
        self.report.train.real_env_calls = calls;
        eprintln!(
            "train: {} steps done, real environment calls during training: {calls}",
            self.cfg.train.steps
        );
        let previous = self.report.stages.get("train").cloned().unwrap_or_default();
        let resumed_run = resumed.is_some();
        let stage = StageReport {
            wall_s: secs(start) + if resumed_run { previous.wall_s } else { 0.0 },
            tokens: tokens + if resumed_run { previous.tokens } else { 0 },
            generated_tokens: generated
                + if resumed_run {
                    previous.generated_tokens
                } else {
                    0
                },
            real_env_calls: calls,
            items: self.report.train.steps.len() as u64,
        };
        self.record_stage("train", stage.clone());
        Ok(stage)
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
            .await?
            .map_err(|e| anyhow!(e))?;
        Ok(all.into_iter().max_by_key(|c| c.step))
    }

    /// Writes the shared weights to `path` (atomically: a temporary file, then a rename).
    ///
    /// # Errors
    /// The file cannot be written.
    pub async fn save_weights(&self, path: PathBuf) -> Result<()> {
        let tmp = path.with_extension("tmp.safetensors");
        let t = tmp.clone();
        self.topology
            .worker
            .request(|tx| Job::Save(t, tx))
            .await
            .map_err(|e| anyhow!("saving weights to {}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &path)
            .map_err(|e| anyhow!("renaming {} to {}: {e}", tmp.display(), path.display()))?;
        Ok(())
    }

    /// Replaces the shared weights with a saved checkpoint and sets the policy version.
    ///
    /// # Errors
    /// The file is missing or does not fit the model.
    pub async fn load_weights(&self, path: PathBuf, version: PolicyVersion) -> Result<()> {
        let p = path.clone();
        self.topology
            .worker
            .request(|tx| Job::Load(p, version, tx))
            .await
            .map_err(|e| anyhow!("loading weights from {}: {e}", path.display()))
    }
}

impl Pipeline {
    /// The rollouts of one training step: `train.k` self-rehearsal episodes for each of
    /// `train.tasks_per_step` train tasks from `cursor` (wrapping), run concurrently; sampling
    /// seeds derive from `train.seed`, the step, the task's index and the sample, so the same
    /// config gives the same rollouts. Returned sorted by (task, sample); a failed episode is
    /// kept as an `ActorFailed` trajectory, never dropped.
    pub(super) async fn rollout_group(
        &self,
        agents: &Agents,
        pool: &SeedPool,
        run: &RunId,
        step: u64,
        cursor: usize,
    ) -> Vec<Trajectory> {
        let train = &self.suite.train;
        let mut set = tokio::task::JoinSet::new();
        for i in 0..self.cfg.train.tasks_per_step {
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
                        ^ ((i as u64) << 16)
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
