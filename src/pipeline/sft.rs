//! `sft`: the supervised warm-up. Act rows: the seed's assistant turns (Hermes tool calls, or
//! the final answer) given the conversation before them; Rehearse rows: each real observation
//! given its call. Only the completion tokens are trained.

use std::time::Instant;

use anyhow::{anyhow, bail, Result};
use rand::seq::SliceRandom;
use rand::SeedableRng;

use super::{progress, secs, Pipeline, SFT_RUN};
use crate::actors::learner::LearnerMsg;
use crate::actors::memory::MemoryMsg;
use crate::actors::protocol::{
    act_messages, rehearse_messages, render_rehearse_target, PromptKit, SeedPool,
};
use crate::actors::{EpisodeTask, Split, ToolCall};
use crate::kernels::ScoreRow;
use crate::report::StageReport;
use crate::storage::{Checkpoint, MessageRole, RunId, RunState, SeedTrajectory};

/// Warm-up rows of one seed, in conversation order.
///
/// Rehearse rows take their few-shot facts from *other* train tasks (the pool is asked as if
/// the task were a test task), so the target result is never in its own prompt.
///
/// # Errors
/// Rendering or tokenising fails.
pub fn seed_rows(
    kit: &PromptKit,
    task: &EpisodeTask,
    seed: &SeedTrajectory,
    pool: &SeedPool,
    cfg: &crate::config::RunConfig,
) -> Result<Vec<(crate::storage::Role, ScoreRow)>> {
    let rendering = cfg.protocol.tool_rendering;
    let mut as_test = task.clone();
    as_test.split = Split::Test;
    let facts = pool.facts_for(
        &as_test,
        cfg.protocol.max_facts,
        cfg.protocol.max_fact_chars,
    );
    let eos: Vec<u32> = kit.eos_id().into_iter().collect();
    let mut rows = Vec::new();
    let mut exchange = seed.tool_calls.iter();
    let mut last_act: Option<(usize, String)> = None;
    for (i, m) in seed.messages.iter().enumerate() {
        let before = &seed.messages[..i];
        match m.role {
            MessageRole::Assistant => {
                let prompt =
                    kit.encode_chat(&act_messages(&task.tools, rendering, before, None), true)?;
                let mut completion = kit.encode(&m.content)?;
                completion.extend(&eos);
                rows.push((
                    crate::storage::Role::Act,
                    ScoreRow {
                        prompt_ids: prompt,
                        completion_ids: completion,
                    },
                ));
                last_act = Some((i, m.content.clone()));
            }
            MessageRole::Tool => {
                let (Some(x), Some((act_at, act_text))) = (exchange.next(), &last_act) else {
                    bail!("seed of {}: a tool message without a call", seed.task);
                };
                let arguments = serde_json::from_str(&x.arguments_json)
                    .map_err(|e| anyhow!("seed of {}: arguments of {}: {e}", seed.task, x.name))?;
                let call = ToolCall::new(x.name.clone(), arguments);
                let history = &seed.messages[..*act_at];
                let prompt = kit.encode_chat(
                    &rehearse_messages(&task.tools, rendering, &facts, history, act_text, &call),
                    true,
                )?;
                let mut completion = kit.encode(&render_rehearse_target(&x.result_json))?;
                completion.extend(&eos);
                rows.push((
                    crate::storage::Role::Rehearse,
                    ScoreRow {
                        prompt_ids: prompt,
                        completion_ids: completion,
                    },
                ));
            }
            _ => {}
        }
    }
    Ok(rows)
}

