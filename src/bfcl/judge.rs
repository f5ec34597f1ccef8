//! The BFCL judges: the rule-based checklist judge ([`RuleChecklistJudge`], nothing executed:
//! the agent's calls are matched against the ground truth's calls) and BFCL's own multi-turn
//! checker as a judge ([`BfclCheckerJudge`], the calls re-executed in a sandbox: the judge of
//! real-environment evaluation). The dense checklist judge, which gives partial credit, is in
//! [`super::dense`].
//!
//! [`checklist_from_task`] turns a task's ground truth into a [`JudgeTask`]: each user turn's
//! checklist has one item per ground-truth call of that turn (function name and arguments),
//! weight 1/n for a turn of n calls, every item required (the reference's
//! `required_for_next_turn`). [`RuleChecklistJudge`] scores a transcript against it:
//!
//! * an item passes when some call of the same turn, not already matched by another item, has
//!   the item's function name and equal arguments — the same key set, values equal as JSON
//!   with integers and floats compared by value (`1 == 1.0`; `true != 1`). Optional arguments
//!   count: a call that spells out a default the ground truth omits does not match;
//! * the turn score is the passed items' share of the turn's total weight (= Σ weight·pass
//!   when the weights sum to 1, as they do here; exactly 1 when every item passes, whatever
//!   the rounding of 1/n); extra calls cost nothing;
//! * a turn with an empty ground truth (miss-param, miss-func: the model should ask or wait)
//!   scores 1 iff the agent made no call in it, and a call there is a failed required item;
//! * a turn that did not end with a final answer (the episode stopped inside it) scores 0;
//! * after a turn whose required item failed, later turns are never reached and score 0;
//! * reward = Σ turn scores / number of user turns (DESIGN.md §2).
//!
//! Greedy matching (items in order, each taking the first free equal call) finds a largest
//! matching, because "equal to an item" is an equivalence: equal items are interchangeable
//! and so are the calls that match them.
//!
//! ```
//! use envace::bfcl::judge::RuleChecklistJudge;
//! use envace::bfcl::env::tool_call_from_python;
//! use envace_actors::judge::{ChecklistItem, Judge, JudgeTask, TurnCalls};
//!
//! let cd = tool_call_from_python("cd(folder='temp')").unwrap();
//! let task = JudgeTask {
//!     id: "t".into(),
//!     checklist: vec![vec![ChecklistItem {
//!         function: cd.name.clone(),
//!         arguments: cd.arguments.clone(),
//!         weight: 1.0,
//!         required: true,
//!     }]],
//!     ..JudgeTask::default()
//! };
//! let verdict = RuleChecklistJudge.judge(&task, &[TurnCalls::answered(vec![cd])]);
//! assert_eq!(verdict.reward, 1.0);
//! ```

use envace_actors::environment::ToolCall;
use envace_actors::judge::{ChecklistItem, Judge, JudgeTask, TurnCalls, TurnScore, Verdict};
use serde_json::{Map, Value};

use super::checker::{Checker, CheckerConfig};
use super::env::tool_call_from_python;
use super::env::{observation, to_py_call};
use super::executor::Executor;
use super::parse::ParseError;
use super::schema::FuncDocs;
use super::tasks::BfclTask;
use std::collections::HashMap;
use std::sync::Arc;

/// Why a task's checklist could not be built.
#[derive(Debug, thiserror::Error)]
pub enum JudgeError {
    /// A ground-truth call string did not parse (or has no JSON form).
    #[error("task {task}, turn {turn}: ground-truth call {call:?}: {source}")]
    GroundTruth {
        task: String,
        turn: usize,
        call: String,
        #[source]
        source: ParseError,
    },
}

