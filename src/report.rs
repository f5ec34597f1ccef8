//! The run report: one JSON file, `DIR/report.json`, that each stage of `envace demo`
//! (collect → sft → train → eval) loads, extends with its own numbers and saves again.
//!
//! Every field has a serde default, so a report written by an older build, or by a run that
//! stopped half-way, still loads. Non-finite floats are written as JSON `null` (serde_json's
//! behaviour) and read back as NaN.
//!
//! ```
//! use envace::report::{EvalReport, RunReport, StageReport, STAGE_EVAL, VARIANT_ENVACE};
//! # fn main() -> Result<(), envace::report::ReportError> {
//! # let dir = std::env::temp_dir().join(format!("envace-report-doc-{}", std::process::id()));
//! let mut report = RunReport::load_or_new(&dir, "tiny", "smollm2-135m")?;
//! report.stages.insert(STAGE_EVAL.into(), StageReport { wall_s: 12.5, ..Default::default() });
//! report.variants.insert(
//!     VARIANT_ENVACE.into(),
//!     EvalReport { split: "test".into(), tasks: 20, task_success: 0.35, ..Default::default() },
//! );
//! report.save(&dir)?;
//! println!("{}", report.summary_table());
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use comfy_table::{presets::ASCII_MARKDOWN, CellAlignment, Table};
use serde::{Deserialize, Deserializer, Serialize};

use crate::stats::{Interval, PerTask};
use crate::storage::Role;

/// File name of the report inside a run directory.
pub const REPORT_FILE: &str = "report.json";

/// Stage key: collecting real-environment trajectories for warm-up.
pub const STAGE_COLLECT: &str = "collect";
/// Stage key: supervised warm-up on the collected trajectories.
pub const STAGE_SFT: &str = "sft";
/// Stage key: EnvACE role-wise GRPO training.
pub const STAGE_TRAIN: &str = "train";
/// Stage key: evaluation of the variants on the test split.
pub const STAGE_EVAL: &str = "eval";
/// Pipeline order of the stage keys; the summary lists stages in this order, others after.
pub const STAGE_ORDER: [&str; 7] = [
    STAGE_COLLECT,
    "eval_base",
    STAGE_SFT,
    "eval_sft",
    STAGE_TRAIN,
    "eval_envace",
    STAGE_EVAL,
];

/// Variant key: the base model, untrained.
pub const VARIANT_BASE: &str = "base";
/// Variant key: the model after supervised warm-up.
pub const VARIANT_SFT: &str = "sft";
/// Variant key: the model after EnvACE training.
pub const VARIANT_ENVACE: &str = "envace";

/// Why a report could not be loaded or saved.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// Reading, writing, creating or renaming a file failed.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The report file exists but is not a valid report.
    #[error("{path} is not a valid run report: {source}")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// The report could not be serialised (a non-string map key, which the types rule out).
    #[error("serialising the run report for {path}: {source}")]
    Serialize {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// Everything one `envace demo` run measured, as saved in `DIR/report.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunReport {
    /// Name of the preset the run used (e.g. `tiny`).
    pub preset: String,
    /// Model the run started from (a model name or path as given on the command line).
    pub model: String,
    /// When the report was first created, seconds since the Unix epoch.
    pub created_unix_s: u64,
    /// The budgets and configuration the run used, as the pipeline serialised them.
    pub budgets: serde_json::Value,
    /// Per-stage totals, keyed by stage ([`STAGE_COLLECT`], [`STAGE_SFT`], [`STAGE_TRAIN`],
    /// [`STAGE_EVAL`]).
    pub stages: BTreeMap<String, StageReport>,
    /// The supervised warm-up: rows, tokens and loss per role, per step.
    pub sft: SftReport,
    /// The EnvACE training curve.
    pub train: TrainReport,
    /// Evaluation results per model variant ([`VARIANT_BASE`], [`VARIANT_SFT`],
    /// [`VARIANT_ENVACE`]).
    pub variants: BTreeMap<String, EvalReport>,
    /// Paired differences between variants on the same tasks ([`COMPARISONS`]), keyed
    /// `"<b> - <a>"`.
    pub comparisons: BTreeMap<String, Comparison>,
    /// Final snapshot of the `metrics` crate (see [`crate::telemetry::MetricsHandle::snapshot`]).
    #[serde(deserialize_with = "f64_map_nan_if_null")]
    pub metrics: BTreeMap<String, f64>,
    /// Test-time-scaling results, free-form as the pipeline writes them.
    pub tts: Vec<serde_json::Value>,
}

/// Totals of one pipeline stage.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StageReport {
    /// Wall-clock time of the stage, seconds.
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub wall_s: f64,
    /// Tokens processed by the model (prompt + completion, including scored-only tokens).
    pub tokens: u64,
    /// Tokens the model generated (completion tokens only).
    pub generated_tokens: u64,
    /// Calls made to the real environment (not rehearsed by the policy).
    pub real_env_calls: u64,
    /// Units of work: tasks for collect and eval, training rows for sft, optimiser steps for
    /// train.
    pub items: u64,
}

