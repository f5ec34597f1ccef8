//! `eval`: the policy against the real environment, judged by the BFCL checker.
//!
//! Per variant, every metric comes with a percentile-bootstrap 95 % interval over tasks
//! ([`crate::stats`]): task success (every user turn passed), turn success, the dense checklist
//! score of the same transcript (partial credit, [`crate::bfcl::dense`]), the share of Act turns
//! with at least one well-formed tool call and the share with a malformed block (the base model
//! mostly answers in plain text, which parses as a final answer, so "turns that parse" would
//! flatter it), tool-name accuracy and argument accuracy over the tasks' ground-truth calls;
//! then Rehearse fidelity on the same tasks' real calls ([`super::fidelity`]).

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};

use super::{progress, secs, Pipeline, SFT_RUN, TRAIN_RUN};
use crate::actors::episode::{run_episode_supervised, transcript, EpisodeConfig, EpisodeSpec};
use crate::actors::memory_actor::MemoryMsg;
use crate::actors::protocol::parse_act;
use crate::actors::{EpisodeTask, Judge, Split, ToolCall};
use crate::bfcl::dense::{match_calls, DenseChecklistJudge};
use crate::report::{EvalMetrics, EvalReport, StageReport, TaskResult};
use crate::storage::{MessageRole, PolicyVersion, RunId, Termination, Trajectory};

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
        let file = self.checkpoint_file(&checkpoint);
        if !file.exists() {
            bail!(
                "the {} checkpoint {} is missing: run `envace {stage}` again",
                variant.name(),
                file.display()
            );
        }
        // The version the weights had when saved: the optimizer steps behind them.
        let version = checkpoint
            .metrics
            .get(super::train_loop::POLICY_VERSION_KEY)
            .map_or(checkpoint.step, |v| *v as u64);
        self.load_weights(file, PolicyVersion(version)).await
    }

    /// The split of `eval.split`, or `limit` (else `eval.tasks`) of its tasks spread evenly over
    /// it in index order ([`evenly_spaced`](crate::bfcl::split::evenly_spaced)), so a subset spans the split's classes as the whole
    /// split does (BFCL's index order groups scenarios by class: the first 30 test tasks would
    /// leave out TravelAPI).
    ///
    /// # Errors
    /// `eval.split` is not `train` or `test`; `limit` is 0.
    pub fn eval_tasks(&self, limit: Option<usize>) -> Result<(Split, Vec<EpisodeTask>)> {
        let split = self.cfg.eval.split;
        let tasks = self.suite.tasks(split);
        let n = limit.or(self.cfg.eval.tasks).unwrap_or(tasks.len());
        if n == 0 {
            bail!("evaluating 0 tasks measures nothing: --limit and eval.tasks must be at least 1");
        }
        let picked = crate::bfcl::split::evenly_spaced(tasks.len(), n)
            .into_iter()
            .map(|i| tasks[i].clone())
            .collect();
        Ok((split, picked))
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

    /// Evaluates the current weights as `variant` on `eval.split` (`eval.tasks` tasks spread over it,
    /// or `limit`) in the real environment, then the Rehearse role's fidelity on the same
    /// tasks' real calls; records the result under `variants.<name>` (every metric with its
    /// interval), updates the paired comparisons and records the stage `eval_<name>`.
    ///
    /// # Errors
    /// An actor fails to start or the store fails; failed episodes are results, not errors.
    pub async fn eval(&mut self, variant: Variant, limit: Option<usize>) -> Result<EvalReport> {
        let (split, tasks) = self.eval_tasks(limit)?;
        let report = self
            .evaluate(
                variant.name(),
                split,
                tasks,
                self.cfg.eval.fidelity_calls_per_task,
            )
            .await?;
        metrics::gauge!("eval_task_success", "variant" => variant.name())
            .set(report.metrics.task_success.estimate);
        metrics::gauge!("eval_checklist_score", "variant" => variant.name())
            .set(report.metrics.checklist_score.estimate);
        eprintln!(
            "eval {}: {} {} tasks; task success {}, checklist score {}, turns with a well-formed \
             call {}, rehearse fidelity (exact) {} %; {} real env calls",
            variant.name(),
            report.tasks,
            split.name(),
            report.metrics.task_success.display(true),
            report.metrics.checklist_score.display(true),
            report.metrics.well_formed_call_share.display(true),
            report
                .fidelity
                .as_ref()
                .map_or("-".into(), |f| f.equal_values.display(true)),
            report.real_env_calls
        );
        self.report
            .variants
            .insert(variant.name().into(), report.clone());
        self.report.update_comparisons();
        self.record_stage(
            &format!("eval_{}", variant.name()),
            StageReport {
                wall_s: report.wall_s,
                tokens: report.tokens,
                generated_tokens: report.generated_tokens,
                real_env_calls: report.real_env_calls,
                items: report.tasks,
            },
        );
        Ok(report)
    }

    /// Plays `tasks` with the current weights in the real environment (run `eval-<name>`,
    /// judged by BFCL's checker, trajectories stored), scores each transcript with the dense
    /// checklist judge and the call metrics, and measures Rehearse fidelity on at most
    /// `fidelity_calls` real calls per task (`None`: all).
    ///
    /// # Errors
    /// An actor fails to start, every episode failed, or the store fails.
    pub(super) async fn evaluate(
        &mut self,
        name: &str,
        split: Split,
        tasks: Vec<EpisodeTask>,
        fidelity_calls: Option<usize>,
    ) -> Result<EvalReport> {
        let start = Instant::now();
        let n = tasks.len();
        let judge = self
            .topology
            .start_judge(
                &format!("evaluation-judge-{name}"),
                self.suite.evaluation_judge(),
            )
            .await?;
        let agents = self.topology.real_agents(judge)?;
        let ep = self.eval_episode_config();
        let run = RunId(format!("eval-{name}"));
        let calls_before = self.topology.real_env_calls();
        let bar = progress(n as u64, name);
        let mut set = tokio::task::JoinSet::new();
        for (i, task) in tasks.iter().enumerate() {
            let spec = EpisodeSpec {
                task: Arc::new(task.clone()),
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
                "eval {name}: every episode failed: {}",
                trajectories
                    .first()
                    .and_then(|t| t.messages.first())
                    .map_or("", |m| m.content.as_str())
            );
        }
        trajectories.sort_by(|a, b| a.task.cmp(&b.task));
        let calls = self.topology.real_env_calls() - calls_before;
        let mut per_task: Vec<TaskResult> = trajectories
            .iter()
            .filter_map(|t| {
                let task = tasks.iter().find(|task| task.id == t.task)?;
                Some(task_result(t, task))
            })
            .collect();
        let (tokens, generated) = super::row_tokens(&trajectories);
        self.memory()
            .ask("memory", |r| MemoryMsg::PutTrajectories(trajectories, r))
            .await??;
        let fidelity = self.fidelity(&tasks, fidelity_calls).await?;
        for t in &mut per_task {
            let mine = fidelity.per_call.iter().filter(|c| c.task == t.task);
            for c in mine {
                t.fidelity_calls += 1;
                t.fidelity_equal += u32::from(c.equal_values);
            }
        }
        let turns: u64 = per_task.iter().map(|t| u64::from(t.turns)).sum();
        let passed: u64 = per_task.iter().map(|t| u64::from(t.turns_passed)).sum();
        let metrics = EvalMetrics::from_tasks(&per_task);
        Ok(EvalReport {
            split: split.name().into(),
            tasks: n as u64,
            task_success: metrics.task_success.estimate,
            turn_success: passed as f64 / turns.max(1) as f64,
            turns,
            // The episodes' calls and the ground-truth replays of Rehearse fidelity.
            real_env_calls: calls + fidelity.real_env_calls,
            tokens: tokens + fidelity.tokens,
            generated_tokens: generated,
            wall_s: secs(start),
            metrics,
            fidelity: Some(fidelity),
            per_task,
        })
    }
}