/// Builds the checklist judge's task from `task`'s ground truth (see the module doc).
///
/// Ground-truth calls may use positional arguments (`sort('final_report.pdf')`). With `docs`,
/// they are named by the function doc's parameter order (`properties` in file order, which
/// follows the Python signature) and the same order is recorded in
/// [`JudgeTask::parameter_order`] for every function of the task's classes, so the agent's
/// positional calls are named alike. Without `docs` (or for a function without a doc),
/// positional arguments are dropped and only keyword arguments are checked — on both sides,
/// so a ground-truth replay still matches.
///
/// # Errors
/// [`JudgeError::GroundTruth`] when a ground-truth call does not parse.
pub fn checklist_from_task(
    task: &BfclTask,
    docs: Option<&FuncDocs>,
) -> Result<JudgeTask, JudgeError> {
    let mut judge_task = JudgeTask {
        id: task.id.clone(),
        ..JudgeTask::default()
    };
    if let Some(docs) = docs {
        for doc in task
            .involved_classes
            .iter()
            .filter_map(|c| docs.class(c))
            .flatten()
        {
            let names = doc
                .parameters
                .get("properties")
                .and_then(Value::as_object)
                .map(|p| p.keys().cloned().collect())
                .unwrap_or_default();
            judge_task.parameter_order.insert(doc.name.clone(), names);
        }
    }
    for (turn, calls) in task.ground_truth.iter().enumerate() {
        let weight = 1.0 / calls.len().max(1) as f32;
        let mut items = Vec::with_capacity(calls.len());
        for src in calls {
            let call = tool_call_from_python(src).map_err(|source| JudgeError::GroundTruth {
                task: task.id.clone(),
                turn,
                call: src.clone(),
                source,
            })?;
            items.push(ChecklistItem {
                arguments: judge_task.named_arguments(&call),
                function: call.name,
                weight,
                required: true,
            });
        }
        judge_task.checklist.push(items);
    }
    Ok(judge_task)
}

/// The rule-based checklist judge (see the module doc). Stateless.
#[derive(Debug, Clone, Copy, Default)]
pub struct RuleChecklistJudge;

impl Judge for RuleChecklistJudge {
    fn judge(&self, task: &JudgeTask, transcript: &[TurnCalls]) -> Verdict {
        judge_turns(task, transcript, |items, played| {
            score_turn(task, items, played)
        })
    }
}

/// Scores each user turn of `task` with `score(items, played)` while the trajectory reaches
/// it: a turn the transcript does not have, and every turn after one whose required item
/// failed, is "not reached" with score 0. Shared by the checklist judges.
pub(crate) fn judge_turns(
    task: &JudgeTask,
    transcript: &[TurnCalls],
    mut score: impl FnMut(&[ChecklistItem], &TurnCalls) -> TurnScore,
) -> Verdict {
    let mut scores = Vec::with_capacity(task.num_turns());
    let mut stopped: Option<&str> = None;
    for (turn, items) in task.checklist.iter().enumerate() {
        let s = match (stopped, transcript.get(turn)) {
            (Some(why), _) => not_reached(why),
            (None, None) => {
                stopped = Some("the trajectory ended before this turn");
                not_reached("the trajectory ended before this turn")
            }
            (None, Some(played)) => {
                let s = score(items, played);
                if !s.passed_required {
                    stopped = Some("a required item of an earlier turn failed");
                }
                s
            }
        };
        scores.push(s);
    }
    Verdict::from_turn_scores(scores)
}

fn not_reached(why: &str) -> TurnScore {
    TurnScore {
        score: 0.0,
        passed_required: false,
        reason: format!("not reached: {why}"),
    }
}

