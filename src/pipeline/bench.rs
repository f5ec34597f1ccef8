//! Measurements for `envace bench rollout`, in the run's protocol, dtype and engine settings:
//!
//! * [`Pipeline::bench_replay`]: the seed trajectories of the first train tasks replayed as the
//!   protocol's rows — every generation call run through the engine with its prompt and its
//!   completion's length (greedy, no stop), then one GRPO step on those rows. The trajectories
//!   (calls, results, lengths) are the same in every mode, so the protocols' costs compare
//!   like for like.
//! * [`Pipeline::bench_rollout`]: the live rollouts of one training step (the policy's own
//!   calls and rehearsed results) and one GRPO step on them; their shapes differ between modes.
//!
//! Each phase reports the tokens the model processed, the wall time and the peak memory.

use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::seed_rows::{first_user_turns, seed_rows};
use super::{secs, Pipeline, TRAIN_RUN};
use crate::actors::learner_actor::LearnerMsg;
use crate::actors::memory_actor::MemoryMsg;
use crate::actors::worker::{Job, WorkerError};
use crate::actors::Split;
use crate::kernels::{EngineStats, GenerationRequest, SamplingParams, TrainRow};
use crate::storage::{Role, RunId, Termination};

/// What one phase cost.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PhaseCost {
    /// Tokens run through the model: generation counts prefill tokens computed plus decode
    /// tokens (KV copied from the prefix cache is not computed); the learner counts the
    /// tokens of its forward passes (padded micro-batches, or packed streams).
    pub tokens: u64,
    /// Wall time, seconds.
    pub wall_s: f64,
    /// Peak resident memory of the process during the phase (`VmHWM` after resetting it), MiB;
    /// includes the weights.
    pub peak_rss_mib: f64,
    /// `tokens` / trajectories.
    pub tokens_per_trajectory: f64,
    /// `wall_s` / trajectories, seconds.
    pub wall_s_per_trajectory: f64,
}

impl PhaseCost {
    fn new(tokens: u64, wall_s: f64, peak_rss_mib: f64, trajectories: usize) -> Self {
        let n = trajectories.max(1) as f64;
        Self {
            tokens,
            wall_s,
            peak_rss_mib,
            tokens_per_trajectory: tokens as f64 / n,
            wall_s_per_trajectory: wall_s / n,
        }
    }
}

/// One mode's measurement.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RolloutBench {
    /// Trajectories rolled out (`tasks × k`).
    pub trajectories: usize,
    /// Mean trajectory reward of the rollouts (checklist judge).
    pub reward_mean: f64,
    /// Act and Rehearse rows (generation calls).
    pub rows_act: usize,
    pub rows_rehearse: usize,
    /// Completion tokens sampled, tokens.
    pub generated_tokens: u64,
    /// How the episodes ended (termination → count).
    pub terminations: std::collections::BTreeMap<String, usize>,
    /// The rollouts.
    pub generation: PhaseCost,
    /// The engine's counters over the rollouts.
    pub engine: EngineStats,
    /// One GRPO step on the rollouts.
    pub learner: PhaseCost,
    /// Loss of that step.
    pub learner_loss: f64,
}

/// The seed-replay measurement of one mode.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplayBench {
    /// Seed trajectories replayed (one per task).
    pub trajectories: usize,
    /// Act and Rehearse rows (generation calls) in the protocol's rendering.
    pub rows_act: usize,
    pub rows_rehearse: usize,
    /// Rows left out because prompt + completion exceed the model's context.
    pub rows_over_context: usize,
    /// Completion tokens, tokens.
    pub completion_tokens: u64,
    /// Prompt + completion tokens of all rows (what a learner without packing scores), tokens.
    pub row_tokens: u64,
    /// Every row generated in call order per trajectory (trajectories concurrently).
    pub generation: PhaseCost,
    /// The engine's counters over the replay.
    pub engine: EngineStats,
    /// One GRPO step on the rows.
    pub learner: PhaseCost,
}

