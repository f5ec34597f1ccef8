//! `sft`: the supervised warm-up on the seeds' rows ([`super::seed_rows`]): Act rows teach the
//! call format and the calls, Rehearse rows ground the world model in real results.
//!
//! **Every row of every seed the warm-up uses is trained**, in both protocols. A budget only
//! chooses how many seeds (`sft.seeds`, taken stratified: round-robin over the split's strata
//! in stratum order, each stratum's seeds in the store's order: task id as text, so
//! `multi_turn_base_10` before `multi_turn_base_2`) and how many passes (`sft.epochs`); it
//! never leaves out a role's rows. An optimizer step takes `sft.seeds_per_step` whole seeds
//! (the seeds shuffled per epoch with `sft.seed`), so a seed's rows stay together and, with
//! `sft.learner.pack_prefixes`, share their common prefixes in one packed forward.
//!
//! A row longer than the model's context is cut to fit, never dropped: its completion is kept
//! and its **oldest prompt tokens** are removed until prompt + completion fit (a completion
//! longer than the context keeps its first `context − 1` tokens after one prompt token). The
//! cut rows and the prompt tokens lost are counted per role, printed and reported. With
//! SmolLM2-135M (8 192 tokens) and BFCL no row is near the context (the longest is about
//! 3 200 tokens).
//!
//! The stage prints and reports rows, tokens and loss per role (the loss of each role from the
//! per-row NLL of every step, so the two roles' progress can be told apart), and saves the
//! weights as the `sft` checkpoint.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use rand::seq::SliceRandom;
use rand::SeedableRng;

use super::seed_rows::{seed_rows, SeedRow};
use super::{progress, secs, Pipeline, SFT_RUN};
use crate::actors::learner_actor::LearnerMsg;
use crate::actors::memory_actor::MemoryMsg;
use crate::actors::{EpisodeTask, Split};
use crate::kernels::ScoreRow;
use crate::report::{SftReport, SftRoleRows, SftStepMetrics, StageReport};
use crate::storage::{Checkpoint, Role, RunId, RunState, SeedTrajectory};

/// Cuts `row` to at most `context` tokens (see the module doc); returns the tokens lost.
pub fn fit_to_context(row: &mut ScoreRow, context: usize) -> usize {
    let len = row.prompt_ids.len() + row.completion_ids.len();
    if len <= context || context < 2 {
        return 0;
    }
    row.completion_ids.truncate(context - 1);
    let keep = context - row.completion_ids.len();
    let drop = row.prompt_ids.len().saturating_sub(keep);
    row.prompt_ids.drain(..drop);
    len - row.prompt_ids.len() - row.completion_ids.len()
}

/// At most `n` of `seeds` (all for `None`), stratified: round-robin over `strata` (in the
/// order given), each stratum's seeds in the order given. `stratum_of` names a seed's stratum;
/// seeds whose stratum is not listed come last.
pub fn stratified_seeds<'a>(
    seeds: &[&'a SeedTrajectory],
    n: Option<usize>,
    stratum_of: impl Fn(&SeedTrajectory) -> Option<String>,
) -> Vec<&'a SeedTrajectory> {
    let n = n.unwrap_or(seeds.len()).min(seeds.len());
    let mut queues: BTreeMap<String, std::collections::VecDeque<&'a SeedTrajectory>> =
        BTreeMap::new();
    for &s in seeds {
        let key = stratum_of(s).unwrap_or_else(|| "\u{10FFFF}".into());
        queues.entry(key).or_default().push_back(s);
    }
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        for q in queues.values_mut() {
            if out.len() == n {
                break;
            }
            if let Some(s) = q.pop_front() {
                out.push(s);
            }
        }
    }
    out
}

/// Per-role running sums of a pass: rows, completion tokens, summed NLL.
#[derive(Debug, Default, Clone, Copy)]
struct RoleLoss {
    rows: u64,
    tokens: u64,
    nll: f64,
}

