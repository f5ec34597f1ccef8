//! The dense checklist judge: partial credit per user turn, so a small model's rollouts get
//! rewards that differ and GRPO has something to push on. Selected with
//! `judge = "dense_checklist"` (the presets' training judge).
//!
//! It scores the same checklists as [`RuleChecklistJudge`](super::judge::RuleChecklistJudge)
//! (one item per ground-truth call, weight 1/n) with decomposed rewards in the style of ToolRL
//! (Qian et al. 2025, "ToolRL: Reward is All Tool Learning Needs", arXiv:2504.13958: a format
//! reward plus a correctness reward split into tool name, parameter names and parameter values).
//!
//! # Formula
//!
//! For a played user turn with checklist items `i` (weights `wᵢ`) and the calls `c` the agent
//! wrote in it — the executed ones and the complete blocks before a malformed one, which the
//! transcript records unexecuted ([`TurnCalls::all_calls`]):
//!
//! ```text
//! format  f = [the turn has the form its checklist asks for: at least one well-formed call
//!              when it expects calls, no call when it expects none]
//!           × (½ + ½·[no Act output of the turn was malformed and the turn ended with a final answer])
//! sim(i, c) = 0                                        if name(c) ≠ name(i)
//!           = ⅓ + ⅓·|Kᵢ ∩ K_c| / |Kᵢ ∪ K_c| + ⅓·|{k ∈ Kᵢ ∩ K_c : vᵢ(k) = v_c(k)}| / |Kᵢ ∪ K_c|
//!                                                      otherwise (K: argument names; 0/0 = 1)
//! credit  a = max over one-to-one matchings M of Σ_{(i,c)∈M} wᵢ·sim(i, c) / Σᵢ wᵢ
//!           = [no call written, nothing malformed, a final answer]  for an empty checklist
//! turn score = 0.2·f + 0.8·a
//! reward R  = Σ turn scores / number of user turns (turns not reached score 0)
//! ```
//!
//! The first factor keeps a plain-text answer to a turn that needs calls from earning format
//! credit: it parses (a final answer), but it is not the protocol's form for that turn, and an
//! untrained model that never calls would otherwise collect format credit on every turn.
//!
//! Values compare as the rule judge compares them (JSON equality, `1 == 1.0`); positional
//! arguments are named by the task's parameter order first. The matching is the optimum of the
//! assignment problem (Hungarian method), so a call earns credit for at most one item and the
//! order of calls does not matter. Extra calls cost nothing, as in the rule checklist.
//!
//! **R = 1 exactly when the rule checklist gives 1**: `a = 1` needs every item matched by a call
//! with the same name, the same argument names and equal values — the rule's pass condition —
//! and `f = 1` needs a final answer, which a turn with a parse error never has. Which user
//! turns are reached is the rule judge's decision (a turn follows only when every required item
//! of the previous one passed), so both judges play the same turns.

use envace_actors::environment::ToolCall;
use envace_actors::judge::{ChecklistItem, Judge, JudgeTask, TurnCalls, TurnScore, Verdict};
use serde_json::{Map, Value};

use super::judge::{json_eq, judge_turns, score_turn};

/// Share of a turn score that is the format component `f`.
pub const FORMAT_WEIGHT: f32 = 0.2;

/// The dense checklist judge (see the module doc). Stateless.
#[derive(Debug, Clone, Copy, Default)]
pub struct DenseChecklistJudge;

impl Judge for DenseChecklistJudge {
    fn judge(&self, task: &JudgeTask, transcript: &[TurnCalls]) -> Verdict {
        judge_turns(task, transcript, |items, played| {
            let gate = score_turn(task, items, played);
            let calls: Vec<&ToolCall> = played.all_calls().collect();
            let m = match_calls(task, items, &calls);
            let format = format_score(items, played);
            // A turn that expects no call earns its credit by answering cleanly without one
            // (a malformed or unfinished output is not that answer).
            let credit = if items.is_empty() {
                f64::from(u8::from(format == 1.0))
            } else {
                m.credit
            };
            let score = FORMAT_WEIGHT * format + (1.0 - FORMAT_WEIGHT) * credit as f32;
            TurnScore {
                score: score.clamp(0.0, 1.0),
                passed_required: gate.passed_required,
                reason: format!(
                    "format {format:.1}, credit {:.3} ({} of {} calls with the right name, {} \
                     exact); {}",
                    credit, m.names, m.expected, m.exact, gate.reason
                ),
            }
        })
    }
}

