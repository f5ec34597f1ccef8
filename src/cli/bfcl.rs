//! `envace bfcl`: the BFCL multi-turn environment from the command line.
//!
//! * `replay --category C`: replays every task's ground truth through the environment (as JSON
//!   tool calls) and the checker; prints failures, the tasks skipped because a class is not
//!   ported yet, and `N/N tasks pass`. Exit 1 on any failure.
//! * `conform --traces FILE`: runs every call of a reference trace file (ground truth and
//!   probes) and compares results and per-turn states; prints `calls: A/B match, states: C/D
//!   match` and the first mismatches in full. Exit 1 on any mismatch.
//! * `split [--json]`: the stratified train/test split of the scenarios (per stratum and per
//!   class, train and test counts, and the test ids).
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use crate::bfcl::checker::replay_ground_truth;
use crate::bfcl::conform::{conform_lines, is_ported, owners, read_trace_file};
use crate::bfcl::env::BfclEnv;
use crate::bfcl::schema::FuncDocs;
use crate::bfcl::split::ScenarioSplit;
use crate::bfcl::tasks::{data_dir, load_category, Category};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};

#[derive(Debug, Subcommand)]
pub enum BfclCommand {
    /// Replay the ground truth of a category through the environment and the checker.
    Replay(ReplayArgs),
    /// Compare the environment with a reference trace file (results, probes, states).
    Conform(ConformArgs),
    /// The stratified train/test split of the scenarios, with per-class counts.
    Split(SplitArgs),
}

