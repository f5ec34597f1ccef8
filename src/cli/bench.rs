//! `envace bench generate`: decode, prefill and training throughput of our kernels against HF
//! transformers / PyTorch eager (`scripts/bench_hf.py`) on the same GGUF, batches and lengths,
//! in the same run, reported as ratios.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::kernels::flops::{gemm_peak, TokenFlops};
use crate::kernels::loader::{embedded_gguf_path, EMBEDDED_MODEL};
use crate::kernels::{
    load, packed_len, score, score_packed, Engine, EngineConfig, GenerationRequest, Model,
    ModelSource, SamplingParams, ScoreRow,
};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};
use tch::Kind;

use super::ModelArgs;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Generation (prefill, decode) and training (fwd+bwd) throughput vs HF transformers.
    Generate(GenerateBenchArgs),
    /// Reference vs inline protocol, f32 vs bf16: tokens, time and memory per trajectory for
    /// the rollouts and the learner step, on BFCL tasks.
    Rollout(super::bench_rollout::RolloutBenchArgs),
}

#[derive(Debug, Args)]
pub struct GenerateBenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Decode batch sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    batch_sizes: Vec<usize>,
    /// Prompt length, tokens.
    #[arg(long, default_value_t = 128)]
    prompt_len: usize,
    /// New tokens per sequence (greedy, no stop token).
    #[arg(long, default_value_t = 128)]
    new_tokens: usize,
    /// Training rows per step.
    #[arg(long, default_value_t = 8)]
    train_batch: usize,
    /// Training row length, tokens.
    #[arg(long, default_value_t = 256)]
    train_len: usize,
    /// Timed training steps (after one warm-up step).
    #[arg(long, default_value_t = 3)]
    train_steps: usize,
    /// Packed training sequence, tokens: a trunk and four 100-token branches off it (one
    /// inline trajectory's Act stream and Rehearse rows), scored by tree attention; 0 skips.
    #[arg(long, default_value_t = 4096)]
    pack_len: usize,
    /// Length of the plain rows the packed rate is compared with, tokens (a reference row).
    #[arg(long, default_value_t = 1800)]
    row_len: usize,
    /// Skip the HF transformers peer run.
    #[arg(long)]
    no_hf: bool,
    /// Python interpreter with torch, transformers and gguf (`make bench-deps`).
    #[arg(long)]
    python: Option<PathBuf>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

/// One side's numbers; the HF script prints the same shape.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Measurements {
    /// Batch size → decode tokens/s (new tokens after the first, over decode time).
    decode_tok_s: BTreeMap<usize, f64>,
    /// Prompt tokens/s of a batch-8 prefill.
    prefill_tok_s: f64,
    /// fwd+bwd tokens/s of the training path.
    train_tok_s: f64,
    /// Peak resident memory of the process, MiB.
    peak_rss_mb: f64,
}

pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Generate(args) => generate(args),
        BenchCommand::Rollout(args) => super::bench_rollout::run(args),
    }
}

/// Deterministic prompt ids that `scripts/bench_hf.py` reproduces: no special tokens.
fn prompt_ids(row: usize, len: usize) -> Vec<u32> {
    (0..len)
        .map(|t| 100 + ((row * 7919 + t * 104_729) % 40_000) as u32)
        .collect()
}

