//! The `envace` command line: parsing and dispatch; `anyhow` lives here and nowhere below.
//!
//! The `envace` binary calls [`run`]. A crate of its own judges calls [`run_with`] from its
//! `main` to get the same commands with those judges selectable by `judge = "…"`.
mod bench;
mod bench_rollout;
mod bfcl;
mod conformance;
mod daemon;
mod export_model;
mod generate;
mod inspect;
mod pipeline;
mod repair;

use std::process::ExitCode;

use crate::registry::Registry;
use crate::runtime::{AllocatorTuning, DeviceChoice, DtypeChoice};
use clap::{Args, Parser, Subcommand};

/// [`run`] with `registry`'s judges (for example [`Registry::builtin`] plus a user's own):
/// `judge = "name"` in a run config then selects any of them. Tunes the allocator as the
/// `envace` binary does; call it first thing in `main`, before other threads start.
///
/// ```no_run
/// use std::sync::Arc;
/// use envace::registry::Registry;
///
/// fn main() -> std::process::ExitCode {
///     let mut registry = Registry::builtin();
///     registry.register_judge("lenient", |_| Arc::new(envace::actors::PassThroughJudge));
///     envace::cli::run_with(registry)
/// }
/// ```
pub fn run_with(registry: Registry) -> ExitCode {
    run_with_args(registry, std::env::args_os())
}

/// [`run_with`] on the command line `args` (its first item is the program name), for a
/// program that gets its arguments elsewhere (a test harness re-running itself as `envace`).
pub fn run_with_args<I, T>(registry: Registry, args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    crate::runtime::tune_allocator(AllocatorTuning::Speed);
    if crate::registry::install(registry).is_err() {
        eprintln!("envace: a judge registry was installed already; using that one");
    }
    run_args(args)
}

#[derive(Debug, Parser)]
#[command(
    name = "envace",
    version,
    about = "EnvACE-style agentic RL for LLM tool-calling agents"
)]
struct Cli {
    /// Log format on stderr: `text` (default) or `json` (one JSON object per event, for log
    /// collectors). RUST_LOG filters as usual.
    #[arg(long, global = true, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// How tracing events are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Generate a completion for one prompt with the model's chat template.
    Generate(generate::GenerateArgs),
    /// Benchmarks (speed and memory tables; not tests).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Summarise a storage database (runs, record counts, last steps) or show one trajectory.
    Inspect(inspect::InspectArgs),
    /// Write records of a storage database to stdout, one JSON object per line.
    Export(inspect::ExportArgs),
    /// Rebuild a damaged database from its journal and what sled can still read; prints
    /// exactly what was lost.
    Repair(repair::RepairArgs),
    /// The BFCL multi-turn environment: ground-truth replay through the checker, conformance
    /// with the reference traces.
    #[command(subcommand)]
    Bfcl(bfcl::BfclCommand),
    /// Seed collection: replay the train split's ground truth in the real environment and
    /// store the seed trajectories in the run's sled DB.
    Collect(pipeline::RunArgs),
    /// Supervised warm-up on the seeds (Act rows from actions, Rehearse rows from
    /// observations).
    Sft(pipeline::RunArgs),
    /// Self-rehearsal role-wise GRPO: zero real environment calls (counted); resumes a stopped
    /// run.
    Train(pipeline::RunArgs),
    /// Long-running self-rehearsal training: checkpoints every N steps or T minutes (last K +
    /// best kept), periodic evaluation, graceful stop on SIGTERM/SIGINT, exact resume,
    /// Prometheus metrics, and control through `envace ctl`.
    Daemon(daemon::DaemonArgs),
    /// Talk to a running daemon over its run folder's Unix socket: status, stop, judge NAME,
    /// add-tasks FILE.
    Ctl(daemon::CtlArgs),
    /// Write a run's trained weights as an HF checkpoint folder or a GGUF file.
    ExportModel(export_model::ExportModelArgs),
    /// Evaluate a model variant against the real environment with the BFCL checker.
    Eval(pipeline::EvalArgs),
    /// The main job: collect, then evaluate base, warm up, evaluate, train, evaluate; prints
    /// the table and writes report.json and training.png into the run folder.
    Demo(pipeline::RunArgs),
    /// The embedded SmolLM2-135M-Instruct against HF transformers' reference (logits,
    /// teacher-forced log-probs, greedy ids) on this machine's device and dtype, with the
    /// dtype's documented tolerances; exits 1 when one fails.
    Conformance(conformance::ConformanceArgs),
    /// Test-time scaling table: no rehearsal, parallel and sequential N = 1, 2, 3, for the
    /// base and the trained model, on the same test tasks.
    TtsTable(pipeline::TtsTableArgs),
    /// Print a preset's complete configuration as TOML (a starting point for `--config`).
    Config(pipeline::ConfigArgs),
}

/// Model, device and dtype, shared by the subcommands that load a model.
#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// `smollm2-135m` (embedded default), `tiny` (random small model), a `.gguf` file, or an
    /// HF checkpoint directory.
    #[arg(long, default_value = "smollm2-135m")]
    pub model: String,
    /// `auto` (CUDA when present), `cpu` or `cuda`.
    #[arg(long, default_value = "auto")]
    pub device: DeviceChoice,
    /// `auto` (f32 on CPU, bf16 on CUDA), `fast` (bf16 where the hardware computes it, else
    /// f32), `f32` or `bf16`.
    #[arg(long, default_value = "auto")]
    pub dtype: DtypeChoice,
}

/// Runs the command line of `std::env::args()` with the judges of [`crate::registry::installed`]
/// (the built-in ones unless a registry was installed); the exit code is 0 on success, 1 with
/// the error chain on stderr otherwise.
pub fn run() -> ExitCode {
    run_args(std::env::args_os())
}

fn run_args<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = Cli::parse_from(args);
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "envace=info,warn".into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => drop(logs.try_init()),
        LogFormat::Json => drop(logs.json().try_init()),
    }
    let result = match cli.command {
        Command::Generate(args) => generate::run(args),
        Command::Bench(cmd) => bench::run(cmd),
        Command::Inspect(args) => inspect::inspect(args),
        Command::Export(args) => inspect::export(args),
        Command::Repair(args) => repair::repair(args),
        Command::Bfcl(cmd) => bfcl::run(cmd),
        Command::Collect(args) => pipeline::run(pipeline::Stage::Collect, args),
        Command::Sft(args) => pipeline::run(pipeline::Stage::Sft, args),
        Command::Train(args) => pipeline::run(pipeline::Stage::Train, args),
        Command::Daemon(args) => daemon::daemon(args),
        Command::Ctl(args) => daemon::ctl(args),
        Command::ExportModel(args) => export_model::run(args),
        Command::Eval(args) => pipeline::eval(args),
        Command::Demo(args) => pipeline::run(pipeline::Stage::Demo, args),
        Command::Config(args) => pipeline::print_config(args),
        Command::TtsTable(args) => pipeline::tts_table_command(args),
        Command::Conformance(args) => conformance::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes joined by ": ", skipping a cause whose text the message already
/// ends with (library errors often print their source inline as well).
fn error_chain(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if msg.ends_with(&text) {
            continue;
        }
        if !msg.is_empty() {
            msg.push_str(": ");
        }
        msg.push_str(&text);
    }
    msg
}
