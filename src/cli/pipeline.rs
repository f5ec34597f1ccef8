//! `envace collect | sft | train | eval | demo`: the pipeline stages on one run folder.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use envace::config::{Preset, RunConfig};
use envace::pipeline::{demo, Pipeline, Variant};

/// Where the run lives and how it is configured.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// The run folder (config.toml, db/, checkpoints/, report.json, training.png).
    #[arg(long, default_value = "runs/demo")]
    pub out: PathBuf,
    /// Budget preset: `smollm2` (embedded model, ~10 min on 2 CPU cores) or `tiny` (tests).
    #[arg(long, default_value = "smollm2")]
    pub preset: Preset,
    /// A TOML config (see examples/demo.toml); replaces the preset. Keys left out keep their
    /// defaults.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Multiply the training and evaluation budgets (steps, tasks) for longer runs.
    #[arg(long, default_value_t = 1)]
    pub scale: u64,
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
                format!("{:?}", self.preset).to_lowercase(),
            ),
        };
        if self.scale > 1 {
            let s = self.scale;
            cfg.sft.steps *= s;
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
            p.eval(args.variant, args.limit).await
        }
        .await;
        let saved = p.save_report();
        p.shutdown();
        out?;
        saved?;
        println!("{}", p.report.summary_table());
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
