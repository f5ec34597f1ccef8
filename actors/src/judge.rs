//! The judge interface the Judge actor hosts: it scores a finished trajectory's tool calls
//! against a task's per-user-turn checklist.
//!
//! A [`JudgeTask`] carries one checklist per user turn ([`ChecklistItem`]s with a weight and a
//! `required` flag, as the authors' checklists do with `weight` and `required_for_next_turn`).
//! The agent's side is a transcript: one [`TurnCalls`] per user turn it played, the
//! [`ToolCall`]s it made in that turn and whether the turn ended with a final answer. A
//! [`Judge`] turns both into a [`Verdict`]: one [`TurnScore`] per user turn of the task and the
//! trajectory reward
//!
//! ```text
//! R = Σ turn scores / number of user turns        (DESIGN.md §2, "reward")
//! ```
//!
//! The next user turn is only reached when no required item of the current one failed, so
//! turns after a failed required item score 0 (DESIGN.md §2, "judge"). Implementations live
//! outside this crate (the rule-based checklist judge for BFCL in the `envace` crate, a user's
//! own in theirs); the trait is object-safe, `Send` and `Sync`, so an actor can own a
//! `Box<dyn Judge>` or share an `Arc<dyn Judge>`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::environment::ToolCall;

/// One expected action of a user turn: a call of `function` with `arguments`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChecklistItem {
    /// The function (tool) name the call must have.
    pub function: String,
    /// The keyword arguments the call must have.
    pub arguments: Map<String, Value>,
    /// The item's share of the turn score (the items of a turn usually sum to 1).
    pub weight: f32,
    /// When true and the item fails, the trajectory does not reach the next user turn.
    pub required: bool,
}

/// What a judge scores against: the task id and one checklist per user turn.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct JudgeTask {
    /// The task id (e.g. `multi_turn_base_0`).
    pub id: String,
    /// The checklist of each user turn, in turn order. An empty checklist means the agent
    /// should make no call in that turn (e.g. it must ask for a missing parameter).
    pub checklist: Vec<Vec<ChecklistItem>>,
    /// Function name → its parameter names in declaration order, used to name positional
    /// arguments of the agent's calls (Python-style calls; JSON tool calls have none).
    /// Positional arguments of a function not listed here cannot be named and are ignored.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parameter_order: BTreeMap<String, Vec<String>>,
}

impl JudgeTask {
    /// Number of user turns.
    pub fn num_turns(&self) -> usize {
        self.checklist.len()
    }

    /// The call's arguments by name: positional arguments named through
    /// [`JudgeTask::parameter_order`] (those beyond the known names are dropped), then the
    /// keyword arguments.
    pub fn named_arguments(&self, call: &ToolCall) -> Map<String, Value> {
        let mut named = Map::new();
        if let Some(order) = self.parameter_order.get(&call.name) {
            for (name, value) in order.iter().zip(&call.positional) {
                named.insert(name.clone(), value.clone());
            }
        }
        for (name, value) in &call.arguments {
            named.insert(name.clone(), value.clone());
        }
        named
    }
}

/// What the agent did in one user turn.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct TurnCalls {
    /// Every tool call of the turn that was executed (rehearsed or real), in the order the
    /// agent made them.
    pub calls: Vec<ToolCall>,
    /// True when the turn ended with a final answer; false when the episode stopped inside
    /// the turn (a parse error, a simulator error, a cap), which scores the turn 0.
    pub final_answer: bool,
    /// Complete, valid calls written before a malformed block: never executed (the parse
    /// error ended the episode), so judges that replay calls must ignore them; a dense judge
    /// credits them.
    #[serde(default)]
    pub unexecuted_calls: Vec<ToolCall>,
    /// True when an Act output of the turn broke the protocol (an unclosed or invalid block,
    /// an unknown tool).
    #[serde(default)]
    pub malformed: bool,
    /// The text of the turn's final answer (the Act output without a call), as the model
    /// wrote it; empty when the turn had none. For judges that read what the agent said
    /// (an LLM judge, a format check).
    #[serde(default)]
    pub answer: String,
}

impl TurnCalls {
    /// A turn that made `calls` and then gave a final answer.
    pub fn answered(calls: Vec<ToolCall>) -> Self {
        Self {
            calls,
            final_answer: true,
            ..Self::default()
        }
    }

    /// Every call the agent wrote in the turn: the executed ones, then the unexecuted ones.
    pub fn all_calls(&self) -> impl Iterator<Item = &ToolCall> {
        self.calls.iter().chain(&self.unexecuted_calls)
    }
}