/// The supervised warm-up stage.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SftReport {
    /// Train seeds the warm-up used, and how many there were.
    pub seeds_used: u64,
    pub seeds_available: u64,
    /// The task ids of the seeds used, in the stratified order they were chosen.
    pub seeds: Vec<String>,
    /// Passes over the rows.
    pub epochs: u64,
    /// Rows and tokens of one epoch per role (`act`, `rehearse`): every row of every seed used.
    pub per_role: BTreeMap<Role, SftRoleRows>,
    /// One entry per optimizer step.
    pub steps: Vec<SftStepMetrics>,
}

/// A role's warm-up rows in one epoch.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SftRoleRows {
    /// Rows trained (each seed's Act turns, or its real calls).
    pub rows: u64,
    /// Prompt tokens (conditioning, not trained).
    pub prompt_tokens: u64,
    /// Completion tokens (trained).
    pub completion_tokens: u64,
    /// Rows longer than the context, cut to fit (their oldest prompt tokens dropped).
    pub truncated_rows: u64,
    /// Prompt tokens those cuts dropped.
    pub truncated_tokens: u64,
    /// Token-mean NLL of the role's completions in the first and in the last epoch, nats.
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub loss_first_epoch: f64,
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub loss_last_epoch: f64,
}

/// One supervised optimizer step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SftStepMetrics {
    pub step: u64,
    pub epoch: u64,
    /// Token-mean NLL of the step's completions, all roles, before the update (nats).
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub loss: f64,
    /// The same over Act and over Rehearse completions (NaN for a role with no row).
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub loss_act: f64,
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub loss_rehearse: f64,
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub grad_norm: f64,
    pub rows_act: u64,
    pub rows_rehearse: u64,
    /// Trained (completion) tokens.
    pub tokens: u64,
    /// Tokens through the forward pass (packed).
    pub forward_tokens: u64,
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub wall_s: f64,
}

/// The EnvACE training stage: real-environment cost and per-step metrics.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TrainReport {
    /// Calls made to the real environment during training, all steps together.
    pub real_env_calls: u64,
    /// One entry per optimiser step, in order (skipped steps included).
    pub steps: Vec<StepMetrics>,
    /// Evaluations of a fixed subset of the eval split during training (`train.eval_every`):
    /// at step 0, every N steps and after the last step.
    pub evals: Vec<PeriodicEval>,
    /// Judge changes made while the run went on (`envace ctl judge`), with the step from
    /// which each was in force (the run's `control.json`).
    pub judges: Vec<crate::pipeline::control::JudgeChange>,
}

/// An evaluation during training.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PeriodicEval {
    /// Training steps done when it ran.
    pub step: u64,
    pub policy_version: u64,
    /// The evaluation's metrics on the subset.
    pub metrics: EvalMetrics,
    /// Rehearse fidelity on the subset's real calls (exact values).
    pub fidelity_equal_values: Interval,
    pub tasks: u64,
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub wall_s: f64,
    /// Real environment calls of the evaluation and its fidelity replays (not training's).
    pub real_env_calls: u64,
}

/// Metrics of one optimiser step of role-wise GRPO.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StepMetrics {
    /// Optimiser step index, from 0.
    pub step: u64,
    /// Version of the policy that generated this step's rollouts.
    pub policy_version: u64,
    /// Mean reward over all rows of the batch.
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub reward_mean: f64,
    /// Mean reward over Act rows.
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub reward_mean_act: f64,
    /// Mean reward over Rehearse rows.
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub reward_mean_rehearse: f64,
    /// Mean advantage over Act rows (≈ 0 when normalised per group).
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub adv_mean_act: f64,
    /// Standard deviation of the advantage over Act rows.
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub adv_std_act: f64,
    /// Mean advantage over Rehearse rows.
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub adv_mean_rehearse: f64,
    /// Standard deviation of the advantage over Rehearse rows.
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub adv_std_rehearse: f64,
    /// Loss of the step (PPO-clip policy loss plus `kl_coef`·KL), aggregated as configured.
    /// This, `kl`, `approx_kl`, `clip_frac` and `grad_norm` are NaN (`null`) on a skipped step.
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub loss: f64,
    /// k3 KL to the frozen reference policy, per token (0 when `grpo.kl_coef` is off).
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub kl: f64,
    /// Token mean of `log π_old − log π_θ` before the update (the learner re-scoring the
    /// rollouts; ~0 when the rollouts were sampled by the same weights).
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub approx_kl: f64,
    /// Fraction of tokens whose importance ratio was clipped, in [0, 1].
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub clip_frac: f64,
    /// Gradient L2 norm before clipping.
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub grad_norm: f64,
    /// Tokens in the step's batch (prompt + completion).
    pub tokens: u64,
    /// Tokens generated by the step's rollouts (completions).
    pub generated_tokens: u64,
    /// Throughput of the step, tokens per second of wall-clock time.
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub tokens_per_s: f64,
    /// Act rows of every rollout of the step (trained or not; see `informative_rows_act`).
    pub rows_act: u64,
    /// Rehearse rows of every rollout of the step (see `informative_rows_rehearse`).
    pub rows_rehearse: u64,
    /// Trajectories rolled out for the step.
    pub trajectories: u64,
    /// Calls made to the real environment during the step.
    pub real_env_calls: u64,
    /// Wall-clock time of the step (rollout + update), seconds.
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub wall_s: f64,
    /// True when no group of the step had a reward spread: no optimizer step was taken, the
    /// weights and the policy version did not change.
    pub skipped: bool,
    /// Groups (tasks × K trajectories) rolled out for the step, dynamic-sampling draws included.
    pub groups: u64,
    /// Of those, groups whose rows all had the same reward (no signal; not trained).
    pub zero_variance_groups: u64,
    /// `zero_variance_groups / groups`.
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub zero_variance_fraction: f64,
    /// Rows with a non-zero advantage, per role.
    pub informative_rows_act: u64,
    pub informative_rows_rehearse: u64,
    /// Dynamic-sampling rounds the step took (1 without redraws).
    pub draw_rounds: u64,
    /// Rollouts whose episode failed (an actor failed past its retries). Each is stored with its
    /// reason but without rows: its tokens are lost, it trains nothing and takes no part in a
    /// baseline (advantages are over rows).
    pub failed_trajectories: u64,
    /// Why they failed: the reason's first line → how many.
    pub failures: BTreeMap<String, u64>,
}

