//! `eval`: the policy against the real environment, judged by the BFCL checker, with success
//! per task (every user turn passed) and per turn.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, Result};

use super::{progress, secs, Pipeline, SFT_RUN, TRAIN_RUN};
use crate::actors::episode::{run_episode_supervised, EpisodeConfig, EpisodeSpec};
use crate::actors::memory::MemoryMsg;
use crate::actors::{EpisodeTask, Split};
use crate::report::{EvalReport, StageReport, TaskResult};
use crate::storage::{PolicyVersion, RunId, Termination, Trajectory};

/// Which weights an evaluation measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// The model as loaded.
    Base,
    /// After the supervised warm-up.
    Sft,
    /// After self-rehearsal GRPO.
    Envace,
}

impl Variant {
    pub fn name(self) -> &'static str {
        match self {
            Variant::Base => "base",
            Variant::Sft => "sft",
            Variant::Envace => "envace",
        }
    }
}

impl std::str::FromStr for Variant {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "base" => Ok(Variant::Base),
            "sft" => Ok(Variant::Sft),
            "envace" => Ok(Variant::Envace),
            other => Err(format!("unknown variant {other:?} (base, sft, envace)")),
        }
    }
}

impl Pipeline {
    /// Loads the checkpoint of `variant` from the run folder (the base model needs none).
    ///
    /// # Errors
    /// The checkpoint does not exist (run the stage that makes it first).
    pub async fn load_variant(&self, variant: Variant) -> Result<()> {
        let (run, stage) = match variant {
            Variant::Base => return Ok(()),
            Variant::Sft => (SFT_RUN, "sft"),
            Variant::Envace => (TRAIN_RUN, "train"),
        };
        let Some(checkpoint) = self.last_checkpoint_of(run).await? else {
            bail!(
                "no {} checkpoint in {}: run `envace {stage}` first",
                variant.name(),
                self.dir.display()
            );
        };
        if !checkpoint.path.exists() {
            bail!(
                "the {} checkpoint {} is missing: run `envace {stage}` again",
                variant.name(),
                checkpoint.path.display()
            );
        }
        // The version the weights had when saved: the optimizer steps behind them.
        let version = checkpoint
            .metrics
            .get(super::train::POLICY_VERSION_KEY)
            .map_or(checkpoint.step, |v| *v as u64);
        self.load_weights(checkpoint.path, PolicyVersion(version))
            .await
    }

    /// The split of `eval.split` and its first `limit` (or `eval.tasks`) tasks.
    ///
    /// # Errors
    /// `eval.split` is not `train` or `test`.
    pub fn eval_tasks(&self, limit: Option<usize>) -> Result<(Split, Vec<EpisodeTask>)> {
        let split: Split = self
            .cfg
            .eval
            .split
            .parse()
            .map_err(|e: String| anyhow!(e))?;
        let tasks = match split {
            Split::Train => &self.suite.train,
            Split::Test => &self.suite.test,
        };
        let n = limit.or(self.cfg.eval.tasks).unwrap_or(tasks.len());
        Ok((split, tasks.iter().take(n).cloned().collect()))
    }

    /// How evaluation episodes are played: the rollout settings with the evaluation sampling
    /// (DESIGN.md §2: temperature 0.6, top-p 0.95), every user turn, the evaluation budget.
    pub fn eval_episode_config(&self) -> EpisodeConfig {
        let mut ep = self.cfg.rollout.clone();
        ep.temperature = self.cfg.eval.temperature;
        ep.top_p = self.cfg.eval.top_p;
        ep.top_k = 0;
        ep.max_user_turns = None;
        ep.act_max_new_tokens = self.cfg.eval.act_max_new_tokens;
        ep
    }