/// The format component `f` of the module doc, in {0, ½, 1}.
pub fn format_score(items: &[ChecklistItem], played: &TurnCalls) -> f32 {
    let wrote_calls = played.all_calls().next().is_some();
    let expects_calls = !items.is_empty();
    if wrote_calls != expects_calls {
        return 0.0;
    }
    let clean = !played.malformed && played.final_answer;
    0.5 + 0.5 * f32::from(u8::from(clean))
}

/// How a turn's calls match its checklist.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CallMatch {
    /// The credit `a` of the module doc, in [0, 1].
    pub credit: f64,
    /// Checklist items (expected calls).
    pub expected: usize,
    /// Items matched one-to-one by a call with the same tool name.
    pub names: usize,
    /// Items matched by a call with the same name and exactly the same arguments.
    pub exact: usize,
}

/// Matches `calls` one-to-one against `items` for the best weighted similarity (see the module
/// doc); positional arguments are named with `task`'s parameter order.
pub fn match_calls(task: &JudgeTask, items: &[ChecklistItem], calls: &[&ToolCall]) -> CallMatch {
    if items.is_empty() {
        return CallMatch {
            credit: if calls.is_empty() { 1.0 } else { 0.0 },
            expected: 0,
            names: 0,
            exact: 0,
        };
    }
    let named: Vec<(&str, Map<String, Value>)> = calls
        .iter()
        .map(|c| (c.name.as_str(), task.named_arguments(c)))
        .collect();
    let weights: Vec<f64> = items.iter().map(|i| f64::from(i.weight.max(0.0))).collect();
    let sims: Vec<Vec<f64>> = items
        .iter()
        .map(|item| {
            named
                .iter()
                .map(|(name, args)| similarity(item, name, args))
                .collect()
        })
        .collect();
    let gain: Vec<Vec<f64>> = sims
        .iter()
        .zip(&weights)
        .map(|(row, w)| row.iter().map(|s| s * w).collect())
        .collect();
    let assignment = max_assignment(&gain, calls.len());
    let total: f64 = weights.iter().sum();
    let mut m = CallMatch {
        credit: 0.0,
        expected: items.len(),
        names: 0,
        exact: 0,
    };
    let mut earned = 0.0;
    for (i, c) in assignment.iter().enumerate() {
        let Some(c) = *c else { continue };
        earned += gain[i][c];
        if items[i].function == named[c].0 {
            m.names += 1;
            if sims[i][c] >= 1.0 {
                m.exact += 1;
            }
        }
    }
    m.credit = if total > 0.0 {
        (earned / total).clamp(0.0, 1.0)
    } else {
        0.0
    };
    m
}

/// `sim(i, c)` of the module doc.
fn similarity(item: &ChecklistItem, name: &str, args: &Map<String, Value>) -> f64 {
    if item.function != name {
        return 0.0;
    }
    let expected = &item.arguments;
    let union = expected.len() + args.keys().filter(|k| !expected.contains_key(*k)).count();
    if union == 0 {
        return 1.0;
    }
    let shared = expected.keys().filter(|k| args.contains_key(*k)).count();
    let equal = expected
        .iter()
        .filter(|(k, v)| args.get(*k).is_some_and(|w| json_eq(v, w)))
        .count();
    let union = union as f64;
    (1.0 + shared as f64 / union + equal as f64 / union) / 3.0
}

