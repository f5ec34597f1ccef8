//! `envace bench rollout`: the reference protocol against the inline one (and f32 against
//! bf16) on the same BFCL train tasks, seeds and budgets: tokens the model processed, wall time
//! and peak memory per trajectory, for generation and for one learner step, with the ratios in
//! one run.
//!
//! The headline numbers (`generation`, `learner`, the ratios) replay the tasks' seed
//! trajectories in each protocol, so every mode processes the same calls and results
//! ([`Pipeline::bench_replay`]); `live` has the policy's own rollouts of one training step,
//! whose shapes differ between modes ([`Pipeline::bench_rollout`]).
//!
//! Each mode runs in its own child process (`--mode`), so its peak memory is its own and
//! libtorch's allocator starts clean. With `--demo` each mode also runs the whole demo
//! (`envace demo --config <mode>.toml`) so the reward it reaches at the demo budget is
//! reported next to its speed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::actors::protocol::RolloutProtocol;
use crate::config::{Preset, RunConfig};
use crate::kernels::flops::{gemm_peak, TokenFlops};
use crate::kernels::{load, ModelSource};
use crate::pipeline::{PhaseCost, Pipeline, ReplayBench, RolloutBench};
use crate::report::RunReport;
use crate::runtime::{resolve, AllocatorTuning, DtypeChoice};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};

/// Options of `envace bench rollout`.
#[derive(Debug, Clone, Args)]
pub struct RolloutBenchArgs {
    /// Budget preset: `smollm2` (embedded model) or `tiny` (random tiny model, seconds).
    #[arg(long, default_value = "smollm2")]
    preset: Preset,
    /// Train tasks rolled out (each `train.k` times, the preset's group size).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
    tasks: u64,
    /// Modes to run, comma-separated: `reference_f32` (the authors' protocol: a fresh prompt
    /// per call, no KV reuse, rows scored one by one), `reference_f32_cached` (the same with
    /// prefix KV reuse), `inline_f32`, `inline_bf16`, `reference_bf16`; the suffix `_ckpt`
    /// (e.g. `inline_f32_ckpt`) turns on `learner.checkpoint_activations`.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "reference_f32,reference_f32_cached,inline_f32,inline_bf16"
    )]
    modes: Vec<String>,
    /// Play every user turn of each task (rollouts and seed replay) instead of the preset's
    /// `rollout.max_user_turns` (the smollm2 preset trains on the first user turn only).
    #[arg(long)]
    all_turns: bool,
    /// Also run the whole demo in each mode and report the reward it reaches.
    #[arg(long)]
    demo: bool,
    /// Folder for the modes' run folders and configs.
    #[arg(long, default_value = "runs/bench-rollout")]
    out: PathBuf,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Run one mode in this process and print its JSON (what the parent spawns).
    #[arg(long, hide = true)]
    mode: Option<String>,
}

/// A mode's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mode {
    protocol: RolloutProtocol,
    bf16: bool,
    prefix_cache: bool,
    /// `_ckpt` suffix: `learner.checkpoint_activations` on.
    checkpoint: bool,
}

impl Mode {
    fn parse(name: &str) -> Result<Self> {
        let (base, checkpoint) = match name.strip_suffix("_ckpt") {
            Some(base) => (base, true),
            None => (name, false),
        };
        let (protocol, bf16, prefix_cache) = match base {
            "reference_f32" => (RolloutProtocol::Reference, false, false),
            "reference_f32_cached" => (RolloutProtocol::Reference, false, true),
            "reference_bf16" => (RolloutProtocol::Reference, true, false),
            "inline_f32" => (RolloutProtocol::Inline, false, true),
            "inline_bf16" => (RolloutProtocol::Inline, true, true),
            other => bail!(
                "unknown mode {other:?} (reference_f32, reference_f32_cached, reference_bf16, \
                 inline_f32, inline_bf16, each optionally with the suffix _ckpt)"
            ),
        };
        Ok(Self {
            protocol,
            bf16,
            prefix_cache,
            checkpoint,
        })
    }