/// Evaluation of one model variant on one split.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EvalReport {
    /// Split evaluated (e.g. `test`).
    pub split: String,
    /// Tasks evaluated.
    pub tasks: u64,
    /// Fraction of tasks fully solved, in [0, 1].
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub task_success: f64,
    /// Fraction of user turns passed, over all tasks, in [0, 1].
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub turn_success: f64,
    /// User turns evaluated, all tasks together.
    pub turns: u64,
    /// Calls made to the real environment: the episodes' and Rehearse fidelity's
    /// ground-truth replays.
    pub real_env_calls: u64,
    /// Tokens processed (prompt + completion), Rehearse fidelity included.
    pub tokens: u64,
    /// Tokens the episodes generated.
    pub generated_tokens: u64,
    /// Wall-clock time of the evaluation, seconds.
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub wall_s: f64,
    /// Every metric with its bootstrap 95 % interval over tasks.
    pub metrics: EvalMetrics,
    /// The Rehearse role against real results of the same tasks' ground-truth replays.
    pub fidelity: Option<FidelityReport>,
    /// One entry per task, sorted by task id (as text).
    pub per_task: Vec<TaskResult>,
}

/// The evaluation metrics, each with its percentile-bootstrap 95 % interval over tasks
/// ([`crate::stats`]); [`METRICS`] says how each is read off the per-task results.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EvalMetrics {
    pub task_success: Interval,
    pub turn_success: Interval,
    /// The dense checklist judge's reward (partial credit).
    pub checklist_score: Interval,
    /// Share of Act turns with at least one well-formed tool call.
    pub well_formed_call_share: Interval,
    /// Share of Act turns with a malformed block (unclosed, bad JSON, unknown tool).
    pub malformed_share: Interval,
    /// Share of the tasks' ground-truth calls matched by a call with the same tool name.
    pub tool_name_accuracy: Interval,
    /// Share of the tasks' ground-truth calls matched with exactly the same arguments.
    pub argument_accuracy: Interval,
}

/// A per-task ratio metric: name, and its (numerator, denominator) for one task.
pub type Metric = (&'static str, fn(&TaskResult) -> PerTask);

/// The evaluation metrics in report order, read off [`TaskResult`]s.
pub const METRICS: [Metric; 7] = [
    ("task_success", |t| {
        PerTask::new(f64::from(u8::from(t.success)), 1.0)
    }),
    ("turn_success", |t| {
        PerTask::new(f64::from(t.turns_passed), f64::from(t.turns))
    }),
    ("checklist_score", |t| PerTask::new(t.checklist_score, 1.0)),
    ("well_formed_call_share", |t| {
        PerTask::new(f64::from(t.well_formed_turns), f64::from(t.act_turns))
    }),
    ("malformed_share", |t| {
        PerTask::new(f64::from(t.malformed_turns), f64::from(t.act_turns))
    }),
    ("tool_name_accuracy", |t| {
        PerTask::new(f64::from(t.name_matches), f64::from(t.expected_calls))
    }),
    ("argument_accuracy", |t| {
        PerTask::new(f64::from(t.exact_matches), f64::from(t.expected_calls))
    }),
];

impl EvalMetrics {
    /// Every metric of `per_task` with its interval (bootstrap seed 0).
    pub fn from_tasks(per_task: &[TaskResult]) -> Self {
        let mut m = EvalMetrics::default();
        for (name, read) in METRICS {
            let values: Vec<PerTask> = per_task.iter().map(read).collect();
            *m.get_mut(name) = crate::stats::bootstrap(&values, 0);
        }
        m
    }

    /// The interval of metric `name` (one of [`METRICS`]); NaN for another name.
    pub fn get(&self, name: &str) -> Interval {
        match name {
            "task_success" => self.task_success,
            "turn_success" => self.turn_success,
            "checklist_score" => self.checklist_score,
            "well_formed_call_share" => self.well_formed_call_share,
            "malformed_share" => self.malformed_share,
            "tool_name_accuracy" => self.tool_name_accuracy,
            "argument_accuracy" => self.argument_accuracy,
            _ => Interval::NAN,
        }
    }

    fn get_mut(&mut self, name: &str) -> &mut Interval {
        match name {
            "task_success" => &mut self.task_success,
            "turn_success" => &mut self.turn_success,
            "checklist_score" => &mut self.checklist_score,
            "well_formed_call_share" => &mut self.well_formed_call_share,
            "malformed_share" => &mut self.malformed_share,
            "tool_name_accuracy" => &mut self.tool_name_accuracy,
            _ => &mut self.argument_accuracy,
        }
    }
}

/// How well the Rehearse role predicts real results: its outputs for real calls of held-out
/// ground-truth replays, compared with the real results.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FidelityReport {
    /// Calls predicted, over this many tasks.
    pub calls: u64,
    pub tasks: u64,
    /// The output parses in the protocol's format as a JSON object or array.
    pub valid_json: Interval,
    /// …and has the real result's shape: the same keys (objects) or length (arrays).
    pub same_keys: Interval,
    /// …and equals the real result (JSON equality).
    pub equal_values: Interval,
    /// The same per class of the called function: (calls, valid, same keys, equal values).
    pub per_class: BTreeMap<String, FidelityCounts>,
    /// Real environment calls of the ground-truth replays (evaluation only; never trained on).
    pub real_env_calls: u64,
    /// Tokens processed (prompt + completion).
    pub tokens: u64,
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub wall_s: f64,
    /// Every call: what was predicted and what was real.
    pub per_call: Vec<FidelityCall>,
}

