//! The EnvACE pipeline on actors: seed collection, supervised warm-up, self-rehearsal role-wise
//! GRPO (zero real environment calls) and real-environment evaluation, on the task suite the
//! config names (`environment`, default BFCL `multi_turn_base` with its fixed train/test split;
//! [`crate::suite`]).
//!
//! A [`Pipeline`] owns one run folder: `config.toml`, `db/` (sled: tasks, seeds, trajectories,
//! run state, checkpoint records), `checkpoints/` (safetensors weights), `report.json` and
//! `training.png`. Every stage adds its numbers to the report and saves it, so a stopped run
//! keeps what it measured and `train` resumes from the run state in sled.

mod bench;
mod collect;
pub mod control;
mod eval;
pub mod fidelity;
pub mod seed_rows;
mod sft;
mod train;
pub mod train_loop;
mod tts;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::actors::learner_actor::LearnerMsg;
use crate::actors::memory_actor::MemoryMsg;
use crate::actors::protocol::{PromptKit, SeedPool};
use crate::actors::slot::Slot;
use crate::actors::topology::{Topology, TopologyBuilder};
use crate::actors::worker::WorkerHandle;
use crate::config::RunConfig;
use crate::kernels::{load, ModelSource};
use crate::registry::JudgeContext;
use crate::report::{RunReport, StageReport};
use crate::run_folder::{config_changes, config_hash, RunLock};
use crate::runtime::resolve;
use crate::storage::{Checkpoint, Store, StoreOptions};
use crate::suite::{split_of, TaskSuite};
use crate::telemetry::{install_metrics_recorder, MetricsHandle};

pub use bench::{peak_rss_mib, reset_peak_rss, PhaseCost, ReplayBench, RolloutBench};
pub use eval::{task_result, Variant};
pub use sft::{fit_to_context, stratified_seeds};
pub use tts::{tts_table, TtsConfig, TtsResult, TtsSpec};

/// The run name of self-rehearsal training in sled (trajectories, run state, checkpoints).
pub const TRAIN_RUN: &str = "envace";
/// The run name of the warm-up's checkpoint record.
pub const SFT_RUN: &str = "sft";

/// One run folder with its model, actors, store and report.
pub struct Pipeline {
    pub cfg: RunConfig,
    pub dir: PathBuf,
    pub store: Arc<Store>,
    /// The run's tasks, real environment and evaluation judge (`environment` in the config).
    pub suite: Arc<dyn TaskSuite>,
    pub topology: Topology,
    pub report: RunReport,
    pub metrics: MetricsHandle,
    /// [`config_hash`] of `cfg`: what the run states this process commits record.
    pub config_hash: String,
    /// Resume a run whose recorded config hash differs from `cfg`'s.
    pub allow_config_change: bool,
    /// Held until the pipeline is dropped: no other process works in `dir` meanwhile.
    _lock: RunLock,
}

/// How [`Pipeline::open_with`] treats the run folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunOpen {
    /// Create the folder if it is missing and record `cfg` as its `config.toml` (the stages
    /// that start or continue a run: collect, sft, train, demo). Without it (eval, tts-table)
    /// the folder must hold a run already and its `config.toml` is left as it is.
    pub create: bool,
    /// Remove the folder's database, checkpoints, report and plot first (once the lock is
    /// held).
    pub fresh: bool,
    /// Continue a run although `cfg` changes keys outside
    /// [`RESUME_SAFE`](crate::run_folder::RESUME_SAFE) (else that is refused, naming them).
    pub allow_config_change: bool,
}

impl RunOpen {
    /// Start or continue a run: create, no fresh start, config changes refused.
    pub const START: RunOpen = RunOpen {
        create: true,
        fresh: false,
        allow_config_change: false,
    };
}

/// What `--fresh` removes from a run folder.
const FRESH_PARTS: [&str; 7] = [
    "db",
    "checkpoints",
    "report.json",
    "training.png",
    "config.toml",
    control::HISTORY_FILE,
    control::ADDED_TASKS_DIR,
];

impl Pipeline {
    /// [`Pipeline::open_with`] with [`RunOpen::START`].
    ///
    /// # Errors
    /// As [`Pipeline::open_with`].
    pub async fn open(cfg: RunConfig, dir: &Path, preset: &str) -> Result<Self> {
        Self::open_with(cfg, dir, preset, RunOpen::START).await
    }