fn generate(args: GenerateBenchArgs) -> Result<()> {
    // Checked before anything runs, not after minutes of decoding.
    if args.pack_len > 0 && (args.pack_len < 5 * PACK_BRANCH || args.row_len < 2) {
        bail!(
            "--pack-len must be 0 or at least {} and --row-len at least 2",
            5 * PACK_BRANCH
        );
    }
    let (device, dtype) = crate::runtime::resolve(args.model.device, args.model.dtype)?;
    let loaded = load(&ModelSource::parse(&args.model.model), device, dtype)?;
    let model = &loaded.model;
    let progress = |what: &str| {
        if !args.json {
            eprintln!("[bench] {what}");
        }
    };

    progress("warm-up");
    run_generation(model, 2, 16, 4)?;
    let mut ours = Measurements::default();
    for &b in &args.batch_sizes {
        progress(&format!(
            "ours: batch {b}, prompt {}, {} new tokens",
            args.prompt_len, args.new_tokens
        ));
        let prefill = run_generation(model, b, args.prompt_len, 1)?;
        let total = run_generation(model, b, args.prompt_len, args.new_tokens)?;
        let decode_seconds = (total - prefill).max(1e-9);
        ours.decode_tok_s
            .insert(b, (b * (args.new_tokens - 1)) as f64 / decode_seconds);
        if b == 8 || ours.prefill_tok_s == 0.0 {
            ours.prefill_tok_s = (b * args.prompt_len) as f64 / prefill;
        }
    }
    progress(&format!(
        "ours: training fwd+bwd {}×{}",
        args.train_batch, args.train_len
    ));
    ours.train_tok_s = run_training(model, args.train_batch, args.train_len, args.train_steps)?;
    let packed = if args.pack_len > 0 {
        progress(&format!(
            "ours: packed training, one {}-token pack against {}-token rows",
            args.pack_len, args.row_len
        ));
        Some(run_packed_training(model, args.pack_len, args.row_len)?)
    } else {
        None
    };
    ours.peak_rss_mb = peak_rss_mb();
    progress("this machine's GEMM peak in the model's dtype");
    let peak = gemm_peak(model.config(), device, dtype, 3)?;
    let util = Utilisation::new(model.config(), peak, &args);

    let hf = if args.no_hf {
        None
    } else {
        progress("HF transformers peer (scripts/bench_hf.py)");
        Some(run_hf(&args)?)
    };
    let ratio = |f: &dyn Fn(&Measurements) -> Option<f64>| -> Option<f64> {
        let h = hf.as_ref().and_then(f)?;
        Some(f(&ours)? / h)
    };
    let hf_ratio_b8 = ratio(&|m| m.decode_tok_s.get(&8).copied());
    let train_ratio = ratio(&|m| Some(m.train_tok_s));
    let report = serde_json::json!({
        "model": args.model.model,
        "device": crate::runtime::device_name(device),
        "dtype": format!("{dtype:?}"),
        "threads": tch::get_num_threads(),
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "decode_tok_s": ours.decode_tok_s,
        "prefill_tok_s": ours.prefill_tok_s,
        "train_tok_s": ours.train_tok_s,
        "peak_rss_mb": ours.peak_rss_mb,
        "hf": hf,
        "hf_ratio_b8": hf_ratio_b8,
        "train_ratio": train_ratio,
        "hf_ratio": args.batch_sizes.iter().map(|b| (b.to_string(), ratio(&|m| m.decode_tok_s.get(b).copied()))).collect::<BTreeMap<_, _>>(),
        "packed_train": packed,
        "gemm_peak_gflop_s": peak / 1e9,
        "utilisation": {
            "decode": ours.decode_tok_s.iter().map(|(&b, &r)| (b.to_string(), util.decode(r))).collect::<BTreeMap<_, _>>(),
            "prefill": util.prefill(ours.prefill_tok_s),
            "train": util.train(ours.train_tok_s),
        },
    });
    if args.json {
        println!("{report}");
        return Ok(());
    }
    let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
    let fmt_ratio = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}x"));
    println!(
        "\nmodel {} on {} ({dtype:?}, {} threads), prompt {} tokens, {} new tokens, greedy",
        args.model.model,
        crate::runtime::device_name(device),
        tch::get_num_threads(),
        args.prompt_len,
        args.new_tokens
    );
    println!(
        "GEMM peak of this machine in {dtype:?}: {:.0} GFLOP/s; util = envace's model FLOP/s as \
         a share of it",
        peak / 1e9
    );
    println!(
        "{:<28} {:>12} {:>12} {:>10} {:>7}",
        "metric", "envace", "HF/PyTorch", "ratio", "util"
    );
    let pct = |u: Option<f64>| u.map_or("-".to_string(), |u| format!("{:.1}%", 100.0 * u));
    for &b in &args.batch_sizes {
        let o = ours.decode_tok_s.get(&b).copied();
        let h = hf.as_ref().and_then(|m| m.decode_tok_s.get(&b).copied());
        println!(
            "{:<28} {:>12} {:>12} {:>10} {:>7}",
            format!("decode tok/s, batch {b}"),
            fmt(o),
            fmt(h),
            fmt_ratio(o.zip(h).map(|(o, h)| o / h)),
            pct(o.map(|r| util.decode(r)))
        );
    }
    let rows = [
        (
            "prefill tok/s, batch 8",
            Some(ours.prefill_tok_s),
            hf.as_ref().map(|m| m.prefill_tok_s),
            Some(util.prefill(ours.prefill_tok_s)),
        ),
        (
            &*format!(
                "train fwd+bwd tok/s, {}x{}",
                args.train_batch, args.train_len
            ),
            Some(ours.train_tok_s),
            hf.as_ref().map(|m| m.train_tok_s),
            Some(util.train(ours.train_tok_s)),
        ),
        (
            "peak RSS, MiB",
            Some(ours.peak_rss_mb),
            hf.as_ref().map(|m| m.peak_rss_mb),
            None,
        ),
    ];
    for (name, o, h, u) in rows {
        println!(
            "{:<28} {:>12} {:>12} {:>10} {:>7}",
            name,
            fmt(o),
            fmt(h),
            fmt_ratio(o.zip(h).map(|(o, h)| o / h)),
            pct(u)
        );
    }
    if let Some(p) = packed {
        println!(
            "packed training: {:.1} tok/s over one {}-token pack against {:.1} tok/s over {}-token \
             rows: {:.2}x per token",
            p.pack_tok_s,
            p.pack_len,
            p.rows_tok_s,
            p.row_len,
            p.pack_tok_s / p.rows_tok_s
        );
    }
    Ok(())
}

