//! `envace collect | sft | train | eval | demo`: the pipeline stages on one run folder.

use std::path::PathBuf;

use crate::actors::task::Split;
use crate::config::{Preset, RunConfig};
use crate::pipeline::{demo, tts_table, Pipeline, RunOpen, TtsSpec, Variant};
use crate::storage::RehearsalMode;
use anyhow::{Context, Result};
use clap::Args;

/// Where the run lives and how it is configured.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// The run folder (config.toml, db/, checkpoints/, report.json, training.png).
    #[arg(long, alias = "run", default_value = "runs/demo")]
    pub out: PathBuf,
    /// Budget preset: `smollm2` (embedded model, ~25 min on 2 CPU cores), `long` (~2 h) or
    /// `tiny` (tests). Without it (and without --config) a folder that holds a run uses its own
    /// config.toml, and a new folder gets `smollm2`.
    #[arg(long)]
    pub preset: Option<Preset>,
    /// A TOML config (see examples/demo.toml); replaces the preset. Keys left out keep their
    /// defaults.
    #[arg(long, conflicts_with = "preset")]
    pub config: Option<PathBuf>,
    /// Multiply the training and evaluation budgets (steps, tasks) for longer runs.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub scale: u64,
    /// Start the run folder afresh: once no other process holds it, remove its db/,
    /// checkpoints/, config.toml, report.json and plot (without it, a folder with a run
    /// resumes that run).
    #[arg(long)]
    pub fresh: bool,
    /// Continue a run although the config changes keys that change what its steps mean
    /// (refused by default, naming the keys).
    #[arg(long)]
    pub allow_config_change: bool,
}

impl RunArgs {
    /// The config (from --config, --preset, the folder's own config.toml, or `smollm2`, in that
    /// order), scaled by --scale and validated, with the name the report records.
    pub(super) fn config(&self) -> Result<(RunConfig, String)> {
        let own = self.out.join("config.toml");
        let (mut cfg, name) = match (&self.config, self.preset) {
            (Some(path), _) => (
                RunConfig::from_file(path).map_err(anyhow::Error::msg)?,
                path.display().to_string(),
            ),
            (None, Some(preset)) => (RunConfig::preset(preset), preset.name().to_string()),
            (None, None) if own.exists() => (
                RunConfig::from_file(&own).map_err(anyhow::Error::msg)?,
                own.display().to_string(),
            ),
            (None, None) => (
                RunConfig::preset(Preset::Smollm2),
                Preset::Smollm2.name().to_string(),
            ),
        };
        // Before any thread starts: the runtime and libtorch come later.
        crate::runtime::tune_allocator(crate::runtime::AllocatorTuning::for_config(&cfg));
        if self.scale > 1 {
            let s = self.scale;
            let too_big = |key: &str| anyhow::anyhow!("--scale {s}: {key} overflows");
            cfg.sft.epochs = u32::try_from(s)
                .ok()
                .and_then(|s| cfg.sft.epochs.checked_mul(s))
                .ok_or_else(|| too_big("sft.epochs"))?;
            cfg.train.steps = cfg
                .train
                .steps
                .checked_mul(s)
                .ok_or_else(|| too_big("train.steps"))?;
            cfg.eval.tasks = match cfg.eval.tasks {
                Some(n) => Some(
                    usize::try_from(s)
                        .ok()
                        .and_then(|s| n.checked_mul(s))
                        .ok_or_else(|| too_big("eval.tasks"))?,
                ),
                None => None,
            };
            cfg.validate()
                .map_err(|e| anyhow::anyhow!("with --scale {s}: {e}"))?;
        }
        Ok((cfg, name))
    }

    /// How the stage opens the run folder.
    pub(super) fn open(&self, create: bool) -> RunOpen {
        RunOpen {
            create,
            // Only the stages that start runs start them afresh.
            fresh: create && self.fresh,
            allow_config_change: self.allow_config_change,
        }
    }

    pub(super) fn runtime(&self) -> Result<tokio::runtime::Runtime> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .context("starting the tokio runtime")
    }
}

/// Options of `envace eval`.
#[derive(Debug, Clone, Args)]
pub struct EvalArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// Which weights: `base`, `sft` (warm-up checkpoint) or `envace` (latest training step).
    #[arg(long, default_value = "envace")]
    pub variant: Variant,
    /// Evaluate only the first K tasks of the split.
    #[arg(long)]
    pub limit: Option<usize>,
    /// `test` (default) or `train`.
    #[arg(long)]
    pub split: Option<Split>,
    /// Test-time scaling: `parallel:N` or `sequential:N` private rehearsals (no real call)
    /// condensed into a memory before one committed real execution.
    #[arg(long)]
    pub tts: Option<TtsSpec>,
    /// With --tts: use a memory already stored for the task instead of rehearsing again.
    #[arg(long, requires = "tts")]
    pub reuse_memory: bool,
}