/// Counts of one class's calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct FidelityCounts {
    pub calls: u64,
    pub valid_json: u64,
    pub same_keys: u64,
    pub equal_values: u64,
}

/// One predicted call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FidelityCall {
    pub task: String,
    pub tool: String,
    pub class: String,
    pub valid_json: bool,
    pub same_keys: bool,
    pub equal_values: bool,
    /// The Rehearse output (first 300 characters) and the real result (the same).
    pub predicted: String,
    pub real: String,
}

/// The paired comparisons the report makes: (a, b) gives `b − a` on their common tasks.
pub const COMPARISONS: [(&str, &str); 2] =
    [(VARIANT_BASE, VARIANT_SFT), (VARIANT_SFT, VARIANT_ENVACE)];

/// `b − a` for every metric on the tasks both variants were evaluated on, with its paired
/// bootstrap interval.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Comparison {
    pub a: String,
    pub b: String,
    /// Tasks in common (compared task by task).
    pub tasks: u64,
    /// Metric name → `b − a` with its interval.
    pub differences: BTreeMap<String, Interval>,
    /// `b − a` of the Rehearse role's exact-value fidelity, paired by task.
    pub fidelity_equal_values: Interval,
}

/// Outcome of one evaluated task.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TaskResult {
    /// Task id.
    pub task: String,
    /// Whether every turn passed.
    pub success: bool,
    /// User turns passed.
    pub turns_passed: u32,
    /// User turns in the task.
    pub turns: u32,
    /// Why the episode ended (e.g. `done`, `max_steps`, `context`).
    pub termination: String,
    /// Reward of the episode under the evaluation judge (BFCL's checker).
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub reward: f64,
    /// The dense checklist judge's reward of the same transcript, in [0, 1].
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub checklist_score: f64,
    /// Act turns (generations) played, those with at least one well-formed tool call, and
    /// those with a malformed block.
    pub act_turns: u32,
    pub well_formed_turns: u32,
    pub malformed_turns: u32,
    /// Ground-truth calls of all the task's user turns, those matched one-to-one by a call
    /// with the same name, and those matched with exactly the same arguments (unreached turns
    /// count as unmatched).
    pub expected_calls: u32,
    pub name_matches: u32,
    pub exact_matches: u32,
    /// Rehearse fidelity on this task's real calls: (calls, equal values).
    pub fidelity_calls: u32,
    pub fidelity_equal: u32,
}

/// serde_json writes NaN and ±inf as `null`; read `null` back as NaN so a saved report loads.
pub(crate) fn f64_nan_if_null<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// [`f64_nan_if_null`] for the values of a map.
fn f64_map_nan_if_null<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, f64>, D::Error> {
    let raw = BTreeMap::<String, Option<f64>>::deserialize(d)?;
    Ok(raw
        .into_iter()
        .map(|(k, v)| (k, v.unwrap_or(f64::NAN)))
        .collect())
}

impl RunReport {
    /// An empty report for `preset` and `model`, stamped with the current time.
    pub fn new(preset: &str, model: &str) -> Self {
        Self {
            preset: preset.to_string(),
            model: model.to_string(),
            created_unix_s: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            ..Default::default()
        }
    }

