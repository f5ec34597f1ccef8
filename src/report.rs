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
pub const STAGE_ORDER: [&str; 4] = [STAGE_COLLECT, STAGE_SFT, STAGE_TRAIN, STAGE_EVAL];

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
    /// The EnvACE training curve.
    pub train: TrainReport,
    /// Evaluation results per model variant ([`VARIANT_BASE`], [`VARIANT_SFT`],
    /// [`VARIANT_ENVACE`]).
    pub variants: BTreeMap<String, EvalReport>,
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

/// The EnvACE training stage: real-environment cost and per-step metrics.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TrainReport {
    /// Calls made to the real environment during training, all steps together.
    pub real_env_calls: u64,
    /// One entry per optimiser step, in order.
    pub steps: Vec<StepMetrics>,
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
    /// Throughput of the step, tokens per second of wall-clock time.
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub tokens_per_s: f64,
    /// Act rows in the batch.
    pub rows_act: u64,
    /// Rehearse rows in the batch.
    pub rows_rehearse: u64,
    /// Trajectories rolled out for the step.
    pub trajectories: u64,
    /// Calls made to the real environment during the step.
    pub real_env_calls: u64,
    /// Wall-clock time of the step (rollout + update), seconds.
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub wall_s: f64,
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
    /// Calls made to the real environment.
    pub real_env_calls: u64,
    /// Tokens processed (prompt + completion).
    pub tokens: u64,
    /// Wall-clock time of the evaluation, seconds.
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub wall_s: f64,
    /// One entry per task, in evaluation order.
    pub per_task: Vec<TaskResult>,
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
    /// Reward of the episode.
    #[serde(deserialize_with = "f64_nan_if_null")]
    pub reward: f64,
}

/// serde_json writes NaN and ±inf as `null`; read `null` back as NaN so a saved report loads.
fn f64_nan_if_null<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
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

    /// A plain-text summary: success per variant, cost per stage, and the real-environment
    /// calls EnvACE training needed. Missing variants and stages show as `-`.
    pub fn summary_table(&self) -> String {
        let mut variants = new_table(["model", "test task success", "turn success", "tasks"]);
        for (key, label) in [
            (VARIANT_BASE, "base"),
            (VARIANT_SFT, "after warm-up (sft)"),
            (VARIANT_ENVACE, "after EnvACE training (envace)"),
        ] {
            match self.variants.get(key) {
                Some(e) => variants.add_row(vec![
                    label.to_string(),
                    percent(e.task_success),
                    percent(e.turn_success),
                    e.tasks.to_string(),
                ]),
                None => variants.add_row(vec![label, "-", "-", "-"]),
            };
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

        format!(
            "{variants}\n\n{stages}\n\nreal env calls during training: {}\n",
            self.train.real_env_calls
        )
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

/// A fraction in [0, 1] as a percentage with one decimal; non-finite values as `-`.
fn percent(fraction: f64) -> String {
    if fraction.is_finite() {
        format!("{:.1}%", fraction * 100.0)
    } else {
        "-".to_string()
    }
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
        for (key, success) in [(VARIANT_BASE, 0.125), (VARIANT_ENVACE, 0.375)] {
            r.variants.insert(
                key.into(),
                EvalReport {
                    split: "test".into(),
                    tasks: 16,
                    task_success: success,
                    turn_success: 0.5,
                    turns: 40,
                    per_task: vec![TaskResult {
                        task: "multi_turn_base_0".into(),
                        success: true,
                        turns_passed: 3,
                        turns: 3,
                        termination: "done".into(),
                        reward: 1.0,
                    }],
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
        assert_eq!(back.variants[VARIANT_ENVACE].per_task[0].turns_passed, 3);
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
            "12.5%",
            "37.5%",
            "50.0%",
            "16",
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
        let collect = table.find("collect").expect("collect row");
        let train = table.find("| train").expect("train row");
        assert!(collect < train);
        // The sft variant was not evaluated: its row shows dashes.
        let sft_row = table
            .lines()
            .find(|l| l.contains("after warm-up (sft)"))
            .expect("sft row");
        assert!(sft_row.contains('-'), "{sft_row}");
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