    /// Evaluates the current weights as `variant` on `eval.split` (first `eval.tasks` tasks,
    /// or `limit`) in the real environment; records the result under `variants.<name>` and the
    /// stage `eval_<name>`.
    ///
    /// # Errors
    /// An actor fails to start or the store fails; failed episodes are results, not errors.
    pub async fn eval(&mut self, variant: Variant, limit: Option<usize>) -> Result<EvalReport> {
        let start = Instant::now();
        let (split, tasks) = self.eval_tasks(limit)?;
        let n = tasks.len();
        let judge = self
            .topology
            .start_judge(
                &format!("bfcl-checker-{}", variant.name()),
                Arc::new(self.suite.checker_judge(Default::default())),
            )
            .await
            .map_err(|e| anyhow!(e))?;
        let agents = self.topology.real_agents(judge).map_err(|e| anyhow!(e))?;
        let ep = self.eval_episode_config();
        let run = RunId(format!("eval-{}", variant.name()));
        let calls_before = self.topology.real_env_calls();
        let bar = progress(n as u64, variant.name());
        let mut set = tokio::task::JoinSet::new();
        for (i, task) in tasks.into_iter().enumerate() {
            let spec = EpisodeSpec {
                task: Arc::new(task),
                facts: Arc::new(Vec::new()),
                memory: None,
                run: run.clone(),
                step: 0,
                sample: 0,
                seed: self.cfg.eval.seed ^ i as u64,
            };
            let (agents, ep, bar) = (agents.clone(), ep.clone(), bar.clone());
            set.spawn(async move {
                let t = run_episode_supervised(&agents, &ep, &spec).await;
                bar.inc(1);
                t
            });
        }
        let mut trajectories: Vec<Trajectory> = set.join_all().await;
        bar.finish_and_clear();
        agents.judge.get().stop(None);
        if !trajectories.is_empty()
            && trajectories
                .iter()
                .all(|t| t.termination == Termination::ActorFailed)
        {
            bail!(
                "eval {}: every episode failed: {}",
                variant.name(),
                trajectories
                    .first()
                    .and_then(|t| t.messages.first())
                    .map_or("", |m| m.content.as_str())
            );
        }
        trajectories.sort_by(|a, b| a.task.cmp(&b.task));
        let calls = self.topology.real_env_calls() - calls_before;
        let per_task: Vec<TaskResult> = trajectories
            .iter()
            .map(|t| {
                let turns = self
                    .suite
                    .train
                    .iter()
                    .chain(&self.suite.test)
                    .find(|task| task.id == t.task)
                    .map_or(t.verdicts.len(), |task| task.user_turns.len());
                task_result(t, turns)
            })
            .collect();
        let turns: u64 = per_task.iter().map(|t| u64::from(t.turns)).sum();
        let passed: u64 = per_task.iter().map(|t| u64::from(t.turns_passed)).sum();
        let tokens: u64 = trajectories
            .iter()
            .flat_map(|t| &t.rows)
            .map(|r| (r.prompt_ids.len() + r.completion_ids.len()) as u64)
            .sum();
        let generated: u64 = trajectories
            .iter()
            .flat_map(|t| &t.rows)
            .map(|r| r.completion_ids.len() as u64)
            .sum();
        let report = EvalReport {
            split: split.name().into(),
            tasks: n as u64,
            task_success: per_task.iter().filter(|t| t.success).count() as f64 / n.max(1) as f64,
            turn_success: passed as f64 / turns.max(1) as f64,
            turns,
            real_env_calls: calls,
            tokens,
            wall_s: secs(start),
            per_task,
        };
        self.memory()
            .ask("memory", |r| MemoryMsg::PutTrajectories(trajectories, r))
            .await?
            .map_err(|e| anyhow!(e))?;
        metrics::gauge!("eval_task_success", "variant" => variant.name()).set(report.task_success);
        metrics::gauge!("eval_turn_success", "variant" => variant.name()).set(report.turn_success);
        eprintln!(
            "eval {}: {} {} tasks, task success {:.3}, turn success {:.3}, {} real env calls",
            variant.name(),
            n,
            split.name(),
            report.task_success,
            report.turn_success,
            calls
        );
        self.report
            .variants
            .insert(variant.name().into(), report.clone());
        self.record_stage(
            &format!("eval_{}", variant.name()),
            StageReport {
                wall_s: report.wall_s,
                tokens,
                generated_tokens: generated,
                real_env_calls: calls,
                items: n as u64,
            },
        );
        Ok(report)
    }
}

/// A task's result; `turns` is the task's number of user turns (a failed episode has no
/// verdicts, and its turns still count as failed).
fn task_result(t: &Trajectory, turns: usize) -> TaskResult {
    let turns = turns as u32;
    let turns_passed = t.verdicts.iter().filter(|v| v.passed).count() as u32;
    TaskResult {
        task: t.task.0.clone(),
        success: turns > 0 && turns_passed == turns && t.termination == Termination::Completed,
        turns_passed,
        turns,
        termination: format!("{:?}", t.termination),
        reward: f64::from(t.reward),
    }
}