    /// Path of the report inside run directory `dir`.
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(REPORT_FILE)
    }

    /// Loads `DIR/report.json`, or starts a [`RunReport::new`] one if the file does not exist.
    ///
    /// A loaded report keeps its stages, variants and creation time; `preset` and `model` are
    /// set to the given values, since the stage now running is what the report describes.
    /// A file that exists but does not parse is an error naming the path, never overwritten.
    pub fn load_or_new(dir: &Path, preset: &str, model: &str) -> Result<Self, ReportError> {
        let path = Self::path(dir);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Self::new(preset, model))
            }
            Err(source) => return Err(ReportError::Io { path, source }),
        };
        let mut report: Self = serde_json::from_slice(&bytes)
            .map_err(|source| ReportError::Corrupt { path, source })?;
        report.preset = preset.to_string();
        report.model = model.to_string();
        Ok(report)
    }

    /// Writes the report to `DIR/report.json` atomically (a temporary file in `dir`, synced,
    /// then renamed over the old one), creating `dir` if needed. A crash mid-save leaves the
    /// previous report intact.
    pub fn save(&self, dir: &Path) -> Result<(), ReportError> {
        let path = Self::path(dir);
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ReportError::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let mut json =
            serde_json::to_vec_pretty(self).map_err(|source| ReportError::Serialize {
                path: path.clone(),
                source,
            })?;
        json.push(b'\n');
        let tmp = dir.join(format!(".{REPORT_FILE}.{}.tmp", std::process::id()));
        let written = std::fs::File::create(&tmp).and_then(|mut f| {
            f.write_all(&json)?;
            f.sync_all()
        });
        if let Err(source) = written {
            std::fs::remove_file(&tmp).ok();
            return Err(ReportError::Io { path: tmp, source });
        }
        std::fs::rename(&tmp, &path).map_err(|source| {
            std::fs::remove_file(&tmp).ok();
            ReportError::Io {
                path: path.clone(),
                source,
            }
        })
    }

    /// Recomputes [`RunReport::comparisons`] from the variants evaluated so far: for each pair
    /// of [`COMPARISONS`] both evaluated, `b − a` of every metric on their common tasks (by
    /// task id), paired bootstrap seed 0.
    pub fn update_comparisons(&mut self) {
        self.comparisons.clear();
        for (a, b) in COMPARISONS {
            let (Some(ea), Some(eb)) = (self.variants.get(a), self.variants.get(b)) else {
                continue;
            };
            let by_id: BTreeMap<&str, &TaskResult> =
                eb.per_task.iter().map(|t| (t.task.as_str(), t)).collect();
            let pairs: Vec<(&TaskResult, &TaskResult)> = ea
                .per_task
                .iter()
                .filter_map(|t| by_id.get(t.task.as_str()).map(|u| (t, *u)))
                .collect();
            let sides = |read: fn(&TaskResult) -> PerTask| {
                let a: Vec<PerTask> = pairs.iter().map(|p| read(p.0)).collect();
                let b: Vec<PerTask> = pairs.iter().map(|p| read(p.1)).collect();
                (a, b)
            };
            let mut c = Comparison {
                a: a.into(),
                b: b.into(),
                tasks: pairs.len() as u64,
                ..Comparison::default()
            };
            for (name, read) in METRICS {
                let (va, vb) = sides(read);
                c.differences
                    .insert(name.into(), crate::stats::paired_difference(&va, &vb, 0));
            }
            if ea.fidelity.is_some() && eb.fidelity.is_some() {
                let (va, vb) = sides(|t| {
                    PerTask::new(f64::from(t.fidelity_equal), f64::from(t.fidelity_calls))
                });
                c.fidelity_equal_values = crate::stats::paired_difference(&va, &vb, 0);
            }
            self.comparisons.insert(format!("{b} - {a}"), c);
        }
    }

    /// A plain-text summary: every metric per variant with its 95 % interval, the paired
    /// differences, the warm-up and training in brief, cost per stage, and the
    /// real-environment calls EnvACE training needed. Missing variants and stages show as `-`.
    pub fn summary_table(&self) -> String {
        let mut variants = new_table([
            "model",
            "tasks",
            "task success %",
            "turn success %",
            "checklist score %",
            "turns with a well-formed call %",
            "turns with a malformed block %",
            "tool-name acc %",
            "argument acc %",
            "rehearse fidelity (exact) %",
        ]);
        for (key, label) in [
            (VARIANT_BASE, "base"),
            (VARIANT_SFT, "after warm-up (sft)"),
            (VARIANT_ENVACE, "after EnvACE training (envace)"),
        ] {
            let Some(e) = self.variants.get(key) else {
                let mut row = vec![label.to_string()];
                row.extend(std::iter::repeat_n("-".to_string(), 9));
                variants.add_row(row);
                continue;
            };
            let mut row = vec![label.to_string(), e.tasks.to_string()];
            row.extend(
                METRICS
                    .iter()
                    .map(|(name, _)| e.metrics.get(name).display(true)),
            );
            row.push(
                e.fidelity
                    .as_ref()
                    .map_or("-".into(), |f| f.equal_values.display(true)),
            );
            variants.add_row(row);
        }

        let mut out = format!(
            "Evaluation on the {} split, each metric with its bootstrap 95 % interval over \
             tasks:\n\n{variants}\n",
            self.variants
                .values()
                .next()
                .map_or("test", |e| e.split.as_str())
        );
        if !self.comparisons.is_empty() {
            let mut header = vec!["paired difference (percentage points)".to_string()];
            let keys: Vec<&String> = COMPARISONS
                .iter()
                .filter_map(|(a, b)| self.comparisons.get_key_value(&format!("{b} - {a}")))
                .map(|(k, _)| k)
                .collect();
            header.extend(keys.iter().map(|k| {
                let c = &self.comparisons[*k];
                format!("{} ({} tasks)", k, c.tasks)
            }));
            let mut diffs = Table::new();
            diffs.load_preset(ASCII_MARKDOWN).set_header(header);
            for (name, _) in METRICS {
                let mut row = vec![name.to_string()];
                for k in &keys {
                    row.push(mark(self.comparisons[*k].differences.get(name).copied()));
                }
                diffs.add_row(row);
            }
            let mut row = vec!["rehearse fidelity (exact)".to_string()];
            for k in &keys {
                row.push(mark(Some(self.comparisons[*k].fidelity_equal_values)));
            }
            diffs.add_row(row);
            out.push_str(&format!("\n{diffs}\n(* : the 95 % interval excludes 0)\n"));
        }
        if !self.sft.per_role.is_empty() {
            let mut sft = new_table([
                "warm-up role",
                "rows",
                "prompt tokens",
                "completion tokens",
                "truncated rows",
                "loss first epoch",
                "loss last epoch",
            ]);
            for (role, r) in &self.sft.per_role {
                sft.add_row(vec![
                    role.to_string(),
                    r.rows.to_string(),
                    r.prompt_tokens.to_string(),
                    r.completion_tokens.to_string(),
                    r.truncated_rows.to_string(),
                    format!("{:.3}", r.loss_first_epoch),
                    format!("{:.3}", r.loss_last_epoch),
                ]);
            }
            out.push_str(&format!(
                "\nWarm-up: {} of {} train seeds, {} epoch(s), {} steps\n\n{sft}\n",
                self.sft.seeds_used,
                self.sft.seeds_available,
                self.sft.epochs,
                self.sft.steps.len()
            ));
        }
        if !self.train.steps.is_empty() {
            out.push_str(&format!("\n{}\n", self.train.summary()));
        }

        let mut stages = new_table(["stage", "wall s", "tokens", "real env calls"]);
        let known = STAGE_ORDER.iter().filter_map(|&name| {
            self.stages
                .get_key_value(name)
                .map(|(k, v)| (k.as_str(), v))
        });
        let others = self
            .stages
            .iter()
            .filter(|(k, _)| !STAGE_ORDER.contains(&k.as_str()))
            .map(|(k, v)| (k.as_str(), v));
        for (name, s) in known.chain(others) {
            stages.add_row(vec![
                name.to_string(),
                format!("{:.1}", s.wall_s),
                s.tokens.to_string(),
                s.real_env_calls.to_string(),
            ]);
        }
        out.push_str(&format!(
            "\n{stages}\n\nreal env calls during training: {}\n",
            self.train.real_env_calls
        ));
        out
    }
}