impl RoleLoss {
    fn mean(&self) -> f64 {
        if self.tokens == 0 {
            f64::NAN
        } else {
            self.nll / self.tokens as f64
        }
    }
}

impl Pipeline {
    /// The warm-up (see the module doc): `sft.epochs` passes over every row of the chosen
    /// train seeds, then the `sft` checkpoint.
    ///
    /// # Errors
    /// No seeds (run `collect` first), a seed whose rows cannot be built, or a learner step
    /// that fails.
    pub async fn sft(&mut self) -> Result<StageReport> {
        let start = Instant::now();
        let seeds = self.memory().ask("memory", MemoryMsg::Seeds).await??;
        // Seeds of test tasks are never used for training (none is collected; this guards
        // against a database that holds one).
        let train: Vec<(&SeedTrajectory, &EpisodeTask)> = seeds
            .iter()
            .filter_map(|s| {
                self.suite
                    .tasks(Split::Train)
                    .iter()
                    .find(|t| t.id == s.task)
                    .map(|t| (s, t))
            })
            .collect();
        if train.is_empty() {
            bail!(
                "sft: no seed trajectories of train tasks in {}; run `envace collect` first",
                self.dir.display()
            );
        }
        let strata = self.stratum_names();
        let chosen = stratified_seeds(
            &train.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
            self.cfg.sft.seeds,
            |s| strata.get(&s.task.0).cloned(),
        );
        let pool = self.seed_pool().await?;
        let context = self.topology.worker.info().context_len;
        let mut per_role: BTreeMap<Role, SftRoleRows> = BTreeMap::new();
        let mut data: Vec<Vec<SeedRow>> = Vec::with_capacity(chosen.len());
        for seed in &chosen {
            let task = train
                .iter()
                .find(|(s, _)| s.task == seed.task)
                .map(|(_, t)| *t)
                .ok_or_else(|| anyhow!("sft: seed {} lost its task", seed.task))?;
            let mut rows = seed_rows(
                &self.topology.kit,
                self.topology.protocol.as_ref(),
                task,
                seed,
                &pool,
                &self.cfg,
            )?;
            for r in &mut rows {
                let lost = fit_to_context(&mut r.row, context);
                let e = per_role.entry(r.role).or_default();
                e.rows += 1;
                e.prompt_tokens += r.row.prompt_ids.len() as u64;
                e.completion_tokens += r.row.completion_ids.len() as u64;
                if lost > 0 {
                    e.truncated_rows += 1;
                    e.truncated_tokens += lost as u64;
                }
            }
            data.push(rows);
        }
        let sft = &self.cfg.sft;
        let steps_per_epoch = chosen.len().div_ceil(sft.seeds_per_step);
        let total_steps = steps_per_epoch as u64 * u64::from(sft.epochs);
        eprintln!(
            "sft: {} of {} train seeds (stratified), {} epoch(s) of {} steps ({} seeds per step), \
             every row of each seed:",
            chosen.len(),
            train.len(),
            sft.epochs,
            steps_per_epoch,
            sft.seeds_per_step
        );
        for (role, r) in &per_role {
            eprintln!(
                "  {role}: {} rows, {} prompt + {} completion tokens, {} rows cut to the \
                 context ({} prompt tokens lost)",
                r.rows, r.prompt_tokens, r.completion_tokens, r.truncated_rows, r.truncated_tokens
            );
        }
        self.configure_learner(self.cfg.sft.learner.clone()).await?;
        let learner = self.topology.learner.clone();
        let bar = progress(total_steps, "sft");
        let mut report = SftReport {
            seeds_used: chosen.len() as u64,
            seeds_available: train.len() as u64,
            seeds: chosen.iter().map(|s| s.task.0.clone()).collect(),
            epochs: u64::from(self.cfg.sft.epochs),
            per_role: per_role.clone(),
            steps: Vec::new(),
        };
        let (mut tokens, mut trained) = (0u64, 0u64);
        let mut order: Vec<usize> = (0..data.len()).collect();
        let mut step = 0u64;
        for epoch in 0..self.cfg.sft.epochs {
            let mut rng =
                rand_chacha::ChaCha8Rng::seed_from_u64(self.cfg.sft.seed ^ u64::from(epoch));
            order.shuffle(&mut rng);
            let mut epoch_loss: BTreeMap<Role, RoleLoss> = BTreeMap::new();
            for chunk in order.chunks(self.cfg.sft.seeds_per_step) {
                let step_start = Instant::now();
                let rows: Vec<&SeedRow> = chunk.iter().flat_map(|&i| &data[i]).collect();
                let batch: Vec<ScoreRow> = rows.iter().map(|r| r.row.clone()).collect();
                tokens += batch.iter().map(|r| r.len() as u64).sum::<u64>();
                let out = learner
                    .ask("learner", |r| LearnerMsg::SftStep(batch, r))
                    .await?
                    .with_context(|| format!("sft step {step}"))?;
                trained += out.stats.tokens as u64;
                let mut step_loss: BTreeMap<Role, RoleLoss> = BTreeMap::new();
                for (row, nll) in rows.iter().zip(&out.row_nll) {
                    for sums in [&mut step_loss, &mut epoch_loss] {
                        let e = sums.entry(row.role).or_default();
                        e.rows += 1;
                        e.tokens += row.row.completion_ids.len() as u64;
                        e.nll += nll;
                    }
                }
                let role = |r: Role| step_loss.get(&r).copied().unwrap_or_default();
                let m = SftStepMetrics {
                    step,
                    epoch: u64::from(epoch),
                    loss: out.stats.loss,
                    loss_act: role(Role::Act).mean(),
                    loss_rehearse: role(Role::Rehearse).mean(),
                    grad_norm: out.stats.grad_norm,
                    rows_act: role(Role::Act).rows,
                    rows_rehearse: role(Role::Rehearse).rows,
                    tokens: out.stats.tokens as u64,
                    forward_tokens: out.stats.forward_tokens as u64,
                    wall_s: secs(step_start),
                };
                metrics::gauge!("sft_loss").set(m.loss);
                metrics::gauge!("sft_loss_role", "role" => "act").set(m.loss_act);
                metrics::gauge!("sft_loss_role", "role" => "rehearse").set(m.loss_rehearse);
                bar.set_message(format!(
                    "sft act {:.2} reh {:.2}",
                    m.loss_act, m.loss_rehearse
                ));
                tracing::info!(
                    step,
                    loss = m.loss,
                    loss_act = m.loss_act,
                    loss_rehearse = m.loss_rehearse,
                    grad_norm = m.grad_norm,
                    "sft step"
                );
                report.steps.push(m);
                step += 1;
                bar.inc(1);
            }
            for (role, sums) in &epoch_loss {
                if let Some(r) = report.per_role.get_mut(role) {
                    if epoch == 0 {
                        r.loss_first_epoch = sums.mean();
                    }
                    r.loss_last_epoch = sums.mean();
                }
            }
        }
        bar.finish_and_clear();
        // With one epoch every seed is seen once: the trend shows in the steps, not the epochs.
        let third = (report.steps.len() / 3).max(1);
        for (role, r) in &report.per_role {
            let role_loss = |m: &SftStepMetrics| match role {
                Role::Act => m.loss_act,
                Role::Rehearse => m.loss_rehearse,
            };
            let mean = |steps: &[SftStepMetrics]| {
                let v: Vec<f64> = steps
                    .iter()
                    .map(role_loss)
                    .filter(|l| l.is_finite())
                    .collect();
                v.iter().sum::<f64>() / v.len().max(1) as f64
            };
            let n = report.steps.len();
            eprintln!(
                "sft: {role} loss {:.3} (first {third} steps) -> {:.3} (last {third} steps); \
                 {:.3} (first epoch) -> {:.3} (last epoch)",
                mean(&report.steps[..third.min(n)]),
                mean(&report.steps[n.saturating_sub(third)..]),
                r.loss_first_epoch,
                r.loss_last_epoch
            );
        }
        self.report.sft = report;
        self.save_sft_checkpoint().await?;
        let stage = StageReport {
            wall_s: secs(start),
            tokens,
            generated_tokens: trained,
            real_env_calls: 0,
            items: per_role.values().map(|r| r.rows).sum::<u64>() * u64::from(self.cfg.sft.epochs),
        };
        self.record_stage("sft", stage.clone());
        Ok(stage)
    }