impl Pipeline {
    /// Runs `sft.steps` supervised steps on warm-up rows from the train seeds and saves the
    /// weights as the `sft` checkpoint.
    ///
    /// # Errors
    /// No seeds (run `collect` first), or a learner step fails.
    pub async fn sft(&mut self) -> Result<StageReport> {
        let start = Instant::now();
        let seeds = self
            .memory()
            .ask("memory", MemoryMsg::Seeds)
            .await?
            .map_err(|e| anyhow!(e))?;
        if seeds.is_empty() {
            bail!(
                "sft: no seed trajectories in {}; run `envace collect` first",
                self.dir.display()
            );
        }
        let pool = self.seed_pool().await?;
        let mut rows = Vec::new();
        for seed in &seeds {
            let Some(task) = self.suite.train.iter().find(|t| t.id == seed.task) else {
                continue; // seeds of test tasks are never used for training
            };
            rows.extend(seed_rows(&self.topology.kit, task, seed, &pool, &self.cfg)?);
        }
        let total = rows.len();
        let mut lengths: Vec<usize> = rows
            .iter()
            .map(|(_, r)| r.prompt_ids.len() + r.completion_ids.len())
            .collect();
        lengths.sort_unstable();
        if let (Some(&max), Some(&median)) = (lengths.last(), lengths.get(lengths.len() / 2)) {
            eprintln!("sft: row length median {median} tokens, max {max} tokens");
        }
        rows.retain(|(_, r)| {
            r.prompt_ids.len() + r.completion_ids.len() <= self.cfg.sft.max_row_tokens
        });
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(self.cfg.sft.seed);
        rows.shuffle(&mut rng);
        eprintln!(
            "sft: {} warm-up rows ({} act, {} rehearse; {} over {} tokens left out)",
            rows.len(),
            rows.iter()
                .filter(|(r, _)| *r == crate::storage::Role::Act)
                .count(),
            rows.iter()
                .filter(|(r, _)| *r == crate::storage::Role::Rehearse)
                .count(),
            total - rows.len(),
            self.cfg.sft.max_row_tokens
        );
        if rows.is_empty() {
            bail!(
                "sft: every warm-up row is longer than sft.max_row_tokens = {}",
                self.cfg.sft.max_row_tokens
            );
        }
        let learner = self.topology.learner.clone();
        let cfg = Box::new(self.cfg.sft.learner.clone());
        learner
            .ask("learner", |r| LearnerMsg::Configure(cfg, r))
            .await?
            .map_err(|e| anyhow!(e))?;
        let bar = progress(self.cfg.sft.steps, "sft");
        let (mut tokens, mut trained) = (0u64, 0u64);
        let per = self.cfg.sft.rows_per_step;
        for step in 0..self.cfg.sft.steps {
            let batch: Vec<ScoreRow> = (0..per)
                .map(|i| rows[(step as usize * per + i) % rows.len()].1.clone())
                .collect();
            tokens += batch
                .iter()
                .map(|r| (r.prompt_ids.len() + r.completion_ids.len()) as u64)
                .sum::<u64>();
            trained += batch
                .iter()
                .map(|r| r.completion_ids.len() as u64)
                .sum::<u64>();
            let stats = learner
                .ask("learner", |r| LearnerMsg::SftStep(batch, r))
                .await?
                .map_err(|e| anyhow!("sft step {step}: {e}"))?;
            metrics::gauge!("sft_loss").set(stats.loss);
            bar.set_message(format!("sft {:.3}", stats.loss));
            tracing::info!(
                step,
                loss = stats.loss,
                grad_norm = stats.grad_norm,
                "sft step"
            );
            bar.inc(1);
        }
        bar.finish_and_clear();
        let path = self.checkpoint_path(SFT_RUN);
        let worker = self.topology.worker.clone();
        let p = path.clone();
        worker
            .request(|tx| crate::actors::worker::Job::Save(p, tx))
            .await
            .map_err(|e| anyhow!("saving the warm-up checkpoint: {e}"))?;
        let run = RunId::from(SFT_RUN);
        let checkpoint = Checkpoint {
            run: run.clone(),
            step: self.cfg.sft.steps,
            path,
            metrics: Default::default(),
        };
        let state = RunState {
            run,
            step: self.cfg.sft.steps,
            data_cursor: 0,
            rng_state: Vec::new(),
            config_hash: String::new(),
        };
        self.memory()
            .ask("memory", |r| MemoryMsg::CommitStep {
                trajectories: Vec::new(),
                checkpoint: Some(checkpoint),
                state,
                reply: r,
            })
            .await?
            .map_err(|e| anyhow!(e))?;
        let stage = StageReport {
            wall_s: secs(start),
            tokens,
            generated_tokens: trained,
            real_env_calls: 0,
            items: self.cfg.sft.steps,
        };
        self.record_stage("sft", stage.clone());
        Ok(stage)
    }
}