/// Scores one played turn against its checklist (the rule judge's turn score; its
/// `passed_required` is the gate of every checklist judge).
pub(crate) fn score_turn(
    task: &JudgeTask,
    items: &[ChecklistItem],
    played: &TurnCalls,
) -> TurnScore {
    if !played.final_answer {
        return TurnScore {
            score: 0.0,
            passed_required: false,
            reason: "the episode stopped inside this turn (no final answer)".into(),
        };
    }
    if items.is_empty() {
        let passed = played.calls.is_empty();
        let reason = if passed {
            "no call expected and none made".to_string()
        } else {
            let names: Vec<&str> = played.calls.iter().map(|c| c.name.as_str()).collect();
            format!("no call expected, but made {}", names.join(", "))
        };
        return TurnScore {
            score: if passed { 1.0 } else { 0.0 },
            passed_required: passed,
            reason,
        };
    }
    let calls: Vec<(&ToolCall, Map<String, Value>)> = played
        .calls
        .iter()
        .map(|c| (c, task.named_arguments(c)))
        .collect();
    let mut used = vec![false; calls.len()];
    let (mut passed_weight, mut total_weight) = (0.0f64, 0.0f64);
    let mut passed_required = true;
    let mut failed = Vec::new();
    for item in items {
        let weight = f64::from(item.weight.max(0.0));
        total_weight += weight;
        let hit = calls.iter().enumerate().position(|(j, (call, args))| {
            !used[j] && call.name == item.function && arguments_eq(args, &item.arguments)
        });
        match hit {
            Some(j) => {
                used[j] = true;
                passed_weight += weight;
            }
            None => {
                passed_required &= !item.required;
                failed.push(format!(
                    "{}({}){}",
                    item.function,
                    Value::Object(item.arguments.clone()),
                    if item.required { " [required]" } else { "" }
                ));
            }
        }
    }
    let score = if total_weight > 0.0 {
        (passed_weight / total_weight).clamp(0.0, 1.0) as f32
    } else {
        0.0
    };
    let reason = if failed.is_empty() {
        format!("all {} items passed", items.len())
    } else {
        format!("missing: {}", failed.join("; "))
    };
    TurnScore {
        score,
        passed_required,
        reason,
    }
}

/// The same keys with [`json_eq`] values.
pub(crate) fn arguments_eq(a: &Map<String, Value>, b: &Map<String, Value>) -> bool {
    a.len() == b.len()
        && a.iter()
            .all(|(k, v)| b.get(k).is_some_and(|w| json_eq(v, w)))
}

/// JSON equality with numbers compared by value (`1 == 1.0`), object keys in any order.
pub(crate) fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            if let (Some(i), Some(j)) = (x.as_i64(), y.as_i64()) {
                i == j
            } else if let (Some(i), Some(j)) = (x.as_u64(), y.as_u64()) {
                i == j
            } else {
                x.as_f64() == y.as_f64()
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(v, w)| json_eq(v, w))
        }
        (Value::Object(x), Value::Object(y)) => arguments_eq(x, y),
        _ => a == b,
    }
}

/// The judge of real-environment evaluation: BFCL's multi-turn checker ([`Checker`]) applied
/// to the agent's calls.
///
/// For a transcript of task `id` it looks up the [`BfclTask`], instantiates a fresh sandbox
/// ([`Executor`]) from the task's initial configuration, and for each user turn the
/// transcript played re-executes that turn's calls in order (deterministic: the same calls
/// give the same results as in the agent's environment) and hands their result texts and the
/// sandbox's state to [`Checker::check_turn`]. Scores:
///
/// * a turn BFCL's checker passes scores 1 with `passed_required`; a failing turn scores 0
///   with the checker's error type and reason;
/// * a turn that did not end with a final answer (the episode stopped inside it) scores 0;
/// * BFCL stops at the first failing turn, so every later turn, and every turn the transcript
///   did not reach, scores 0 ("not reached");
/// * reward = mean turn score (1 exactly when BFCL's verdict on the task is a pass).
///
/// Problems with the task itself (an unknown id, a class that is not ported, a turn count
/// that differs from the [`JudgeTask`]'s) give reward 0 with the reason in every turn score,
/// never a panic.
#[derive(Clone)]
pub struct BfclCheckerJudge {
    tasks: Arc<HashMap<String, BfclTask>>,
    config: CheckerConfig,
}

impl BfclCheckerJudge {
    /// A judge for the tasks in `tasks` (by id).
    pub fn new(tasks: Arc<HashMap<String, BfclTask>>, config: CheckerConfig) -> Self {
        Self { tasks, config }
    }

    /// The checker options.
    pub fn config(&self) -> CheckerConfig {
        self.config
    }
}