    /// Takes the run folder `dir` ([`RunLock`], before anything there is read or changed),
    /// applies `how`, loads the model and starts the actors.
    ///
    /// # Errors
    /// Another process holds the folder; without `how.create`, `dir` holds no run; with it,
    /// `cfg` changes the keys of a run already in `dir` (the message lists them) and
    /// `how.allow_config_change` is off; `cfg.judge` or `cfg.environment` is not in the
    /// registry ([`crate::registry`]); the model, the suite or the store cannot be loaded, or an
    /// actor does not start.
    pub async fn open_with(cfg: RunConfig, dir: &Path, preset: &str, how: RunOpen) -> Result<Self> {
        // A judge name that is not registered fails before anything is loaded or written.
        let registry = crate::registry::installed();
        registry.check_judge(cfg.judge.as_str())?;
        registry.check_suite(cfg.environment.as_str())?;
        let config_file = dir.join("config.toml");
        if how.create {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        } else if !config_file.exists() || !dir.join("db").exists() {
            bail!(
                "no run at {}: start one with `envace demo --out {0}` (or `envace collect`)",
                dir.display()
            );
        }
        let lock = RunLock::acquire(dir)?;
        if how.fresh {
            for part in FRESH_PARTS {
                let path = dir.join(part);
                let removed = if path.is_dir() {
                    std::fs::remove_dir_all(&path)
                } else if path.exists() {
                    std::fs::remove_file(&path)
                } else {
                    Ok(())
                };
                removed.with_context(|| format!("removing {}", path.display()))?;
            }
        }
        let toml_text = cfg.to_toml();
        let config_hash = config_hash(&toml_text)?;
        if how.create {
            if config_file.exists() && dir.join("db").exists() {
                let old = std::fs::read_to_string(&config_file)
                    .with_context(|| format!("reading {}", config_file.display()))?;
                let changes = config_changes(&old, &toml_text)?;
                if !changes.is_empty() {
                    if !how.allow_config_change {
                        bail!(
                            "the config differs from the run in {} in {} key(s):\n  {}\nresume \
                             with the run's own config (leave out --preset and --config), pass \
                             --allow-config-change to go on with the new one, or --fresh to \
                             start over",
                            dir.display(),
                            changes.len(),
                            changes.join("\n  ")
                        );
                    }
                    eprintln!(
                        "warning: continuing the run in {} with a changed config \
                         (--allow-config-change):\n  {}",
                        dir.display(),
                        changes.join("\n  ")
                    );
                }
            }
            // The same durable, atomic replacement as the checkpoints.
            crate::kernels::model::write_atomically(&config_file, |tmp| {
                std::fs::write(tmp, &toml_text).map_err(|source| crate::kernels::Error::Io {
                    path: tmp.to_path_buf(),
                    source,
                })
            })
            .with_context(|| format!("writing {}", config_file.display()))?;
        }
        let metrics = install_metrics_recorder();
        let (device, kind) = resolve(cfg.model.device, cfg.model.dtype)?;
        let loaded = load(&ModelSource::parse(&cfg.model.source), device, kind)
            .with_context(|| format!("loading model {}", cfg.model.source))?;
        let kit = Arc::new(
            PromptKit::new(loaded.tokenizer.clone(), loaded.chat_template)
                .context("building the prompt kit")?,
        );
        let context = loaded.model.config().max_position_embeddings;
        for (key, n) in [
            ("rollout.act_max_new_tokens", cfg.rollout.act_max_new_tokens),
            (
                "rollout.rehearse_max_new_tokens",
                cfg.rollout.rehearse_max_new_tokens,
            ),
            ("eval.act_max_new_tokens", cfg.eval.act_max_new_tokens),
        ] {
            if n >= context {
                bail!(
                    "{key} = {n}: must be below the model's context of {context} tokens (a \
                     turn needs room for its prompt)"
                );
            }
        }
        let worker = WorkerHandle::spawn(loaded.model, loaded.tokenizer, cfg.engine.clone());
        let store = Arc::new(
            Store::open(dir.join("db"), StoreOptions::default())
                .with_context(|| format!("opening {}", dir.join("db").display()))?,
        );
        let suite = registry.suite(cfg.environment.as_str())?;
        let judge = registry.judge(
            cfg.judge.as_str(),
            &JudgeContext {
                suite: suite.as_ref(),
            },
        )?;
        let topology = TopologyBuilder::new(worker, kit, store.clone())
            .spec(cfg.topology)
            .judge(judge)
            .environment(suite.environment())
            .protocol_config(&cfg.protocol)
            .start()
            .await?;
        let mut report = RunReport::load_or_new(dir, preset, &cfg.model.source)?;
        if how.create {
            report.budgets = cfg.budgets();
        }
        Ok(Self {
            cfg,
            dir: dir.to_path_buf(),
            store,
            suite,
            topology,
            report,
            metrics,
            config_hash,
            allow_config_change: how.allow_config_change,
            _lock: lock,
        })
    }

