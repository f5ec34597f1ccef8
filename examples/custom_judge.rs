//! A custom judge: implement [`Judge`] and hand it to a topology (or set it per evaluation with
//! `Topology::start_judge`). This one is stricter than the default rule checklist: a turn
//! passes only when the agent's calls are exactly the expected functions, in order, with the
//! expected arguments — no extra calls.
//!
//! `cargo run --release --example custom_judge` (after `make setup`) scores the ground truth
//! of a few BFCL tasks and a copy with one extra call, with this judge and the default one.
//!
//! With arguments it is the whole `envace` command line with this judge registered as
//! `exact_sequence` (`envace::cli::run_with`), so a run config can train with it:
//!
//! ```text
//! cargo run --release --example custom_judge -- demo --config my.toml --out runs/exact
//! ```
//!
//! where `my.toml` says `judge = "exact_sequence"`.

use std::sync::Arc;

use envace::actors::{Judge, JudgeTask, ToolCall, TurnCalls, TurnScore, Verdict};
use envace::bfcl::env::tool_call_from_python;
use envace::bfcl::episode::BfclSuite;
use envace::bfcl::judge::RuleChecklistJudge;
use envace::registry::Registry;

/// Exact, ordered match of each turn's calls against its checklist; the episode stops at the
/// first failed turn.
struct ExactSequenceJudge;

impl Judge for ExactSequenceJudge {
    fn judge(&self, task: &JudgeTask, transcript: &[TurnCalls]) -> Verdict {
        let mut scores = Vec::new();
        let mut reached = true;
        for (t, items) in task.checklist.iter().enumerate() {
            let pass = reached
                && transcript.get(t).is_some_and(|turn| {
                    turn.final_answer
                        && turn.calls.len() == items.len()
                        && turn.calls.iter().zip(items).all(|(call, item)| {
                            call.name == item.function
                                && task.named_arguments(call) == item.arguments
                        })
                });
            scores.push(TurnScore {
                score: if pass { 1.0 } else { 0.0 },
                passed_required: pass,
                reason: if pass {
                    "exact".into()
                } else {
                    "calls differ".into()
                },
            });
            reached = pass;
        }
        Verdict::from_turn_scores(scores)
    }
}

fn main() -> std::process::ExitCode {
    if std::env::args().len() > 1 {
        let mut registry = Registry::builtin();
        registry.register_judge("exact_sequence", |_| Arc::new(ExactSequenceJudge));
        return envace::cli::run_with(registry);
    }
    match compare_judges() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("custom_judge: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Scores the ground truth of three train tasks, and a copy with one extra call, with this
/// judge and the default one.
fn compare_judges() -> Result<(), Box<dyn std::error::Error>> {
    let suite = BfclSuite::load_base()?;
    for task in suite.train.iter().take(3) {
        let bfcl = suite.task(&task.id.0).ok_or("task missing")?;
        let transcript: Vec<TurnCalls> = bfcl
            .ground_truth
            .iter()
            .map(|calls| {
                let calls: Vec<ToolCall> = calls
                    .iter()
                    .filter_map(|src| tool_call_from_python(src).ok())
                    .collect();
                TurnCalls::answered(calls)
            })
            .collect();
        let mut extra = transcript.clone();
        if let Some(first) = extra.first_mut() {
            first.calls.push(ToolCall::new("ls", Default::default()));
        }
        for (name, judge) in [
            ("exact", &ExactSequenceJudge as &dyn Judge),
            ("rule checklist", &RuleChecklistJudge),
        ] {
            println!(
                "{:<22} {:<15} ground truth R = {:.2}, with an extra call R = {:.2}",
                task.id.0,
                name,
                judge.judge(&task.judge, &transcript).reward,
                judge.judge(&task.judge, &extra).reward,
            );
        }
    }
    Ok(())
}