    /// The preset's config in this mode, rolling out `tasks` tasks per step (all their user
    /// turns with `all_turns`).
    fn config(self, preset: Preset, tasks: usize, all_turns: bool) -> RunConfig {
        let mut cfg = RunConfig::preset(preset).with_protocol(self.protocol);
        if all_turns {
            cfg.rollout.max_user_turns = None;
        }
        cfg.model.dtype = if self.bf16 {
            DtypeChoice::Bf16
        } else {
            DtypeChoice::F32
        };
        if !self.prefix_cache {
            cfg.engine.prefix_cache_tokens = 0;
        }
        if self.protocol == RolloutProtocol::Reference {
            // The authors' learner scores each row on its own (the presets pack prefixes).
            cfg.train.learner.pack_prefixes = false;
            cfg.sft.learner.pack_prefixes = false;
        }
        cfg.train.learner.checkpoint_activations = self.checkpoint;
        cfg.sft.learner.checkpoint_activations = self.checkpoint;
        cfg.train.tasks_per_step = tasks;
        // Every mode rolls out the same tasks: no draws past zero-variance groups.
        cfg.train.dynamic_sampling = false;
        cfg
    }
}

/// What one mode's child process measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ModeBench {
    /// Seed replay: the same trajectories in every mode.
    #[serde(flatten)]
    replay: ReplayBench,
    /// The policy's own rollouts of one training step.
    live: RolloutBench,
    /// This machine's GEMM peak in the mode's dtype, measured after the phases, FLOP/s.
    gemm_peak_flop_s: f64,
    /// Dense FLOPs of one token's forward through the decoder layers ([`TokenFlops::layers`]).
    layer_flops_per_token: f64,
}

impl ModeBench {
    /// Dense-layer utilisation of a phase: its tokens' decoder-layer FLOPs (three forwards for
    /// the learner) over its wall time, as a share of the GEMM peak. Attention and the
    /// vocabulary projection are not counted, so this is a lower bound.
    fn utilisation(&self, phase: &PhaseCost, forwards: f64) -> f64 {
        let flop_s = forwards * self.layer_flops_per_token * phase.tokens_per_trajectory
            / phase.wall_s_per_trajectory.max(1e-9);
        flop_s / self.gemm_peak_flop_s.max(1.0)
    }
}

/// What one mode measured, plus the demo's outcome when asked.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ModeResult {
    #[serde(flatten)]
    bench: ModeBench,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    demo: Option<DemoOutcome>,
}

/// Reward at the demo budget.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct DemoOutcome {
    /// Mean rollout reward of the last training step.
    train_reward_last: f64,
    /// Mean rollout reward over all training steps.
    train_reward_mean: f64,
    /// Test task success of the trained policy (real environment, BFCL checker).
    eval_task_success: Option<f64>,
    /// Wall time of the whole demo, seconds.
    wall_s: f64,
}