    /// Sends `cfg` to the Learner actor, which (re)builds the model thread's learner with it.
    ///
    /// # Errors
    /// The Learner actor is gone, or the config is invalid.
    pub async fn configure_learner(&self, cfg: crate::kernels::LearnerConfig) -> Result<()> {
        let cfg = Box::new(cfg);
        self.topology
            .learner
            .ask("learner", |r| LearnerMsg::Configure(cfg, r))
            .await??;
        Ok(())
    }

    /// The run's control ([`control::Control`]): its history loaded, every task id of the
    /// suite taken.
    ///
    /// # Errors
    /// As [`control::Control::open`].
    pub fn open_control(&self) -> Result<Arc<control::Control>> {
        let ids = self
            .suite
            .tasks(crate::actors::Split::Train)
            .iter()
            .chain(self.suite.tasks(crate::actors::Split::Test))
            .map(|t| t.id.0.clone())
            .collect();
        control::Control::open(&self.dir, self.cfg.judge.as_str(), ids)
    }

    /// The Memory actor.
    pub fn memory(&self) -> &Slot<MemoryMsg> {
        &self.topology.memory
    }

    /// The few-shot fact pool: every stored seed with its task's split.
    ///
    /// # Errors
    /// The store cannot be read.
    pub async fn seed_pool(&self) -> Result<SeedPool> {
        let seeds = self.memory().ask("memory", MemoryMsg::Seeds).await??;
        let pool = seeds
            .into_iter()
            .map(|s| (split_of(self.suite.as_ref(), &s.task), s))
            .collect();
        Ok(SeedPool::new(pool))
    }

    /// Where a checkpoint file of `name` lives: `DIR/checkpoints/NAME.safetensors`.
    pub fn checkpoint_path(&self, name: &str) -> PathBuf {
        self.dir
            .join("checkpoints")
            .join(format!("{name}.safetensors"))
    }

    /// The file a checkpoint record names, in this run folder: `DIR/checkpoints/` and the
    /// record's file name. Records hold paths relative to the run folder ([`recorded_path`]), so
    /// a copied or moved folder and any working directory find their own weights; records
    /// written before held paths relative to the working directory, which this also reads.
    pub fn checkpoint_file(&self, checkpoint: &Checkpoint) -> PathBuf {
        let name = checkpoint.path.file_name().map_or_else(
            || checkpoint.path.clone().into_os_string(),
            |n| n.to_owned(),
        );
        self.dir.join("checkpoints").join(name)
    }

    /// Writes the report (and the training plot) to the run folder.
    ///
    /// # Errors
    /// The files cannot be written.
    pub fn save_report(&mut self) -> Result<()> {
        self.report.metrics = self.metrics.snapshot();
        self.report.save(&self.dir)?;
        crate::plot::plot_training(&self.dir.join("training.png"), &self.report.train)?;
        Ok(())
    }

    /// Records a stage's numbers in the report, then returns the stage's freed memory to the
    /// system ([`crate::runtime::release_free_memory`]).
    pub fn record_stage(&mut self, name: &str, stage: StageReport) {
        tracing::info!(
            stage = name,
            wall_s = stage.wall_s,
            tokens = stage.tokens,
            real_env_calls = stage.real_env_calls,
            "stage done"
        );
        metrics::gauge!("stage_wall_s", "stage" => name.to_string()).set(stage.wall_s);
        self.report.stages.insert(name.to_string(), stage);
        crate::runtime::release_free_memory();
    }