/// Options of `envace tts-table`.
#[derive(Debug, Clone, Args)]
pub struct TtsTableArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// Evaluate only the first K tasks of the split.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Rehearsal counts N to try in each mode.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    pub n: Vec<u32>,
    /// Variants to compare (`envace` needs a trained run folder; skipped without one).
    #[arg(long, value_delimiter = ',', default_value = "base,envace")]
    pub variants: Vec<Variant>,
}

/// Which stage to run.
#[derive(Debug, Clone, Copy)]
pub enum Stage {
    Collect,
    Sft,
    Train,
    Demo,
}

/// Runs one stage (or the whole demo) on the run folder.
pub fn run(stage: Stage, args: RunArgs) -> Result<()> {
    let (cfg, name) = args.config()?;
    let rt = args.runtime()?;
    rt.block_on(async {
        let mut p = Pipeline::open_with(cfg, &args.out, &name, args.open(true)).await?;
        let out = match stage {
            Stage::Collect => p.collect().await.map(drop),
            Stage::Sft => p.sft().await.map(drop),
            Stage::Train => {
                let sft = p.checkpoint_path(crate::pipeline::SFT_RUN);
                p.train(sft.exists().then_some(sft)).await.map(drop)
            }
            Stage::Demo => demo(&mut p).await.map(|table| println!("{table}")),
        };
        let saved = p.save_report();
        p.shutdown();
        out?;
        saved?;
        eprintln!("report: {}", p.dir.join("report.json").display());
        Ok(())
    })
}

/// `envace eval`.
pub fn eval(args: EvalArgs) -> Result<()> {
    let (mut cfg, name) = args.run.config()?;
    if let Some(split) = args.split {
        cfg.eval.split = split;
    }
    let rt = args.run.runtime()?;
    rt.block_on(async {
        let mut p = Pipeline::open_with(cfg, &args.run.out, &name, args.run.open(false)).await?;
        let out = async {
            p.load_variant(args.variant).await?;
            match args.tts {
                Some(tts) => p
                    .eval_tts(args.variant, Some(tts), args.limit, args.reuse_memory)
                    .await
                    .map(|r| tts_table(&[r])),
                None => p
                    .eval(args.variant, args.limit)
                    .await
                    .map(|_| p.report.summary_table()),
            }
        }
        .await;
        let saved = p.save_report();
        p.shutdown();
        let table = out?;
        saved?;
        println!("{table}");
        Ok(())
    })
}

/// Options of `envace config`.
#[derive(Debug, Clone, Args)]
pub struct ConfigArgs {
    /// `smollm2` or `tiny`.
    #[arg(long, default_value = "smollm2")]
    pub preset: Preset,
}

/// `envace config`: the preset as a complete TOML file on stdout.
pub fn print_config(args: ConfigArgs) -> Result<()> {
    print!("{}", RunConfig::preset(args.preset).to_toml());
    Ok(())
}

/// `envace tts-table`: no TTS, then parallel and sequential rehearsal for each N, for each
/// variant, on the same tasks; prints the table and adds every row to the report.
pub fn tts_table_command(args: TtsTableArgs) -> Result<()> {
    if args.n.contains(&0) {
        anyhow::bail!("--n {:?}: every rehearsal count must be at least 1", args.n);
    }
    let (cfg, name) = args.run.config()?;
    let rt = args.run.runtime()?;
    rt.block_on(async {
        let mut p = Pipeline::open_with(cfg, &args.run.out, &name, args.run.open(false)).await?;
        let out = async {
            let mut rows = Vec::new();
            for &variant in &args.variants {
                if let Err(e) = p.load_variant(variant).await {
                    eprintln!("tts-table: skipping {}: {e}", variant.name());
                    continue;
                }
                rows.push(p.eval_tts(variant, None, args.limit, false).await?);
                for mode in [RehearsalMode::Parallel, RehearsalMode::Sequential] {
                    for &n in &args.n {
                        let spec = TtsSpec { mode, n };
                        rows.push(p.eval_tts(variant, Some(spec), args.limit, false).await?);
                        p.save_report()?;
                    }
                }
            }
            anyhow::Ok(rows)
        }
        .await;
        let saved = p.save_report();
        p.shutdown();
        let rows = out?;
        saved?;
        println!("{}", tts_table(&rows));
        Ok(())
    })
}