impl TrainReport {
    /// One paragraph on the training steps: how many changed the weights, informative groups,
    /// grad norms, rewards per role first and last.
    pub fn summary(&self) -> String {
        let n = self.steps.len();
        let skipped = self.steps.iter().filter(|s| s.skipped).count();
        let groups: u64 = self.steps.iter().map(|s| s.groups).sum();
        let zero: u64 = self.steps.iter().map(|s| s.zero_variance_groups).sum();
        let trained: Vec<&StepMetrics> = self.steps.iter().filter(|s| !s.skipped).collect();
        let failed: u64 = self.steps.iter().map(|s| s.failed_trajectories).sum();
        let failed = if failed == 0 {
            String::new()
        } else {
            format!(" {failed} rollouts failed and lost their rows (see failures per step).")
        };
        let judges: String = self
            .judges
            .iter()
            .map(|j| format!(" Judge {} from step {}.", j.judge, j.step))
            .collect();
        let min_grad = trained
            .iter()
            .map(|s| s.grad_norm)
            .fold(f64::INFINITY, f64::min);
        let reward = |s: Option<&StepMetrics>, f: fn(&StepMetrics) -> f64| {
            s.map_or("-".to_string(), |s| format!("{:.3}", f(s)))
        };
        format!(
            "Training: {n} steps, {} updated the weights and {skipped} were skipped (no group \
             with a reward spread); {zero} of {groups} groups had zero variance; smallest grad \
             norm of an update {}; reward act {} -> {}, rehearse {} -> {} (first -> last \
             step).{failed}{judges}",
            n - skipped,
            if trained.is_empty() {
                "-".to_string()
            } else {
                format!("{min_grad:.3e}")
            },
            reward(self.steps.first(), |s| s.reward_mean_act),
            reward(self.steps.last(), |s| s.reward_mean_act),
            reward(self.steps.first(), |s| s.reward_mean_rehearse),
            reward(self.steps.last(), |s| s.reward_mean_rehearse),
        )
    }
}

/// An interval in percentage points, starred when it excludes 0.
fn mark(ci: Option<Interval>) -> String {
    match ci {
        Some(ci) if ci.estimate.is_finite() => {
            let star = if ci.low > 0.0 || ci.high < 0.0 {
                " *"
            } else {
                ""
            };
            format!(
                "{:+.1} [{:+.1}, {:+.1}]{star}",
                100.0 * ci.estimate,
                100.0 * ci.low,
                100.0 * ci.high
            )
        }
        _ => "-".into(),
    }
}