impl Pipeline {
    /// Replays the seed trajectories of the first `train.tasks_per_step` train tasks that
    /// have one, in this run's protocol (the warm-up's rows: Act turns and Rehearse calls with
    /// their real results), up to `rollout.max_user_turns` user turns as training plays them.
    ///
    /// Generation: each row's prompt, greedy, exactly its completion's length of new tokens,
    /// the rows of a trajectory in order. The next row's prompt holds the seed's completion,
    /// not the greedy one, so a prefix cache reuses only up to the previous prompt: the
    /// cached modes' reuse is slightly understated. Then one GRPO step on the rows (zero old
    /// log-probs, advantages ±1 by trajectory: the cost of a step, not a meaningful update).
    ///
    /// # Errors
    /// No seeds, a row the engine rejects, or a learner failure.
    pub async fn bench_replay(&mut self) -> Result<ReplayBench> {
        let seeds = self.memory().ask("memory", MemoryMsg::Seeds).await??;
        let pool = self.seed_pool().await?;
        let context = self.topology.worker.info().context_len;
        let mut out = ReplayBench::default();
        let mut trajectories = Vec::new();
        for task in self.suite.tasks(Split::Train) {
            if trajectories.len() == self.cfg.train.tasks_per_step {
                break;
            }
            let Some(seed) = seeds.iter().find(|s| s.task == task.id) else {
                continue;
            };
            let seed = first_user_turns(seed, self.cfg.rollout.max_user_turns);
            let mut rows = Vec::new();
            for r in seed_rows(
                &self.topology.kit,
                self.topology.protocol.as_ref(),
                task,
                &seed,
                &pool,
                &self.cfg,
            )? {
                let (role, row) = (r.role, r.row);
                if row.len() > context {
                    out.rows_over_context += 1;
                    continue;
                }
                match role {
                    Role::Act => out.rows_act += 1,
                    Role::Rehearse => out.rows_rehearse += 1,
                }
                out.completion_tokens += row.completion_ids.len() as u64;
                out.row_tokens += row.len() as u64;
                rows.push(row);
            }
            trajectories.push(rows);
        }
        if trajectories.is_empty() {
            bail!("bench: no seed trajectories of train tasks; collect first");
        }
        out.trajectories = trajectories.len();
        let n = trajectories.len();
        let worker = self.topology.worker.clone();

        let before = worker.engine_stats().await?;
        reset_peak_rss();
        let start = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        for rows in trajectories.clone() {
            let worker = worker.clone();
            set.spawn(async move {
                for row in rows {
                    let params = SamplingParams {
                        temperature: 0.0,
                        max_new_tokens: row.completion_ids.len(),
                        ..SamplingParams::default()
                    };
                    worker
                        .generate(GenerationRequest {
                            prompt_ids: row.prompt_ids,
                            params,
                        })
                        .await?;
                }
                Ok::<(), WorkerError>(())
            });
        }
        for done in set.join_all().await {
            done.context("bench replay")?;
        }
        let wall = secs(start);
        out.engine = delta(&worker.engine_stats().await?, &before);
        out.generation = PhaseCost::new(
            out.engine.prefill_tokens_computed + out.engine.decode_tokens,
            wall,
            peak_rss_mib(),
            n,
        );

        self.configure_learner(self.cfg.train.learner.clone())
            .await?;
        let rows: Vec<TrainRow> = trajectories
            .into_iter()
            .enumerate()
            .flat_map(|(t, rows)| {
                let advantage = if t % 2 == 0 { 1.0 } else { -1.0 };
                rows.into_iter().map(move |r| TrainRow {
                    old_logprobs: vec![0.0; r.completion_ids.len()],
                    prompt_ids: r.prompt_ids,
                    completion_ids: r.completion_ids,
                    advantage,
                })
            })
            .collect();
        reset_peak_rss();
        let start = Instant::now();
        let stats = worker
            .request(|tx| Job::Train(rows, tx))
            .await
            .map_err(|e| anyhow!("bench replay: learner step: {e}"))?;
        out.learner = PhaseCost::new(stats.forward_tokens as u64, secs(start), peak_rss_mib(), n);
        Ok(out)
    }