#[derive(Debug, Args)]
pub struct SplitArgs {
    /// One JSON object (strata, classes, train and test indices) instead of the tables.
    #[arg(long)]
    json: bool,
    /// BFCL data folder (default: the installed `assets/bfcl_eval/data`).
    #[arg(long)]
    data: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// `base`, `miss_param`, `miss_func`, `long_context` or `all`.
    #[arg(long, default_value = "all")]
    category: String,
    /// BFCL data folder (default: the installed `assets/bfcl_eval/data`).
    #[arg(long)]
    data: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ConformArgs {
    /// A reference trace file (`traces/<category>.jsonl`, or `.jsonl.xz`) or a fixture in that format.
    #[arg(long)]
    traces: PathBuf,
    /// BFCL data folder for the tasks' `initial_config` and the function docs (default: the
    /// installed `assets/bfcl_eval/data`).
    #[arg(long)]
    data: Option<PathBuf>,
    /// How many mismatches to print in full.
    #[arg(long, default_value_t = 10)]
    show: usize,
}

/// Runs a subcommand; a failing task or a mismatch is an error (exit code 1).
pub fn run(cmd: BfclCommand) -> Result<()> {
    match cmd {
        BfclCommand::Replay(args) => replay(args),
        BfclCommand::Conform(args) => conform(args),
        BfclCommand::Split(args) => split(args),
    }
}

fn categories(name: &str) -> Result<Vec<Category>> {
    if name == "all" {
        return Ok(Category::ALL.to_vec());
    }
    Ok(vec![name.parse::<Category>()?])
}

fn replay(args: ReplayArgs) -> Result<()> {
    let data = args.data.unwrap_or_else(data_dir);
    let docs = FuncDocs::load(&data.join("multi_turn_func_doc")).context("loading func docs")?;
    let mut env = BfclEnv::new(Arc::new(docs));
    let mut failed = 0;
    for category in categories(&args.category)? {
        let tasks = load_category(&data, category)
            .with_context(|| format!("loading category {category}"))?;
        let started = Instant::now();
        let (mut passed, mut run) = (0usize, 0usize);
        let mut skipped: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for task in &tasks {
            match replay_ground_truth(&mut env, task) {
                Err(e) if e.is_unsupported() => {
                    let missing: Vec<&str> = task
                        .involved_classes
                        .iter()
                        .filter(|c| !is_ported(c))
                        .map(String::as_str)
                        .collect();
                    skipped
                        .entry(missing.join("+"))
                        .or_default()
                        .push(task.id.clone());
                }
                Err(e) => {
                    run += 1;
                    println!("FAIL {}: {e}", task.id);
                }
                Ok(verdict) => {
                    run += 1;
                    match &verdict.failure {
                        None => passed += 1,
                        Some((turn, reason)) => println!(
                            "FAIL {} turn {turn} ({}): {reason}",
                            task.id,
                            reason.error_type()
                        ),
                    }
                }
            }
        }
        let elapsed = started.elapsed();
        let n_skipped: usize = skipped.values().map(Vec::len).sum();
        if n_skipped > 0 {
            println!("{category}: skipped {n_skipped} task(s), classes not ported yet:");
            for (classes, ids) in &skipped {
                let suffixes: Vec<String> = ids
                    .iter()
                    .map(|id| id.rsplit('_').next().unwrap_or(id).to_string())
                    .collect();
                println!("  {classes} ({}): {}", ids.len(), suffixes.join(" "));
            }
        }
        println!(
            "{category}: {passed}/{run} tasks pass ({:.2} ms per task, replay and check)",
            elapsed.as_secs_f64() * 1e3 / run.max(1) as f64
        );
        failed += run - passed;
    }
    if failed > 0 {
        bail!("{failed} task(s) fail the ground-truth replay");
    }
    Ok(())
}

fn conform(args: ConformArgs) -> Result<()> {
    let data = args.data.unwrap_or_else(data_dir);
    let docs = FuncDocs::load(&data.join("multi_turn_func_doc")).context("loading func docs")?;
    let owners = owners(&docs);
    let text = read_trace_file(&args.traces)?;
    // The reference traces carry no initial_config: take it from the task files.
    let mut configs = BTreeMap::new();
    let needed: Vec<Category> = Category::ALL
        .into_iter()
        .filter(|c| text.contains(&format!("\"multi_turn_{}_", c.name())))
        .collect();
    for category in needed {
        for task in load_category(&data, category)
            .with_context(|| format!("loading category {category}"))?
        {
            configs.insert(task.id, task.initial_config);
        }
    }
    let started = Instant::now();
    let report = conform_lines(&text, &args.traces, &owners, &|id| configs.get(id).cloned())?;
    let elapsed = started.elapsed();
    for m in report.mismatches.iter().take(args.show) {
        println!("MISMATCH {m}");
    }
    for (class, t) in &report.per_class {
        println!(
            "  {class}: calls {}/{} match, states {}/{} match",
            t.calls_ok, t.calls, t.states_ok, t.states
        );
    }
    if !report.skipped_calls.is_empty() {
        let list: Vec<String> = report
            .skipped_calls
            .iter()
            .map(|(c, n)| format!("{c} ({n} calls)"))
            .collect();
        println!("skipped, classes not ported yet: {}", list.join(", "));
    }
    let total = report.total();
    println!(
        "{} tasks in {:.2} s; {} mismatches",
        report.tasks,
        elapsed.as_secs_f64(),
        report.mismatches.len()
    );
    println!(
        "calls: {}/{} match, states: {}/{} match",
        total.calls_ok, total.calls, total.states_ok, total.states
    );
    if !report.mismatches.is_empty() {
        bail!(
            "{} mismatches with {}",
            report.mismatches.len(),
            args.traces.display()
        );
    }
    Ok(())
}

fn split(args: SplitArgs) -> Result<()> {
    let data = args.data.unwrap_or_else(data_dir);
    let base = load_category(&data, Category::Base).context("loading category base")?;
    let split = ScenarioSplit::from_base(&base)?;
    if args.json {
        let classes: BTreeMap<String, serde_json::Value> = split
            .class_counts()
            .into_iter()
            .map(|(c, (train, test))| (c, serde_json::json!({"train": train, "test": test})))
            .collect();
        let out = serde_json::json!({
            "train": split.train,
            "test": split.test,
            "classes": classes,
            "strata": split.strata,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "multi_turn_base: {} train, {} test scenarios (the same indices in miss_param, \
         miss_func and long_context)\n",
        split.train.len(),
        split.test.len()
    );
    println!("| stratum (involved classes) | train | test |\n| --- | ---: | ---: |");
    for (key, s) in &split.strata {
        println!("| {key} | {} | {} |", s.train.len(), s.test.len());
    }
    println!("\n| class | train scenarios | test scenarios |\n| --- | ---: | ---: |");
    for (class, (train, test)) in split.class_counts() {
        println!("| {class} | {train} | {test} |");
    }
    let ids: Vec<String> = split.test.iter().map(usize::to_string).collect();
    println!("\ntest scenario indices: {}", ids.join(" "));
    Ok(())
}