impl Judge for BfclCheckerJudge {
    fn judge(&self, task: &JudgeTask, transcript: &[TurnCalls]) -> Verdict {
        let turns = task.num_turns();
        let fail_all = |reason: String| {
            Verdict::from_turn_scores(vec![
                TurnScore {
                    score: 0.0,
                    passed_required: false,
                    reason,
                };
                turns
            ])
        };
        let Some(bfcl) = self.tasks.get(&task.id) else {
            return fail_all(format!("unknown BFCL task {}", task.id));
        };
        if bfcl.num_turns() != turns {
            return fail_all(format!(
                "BFCL task {} has {} turns but the judge task has {turns}",
                task.id,
                bfcl.num_turns()
            ));
        }
        let sandbox = Executor::new(
            &bfcl.involved_classes,
            &bfcl.initial_config,
            bfcl.long_context(),
        );
        let (mut sandbox, mut checker) = match (sandbox, Checker::new(bfcl, self.config)) {
            (Ok(s), Ok(c)) => (s, c),
            (Err(e), _) | (_, Err(e)) => {
                return fail_all(format!("task {} cannot be checked: {e}", task.id))
            }
        };
        let mut scores = Vec::with_capacity(turns);
        let mut stopped: Option<String> = None;
        for turn in 0..turns {
            let played = match (&stopped, transcript.get(turn)) {
                (Some(why), _) => {
                    scores.push(not_reached(why));
                    continue;
                }
                (None, None) => {
                    let why = "the trajectory ended before this turn".to_string();
                    scores.push(not_reached(&why));
                    stopped = Some(why);
                    continue;
                }
                (None, Some(played)) => played,
            };
            let results: Vec<String> = played
                .calls
                .iter()
                .map(|c| observation(sandbox.execute(to_py_call(c))).text)
                .collect();
            let verdict = checker.check_turn(&results, &sandbox.snapshot());
            let score = if !played.final_answer {
                TurnScore {
                    score: 0.0,
                    passed_required: false,
                    reason: "the episode stopped inside this turn (no final answer)".into(),
                }
            } else if let Some(failure) = &verdict.failure {
                TurnScore {
                    score: 0.0,
                    passed_required: false,
                    reason: format!("{}: {failure}", failure.error_type()),
                }
            } else {
                TurnScore {
                    score: 1.0,
                    passed_required: true,
                    reason: if verdict.checked {
                        "state and results match the ground truth".into()
                    } else {
                        "no call expected and none checked".into()
                    },
                }
            };
            if !score.passed_required {
                stopped = Some(format!("turn {turn} failed"));
            }
            scores.push(score);
        }
        Verdict::from_turn_scores(scores)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bfcl::tasks::{data_dir, load_category, Category};
    use serde_json::json;

    fn docs() -> FuncDocs {
        FuncDocs::load_installed().expect("BFCL func docs (make setup)")
    }

    fn base_tasks() -> Vec<BfclTask> {
        load_category(&data_dir(), Category::Base).expect("BFCL base tasks (make setup)")
    }

    /// The ground truth as the agent's transcript: every call, each turn answered.
    fn ground_truth_transcript(task: &BfclTask) -> Vec<TurnCalls> {
        task.ground_truth
            .iter()
            .map(|calls| {
                TurnCalls::answered(
                    calls
                        .iter()
                        .map(|c| tool_call_from_python(c).expect("ground truth parses"))
                        .collect(),
                )
            })
            .collect()
    }

    fn task(id: &str) -> BfclTask {
        base_tasks()
            .into_iter()
            .find(|t| t.id == id)
            .expect("task present")
    }

    fn call(src: &str) -> ToolCall {
        tool_call_from_python(src).expect("call parses")
    }

    fn scores(v: &Verdict) -> Vec<f32> {
        v.turn_scores.iter().map(|t| t.score).collect()
    }

    #[test]
    fn ground_truth_scores_one_on_every_base_task() {
        let docs = docs();
        let tasks = base_tasks();
        assert_eq!(tasks.len(), 200);
        for task in &tasks {
            let jt = checklist_from_task(task, Some(&docs)).expect("checklist");
            assert_eq!(jt.num_turns(), task.num_turns());
            let transcript = ground_truth_transcript(task);
            // Every positional argument got a name from the docs.
            for c in transcript.iter().flat_map(|t| &t.calls) {
                let named = jt.named_arguments(c).len();
                assert_eq!(
                    named,
                    c.positional.len() + c.arguments.len(),
                    "{}: {c:?}",
                    task.id
                );
            }
            let verdict = RuleChecklistJudge.judge(&jt, &transcript);
            assert_eq!(
                verdict.reward, 1.0,
                "{}: {:?}",
                task.id, verdict.turn_scores
            );
            // The same calls in JSON form (keywords only, as the Act role emits them).
            let json_form: Vec<TurnCalls> = transcript
                .iter()
                .map(|t| {
                    TurnCalls::answered(
                        t.calls
                            .iter()
                            .map(|c| ToolCall::new(c.name.clone(), jt.named_arguments(c)))
                            .collect(),
                    )
                })
                .collect();
            assert_eq!(
                RuleChecklistJudge.judge(&jt, &json_form).reward,
                1.0,
                "{}",
                task.id
            );
        }
    }

    #[test]
    fn positional_ground_truth_is_named_from_the_docs() {
        let jt = checklist_from_task(&task("multi_turn_base_0"), Some(&docs())).unwrap();
        // Turn 2 is `sort('final_report.pdf')`.
        assert_eq!(jt.checklist[2][0].function, "sort");
        assert_eq!(
            Value::Object(jt.checklist[2][0].arguments.clone()),
            json!({"file_name": "final_report.pdf"})
        );
        assert_eq!(jt.checklist[1][0].weight, 0.5);
        assert!(jt.checklist.iter().flatten().all(|i| i.required));
        // The JSON call the Act role would make matches it.
        let mut t = ground_truth_transcript(&task("multi_turn_base_0"));
        t[2].calls = vec![ToolCall::new(
            "sort",
            json!({"file_name": "final_report.pdf"})
                .as_object()
                .cloned()
                .unwrap(),
        )];
        assert_eq!(RuleChecklistJudge.judge(&jt, &t).reward, 1.0);
    }

    #[test]
    fn without_docs_only_keyword_arguments_are_checked() {
        let jt = checklist_from_task(&task("multi_turn_base_0"), None).unwrap();
        assert!(jt.parameter_order.is_empty());
        assert!(jt.checklist[2][0].arguments.is_empty());
        let transcript = ground_truth_transcript(&task("multi_turn_base_0"));
        assert_eq!(RuleChecklistJudge.judge(&jt, &transcript).reward, 1.0);
    }

    #[test]
    fn dropping_a_call_halves_the_turn_and_stops_the_trajectory() {
        // multi_turn_base_0 has turns of 3, 2, 1 and 4 calls; turn 1 is
        // cd(folder='temp'), grep(file_name='final_report.pdf', pattern='budget analysis').
        let t = task("multi_turn_base_0");
        let jt = checklist_from_task(&t, Some(&docs())).unwrap();
        let mut transcript = ground_truth_transcript(&t);
        transcript[1].calls.truncate(1);
        let v = RuleChecklistJudge.judge(&jt, &transcript);
        assert_eq!(scores(&v), vec![1.0, 0.5, 0.0, 0.0]);
        assert_eq!(v.reward, 0.375);
        assert!(v.turn_scores[0].passed_required);
        assert!(!v.turn_scores[1].passed_required);
        assert!(
            v.turn_scores[1].reason.contains("grep"),
            "{}",
            v.turn_scores[1].reason
        );
        assert!(v.turn_scores[2].reason.starts_with("not reached"));
    }

    #[test]
    fn a_wrong_argument_value_fails_the_item() {
        let t = task("multi_turn_base_0");
        let jt = checklist_from_task(&t, Some(&docs())).unwrap();
        let mut transcript = ground_truth_transcript(&t);
        transcript[0].calls[1] = call("mkdir(dir_name='tmp')");
        let v = RuleChecklistJudge.judge(&jt, &transcript);
        assert_eq!(scores(&v), vec![(2.0f64 / 3.0) as f32, 0.0, 0.0, 0.0]);
        assert!((v.reward - 1.0 / 6.0).abs() < 1e-6, "{}", v.reward);
        assert!(v.turn_scores[0].reason.contains("mkdir"));
        // A missing or extra argument key fails too.
        transcript[0].calls[1] = call("mkdir(dir_name='temp', mode=1)");
        assert!(!RuleChecklistJudge.judge(&jt, &transcript).turn_scores[0].passed_required);
    }

    #[test]
    fn extra_calls_do_not_reduce_the_score() {
        let t = task("multi_turn_base_0");
        let jt = checklist_from_task(&t, Some(&docs())).unwrap();
        let mut transcript = ground_truth_transcript(&t);
        transcript[0].calls.insert(0, call("ls()"));
        transcript[3].calls.push(call("pwd()"));
        transcript[3].calls.push(call("cd(folder='temp')"));
        assert_eq!(RuleChecklistJudge.judge(&jt, &transcript).reward, 1.0);
    }

    #[test]
    fn a_call_matches_at_most_one_item() {
        // Two items expecting the same call need two calls.
        let cd = call("cd(folder='x')");
        let item = ChecklistItem {
            function: "cd".into(),
            arguments: cd.arguments.clone(),
            weight: 0.5,
            required: true,
        };
        let jt = JudgeTask {
            id: "dup".into(),
            checklist: vec![vec![item.clone(), item]],
            ..JudgeTask::default()
        };
        let one = RuleChecklistJudge.judge(&jt, &[TurnCalls::answered(vec![cd.clone()])]);
        assert_eq!(one.reward, 0.5);
        let two = RuleChecklistJudge.judge(&jt, &[TurnCalls::answered(vec![cd.clone(), cd])]);
        assert_eq!(two.reward, 1.0);
    }

    #[test]
    fn integers_and_floats_compare_by_value() {
        let jt = JudgeTask {
            id: "num".into(),
            checklist: vec![vec![ChecklistItem {
                function: "fillFuelTank".into(),
                arguments: call("fillFuelTank(fuelAmount=15.0)").arguments,
                weight: 1.0,
                required: true,
            }]],
            ..JudgeTask::default()
        };
        let judge = |src: &str| {
            RuleChecklistJudge
                .judge(&jt, &[TurnCalls::answered(vec![call(src)])])
                .reward
        };
        assert_eq!(judge("fillFuelTank(fuelAmount=15)"), 1.0);
        assert_eq!(judge("fillFuelTank(fuelAmount=15.0)"), 1.0);
        assert_eq!(judge("fillFuelTank(fuelAmount=15.5)"), 0.0);
        assert_eq!(judge("fillFuelTank(fuelAmount='15')"), 0.0);
        assert!(json_eq(&json!({"a": [1, 2.0]}), &json!({"a": [1.0, 2]})));
        assert!(!json_eq(&json!(true), &json!(1)));
    }

    #[test]
    fn an_empty_ground_truth_turn_passes_only_without_calls() {
        let docs = docs();
        let tasks = load_category(&data_dir(), Category::MissParam).expect("miss_param tasks");
        let t = tasks
            .iter()
            .find(|t| t.ground_truth.iter().any(Vec::is_empty))
            .expect("a miss_param task with an empty turn");
        let empty = t
            .ground_truth
            .iter()
            .position(Vec::is_empty)
            .expect("empty turn");
        let jt = checklist_from_task(t, Some(&docs)).unwrap();
        assert!(jt.checklist[empty].is_empty());
        let mut transcript = ground_truth_transcript(t);
        assert_eq!(RuleChecklistJudge.judge(&jt, &transcript).reward, 1.0);
        transcript[empty].calls.push(call("ls()"));
        let v = RuleChecklistJudge.judge(&jt, &transcript);
        assert_eq!(v.turn_scores[empty].score, 0.0);
        assert!(!v.turn_scores[empty].passed_required);
        assert!(v.turn_scores[empty + 1..].iter().all(|s| s.score == 0.0));
        let expected = empty as f32 / t.num_turns() as f32;
        assert!(
            (v.reward - expected).abs() < 1e-6,
            "{} vs {expected}",
            v.reward
        );
    }

    #[test]
    fn a_turn_without_final_answer_or_never_played_scores_zero() {
        let t = task("multi_turn_base_0");
        let jt = checklist_from_task(&t, Some(&docs())).unwrap();
        let mut transcript = ground_truth_transcript(&t);
        transcript[1].final_answer = false;
        assert_eq!(
            scores(&RuleChecklistJudge.judge(&jt, &transcript)),
            vec![1.0, 0.0, 0.0, 0.0]
        );
        transcript.truncate(1);
        let v = RuleChecklistJudge.judge(&jt, &transcript);
        assert_eq!(v.turn_scores.len(), 4);
        assert_eq!(v.reward, 0.25);
    }
}
