//! `envace collect | sft | train | eval | demo`: the pipeline stages on one run folder.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use envace::config::{Preset, RunConfig};
use envace::pipeline::{demo, tts_table, Pipeline, TtsSpec, Variant};
use envace::storage::RehearsalMode;

/// Where the run lives and how it is configured.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// The run folder (config.toml, db/, checkpoints/, report.json, training.png).
    #[arg(long, alias = "run", default_value = "runs/demo")]
    pub out: PathBuf,
    /// Budget preset: `smollm2` (embedded model, ~10 min on 2 CPU cores) or `tiny` (tests).
    #[arg(long, default_value = "smollm2")]
    pub preset: Preset,
    /// A TOML config (see examples/demo.toml); replaces the preset. Keys left out keep their
    /// defaults.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Multiply the training and evaluation budgets (steps, tasks) for longer runs.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub scale: u64,
    /// Start the run folder afresh: remove its db/, checkpoints/, report.json and plot first
    /// (without it, a folder with a training run resumes that run).
    #[arg(long)]
    pub fresh: bool,
}

impl RunArgs {
    fn config(&self) -> Result<(RunConfig, String)> {
        let (mut cfg, name) = match &self.config {
            Some(path) => (
                RunConfig::from_file(path).map_err(anyhow::Error::msg)?,
                path.display().to_string(),
            ),
            None => (
                RunConfig::preset(self.preset),
                self.preset.name().to_string(),
            ),
        };
        if self.scale > 1 {
            let s = self.scale;
            cfg.sft.epochs = cfg.sft.epochs.saturating_mul(s as u32);
            cfg.train.steps *= s;
            cfg.eval.tasks = cfg.eval.tasks.map(|n| n * s as usize);
        }
        Ok((cfg, name))
    }

    fn runtime(&self) -> Result<tokio::runtime::Runtime> {
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
    pub split: Option<String>,
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
    if args.fresh {
        for part in ["db", "checkpoints"] {
            let path = args.out.join(part);
            if path.exists() {
                std::fs::remove_dir_all(&path)
                    .with_context(|| format!("removing {}", path.display()))?;
            }
        }
        for file in ["report.json", "training.png"] {
            let path = args.out.join(file);
            if path.exists() {
                std::fs::remove_file(&path)
                    .with_context(|| format!("removing {}", path.display()))?;
            }
        }
    }
    let rt = args.runtime()?;
    rt.block_on(async {
        let mut p = Pipeline::open(cfg, &args.out, &name).await?;
        let out = match stage {
            Stage::Collect => p.collect().await.map(drop),
            Stage::Sft => p.sft().await.map(drop),
            Stage::Train => {
                let sft = p.checkpoint_path(envace::pipeline::SFT_RUN);
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
    if let Some(split) = &args.split {
        cfg.eval.split = split.clone();
        cfg.validate().map_err(anyhow::Error::msg)?;
    }
    let rt = args.run.runtime()?;
    rt.block_on(async {
        let mut p = Pipeline::open(cfg, &args.run.out, &name).await?;
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
        let mut p = Pipeline::open(cfg, &args.run.out, &name).await?;
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