    /// Runs the rollouts of training step 0 (`train.tasks_per_step` tasks × `train.k`, the
    /// train seeds and budgets of the config) and one GRPO step on them, and measures both.
    /// Nothing is committed to the run; the weights change by that one step.
    ///
    /// # Errors
    /// No seeds (run `collect` first), an actor or learner failure, or a real environment call.
    pub async fn bench_rollout(&mut self) -> Result<RolloutBench> {
        let pool = self.seed_pool().await?;
        if pool.is_empty() {
            bail!("bench: no seed trajectories; collect first");
        }
        let learner = self.topology.learner.clone();
        self.configure_learner(self.cfg.train.learner.clone())
            .await?;
        let worker = self.topology.worker.clone();
        let engine_before = worker.engine_stats().await?;
        let calls_before = self.topology.real_env_calls();
        let agents = self.topology.rehearsal_agents();

        reset_peak_rss();
        let start = Instant::now();
        let run = RunId::from(format!("{TRAIN_RUN}-bench"));
        let n = self.cfg.train.tasks_per_step;
        let trajectories = self
            .rollout_group(
                &agents,
                &pool,
                self.suite.tasks(crate::actors::Split::Train),
                &run,
                0,
                0,
                n,
                0,
            )
            .await;
        let generation_s = secs(start);
        let generation_peak = peak_rss_mib();
        if self.topology.real_env_calls() != calls_before {
            bail!("bench: the rollouts called the real environment");
        }
        let engine = delta(&worker.engine_stats().await?, &engine_before);
        let n = trajectories.len();
        let rows = |role| {
            trajectories
                .iter()
                .flat_map(|t| &t.rows)
                .filter(|r| r.role == role)
                .count()
        };
        let mut terminations = std::collections::BTreeMap::new();
        for t in &trajectories {
            *terminations
                .entry(termination_name(t.termination))
                .or_insert(0) += 1;
        }
        let mut out = RolloutBench {
            trajectories: n,
            reward_mean: trajectories
                .iter()
                .map(|t| f64::from(t.reward))
                .sum::<f64>()
                / n.max(1) as f64,
            rows_act: rows(Role::Act),
            rows_rehearse: rows(Role::Rehearse),
            generated_tokens: trajectories
                .iter()
                .flat_map(|t| &t.rows)
                .map(|r| r.completion_ids.len() as u64)
                .sum(),
            terminations,
            generation: PhaseCost::new(
                engine.prefill_tokens_computed + engine.decode_tokens,
                generation_s,
                generation_peak,
                n,
            ),
            engine,
            ..RolloutBench::default()
        };

        reset_peak_rss();
        let start = Instant::now();
        let step = learner
            .ask("learner", |r| LearnerMsg::GrpoStep(trajectories, r))
            .await?
            .context("bench: learner")?;
        out.learner = PhaseCost::new(
            step.stats.forward_tokens as u64,
            secs(start),
            peak_rss_mib(),
            n,
        );
        out.learner_loss = step.stats.loss;
        Ok(out)
    }
}

/// Counters over a phase. Saturating: a failed generation step rebuilds the engine and restarts
/// its counters (the phase then under-reports rather than wraps).
fn delta(after: &EngineStats, before: &EngineStats) -> EngineStats {
    EngineStats {
        prefill_tokens_computed: after
            .prefill_tokens_computed
            .saturating_sub(before.prefill_tokens_computed),
        prefill_tokens_reused: after
            .prefill_tokens_reused
            .saturating_sub(before.prefill_tokens_reused),
        decode_tokens: after.decode_tokens.saturating_sub(before.decode_tokens),
        prefix_hits: after.prefix_hits.saturating_sub(before.prefix_hits),
        prefix_evictions: after
            .prefix_evictions
            .saturating_sub(before.prefix_evictions),
        prefix_cache_tokens: after.prefix_cache_tokens,
    }
}

fn termination_name(t: Termination) -> String {
    serde_json::to_value(t)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{t:?}"))
}

/// Resets the process's peak resident set size (`echo 5 > /proc/self/clear_refs`, Linux ≥ 4.0),
/// so the next [`peak_rss_mib`] covers only what follows. Elsewhere it does nothing.
pub fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Peak resident set size of this process (`VmHWM`), MiB; 0 where `/proc` is missing.
pub fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}