/// A task's result from its evaluation trajectory (see [`TaskResult`]): the checker's turns,
/// the dense checklist score of the same transcript, the Act turns that wrote a well-formed
/// call or a malformed block, and the ground-truth calls matched by name and exactly. A failed
/// episode has no turns played and counts every turn as failed.
pub fn task_result(t: &Trajectory, task: &EpisodeTask) -> TaskResult {
    let whitelist = task.tool_names();
    let turns = transcript(&t.messages, &whitelist);
    let n_turns = task.user_turns.len() as u32;
    let turns_passed = t.verdicts.iter().filter(|v| v.passed).count() as u32;
    let checklist_score = DenseChecklistJudge.judge(&task.judge, &turns).reward;
    let (mut expected, mut names, mut exact) = (0u32, 0u32, 0u32);
    for (i, items) in task.judge.checklist.iter().enumerate() {
        let calls: Vec<&ToolCall> = turns.get(i).map_or(Vec::new(), |t| t.all_calls().collect());
        let m = match_calls(&task.judge, items, &calls);
        expected += m.expected as u32;
        names += m.names as u32;
        exact += m.exact as u32;
    }
    let (mut act_turns, mut well_formed, mut malformed) = (0u32, 0u32, 0u32);
    for m in t
        .messages
        .iter()
        .filter(|m| m.role == MessageRole::Assistant)
    {
        act_turns += 1;
        match parse_act(&m.content, &whitelist) {
            Ok(out) => well_formed += u32::from(!out.calls.is_empty()),
            Err(e) => {
                malformed += 1;
                well_formed += u32::from(!e.calls_before.is_empty());
            }
        }
    }
    TaskResult {
        task: t.task.0.clone(),
        success: n_turns > 0 && turns_passed == n_turns && t.termination == Termination::Completed,
        turns_passed,
        turns: n_turns,
        termination: format!("{:?}", t.termination),
        reward: f64::from(t.reward),
        checklist_score: f64::from(checklist_score),
        act_turns,
        well_formed_turns: well_formed,
        malformed_turns: malformed,
        expected_calls: expected,
        name_matches: names,
        exact_matches: exact,
        fidelity_calls: 0,
        fidelity_equal: 0,
    }
}

#[cfg(test)]
mod tests {
    use crate::bfcl::split::evenly_spaced;

    #[test]
    fn subsets_spread_over_the_split() {
        assert_eq!(evenly_spaced(50, 2), vec![12, 37]);
        assert_eq!(evenly_spaced(50, 1), vec![25]);
        assert_eq!(evenly_spaced(3, 5), vec![0, 1, 2]);
        assert_eq!(evenly_spaced(0, 2), Vec::<usize>::new());
        let thirty = evenly_spaced(50, 30);
        assert_eq!(thirty.len(), 30);
        assert!(thirty.windows(2).all(|w| w[0] < w[1]));
        assert_eq!((thirty[0], thirty[29]), (0, 49));
    }
}