    /// Train task id → the name of its stratum ([`crate::suite::TaskSuite::stratum`]).
    fn stratum_names(&self) -> BTreeMap<String, String> {
        self.suite
            .tasks(Split::Train)
            .iter()
            .filter_map(|t| Some((t.id.0.clone(), self.suite.stratum(t)?)))
            .collect()
    }

    /// Saves the weights as the `sft` checkpoint and commits its record.
    async fn save_sft_checkpoint(&self) -> Result<()> {
        let path = self.checkpoint_path(SFT_RUN);
        self.save_weights(path.clone())
            .await
            .context("saving the warm-up checkpoint")?;
        crate::kernels::fault::crash_point("sft-saved");
        let run = RunId::from(SFT_RUN);
        let steps = self.report.sft.steps.len() as u64;
        let checkpoint = Checkpoint {
            run: run.clone(),
            step: steps,
            path: super::recorded_path(&path),
            metrics: Default::default(),
        };
        let state = RunState {
            run,
            step: steps,
            data_cursor: 0,
            rng_state: Vec::new(),
            config_hash: self.config_hash.clone(),
        };
        self.memory()
            .ask("memory", |r| MemoryMsg::CommitStep {
                trajectories: Vec::new(),
                checkpoint: Some(checkpoint),
                state,
                reply: r,
            })
            .await?
            .map_err(anyhow::Error::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::TaskId;

    #[test]
    fn rows_over_the_context_lose_their_oldest_prompt_tokens() {
        let row = ScoreRow {
            prompt_ids: (0..10).collect(),
            completion_ids: vec![100, 101, 102],
        };
        let mut same = row.clone();
        assert_eq!(fit_to_context(&mut same, 13), 0);
        assert_eq!(same, row);
        let mut cut = row.clone();
        assert_eq!(fit_to_context(&mut cut, 8), 5);
        assert_eq!(cut.prompt_ids, vec![5, 6, 7, 8, 9]);
        assert_eq!(cut.completion_ids, row.completion_ids);
        // A completion longer than the context keeps its head after one prompt token.
        let mut cut = row;
        assert_eq!(fit_to_context(&mut cut, 3), 10);
        assert_eq!(cut.prompt_ids, vec![9]);
        assert_eq!(cut.completion_ids, vec![100, 101]);
    }

    fn seed(id: &str) -> SeedTrajectory {
        SeedTrajectory {
            task: TaskId::from(id),
            index: 0,
            messages: Vec::new(),
            tool_calls: Vec::new(),
        }
    }

    #[test]
    fn seeds_are_taken_round_robin_over_strata() {
        let all: Vec<SeedTrajectory> = ["a1", "a2", "a3", "b1", "c1", "c2", "x1"]
            .into_iter()
            .map(seed)
            .collect();
        let refs: Vec<&SeedTrajectory> = all.iter().collect();
        let stratum = |s: &SeedTrajectory| {
            let c = s.task.0.chars().next()?;
            (c != 'x').then(|| c.to_string())
        };
        let ids = |n| {
            stratified_seeds(&refs, n, stratum)
                .iter()
                .map(|s| s.task.0.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(Some(4)), ["a1", "b1", "c1", "x1"]);
        assert_eq!(ids(Some(5)), ["a1", "b1", "c1", "x1", "a2"]);
        assert_eq!(ids(None).len(), 7);
        assert_eq!(ids(Some(100)).len(), 7);
    }
}