    /// Stops the actors.
    pub fn shutdown(&self) {
        self.topology.stop();
    }

    /// Stops the actors, waits for them to let go of the store (at most 30 s), then releases
    /// the run folder (store and lock): when it returns, the folder can be opened again, by
    /// this process or another.
    pub async fn close(self) {
        self.topology
            .shutdown(std::time::Duration::from_secs(30))
            .await;
    }
}

/// A progress bar for `len` items of a stage (hidden when stderr is not a terminal).
pub fn progress(len: u64, what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len);
    let style = indicatif::ProgressStyle::with_template(
        "{msg:>10} [{bar:30}] {pos}/{len} {elapsed_precise} eta {eta}",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
    .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(what.to_string());
    bar
}

/// Tokens of the rows of `trajectories`: (prompt + completion, completion only).
pub fn row_tokens(trajectories: &[crate::storage::Trajectory]) -> (u64, u64) {
    trajectories
        .iter()
        .flat_map(|t| &t.rows)
        .fold((0, 0), |(all, generated), r| {
            let c = r.completion_ids.len() as u64;
            (all + r.prompt_ids.len() as u64 + c, generated + c)
        })
}

/// Seconds since `start`.
pub fn secs(start: Instant) -> f64 {
    start.elapsed().as_secs_f64()
}

/// The path a checkpoint record stores for the checkpoint file `file`: relative to the run
/// folder (`checkpoints/NAME.safetensors`).
pub fn recorded_path(file: &Path) -> PathBuf {
    Path::new("checkpoints").join(file.file_name().unwrap_or(file.as_os_str()))
}

/// Runs the whole demo: collect → eval(base) → sft → eval(sft) → train → eval(envace), then
/// writes the report and plot and returns the summary table. On a folder that holds a stopped
/// run, the stages already done are not run again: collect when its seeds are stored, an
/// evaluation whose variant the report has on the same tasks (and whose weights did not change
/// since), the warm-up when its checkpoint is committed; training resumes after its last
/// committed step.
///
/// # Errors
/// Any stage's error.
pub async fn demo(p: &mut Pipeline) -> Result<String> {
    let budgets = serde_json::to_string_pretty(&p.cfg.budgets())?;
    eprintln!(
        "envace demo: run folder {}\nbudgets: {budgets}",
        p.dir.display()
    );
    let skip = |p: &Pipeline, stage: &str| {
        eprintln!(
            "demo: {stage} is already done in {} (report.json): not run again",
            p.dir.display()
        );
    };
    if p.report.stages.contains_key("collect") && !p.seed_pool().await?.is_empty() {
        skip(p, "collect");
    } else {
        p.collect().await?;
        p.save_report()?;
    }
    if evaluated(p, Variant::Base)? {
        skip(p, "eval base");
    } else {
        p.eval(Variant::Base, None).await?;
        p.save_report()?;
    }
    let sft_done = p.report.stages.contains_key("sft")
        && match p.last_checkpoint_of(SFT_RUN).await? {
            Some(c) => p.checkpoint_file(&c).exists(),
            None => false,
        };
    if sft_done {
        skip(p, "sft");
        p.load_variant(Variant::Sft).await?;
    } else {
        p.sft().await?;
        p.save_report()?;
    }
    if sft_done && evaluated(p, Variant::Sft)? {
        skip(p, "eval sft");
    } else {
        p.eval(Variant::Sft, None).await?;
        p.save_report()?;
    }
    let steps_before = p.report.train.steps.len();
    p.train(None).await?;
    p.save_report()?;
    if p.report.train.steps.len() == steps_before && evaluated(p, Variant::Envace)? {
        skip(p, "eval envace");
    } else {
        p.eval(Variant::Envace, None).await?;
        p.save_report()?;
    }
    Ok(p.report.summary_table())
}

/// True when the report holds an evaluation of `variant` on the tasks the config names now.
fn evaluated(p: &Pipeline, variant: Variant) -> Result<bool> {
    let (split, tasks) = p.eval_tasks(None)?;
    Ok(p.report
        .stages
        .contains_key(&format!("eval_{}", variant.name()))
        && p.report
            .variants
            .get(variant.name())
            .is_some_and(|r| r.tasks == tasks.len() as u64 && r.split == split.name()))
}