/// Tokens of each of the four branches of the packed-training sequence.
const PACK_BRANCH: usize = 100;

/// fwd+bwd rate of one packed sequence against plain rows ([`run_packed_training`]).
#[derive(Debug, Serialize)]
struct PackedTraining {
    pack_len: usize,
    row_len: usize,
    /// Packed tokens (distinct trie nodes) per second of fwd+bwd.
    pack_tok_s: f64,
    /// Row tokens per second of fwd+bwd, one row at a time.
    rows_tok_s: f64,
}

/// fwd+bwd tokens/s of one prefix-packed sequence of `pack_len` tokens — a trunk scored
/// whole and four 100-token branches leaving it at 1/5 … 4/5 of its length, what one inline
/// trajectory's rows pack into — against single rows of `row_len` tokens; one warm-up and two
/// timed steps each.
fn run_packed_training(model: &Model, pack_len: usize, row_len: usize) -> Result<PackedTraining> {
    const BRANCH: usize = PACK_BRANCH;
    let trunk = prompt_ids(0, pack_len - 4 * BRANCH);
    let mut rows = vec![ScoreRow {
        prompt_ids: trunk[..1].to_vec(),
        completion_ids: trunk[1..].to_vec(),
    }];
    for b in 1..=4 {
        let own = prompt_ids(b, BRANCH);
        rows.push(ScoreRow {
            prompt_ids: [&trunk[..trunk.len() * b / 5], &own[..1]].concat(),
            completion_ids: own[1..].to_vec(),
        });
    }
    let packed = packed_len(&rows);
    let row = |r: usize| {
        let ids = prompt_ids(10 + r, row_len);
        vec![ScoreRow {
            prompt_ids: ids[..1].to_vec(),
            completion_ids: ids[1..].to_vec(),
        }]
    };
    let step = |rows: &[ScoreRow], pack: bool| -> Result<()> {
        let scored = if pack {
            score_packed(model, rows, 1.0)?
        } else {
            score(model, rows, 1.0)?
        };
        (-(scored.logprobs.sum(Kind::Float))).backward();
        for mut v in model.var_store().trainable_variables() {
            v.zero_grad();
        }
        Ok(())
    };
    let timed = |f: &dyn Fn(usize) -> Result<()>| -> Result<f64> {
        f(0)?;
        let started = Instant::now();
        for i in 1..=2 {
            f(i)?;
        }
        Ok(started.elapsed().as_secs_f64() / 2.0)
    };
    let pack_s = timed(&|_| step(&rows, true))?;
    let row_s = timed(&|i| step(&row(i), false))?;
    Ok(PackedTraining {
        pack_len: packed,
        row_len,
        pack_tok_s: packed as f64 / pack_s,
        rows_tok_s: row_len as f64 / row_s,
    })
}

/// Utilisation of each measured rate: its model FLOP/s ([`TokenFlops`]) over the GEMM peak.
struct Utilisation {
    flops: TokenFlops,
    peak: f64,
    prompt_len: usize,
    new_tokens: usize,
    train_len: usize,
}

impl Utilisation {
    fn new(config: &crate::kernels::ModelConfig, peak: f64, args: &GenerateBenchArgs) -> Self {
        Self {
            flops: TokenFlops::of(config),
            peak,
            prompt_len: args.prompt_len,
            new_tokens: args.new_tokens,
            train_len: args.train_len,
        }
    }

    /// Decode tokens/s: each token attends to the prompt and half the new tokens on average
    /// and gets its logits.
    fn decode(&self, tok_s: f64) -> f64 {
        let keys = self.prompt_len as f64 + self.new_tokens as f64 / 2.0;
        tok_s * self.flops.forward(keys, true) / self.peak
    }