/// The judgement of one user turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnScore {
    /// The turn score in [0, 1]; 0 for a turn never reached.
    pub score: f32,
    /// True when no required item failed (the next user turn is reached).
    pub passed_required: bool,
    /// Why: the failed items, or why the turn was not reached.
    pub reason: String,
}

/// A judge's verdict on a whole trajectory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// One score per user turn of the task (turns never reached included, with score 0).
    pub turn_scores: Vec<TurnScore>,
    /// Σ turn scores / number of user turns, in [0, 1] (0 for a task without turns).
    pub reward: f32,
}

impl Verdict {
    /// The verdict for `turn_scores`, with the reward as their mean.
    pub fn from_turn_scores(turn_scores: Vec<TurnScore>) -> Self {
        let reward = if turn_scores.is_empty() {
            0.0
        } else {
            let sum: f64 = turn_scores.iter().map(|t| f64::from(t.score)).sum();
            (sum / turn_scores.len() as f64) as f32
        };
        Self {
            turn_scores,
            reward,
        }
    }
}

/// Scores a trajectory's tool calls against a task's checklists.
pub trait Judge: Send + Sync {
    /// Judges `transcript` (one entry per user turn the agent played, in order) against
    /// `task`. The verdict has exactly `task.num_turns()` turn scores.
    fn judge(&self, task: &JudgeTask, transcript: &[TurnCalls]) -> Verdict;
}

/// A judge that knows nothing about the task: every user turn passes (so all of them are
/// played) with score 0. For private rehearsal of a task whose ground truth must stay unseen
/// (test-time scaling on a test task): nothing about the checklist reaches the episode.
#[derive(Debug, Clone, Copy, Default)]
pub struct PassThroughJudge;

impl Judge for PassThroughJudge {
    fn judge(&self, task: &JudgeTask, _transcript: &[TurnCalls]) -> Verdict {
        Verdict::from_turn_scores(
            (0..task.num_turns())
                .map(|_| TurnScore {
                    score: 0.0,
                    passed_required: true,
                    reason: "not judged (private rehearsal)".into(),
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Passes a turn iff it made at least as many calls as the checklist has items.
    struct CountJudge;

    impl Judge for CountJudge {
        fn judge(&self, task: &JudgeTask, transcript: &[TurnCalls]) -> Verdict {
            let mut scores = Vec::new();
            let mut reached = true;
            for (t, items) in task.checklist.iter().enumerate() {
                let ok = reached
                    && transcript
                        .get(t)
                        .is_some_and(|c| c.calls.len() >= items.len());
                scores.push(TurnScore {
                    score: if ok { 1.0 } else { 0.0 },
                    passed_required: ok,
                    reason: String::new(),
                });
                reached = ok;
            }
            Verdict::from_turn_scores(scores)
        }
    }

    fn item(function: &str) -> ChecklistItem {
        ChecklistItem {
            function: function.into(),
            arguments: Map::new(),
            weight: 1.0,
            required: true,
        }
    }

    #[test]
    fn trait_objects_judge_and_reward_is_the_turn_mean() {
        let judge: Box<dyn Judge> = Box::new(CountJudge);
        let task = JudgeTask {
            id: "t".into(),
            checklist: vec![vec![item("a")], vec![item("b")], vec![item("c")]],
            parameter_order: BTreeMap::new(),
        };
        let call = ToolCall::new("a", Map::new());
        let transcript = vec![TurnCalls::answered(vec![call])];
        let verdict = judge.judge(&task, &transcript);
        assert_eq!(verdict.turn_scores.len(), 3);
        assert_eq!(verdict.reward, 1.0 / 3.0);
    }

    #[test]
    fn positional_arguments_are_named_by_parameter_order() {
        let mut task = JudgeTask::default();
        task.parameter_order
            .insert("sort".into(), vec!["file_name".into()]);
        let call = ToolCall {
            name: "sort".into(),
            positional: vec![Value::from("a.txt"), Value::from("extra")],
            arguments: Map::new(),
        };
        let named = task.named_arguments(&call);
        assert_eq!(named.len(), 1);
        assert_eq!(named["file_name"], "a.txt");
        let unknown = ToolCall {
            name: "cd".into(),
            ..call
        };
        assert!(task.named_arguments(&unknown).is_empty());
    }

    #[test]
    fn verdict_round_trips_through_json() {
        let verdict = Verdict::from_turn_scores(vec![TurnScore {
            score: 0.5,
            passed_required: false,
            reason: "missing cd(folder='temp')".into(),
        }]);
        let text = serde_json::to_string(&verdict).expect("serialise");
        let back: Verdict = serde_json::from_str(&text).expect("parse");
        assert_eq!(back, verdict);
        assert_eq!(back.reward, 0.5);
    }
}
