//! One rollout-and-learn measurement for `envace bench rollout`: the rollouts of one training
//! step (self-rehearsal, the run's protocol, dtype and engine settings) and one GRPO step on
//! them, with the tokens the model processed, the wall time and the peak memory of each phase.

use std::time::Instant;

use anyhow::{anyhow, bail, Result};
use serde::{Deserialize, Serialize};

use super::{secs, Pipeline, TRAIN_RUN};
use crate::actors::learner::LearnerMsg;
use crate::kernels::EngineStats;
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

impl Pipeline {
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
        let cfg = Box::new(self.cfg.train.learner.clone());
        learner
            .ask("learner", |r| LearnerMsg::Configure(cfg, r))
            .await?
            .map_err(|e| anyhow!(e))?;
        let worker = self.topology.worker.clone();
        let engine_before = worker.engine_stats().await.map_err(|e| anyhow!(e))?;
        let calls_before = self.topology.real_env_calls();
        let agents = self.topology.rehearsal_agents();

        reset_peak_rss();
        let start = Instant::now();
        let run = RunId::from(format!("{TRAIN_RUN}-bench"));
        let trajectories = self.rollout_group(&agents, &pool, &run, 0, 0).await;
        let generation_s = secs(start);
        let generation_peak = peak_rss_mib();
        if self.topology.real_env_calls() != calls_before {
            bail!("bench: the rollouts called the real environment");
        }
        let engine = delta(
            &worker.engine_stats().await.map_err(|e| anyhow!(e))?,
            &engine_before,
        );
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
            .map_err(|e| anyhow!("bench: learner: {e}"))?;
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

fn delta(after: &EngineStats, before: &EngineStats) -> EngineStats {
    EngineStats {
        prefill_tokens_computed: after.prefill_tokens_computed - before.prefill_tokens_computed,
        prefill_tokens_reused: after.prefill_tokens_reused - before.prefill_tokens_reused,
        decode_tokens: after.decode_tokens - before.decode_tokens,
        prefix_hits: after.prefix_hits - before.prefix_hits,
        prefix_evictions: after.prefix_evictions - before.prefix_evictions,
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