/// A table in Markdown-compatible ASCII with numeric columns right-aligned.
fn new_table<const N: usize>(header: [&str; N]) -> Table {
    let mut table = Table::new();
    table.load_preset(ASCII_MARKDOWN).set_header(header);
    for i in 1..N {
        if let Some(column) = table.column_mut(i) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh, empty directory under the system temp dir, unique to this test and process.
    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("envace-report-{name}-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        std::fs::create_dir_all(&dir).expect("create temp dir");
        dir
    }

    fn sample() -> RunReport {
        let mut r = RunReport::new("tiny", "smollm2-135m");
        r.budgets = serde_json::json!({"train_steps": 5, "group_size": 4});
        r.stages.insert(
            STAGE_COLLECT.into(),
            StageReport {
                wall_s: 12.3,
                tokens: 4321,
                generated_tokens: 1000,
                real_env_calls: 77,
                items: 8,
            },
        );
        r.stages.insert(
            STAGE_TRAIN.into(),
            StageReport {
                wall_s: 90.5,
                tokens: 98765,
                real_env_calls: 123,
                items: 5,
                ..Default::default()
            },
        );
        r.train.real_env_calls = 123;
        r.train.steps = (0..3)
            .map(|i| StepMetrics {
                step: i,
                policy_version: i,
                reward_mean: 0.1 * i as f64,
                loss: 1.0 / (i + 1) as f64,
                kl: if i == 0 { f64::NAN } else { 0.01 },
                ..Default::default()
            })
            .collect();
        // Eight tasks: one of them solved by base, three by envace; each task has 2 turns and
        // 2 Act turns; envace writes a well-formed call in every Act turn, base in none.
        for (key, solved) in [(VARIANT_BASE, 1usize), (VARIANT_ENVACE, 3)] {
            let per_task: Vec<TaskResult> = (0..8)
                .map(|i| TaskResult {
                    task: format!("multi_turn_base_{i}"),
                    success: i < solved,
                    turns_passed: if i < solved { 2 } else { 0 },
                    turns: 2,
                    termination: "done".into(),
                    reward: 1.0,
                    checklist_score: if i < solved { 1.0 } else { 0.25 },
                    act_turns: 2,
                    well_formed_turns: if key == VARIANT_ENVACE { 2 } else { 0 },
                    ..Default::default()
                })
                .collect();
            let metrics = EvalMetrics::from_tasks(&per_task);
            r.variants.insert(
                key.into(),
                EvalReport {
                    split: "test".into(),
                    tasks: 8,
                    task_success: metrics.task_success.estimate,
                    turn_success: metrics.turn_success.estimate,
                    turns: 16,
                    metrics,
                    per_task,
                    ..Default::default()
                },
            );
        }
        r.metrics.insert("reward_mean{role=act}".into(), 0.5);
        r.metrics.insert("nan_gauge".into(), f64::NAN);
        r.tts.push(serde_json::json!({"k": 4, "task_success": 0.5}));
        r
    }

    /// Equality that treats NaN as equal to NaN, via the JSON form (where NaN is `null`).
    fn assert_same(a: &RunReport, b: &RunReport) {
        assert_eq!(
            serde_json::to_value(a).expect("serialise"),
            serde_json::to_value(b).expect("serialise")
        );
    }

    #[test]
    fn report_json_round_trip_keeps_nan_as_nan() {
        let r = sample();
        let json = serde_json::to_string(&r).expect("serialise");
        let back: RunReport = serde_json::from_str(&json).expect("deserialise");
        assert_same(&r, &back);
        assert!(back.train.steps[0].kl.is_nan());
        assert_eq!(back.train.steps[1].kl, 0.01);
        assert!(back.metrics["nan_gauge"].is_nan());
        assert_eq!(back.variants[VARIANT_ENVACE].per_task[0].turns_passed, 2);
        let (m, back_m) = (
            &r.variants[VARIANT_ENVACE].metrics,
            &back.variants[VARIANT_ENVACE].metrics,
        );
        assert_eq!(back_m.checklist_score, m.checklist_score);
        assert!(
            back_m.tool_name_accuracy.estimate.is_nan(),
            "no expected calls: NaN"
        );
    }

    #[test]
    fn report_partial_json_loads_with_defaults() {
        let back: RunReport =
            serde_json::from_str(r#"{"preset":"tiny","stages":{"sft":{"wall_s":3.5}}}"#)
                .expect("partial report");
        assert_eq!(back.preset, "tiny");
        assert_eq!(back.stages[STAGE_SFT].wall_s, 3.5);
        assert_eq!(back.stages[STAGE_SFT].tokens, 0);
        assert!(back.train.steps.is_empty());
        assert!(back.budgets.is_null());
    }

    #[test]
    fn report_save_then_load_or_new_gives_same_report() {
        let dir = temp_dir("save");
        let fresh = RunReport::load_or_new(&dir, "tiny", "m").expect("new");
        assert!(fresh.stages.is_empty());
        assert!(fresh.created_unix_s > 0);

        let r = sample();
        r.save(&dir).expect("save");
        // Saving again replaces the file in place and leaves no temporary file behind.
        r.save(&dir).expect("save again");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(REPORT_FILE)]);

        let back = RunReport::load_or_new(&dir, &r.preset, &r.model).expect("load");
        assert_same(&r, &back);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn report_save_creates_missing_dir() {
        let dir = temp_dir("mkdir").join("nested/run");
        sample().save(&dir).expect("save into new dir");
        assert!(RunReport::path(&dir).is_file());
        std::fs::remove_dir_all(dir.parent().and_then(Path::parent).expect("root")).ok();
    }

    #[test]
    fn report_corrupt_file_is_an_error_naming_the_path() {
        let dir = temp_dir("corrupt");
        let path = RunReport::path(&dir);
        std::fs::write(&path, b"{\"preset\": \"tiny\", \"stages\": [").expect("write");
        let err = RunReport::load_or_new(&dir, "tiny", "m").expect_err("corrupt must fail");
        assert!(matches!(err, ReportError::Corrupt { .. }), "{err:?}");
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
        // The corrupt file is left for the user to inspect.
        assert!(path.is_file());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn report_summary_table_contains_the_numbers() {
        let table = sample().summary_table();
        println!("{table}");
        for needle in [
            "base",
            "after warm-up (sft)",
            "after EnvACE training (envace)",
            // Task success 1/8 and 3/8, the checklist score 0.25 + 0.75/8 and 0.25 + 2.25/8.
            "12.5 [",
            "37.5 [",
            "34.4 [",
            "53.1 [",
            "100.0 [100.0, 100.0]",
            "collect",
            "12.3",
            "4321",
            "77",
            "train",
            "90.5",
            "98765",
            "real env calls during training: 123",
        ] {
            assert!(table.contains(needle), "missing {needle:?} in\n{table}");
        }
        // Stages follow pipeline order, not alphabetical order.
        let collect = table.find("| collect").expect("collect row");
        let train = table.find("| train").expect("train row");
        assert!(collect < train);
        // The sft variant was not evaluated: its row shows dashes, and no comparison with it.
        let sft_row = table
            .lines()
            .find(|l| l.contains("after warm-up (sft)"))
            .expect("sft row");
        assert!(sft_row.contains('-'), "{sft_row}");
        assert!(!table.contains("sft - base"), "{table}");
    }

    #[test]
    fn comparisons_pair_tasks_and_star_intervals_that_exclude_zero() {
        let mut r = sample();
        let mut sft = r.variants[VARIANT_ENVACE].clone();
        // Each task's checklist score 0.1 below its base score (the scores differ between
        // tasks), listed in another order: only pairing by task id gives a constant -0.1.
        let base: BTreeMap<String, f64> = r.variants[VARIANT_BASE]
            .per_task
            .iter()
            .map(|t| (t.task.clone(), t.checklist_score))
            .collect();
        for t in &mut sft.per_task {
            t.checklist_score = base[&t.task] - 0.1;
        }
        sft.per_task.reverse();
        r.variants.insert(VARIANT_SFT.into(), sft);
        r.update_comparisons();
        let c = &r.comparisons["sft - base"];
        assert_eq!((c.a.as_str(), c.b.as_str(), c.tasks), ("base", "sft", 8));
        // Every task gains a full well-formed share: the paired difference is exactly +1.
        let wf = c.differences["well_formed_call_share"];
        assert_eq!((wf.estimate, wf.low, wf.high), (1.0, 1.0, 1.0));
        let cs = c.differences["checklist_score"];
        for v in [cs.estimate, cs.low, cs.high] {
            assert!((v + 0.1).abs() < 1e-12, "{cs:?}");
        }
        let ts = c.differences["task_success"];
        assert!((ts.estimate - 0.25).abs() < 1e-12);
        assert!(r.comparisons["envace - sft"].differences["task_success"].estimate == 0.0);
        let table = r.summary_table();
        assert!(table.contains("+100.0 [+100.0, +100.0] *"), "{table}");
        let order = |k: &str| table.find(k).expect(k);
        assert!(order("sft - base") < order("envace - sft"));
    }

    #[test]
    fn the_training_summary_counts_failed_rollouts_and_the_report_keeps_their_reasons() {
        let train = TrainReport {
            steps: vec![
                StepMetrics {
                    step: 0,
                    ..Default::default()
                },
                StepMetrics {
                    step: 1,
                    failed_trajectories: 3,
                    failures: [("episode failed: acting worker crashed".to_string(), 3)]
                        .into_iter()
                        .collect(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let text = train.summary();
        assert!(
            text.contains("3 rollouts failed and lost their rows"),
            "{text}"
        );
        assert!(!TrainReport::default().summary().contains("failed"));
        let json = serde_json::to_value(&train).unwrap();
        assert_eq!(
            json["steps"][1]["failures"]["episode failed: acting worker crashed"],
            3
        );
        assert_eq!(json["steps"][0]["failed_trajectories"], 0);
    }

    #[test]
    fn report_summary_table_of_empty_report() {
        let table = RunReport::new("tiny", "m").summary_table();
        assert!(
            table.contains("real env calls during training: 0"),
            "{table}"
        );
    }
}