    /// Prompt tokens/s of a prefill: causal over the prompt, logits of the last token only.
    fn prefill(&self, tok_s: f64) -> f64 {
        let per_token = self.flops.causal_sequence(self.prompt_len, 1) / self.prompt_len as f64;
        tok_s * per_token / self.peak
    }

    /// fwd+bwd tokens/s of `train_len`-token rows, all but the first scored: three forwards.
    fn train(&self, tok_s: f64) -> f64 {
        let n = self.train_len.max(1);
        let per_token = 3.0 * self.flops.causal_sequence(n, n - 1) / n as f64;
        tok_s * per_token / self.peak
    }
}

/// Wall seconds to generate `new_tokens` greedy tokens for `batch` prompts of `prompt_len`.
fn run_generation(
    model: &Model,
    batch: usize,
    prompt_len: usize,
    new_tokens: usize,
) -> Result<f64> {
    let requests = (0..batch)
        .map(|row| GenerationRequest {
            prompt_ids: prompt_ids(row, prompt_len),
            params: SamplingParams {
                max_new_tokens: new_tokens,
                ..Default::default()
            },
        })
        .collect();
    let mut engine = Engine::new(
        model,
        None,
        EngineConfig {
            max_batch: batch,
            max_prefill_tokens: batch * prompt_len,
            // Throughput of fresh prompts: no reuse between the timed runs.
            prefix_cache_tokens: 0,
        },
    );
    let started = Instant::now();
    let out = engine.generate(requests)?;
    let seconds = started.elapsed().as_secs_f64();
    if out.iter().any(|c| c.completion_ids.len() != new_tokens) {
        bail!("a benchmark request stopped before {new_tokens} tokens");
    }
    Ok(seconds)
}

/// fwd+bwd tokens/s of the scoring path: rows of `len` tokens (1 prompt + `len − 1` scored),
/// mean negative log-likelihood, backward — what `model(x, labels=x).loss.backward()` does.
fn run_training(model: &Model, batch: usize, len: usize, steps: usize) -> Result<f64> {
    let rows: Vec<ScoreRow> = (0..batch)
        .map(|r| {
            let ids = prompt_ids(r, len);
            ScoreRow {
                prompt_ids: ids[..1].to_vec(),
                completion_ids: ids[1..].to_vec(),
            }
        })
        .collect();
    let step = || -> Result<()> {
        let scored = score(model, &rows, 1.0)?;
        let loss = -(scored.logprobs.sum(Kind::Float) / scored.mask.sum(Kind::Float));
        loss.backward();
        for mut v in model.var_store().trainable_variables() {
            v.zero_grad();
        }
        Ok(())
    };
    step()?;
    let started = Instant::now();
    for _ in 0..steps {
        step()?;
    }
    Ok((batch * len * steps) as f64 / started.elapsed().as_secs_f64())
}

/// Peak resident set size of this process (`VmHWM`), MiB.
fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn project_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn run_hf(args: &GenerateBenchArgs) -> Result<Measurements> {
    let gguf = match ModelSource::parse(&args.model.model) {
        ModelSource::Embedded => embedded_gguf_path(),
        ModelSource::Gguf(p) => p,
        _ => {
            bail!("the HF peer needs a GGUF model ({EMBEDDED_MODEL} or a .gguf path); pass --no-hf")
        }
    };
    let python = args
        .python
        .clone()
        .unwrap_or_else(|| project_root().join(".venv/bin/python"));
    let script = project_root().join("scripts/bench_hf.py");
    let sizes: Vec<String> = args.batch_sizes.iter().map(ToString::to_string).collect();
    let output = Command::new(&python)
        .arg(&script)
        .arg("--gguf")
        .arg(&gguf)
        .args(["--batch-sizes", &sizes.join(",")])
        .args(["--prompt-len", &args.prompt_len.to_string()])
        .args(["--new-tokens", &args.new_tokens.to_string()])
        .args(["--train-batch", &args.train_batch.to_string()])
        .args(["--train-len", &args.train_len.to_string()])
        .args(["--train-steps", &args.train_steps.to_string()])
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {} {}", python.display(), script.display()))?;
    if !output.status.success() {
        bail!(
            "{} failed ({}); install its dependencies with `make bench-deps`, or pass --no-hf",
            script.display(),
            output.status
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).with_context(|| format!("parsing bench_hf.py output {line:?}"))
}
