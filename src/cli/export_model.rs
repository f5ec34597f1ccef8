//! `envace export-model`: a run's trained weights as an HF checkpoint folder or a GGUF file,
//! for transformers, llama.cpp or any other runtime ([`crate::kernels::export`]).
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use tch::{Device, Kind};

use crate::config::RunConfig;
use crate::kernels::export::{write_gguf, write_hf, ExportDtype};
use crate::kernels::loader::embedded_gguf_path;
use crate::kernels::{load, ModelSource};
use crate::pipeline::TRAIN_RUN;
use crate::storage::{Checkpoint, CheckpointKey, RunId, Store, StoreOptions};

/// The metric of a checkpoint record that `--best` maximises.
use crate::pipeline::train_loop::EVAL_SCORE_KEY as EVAL_SCORE;

#[derive(Debug, Args)]
#[command(
    after_help = "The weights come from a checkpoint of the run's training (run \
\"envace\" in DIR/db, files in DIR/checkpoints); the architecture and tokenizer from the run's \
model.source. hf writes a folder (config.json, model.safetensors, tokenizer.json, \
tokenizer_config.json with the chat template, generation_config.json) that transformers and \
`--model OUT` read. gguf writes one GGUF v3 file with the metadata (tokenizer, chat template) \
of the model's GGUF, which llama.cpp reads; it needs a GGUF model.source (smollm2-135m, tiny or \
a .gguf file). The run must not be training while it is exported (its database is locked)."
)]
pub struct ExportModelArgs {
    /// The run folder (config.toml, db/, checkpoints/).
    #[arg(long)]
    pub run: PathBuf,
    /// Export the checkpoint of this optimizer step (default: the newest whose file exists).
    #[arg(long, conflicts_with = "best")]
    pub step: Option<u64>,
    /// Export the checkpoint with the highest periodic evaluation score (`eval_score`) among
    /// those whose file exists.
    #[arg(long)]
    pub best: bool,
    /// `hf` (a checkpoint folder) or `gguf` (one file).
    #[arg(long)]
    pub format: ExportFormat,
    /// How the weights are stored: `f32` (exact), `f16` or `bf16`. GGUF keeps norms and biases
    /// in f32.
    #[arg(long, default_value = "f32")]
    pub dtype: DtypeArg,
    /// The folder (hf) or file (gguf) to write; an earlier export there is replaced.
    #[arg(long)]
    pub out: PathBuf,
}

/// `--format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    Hf,
    Gguf,
}

/// `--dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DtypeArg {
    F32,
    F16,
    Bf16,
}

impl From<DtypeArg> for ExportDtype {
    fn from(d: DtypeArg) -> Self {
        match d {
            DtypeArg::F32 => ExportDtype::F32,
            DtypeArg::F16 => ExportDtype::F16,
            DtypeArg::Bf16 => ExportDtype::BF16,
        }
    }
}

/// The checkpoint chosen for export.
#[derive(Debug)]
struct Picked {
    step: u64,
    file: PathBuf,
    eval_score: Option<f64>,
}

pub fn run(args: ExportModelArgs) -> Result<()> {
    let dir = &args.run;
    let config_path = dir.join("config.toml");
    if !config_path.is_file() {
        bail!(
            "{} is not a run folder: it has no config.toml",
            dir.display()
        );
    }
    // Like every command on a run folder: not while another process trains in it.
    let _lock = crate::run_folder::RunLock::acquire(dir)?;
    let cfg = RunConfig::from_file(&config_path).map_err(anyhow::Error::msg)?;
    let spec = cfg.model.source.as_str();
    let source = ModelSource::parse(spec);
    let gguf_source = match args.format {
        ExportFormat::Hf => {
            if args.out.is_file() {
                bail!(
                    "--out {} is a file; --format hf writes a folder",
                    args.out.display()
                );
            }
            None
        }
        ExportFormat::Gguf => {
            if args.out.is_dir() {
                bail!(
                    "--out {} is a folder; --format gguf writes one file (e.g. {})",
                    args.out.display(),
                    args.out.join("model.gguf").display()
                );
            }
            Some(gguf_source(&source, spec)?)
        }
    };
    let picked = pick_checkpoint(dir, args.step, args.best)?;
    let loaded = load(&source, Device::Cpu, Kind::Float)
        .with_context(|| format!("loading the run's model {spec}"))?;
    loaded
        .model
        .load_weights(&picked.file)
        .with_context(|| format!("loading the checkpoint of step {}", picked.step))?;
    let dtype = ExportDtype::from(args.dtype);
    let files = match &gguf_source {
        None => {
            write_hf(
                &loaded.model,
                &loaded.tokenizer,
                loaded.tokenizer.chat_template.as_deref(),
                dtype,
                &args.out,
            )
            .with_context(|| format!("writing {}", args.out.display()))?;
            [
                "config.json",
                "model.safetensors",
                "tokenizer.json",
                "tokenizer_config.json",
                "generation_config.json",
            ]
            .iter()
            .map(|name| args.out.join(name))
            .collect()
        }
        Some(source_gguf) => {
            write_gguf(&loaded.model, source_gguf, dtype, &args.out)
                .with_context(|| format!("writing {}", args.out.display()))?;
            vec![args.out.clone()]
        }
    };
    let format = match args.format {
        ExportFormat::Hf => "hf",
        ExportFormat::Gguf => "gguf",
    };
    let score = picked
        .eval_score
        .map_or_else(String::new, |s| format!(", {EVAL_SCORE} {s}"));
    println!(
        "exported step {} of {} ({}{score}) as {format} {dtype}:",
        picked.step,
        dir.display(),
        picked.file.display()
    );
    let mut total = 0;
    for file in &files {
        let bytes = std::fs::metadata(file)
            .with_context(|| format!("reading {}", file.display()))?
            .len();
        total += bytes;
        println!("  {}  {bytes} bytes", file.display());
    }
    println!("total {total} bytes");
    Ok(())
}