pub fn run(args: RolloutBenchArgs) -> Result<()> {
    if let Some(mode) = &args.mode {
        return run_one(&args, mode);
    }
    // Every mode name is checked before any mode runs.
    for name in &args.modes {
        Mode::parse(name)?;
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let exe = std::env::current_exe().context("locating the envace binary")?;
    let mut results: BTreeMap<String, ModeResult> = BTreeMap::new();
    for name in &args.modes {
        if !args.json {
            eprintln!(
                "[bench rollout] {name}: rollouts of {} tasks and one learner step",
                args.tasks
            );
        }
        let out = Command::new(&exe)
            .args(["bench", "rollout", "--mode", name, "--tasks"])
            .arg(args.tasks.to_string())
            .args(["--preset", args.preset.name(), "--out"])
            .arg(&args.out)
            .args(args.all_turns.then_some("--all-turns"))
            .output()
            .with_context(|| format!("running mode {name}"))?;
        if !out.status.success() {
            bail!(
                "mode {name} failed ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let bench: ModeBench = serde_json::from_slice(&out.stdout)
            .with_context(|| format!("reading mode {name}'s result"))?;
        let demo = if args.demo {
            if !args.json {
                eprintln!("[bench rollout] {name}: the demo at the preset's budget");
            }
            Some(run_demo(&exe, &args, name)?)
        } else {
            None
        };
        results.insert(name.clone(), ModeResult { bench, demo });
    }
    let ratio = |num: &str, den: &str, f: &dyn Fn(&ModeBench) -> f64| -> Option<f64> {
        let (a, b) = (results.get(num)?, results.get(den)?);
        let d = f(&b.bench);
        (d > 0.0).then(|| f(&a.bench) / d)
    };
    let report = serde_json::json!({
        "preset": args.preset.name(),
        "tasks": args.tasks,
        "all_turns": args.all_turns,
        "threads": tch::get_num_threads(),
        "modes": results,
        // Reference over inline, f32, per trajectory: > 1 means inline is cheaper.
        "learner_ratio": ratio("reference_f32", "inline_f32", &|b| b.replay.learner.tokens_per_trajectory),
        "generation_ratio": ratio("reference_f32", "inline_f32", &|b| b.replay.generation.tokens_per_trajectory),
        "learner_time_ratio": ratio("reference_f32", "inline_f32", &|b| b.replay.learner.wall_s_per_trajectory),
        "generation_time_ratio": ratio("reference_f32", "inline_f32", &|b| b.replay.generation.wall_s_per_trajectory),
        // f32 over bf16 wall time per trajectory, inline: > 1 means bf16 is faster.
        "bf16_learner_time_ratio": ratio("inline_f32", "inline_bf16", &|b| b.replay.learner.wall_s_per_trajectory),
        "bf16_generation_time_ratio": ratio("inline_f32", "inline_bf16", &|b| b.replay.generation.wall_s_per_trajectory),
        // Activation checkpointing over none, inline f32 learner: time > 1 is its extra cost,
        // memory < 1 its saving.
        "checkpoint_learner_time_ratio": ratio("inline_f32_ckpt", "inline_f32", &|b| b.replay.learner.wall_s_per_trajectory),
        "checkpoint_learner_memory_ratio": ratio("inline_f32_ckpt", "inline_f32", &|b| b.replay.learner.peak_rss_mib),
    });
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", table(&report, &results));
    }
    Ok(())
}

/// The child: collect seeds into a fresh folder, then measure.
fn run_one(args: &RolloutBenchArgs, name: &str) -> Result<()> {
    let mode = Mode::parse(name)?;
    let cfg = mode.config(args.preset, args.tasks as usize, args.all_turns);
    cfg.validate().map_err(anyhow::Error::msg)?;
    crate::runtime::tune_allocator(AllocatorTuning::for_config(&cfg));
    let dir = args.out.join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let bench = rt.block_on(async {
        let mut p = Pipeline::open(cfg.clone(), &dir, args.preset.name()).await?;
        p.collect().await?;
        let out = async {
            let live = p.bench_rollout().await?;
            let replay = p.bench_replay().await?;
            Ok::<_, anyhow::Error>((replay, live))
        }
        .await;
        p.shutdown();
        out
    })?;
    let (replay, live) = bench;
    // The peak in the same process and dtype, once the phases are done.
    let (device, dtype) = resolve(cfg.model.device, cfg.model.dtype)?;
    let loaded = load(&ModelSource::parse(&cfg.model.source), device, dtype)?;
    let config = loaded.model.config();
    let bench = ModeBench {
        replay,
        live,
        gemm_peak_flop_s: gemm_peak(config, device, dtype, 3)?,
        layer_flops_per_token: TokenFlops::of(config).layers,
    };
    println!("{}", serde_json::to_string(&bench)?);
    Ok(())
}

/// Runs `envace demo` with the mode's config in `<out>/<mode>-demo` and reads its report.
fn run_demo(exe: &Path, args: &RolloutBenchArgs, name: &str) -> Result<DemoOutcome> {
    // The demo keeps the preset's budgets: only the mode changes.
    let cfg = Mode::parse(name)?.config(
        args.preset,
        RunConfig::preset(args.preset).train.tasks_per_step,
        false,
    );
    let config = args.out.join(format!("{name}.toml"));
    std::fs::write(&config, cfg.to_toml())
        .with_context(|| format!("writing {}", config.display()))?;
    let dir = args.out.join(format!("{name}-demo"));
    let status = Command::new(exe)
        .args(["demo", "--fresh", "--config"])
        .arg(&config)
        .arg("--out")
        .arg(&dir)
        .stdout(std::process::Stdio::null())
        .status()
        .with_context(|| format!("running the demo of mode {name}"))?;
    if !status.success() {
        bail!("the demo of mode {name} failed ({status})");
    }
    let report = RunReport::load_or_new(&dir, "", "").map_err(|e| anyhow!("{e}"))?;
    let steps = &report.train.steps;
    Ok(DemoOutcome {
        train_reward_last: steps.last().map_or(0.0, |s| s.reward_mean),
        train_reward_mean: steps.iter().map(|s| s.reward_mean).sum::<f64>()
            / steps.len().max(1) as f64,
        eval_task_success: report.variants.get("envace").map(|v| v.task_success),
        wall_s: report.stages.values().map(|s| s.wall_s).sum(),
    })
}

fn table(report: &serde_json::Value, results: &BTreeMap<String, ModeResult>) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nbench rollout: preset {}, {} tasks, {} threads; per trajectory",
        report["preset"].as_str().unwrap_or("?"),
        report["tasks"],
        report["threads"]
    );
    let header = |s: &mut String, title: &str| {
        let _ = writeln!(
            s,
            "\n{title}\n{:<22} {:>6} {:>10} {:>8} {:>9} {:>6} {:>10} {:>8} {:>9} {:>6}",
            "mode",
            "trajs",
            "gen tok",
            "gen s",
            "gen MiB",
            "util",
            "learn tok",
            "learn s",
            "learn MiB",
            "util"
        );
    };
    let pct = |u: f64| format!("{:.1}%", 100.0 * u);
    let row =
        |s: &mut String, name: &str, m: &ModeBench, n: usize, g: &PhaseCost, l: &PhaseCost| {
            let learn_util = if l.tokens_per_trajectory > 0.0 {
                pct(m.utilisation(l, 3.0))
            } else {
                "-".into()
            };
            let _ = writeln!(
                s,
                "{:<22} {:>6} {:>10.0} {:>8.2} {:>9.0} {:>6} {:>10.0} {:>8.2} {:>9.0} {:>6}",
                name,
                n,
                g.tokens_per_trajectory,
                g.wall_s_per_trajectory,
                g.peak_rss_mib,
                pct(m.utilisation(g, 1.0)),
                l.tokens_per_trajectory,
                l.wall_s_per_trajectory,
                l.peak_rss_mib,
                learn_util,
            );
        };
    type Pick = fn(&ModeBench) -> (usize, &PhaseCost, &PhaseCost);
    let sections: [(&str, Pick); 2] = [
        ("seed replay (the same trajectories in every mode)", |b| {
            (
                b.replay.trajectories,
                &b.replay.generation,
                &b.replay.learner,
            )
        }),
        (
            "live rollouts of one training step (shapes differ by mode)",
            |b| (b.live.trajectories, &b.live.generation, &b.live.learner),
        ),
    ];
    for (title, pick) in sections {
        header(&mut s, title);
        for (name, r) in results {
            let (n, generation, learner) = pick(&r.bench);
            row(&mut s, name, &r.bench, n, generation, learner);
        }
    }
    let _ = writeln!(
        s,
        "\nutil: decoder-layer FLOP/s (three forwards for the learner; attention and the \
         vocabulary projection not counted: a lower bound) as a share of this machine's GEMM \
         peak in the mode's dtype, measured in the same run:"
    );
    for (name, r) in results {
        let _ = writeln!(
            s,
            "  {name:<22} {:.0} GFLOP/s",
            r.bench.gemm_peak_flop_s / 1e9
        );
    }
    let _ = writeln!(
        s,
        "\nreward (live rollouts; with --demo: last training step, test success)"
    );
    for (name, r) in results {
        let demo = r.demo.as_ref().map_or_else(String::new, |d| {
            format!(
                "  demo: train {:.3}, test success {}",
                d.train_reward_last,
                d.eval_task_success
                    .map_or_else(|| "-".to_string(), |v| format!("{:.1}%", v * 100.0))
            )
        });
        let _ = writeln!(s, "{name:<22} {:.3}{demo}", r.bench.live.reward_mean);
    }
    let _ = writeln!(s);
    for key in [
        "learner_ratio",
        "generation_ratio",
        "learner_time_ratio",
        "generation_time_ratio",
        "bf16_learner_time_ratio",
        "bf16_generation_time_ratio",
        "checkpoint_learner_time_ratio",
        "checkpoint_learner_memory_ratio",
    ] {
        let v = report[key]
            .as_f64()
            .map_or_else(|| "-".to_string(), |v| format!("{v:.2}×"));
        let _ = writeln!(s, "{key:<32} {v}");
    }
    s
}