/// For each row of `gain` (`rows × cols`, values ≥ 0), the column it is assigned to in a
/// one-to-one assignment maximising the total gain; rows may stay unassigned when there are
/// fewer columns. The Hungarian method on the square matrix padded with zeros, O(n³) for
/// n = max(rows, cols).
fn max_assignment(gain: &[Vec<f64>], cols: usize) -> Vec<Option<usize>> {
    let rows = gain.len();
    let n = rows.max(cols);
    if n == 0 {
        return Vec::new();
    }
    let max = gain
        .iter()
        .flatten()
        .fold(0.0f64, |a, &b| if b > a { b } else { a });
    // Minimise cost = max − gain (padding cells have gain 0).
    let cost =
        |i: usize, j: usize| max - gain.get(i).and_then(|r| r.get(j)).copied().unwrap_or(0.0);
    // 1-based potentials and matching (e-maxx formulation).
    let (mut u, mut v) = (vec![0.0f64; n + 1], vec![0.0f64; n + 1]);
    let (mut p, mut way) = (vec![0usize; n + 1], vec![0usize; n + 1]);
    for i in 1..=n {
        p[0] = i;
        let mut j0 = 0;
        let mut minv = vec![f64::INFINITY; n + 1];
        let mut used = vec![false; n + 1];
        loop {
            used[j0] = true;
            let i0 = p[j0];
            let mut delta = f64::INFINITY;
            let mut j1 = 0;
            for j in 1..=n {
                if used[j] {
                    continue;
                }
                let cur = cost(i0 - 1, j - 1) - u[i0] - v[j];
                if cur < minv[j] {
                    minv[j] = cur;
                    way[j] = j0;
                }
                if minv[j] < delta {
                    delta = minv[j];
                    j1 = j;
                }
            }
            for j in 0..=n {
                if used[j] {
                    u[p[j]] += delta;
                    v[j] -= delta;
                } else {
                    minv[j] -= delta;
                }
            }
            j0 = j1;
            if p[j0] == 0 {
                break;
            }
        }
        loop {
            let j1 = way[j0];
            p[j0] = p[j1];
            j0 = j1;
            if j0 == 0 {
                break;
            }
        }
    }
    let mut out = vec![None; rows];
    for (j, &i) in p.iter().enumerate().take(n + 1).skip(1) {
        if i >= 1 && i <= rows && j <= cols {
            out[i - 1] = Some(j - 1);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bfcl::env::tool_call_from_python;
    use crate::bfcl::judge::{checklist_from_task, RuleChecklistJudge};
    use crate::bfcl::schema::FuncDocs;
    use crate::bfcl::tasks::{load_installed, BfclTask, Category};

    fn call(src: &str) -> ToolCall {
        tool_call_from_python(src).expect("call parses")
    }

    fn item(src: &str, weight: f32) -> ChecklistItem {
        let c = call(src);
        ChecklistItem {
            function: c.name,
            arguments: c.arguments,
            weight,
            required: true,
        }
    }

    /// One turn expecting `cd(folder='communal')` and `touch(file_name='Annual_Report_2023.docx')`
    /// (`multi_turn_base_6`'s first turn), then a second turn expecting `ls()`.
    fn two_turn_task() -> JudgeTask {
        JudgeTask {
            id: "t".into(),
            checklist: vec![
                vec![
                    item("cd(folder='communal')", 0.5),
                    item("touch(file_name='Annual_Report_2023.docx')", 0.5),
                ],
                vec![item("ls()", 1.0)],
            ],
            ..JudgeTask::default()
        }
    }

    fn rewards(task: &JudgeTask, transcript: &[TurnCalls]) -> (f32, f32) {
        (
            DenseChecklistJudge.judge(task, transcript).reward,
            RuleChecklistJudge.judge(task, transcript).reward,
        )
    }

    fn close(a: f32, b: f64) -> bool {
        (f64::from(a) - b).abs() < 1e-6
    }

    #[test]
    fn a_full_transcript_scores_one_like_the_rule() {
        let task = two_turn_task();
        let full = vec![
            TurnCalls::answered(vec![
                call("touch(file_name='Annual_Report_2023.docx')"),
                call("cd(folder='communal')"),
            ]),
            TurnCalls::answered(vec![call("ls()")]),
        ];
        assert_eq!(rewards(&task, &full), (1.0, 1.0));
    }

    #[test]
    fn partial_credit_for_names_and_arguments() {
        let task = two_turn_task();
        // What the warm-up model writes on multi_turn_base_6: the right class, wrong calls.
        let wrong = vec![TurnCalls::answered(vec![
            call("mkdir(dir_name='Annual_Report_2023')"),
            call("echo(content='x', file_name='Annual_Report_2023.docx')"),
        ])];
        let v = DenseChecklistJudge.judge(&task, &wrong);
        // Right format, no name matches: 0.2 on turn 1; turn 2 not reached; R = 0.1.
        assert!(close(v.reward, 0.1), "{}", v.reward);
        // A plain-text answer where calls are expected earns nothing, format included.
        let text = vec![TurnCalls::answered(vec![])];
        assert_eq!(DenseChecklistJudge.judge(&task, &text).reward, 0.0);
        assert_eq!(RuleChecklistJudge.judge(&task, &wrong).reward, 0.0);

        // cd right; touch with the right argument name and a wrong value:
        // sim = 1/3 + 1/3 + 0 = 2/3; a = (1 + 2/3) / 2 = 5/6; turn = 0.2 + 0.8·5/6.
        let near = vec![TurnCalls::answered(vec![
            call("cd(folder='communal')"),
            call("touch(file_name='report.docx')"),
        ])];
        let v = DenseChecklistJudge.judge(&task, &near);
        let turn = 0.2 + 0.8 * (5.0 / 6.0);
        assert!(close(v.turn_scores[0].score, turn), "{:?}", v.turn_scores);
        assert!(close(v.reward, turn / 2.0));
        assert!(!v.turn_scores[0].passed_required);
        assert!(v.turn_scores[1].reason.starts_with("not reached"));

        // An extra argument name halves the keys and values shares: 1/3 + 1/3·1/2 + 1/3·1/2.
        let extra_key = vec![TurnCalls::answered(vec![call(
            "cd(folder='communal', recursive=True)",
        )])];
        let v = DenseChecklistJudge.judge(&task, &extra_key);
        let a = (2.0 / 3.0) / 2.0;
        assert!(close(v.turn_scores[0].score, 0.2 + 0.8 * a), "{:?}", v);
    }

    #[test]
    fn a_turn_stopped_inside_credits_its_complete_blocks() {
        let task = two_turn_task();
        // `cd` closed, then a `touch` block cut by the token budget: cd recorded unexecuted.
        let stopped = vec![TurnCalls {
            unexecuted_calls: vec![call("cd(folder='communal')")],
            malformed: true,
            ..TurnCalls::default()
        }];
        let (dense, rule) = rewards(&task, &stopped);
        // f = 1/2 (a call written, but malformed and unfinished), a = 1/2: turn = 0.1 + 0.4,
        // R = 0.25.
        assert!(close(dense, 0.25), "{dense}");
        assert_eq!(rule, 0.0);
        // Malformed from its first block: no call written, f = 0, a = 0.
        let nothing = vec![TurnCalls {
            malformed: true,
            ..TurnCalls::default()
        }];
        assert_eq!(rewards(&task, &nothing), (0.0, 0.0));
        // Stopped by a simulator error after the executed calls: f = 1/2.
        let simulator = vec![TurnCalls {
            calls: vec![
                call("cd(folder='communal')"),
                call("touch(file_name='Annual_Report_2023.docx')"),
            ],
            ..TurnCalls::default()
        }];
        let v = DenseChecklistJudge.judge(&task, &simulator);
        assert!(close(v.turn_scores[0].score, 0.1 + 0.8), "{:?}", v);
        assert!(!v.turn_scores[0].passed_required);
    }

    #[test]
    fn extra_calls_cost_nothing_and_order_does_not_matter() {
        let task = two_turn_task();
        let extra = vec![
            TurnCalls::answered(vec![
                call("pwd()"),
                call("touch(file_name='Annual_Report_2023.docx')"),
                call("ls()"),
                call("cd(folder='communal')"),
                call("cd(folder='communal')"),
            ]),
            TurnCalls::answered(vec![call("ls()"), call("pwd()")]),
        ];
        assert_eq!(rewards(&task, &extra), (1.0, 1.0));
        // A call earns credit for one item only: two items, one call.
        let dup = JudgeTask {
            id: "dup".into(),
            checklist: vec![vec![
                item("cd(folder='x')", 0.5),
                item("cd(folder='x')", 0.5),
            ]],
            ..JudgeTask::default()
        };
        let v =
            DenseChecklistJudge.judge(&dup, &[TurnCalls::answered(vec![call("cd(folder='x')")])]);
        assert!(close(v.reward, 0.2 + 0.8 * 0.5), "{}", v.reward);
    }

    #[test]
    fn the_matching_is_optimal_not_greedy() {
        // Greedy in item order gives item 0 the first near call, cd(b) (2/3), and item 1 only
        // cd(c) (2/3): 4/3. The optimum pairs item 0 with cd(c) and item 1 with its exact
        // call: 2/3 + 1 = 5/3.
        let task = JudgeTask {
            id: "opt".into(),
            checklist: vec![vec![
                item("cd(folder='a')", 0.5),
                item("cd(folder='b')", 0.5),
            ]],
            ..JudgeTask::default()
        };
        let m = match_calls(
            &task,
            &task.checklist[0],
            &[&call("cd(folder='b')"), &call("cd(folder='c')")],
        );
        assert!((m.credit - (1.0 + 2.0 / 3.0) / 2.0).abs() < 1e-9, "{m:?}");
        assert_eq!((m.expected, m.names, m.exact), (2, 2, 1));
    }

    #[test]
    fn wrong_names_and_empty_turns() {
        let task = JudgeTask {
            id: "e".into(),
            checklist: vec![vec![], vec![item("ls()", 1.0)]],
            ..JudgeTask::default()
        };
        // An empty checklist turn: 1 iff no call; a call there fails it and stops the task.
        let quiet = vec![
            TurnCalls::answered(vec![]),
            TurnCalls::answered(vec![call("cd(folder='ls')")]),
        ];
        let v = DenseChecklistJudge.judge(&task, &quiet);
        assert_eq!(v.turn_scores[0].score, 1.0);
        assert!(close(v.turn_scores[1].score, 0.2), "{:?}", v);
        let chatty = vec![TurnCalls::answered(vec![call("ls()")])];
        let v = DenseChecklistJudge.judge(&task, &chatty);
        // Calls where none are expected: neither form nor credit.
        assert_eq!(v.turn_scores[0].score, 0.0, "{v:?}");
        assert!(v.turn_scores[1].reason.starts_with("not reached"));
        // A plain-text answer to a turn that needs calls parses, but is not the turn's form.
        // An output that breaks off on a turn expecting no call: form only, no credit.
        let broken = vec![
            TurnCalls {
                malformed: true,
                ..TurnCalls::default()
            },
            TurnCalls::answered(vec![call("ls()")]),
        ];
        let v = DenseChecklistJudge.judge(&task, &broken);
        assert!(close(v.turn_scores[0].score, 0.1), "{v:?}");
        let text = vec![TurnCalls::answered(vec![])];
        assert_eq!(
            DenseChecklistJudge.judge(&two_turn_task(), &text).reward,
            0.0
        );
    }

    fn ground_truth(task: &BfclTask) -> Vec<TurnCalls> {
        task.ground_truth
            .iter()
            .map(|calls| TurnCalls::answered(calls.iter().map(|c| call(c)).collect()))
            .collect()
    }

    #[test]
    fn one_exactly_when_the_rule_gives_one_on_every_base_task() {
        let docs = FuncDocs::load_installed().expect("BFCL func docs (make setup)");
        for task in load_installed(Category::Base).expect("base tasks") {
            let jt = checklist_from_task(&task, Some(&docs)).expect("checklist");
            let mut transcript = ground_truth(&task);
            assert_eq!(rewards(&jt, &transcript), (1.0, 1.0), "{}", task.id);
            // Any single perturbation drops both below 1, the dense one by less.
            let Some((turn, _)) = transcript
                .iter()
                .enumerate()
                .find(|(_, t)| !t.calls.is_empty())
            else {
                continue;
            };
            transcript[turn].calls.pop();
            let (dense, rule) = rewards(&jt, &transcript);
            assert!(dense < 1.0 && rule < 1.0, "{}", task.id);
            assert!(dense >= rule, "{}: {dense} < {rule}", task.id);
        }
    }

    #[test]
    fn assignment_handles_every_shape() {
        assert_eq!(max_assignment(&[], 3), Vec::<Option<usize>>::new());
        assert_eq!(max_assignment(&[vec![], vec![]], 0), vec![None, None]);
        // More rows than columns: the best row gets the column.
        assert_eq!(
            max_assignment(&[vec![0.2], vec![0.9], vec![0.5]], 1),
            vec![None, Some(0), None]
        );
        let a = max_assignment(&[vec![1.0, 0.9, 0.0], vec![0.95, 0.0, 0.1]], 3);
        assert_eq!(a, vec![Some(1), Some(0)]);
    }
}