/// The GGUF whose metadata a GGUF export copies.
fn gguf_source(source: &ModelSource, spec: &str) -> Result<PathBuf> {
    match source {
        ModelSource::Embedded | ModelSource::Tiny => Ok(embedded_gguf_path()),
        ModelSource::Gguf(path) => Ok(path.clone()),
        ModelSource::HfDir(path) => bail!(
            "--format gguf copies the tokenizer and chat template from the model's GGUF, but the \
             run's model.source {spec:?} is an HF checkpoint folder ({}): export with --format hf",
            path.display()
        ),
    }
}

/// The file of a checkpoint record in run folder `dir`: `DIR/checkpoints/` and the record's
/// file name (records hold paths relative to the run folder).
fn checkpoint_file(dir: &Path, checkpoint: &Checkpoint) -> PathBuf {
    let name = checkpoint
        .path
        .file_name()
        .unwrap_or(checkpoint.path.as_os_str());
    dir.join("checkpoints").join(name)
}

/// Chooses the checkpoint of training run `envace` in `dir`: step `step`, else the best
/// `eval_score` (`best`), else the newest whose file exists.
fn pick_checkpoint(dir: &Path, step: Option<u64>, best: bool) -> Result<Picked> {
    let db = dir.join("db");
    if !db.is_dir() {
        bail!(
            "{} has no database (db/), so no checkpoint to export: train first",
            dir.display()
        );
    }
    let store = Store::open(&db, StoreOptions::default())
        .with_context(|| format!("opening {}", db.display()))?;
    let mut records: Vec<Checkpoint> = Vec::new();
    for item in store.scan::<Checkpoint>(&CheckpointKey::run_prefix(&RunId::from(TRAIN_RUN))) {
        match item {
            Ok((_, c)) => records.push(c),
            Err(e) => tracing::warn!("skipping an unreadable checkpoint record: {e}"),
        }
    }
    drop(store);
    records.sort_by_key(|c| c.step);
    if records.is_empty() {
        bail!(
            "{} has no training checkpoint (run {TRAIN_RUN:?} in db/): train first",
            dir.display()
        );
    }
    let exists = |c: &Checkpoint| checkpoint_file(dir, c).is_file();
    // Those whose file exists (the ones that can be exported), at most the last 20.
    let listed: Vec<&Checkpoint> = records.iter().filter(|c| exists(c)).collect();
    let skipped = listed.len().saturating_sub(20);
    let listing = listed[skipped..]
        .iter()
        .map(|c| {
            let score = c
                .metrics
                .get(EVAL_SCORE)
                .map_or_else(String::new, |s| format!(" {EVAL_SCORE} {s}"));
            format!("{}{score}", c.step)
        })
        .collect::<Vec<_>>()
        .join(", ");
    let listing = match (listed.is_empty(), skipped) {
        (true, _) => "none with its file in place".to_string(),
        (false, 0) => listing,
        (false, n) => format!("… ({n} older), {listing}"),
    };
    let chosen = match (step, best) {
        (Some(n), _) => {
            let Some(c) = records.iter().find(|c| c.step == n) else {
                bail!(
                    "{} has no checkpoint of step {n}; checkpoints (steps): {listing}",
                    dir.display()
                );
            };
            if !exists(c) {
                bail!(
                    "the checkpoint of step {n} is recorded but its file {} is gone (the daemon \
                     keeps only the last checkpoints and the best); checkpoints (steps): \
                     {listing}",
                    checkpoint_file(dir, c).display()
                );
            }
            c
        }
        (None, true) => records
            .iter()
            .filter(|c| exists(c))
            .filter_map(|c| Some((*c.metrics.get(EVAL_SCORE)?, c)))
            .filter(|(s, _)| s.is_finite())
            .max_by(|a, b| a.0.total_cmp(&b.0).then(a.1.step.cmp(&b.1.step)))
            .map(|(_, c)| c)
            .with_context(|| {
                format!(
                    "no checkpoint of {} with a file has an {EVAL_SCORE} (periodic evaluation: \
                     train.eval_every); checkpoints (steps): {listing}",
                    dir.display()
                )
            })?,
        (None, false) => records.iter().rev().find(|c| exists(c)).with_context(|| {
            format!(
                "no checkpoint file of {} exists any more; checkpoints (steps): {listing}",
                dir.display()
            )
        })?,
    };
    Ok(Picked {
        step: chosen.step,
        file: checkpoint_file(dir, chosen),
        eval_score: chosen.metrics.get(EVAL_SCORE).copied(),
    })
}
