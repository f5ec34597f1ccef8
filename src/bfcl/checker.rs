//! The BFCL multi-turn checker: a verdict per user turn and per task, with the reason for a
//! failure.
//!
//! Source: `bfcl_eval/eval_checker/multi_turn_eval/multi_turn_checker.py` at the commit of the
//! BFCL trace README. The ground truth runs on its own instances, one turn at a time. After
//! each user turn `t` of the model's episode:
//!
//! * **Empty ground truth** (miss-param and miss-func turns, the model should ask or wait):
//!   nothing is compared; with [`CheckerConfig::irrelevance`] (default on, BFCL's
//!   `multi_turn_irrelevance_checker`) any model call in the turn fails it. Calls still ran, so
//!   later state checks see their effect.
//! * **Non-empty ground truth**: the model must have made at least one call in the turn
//!   (`empty_turn_model_response`); then every involved instance's state (public attributes,
//!   see [`state_differences`]) must equal the ground truth's (`instance_state_mismatch`);
//!   then the ground truth's result strings of this turn must be an unordered sub-multiset of
//!   all the model's result strings so far, earlier turns included
//!   (`execution_response_mismatch`).
//!
//! BFCL stops at the first failing turn; [`TaskVerdict::failure`] is that turn's reason. The
//! later turns are still judged (against the ground truth's state, which the model's may
//! no longer match) so that [`TaskVerdict::turns`] shows how far an episode went right.
//! An episode with fewer turns than the task is `force_terminated`.
//!
//! State equality is Python's `==` on the decoded values: dict key order does not matter, list
//! order does, `1 == 1.0 == True`, sets are unordered.

use std::fmt;

use envace_actors::environment::{Environment, ToolCall};
use serde::Serialize;
use serde_json::Value;

use super::env::tool_call_from_python;
use super::error::BfclError;
use super::executor::Executor;
use super::tasks::BfclTask;

/// Checker options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckerConfig {
    /// Fail a turn whose ground truth is empty when the model made any call in it (BFCL's
    /// irrelevance check for miss-param and miss-func turns).
    pub irrelevance: bool,
}

impl Default for CheckerConfig {
    fn default() -> Self {
        Self { irrelevance: true }
    }
}

/// One attribute whose value differs between the model's and the ground truth's instance.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AttrDiff {
    pub attribute: String,
    /// The model's value (trace encoding; `null` when the attribute is missing).
    pub model: Value,
    pub ground_truth: Value,
}

/// Why a turn (or a task) failed; the BFCL error type is [`FailureReason::error_type`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FailureReason {
    /// The ground truth calls functions in this turn but the model made no call.
    EmptyTurn,
    /// The ground truth is empty (the model should ask or wait) but the model made calls.
    Irrelevance { calls: usize },
    /// An instance's public state differs from the ground truth's.
    StateMismatch {
        class: String,
        differences: Vec<AttrDiff>,
    },
    /// Ground-truth results of this turn missing from the model's results so far.
    ResponseMismatch { missing: Vec<String> },
    /// The episode ended before the task's last turn.
    ForceTerminated { turns_run: usize, turns: usize },
}

impl FailureReason {
    /// BFCL's `error_type` string.
    pub fn error_type(&self) -> &'static str {
        match self {
            FailureReason::EmptyTurn => "multi_turn:empty_turn_model_response",
            FailureReason::Irrelevance { .. } => "multi_turn:irrelevance_error:decoder_success",
            FailureReason::StateMismatch { .. } => "multi_turn:instance_state_mismatch",
            FailureReason::ResponseMismatch { .. } => "multi_turn:execution_response_mismatch",
            FailureReason::ForceTerminated { .. } => "multi_turn:force_terminated",
        }
    }
}

impl fmt::Display for FailureReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailureReason::EmptyTurn => {
                f.write_str("model made no call in a turn that needs calls")
            }
            FailureReason::Irrelevance { calls } => {
                write!(f, "model made {calls} call(s) in a turn that needs none")
            }
            FailureReason::StateMismatch { class, differences } => {
                write!(f, "{class} state differs from the ground truth:")?;
                for d in differences {
                    write!(
                        f,
                        " {} (model {}, ground truth {})",
                        d.attribute, d.model, d.ground_truth
                    )?;
                }
                Ok(())
            }
            FailureReason::ResponseMismatch { missing } => {
                write!(f, "ground-truth results missing from the model's results: ")?;
                for (i, m) in missing.iter().enumerate() {
                    write!(f, "{}{m}", if i == 0 { "" } else { " | " })?;
                }
                Ok(())
            }
            FailureReason::ForceTerminated { turns_run, turns } => {
                write!(f, "episode ended after {turns_run} of {turns} turns")
            }
        }
    }
}

/// The checker's result on one user turn (the judge's per-turn record is [`crate::storage::TurnVerdict`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TurnCheck {
    pub turn: usize,
    /// True when the ground truth of this turn is non-empty (states and results compared).
    pub checked: bool,
    /// `None` when the turn passes.
    pub failure: Option<FailureReason>,
}

impl TurnCheck {
    /// True when the turn passes.
    pub fn passed(&self) -> bool {
        self.failure.is_none()
    }
}

/// The verdict on a task.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TaskVerdict {
    pub id: String,
    /// One verdict per turn the episode ran.
    pub turns: Vec<TurnCheck>,
    /// The first failure (BFCL's verdict), with its turn; `None` when the task passes.
    pub failure: Option<(usize, FailureReason)>,
}

impl TaskVerdict {
    /// True when every turn passes and the episode ran every turn.
    pub fn passed(&self) -> bool {
        self.failure.is_none()
    }
}

/// An incremental checker for one task: feed it each finished user turn of an episode.
pub struct Checker {
    id: String,
    ground_truth: Vec<Vec<String>>,
    gt: Executor,
    config: CheckerConfig,
    model_results: Vec<String>,
    turns: Vec<TurnCheck>,
}

impl Checker {
    /// Starts checking `task`; the ground truth gets its own instances.
    ///
    /// # Errors
    /// [`BfclError::UnsupportedClass`] / [`BfclError::Config`] when the task's classes cannot
    /// be instantiated.
    pub fn new(task: &BfclTask, config: CheckerConfig) -> Result<Self, BfclError> {
        Ok(Self {
            id: task.id.clone(),
            ground_truth: task.ground_truth.clone(),
            gt: Executor::new(
                &task.involved_classes,
                &task.initial_config,
                task.long_context(),
            )?,
            config,
            model_results: Vec::new(),
            turns: Vec::new(),
        })
    }

    /// The next turn to check.
    pub fn next_turn(&self) -> usize {
        self.turns.len()
    }

    /// Judges the next user turn. `results` are the result texts of the calls the model made
    /// in this turn, in order (one per executed call); `model_state` is the model
    /// environment's [`Environment::snapshot`] after the turn.
    pub fn check_turn(&mut self, results: &[String], model_state: &Value) -> &TurnCheck {
        let turn = self.turns.len();
        let gt_calls = self.ground_truth.get(turn).cloned().unwrap_or_default();
        let gt_results: Vec<String> = gt_calls
            .iter()
            .map(|c| self.gt.execute_str(c).text)
            .collect();
        self.model_results.extend(results.iter().cloned());
        let checked = !gt_calls.is_empty();
        let failure = if !checked {
            (self.config.irrelevance && !results.is_empty()).then_some(FailureReason::Irrelevance {
                calls: results.len(),
            })
        } else if results.is_empty() {
            Some(FailureReason::EmptyTurn)
        } else if let Some((class, differences)) =
            state_differences(model_state, &self.gt.snapshot())
        {
            Some(FailureReason::StateMismatch { class, differences })
        } else {
            let missing = missing_results(&gt_results, &self.model_results);
            (!missing.is_empty()).then_some(FailureReason::ResponseMismatch { missing })
        };
        self.turns.push(TurnCheck {
            turn,
            checked,
            failure,
        });
        &self.turns[turn]
    }

    /// The verdict so far; turns the episode did not reach make it `force_terminated`.
    pub fn finish(self) -> TaskVerdict {
        let first = self
            .turns
            .iter()
            .find_map(|t| t.failure.clone().map(|f| (t.turn, f)));
        let failure = first.or_else(|| {
            (self.turns.len() < self.ground_truth.len()).then(|| {
                (
                    self.turns.len(),
                    FailureReason::ForceTerminated {
                        turns_run: self.turns.len(),
                        turns: self.ground_truth.len(),
                    },
                )
            })
        });
        TaskVerdict {
            id: self.id,
            turns: self.turns,
            failure,
        }
    }
}

/// Runs an episode's calls (`turns[t]` = the model's calls in user turn `t`, all steps
/// together) through `env` and judges them. `env` must offer `task`'s classes.
///
/// # Errors
/// [`BfclError::UnsupportedClass`] / [`BfclError::Config`] from instantiating the task.
pub fn check_episode(
    env: &mut dyn Environment,
    task: &BfclTask,
    turns: &[Vec<ToolCall>],
    config: CheckerConfig,
) -> Result<TaskVerdict, CheckError> {
    let mut checker = Checker::new(task, config).map_err(CheckError::Bfcl)?;
    env.reset(&task.to_env_task()).map_err(CheckError::Env)?;
    for (t, calls) in turns.iter().enumerate().take(task.num_turns()) {
        env.begin_turn(t);
        let results: Vec<String> = calls.iter().map(|c| env.execute(c).text).collect();
        checker.check_turn(&results, &env.snapshot());
    }
    Ok(checker.finish())
}

/// Replays `task`'s ground truth as the model's episode (through `env`, as JSON tool calls)
/// and judges it; a faithful environment passes every task.
///
/// # Errors
/// As [`check_episode`], plus [`CheckError::GroundTruth`] for a ground-truth call that does
/// not parse.
pub fn replay_ground_truth(
    env: &mut dyn Environment,
    task: &BfclTask,
) -> Result<TaskVerdict, CheckError> {
    let turns = task
        .ground_truth
        .iter()
        .map(|calls| {
            calls
                .iter()
                .map(|c| {
                    tool_call_from_python(c).map_err(|e| CheckError::GroundTruth {
                        call: c.clone(),
                        reason: e.to_string(),
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<Vec<_>, _>>()?;
    check_episode(env, task, &turns, CheckerConfig::default())
}

/// Why an episode could not be judged at all.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Bfcl(BfclError),
    #[error(transparent)]
    Env(envace_actors::environment::EnvironmentError),
    #[error("ground-truth call {call:?} does not parse: {reason}")]
    GroundTruth { call: String, reason: String },
}

impl CheckError {
    /// True when the task needs an API class this port does not implement yet.
    pub fn is_unsupported(&self) -> bool {
        matches!(
            self,
            CheckError::Bfcl(BfclError::UnsupportedClass(_))
                | CheckError::Env(envace_actors::environment::EnvironmentError::Unsupported { .. })
        )
    }
}

/// The ground-truth results not found in `model` (each model result used at most once),
/// in ground-truth order: BFCL's `_is_subsequence_unordered`.
pub fn missing_results(ground_truth: &[String], model: &[String]) -> Vec<String> {
    let mut pool: Vec<&str> = model.iter().map(String::as_str).collect();
    let mut missing = Vec::new();
    for r in ground_truth {
        match pool.iter().position(|m| m == r) {
            Some(i) => {
                pool.remove(i);
            }
            None => missing.push(r.clone()),
        }
    }
    missing
}

/// The first class (in the ground truth's order) whose public state differs, with the
/// differing attributes: BFCL's `state_checker` / `_compare_instances`, which walk the ground
/// truth's attributes. Snapshots are `{class: {attribute: value}}` in the trace encoding.
pub fn state_differences(model: &Value, ground_truth: &Value) -> Option<(String, Vec<AttrDiff>)> {
    let empty = serde_json::Map::new();
    let gt_classes = ground_truth.as_object().unwrap_or(&empty);
    for (class, gt_attrs) in gt_classes {
        let gt_attrs = gt_attrs.as_object().unwrap_or(&empty);
        let model_attrs = model
            .get(class)
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let differences: Vec<AttrDiff> = gt_attrs
            .iter()
            .filter_map(|(attr, gt)| {
                let m = model_attrs.get(attr).unwrap_or(&Value::Null);
                (model_attrs.get(attr).is_none() || !py_eq(m, gt)).then(|| AttrDiff {
                    attribute: attr.clone(),
                    model: m.clone(),
                    ground_truth: gt.clone(),
                })
            })
            .collect();
        if !differences.is_empty() {
            return Some((class.clone(), differences));
        }
    }
    None
}

/// Python `==` on two values in the trace encoding (see the module doc).
pub fn py_eq(a: &Value, b: &Value) -> bool {
    if let (Some(x), Some(y)) = (as_number(a), as_number(b)) {
        return x == y;
    }
    match (a, b) {
        (Value::Null, Value::Null) => true,
        (Value::String(x), Value::String(y)) => x == y,
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| py_eq(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            if let (Some(p), Some(q)) = (x.get("__pyset__"), y.get("__pyset__")) {
                return unordered_eq(p, q);
            }
            if x.contains_key("__pyset__") || y.contains_key("__pyset__") {
                return false;
            }
            if let (Some(p), Some(q)) = (x.get("__pyfloat__"), y.get("__pyfloat__")) {
                // nan != nan, as in Python.
                return p == q && p != "nan";
            }
            match (dict_pairs(a), dict_pairs(b)) {
                (Some(p), Some(q)) => {
                    p.len() == q.len()
                        && p.iter().all(|(k, v)| {
                            q.iter()
                                .find(|(k2, _)| py_eq(k, k2))
                                .is_some_and(|(_, w)| py_eq(v, w))
                        })
                }
                _ => false,
            }
        }
        _ => false,
    }
}

fn as_number(v: &Value) -> Option<f64> {
    match v {
        Value::Bool(b) => Some(f64::from(u8::from(*b))),
        Value::Number(n) => n.as_f64(),
        _ => None,
    }
}

/// A dict's (key, value) pairs: plain objects have `str` keys, `__pydict__` any keys. Tagged
/// objects (`File`, `Directory`, `mpf`…) compare as their fields do, which is what
/// `File.__eq__` (name, content) and `Directory.__eq__` (name, contents) do.
fn dict_pairs(v: &Value) -> Option<Vec<(Value, &Value)>> {
    let m = v.as_object()?;
    if let Some(pairs) = m.get("__pydict__") {
        return pairs
            .as_array()?
            .iter()
            .map(|p| match p.as_array().map(Vec::as_slice) {
                Some([k, v]) => Some((k.clone(), v)),
                _ => None,
            })
            .collect();
    }
    Some(
        m.iter()
            .map(|(k, v)| (Value::String(k.clone()), v))
            .collect(),
    )
}

fn unordered_eq(a: &Value, b: &Value) -> bool {
    let (Some(x), Some(y)) = (a.as_array(), b.as_array()) else {
        return false;
    };
    x.len() == y.len() && x.iter().all(|p| y.iter().any(|q| py_eq(p, q)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bfcl::env::BfclEnv;
    use crate::bfcl::tasks::{load_installed, synthetic_task, Category};
    use serde_json::json;

    fn env() -> BfclEnv {
        BfclEnv::from_installed().expect("installed by `make setup`")
    }

    fn calls(turns: &[&[&str]]) -> Vec<Vec<ToolCall>> {
        turns
            .iter()
            .map(|t| {
                t.iter()
                    .map(|c| tool_call_from_python(c).unwrap())
                    .collect()
            })
            .collect()
    }

    fn judge(turns: &[&[&str]]) -> TaskVerdict {
        check_episode(
            &mut env(),
            &synthetic_task(),
            &calls(turns),
            CheckerConfig::default(),
        )
        .unwrap()
    }

    const LOGIN: &str = "ticket_login(username='ann', password='pw')";
    const CREATE: &str = "create_ticket(title='Printer jam', description='Floor 2', priority=3)";
    const ADD: &str = "add(a=2, b=3)";
    const CLOSE: &str = "close_ticket(ticket_id=1)";

    #[test]
    fn ground_truth_replay_passes() {
        let v = replay_ground_truth(&mut env(), &synthetic_task()).unwrap();
        assert!(v.passed(), "{:?}", v.failure);
        let checked: Vec<bool> = v.turns.iter().map(|t| t.checked).collect();
        assert_eq!(checked, [true, false, true]);
        // Extra calls and results obtained in an earlier turn are fine.
        let v = judge(&[&[LOGIN, ADD, "get_user_tickets()", CREATE], &[], &[CLOSE]]);
        assert!(v.passed(), "{:?}", v.failure);
    }

    #[test]
    fn dropped_calls_fail_with_the_right_reason() {
        let v = judge(&[&[LOGIN], &[], &[ADD, CLOSE]]);
        let (turn, reason) = v.failure.clone().unwrap();
        assert_eq!(turn, 0);
        assert_eq!(reason.error_type(), "multi_turn:instance_state_mismatch");
        let FailureReason::StateMismatch { class, differences } = reason else {
            unreachable!()
        };
        assert_eq!(class, "TicketAPI");
        let attrs: Vec<&str> = differences.iter().map(|d| d.attribute.as_str()).collect();
        assert_eq!(attrs, ["ticket_queue", "ticket_counter"]);
        assert_eq!(differences[1].model, json!(1));
        assert_eq!(differences[1].ground_truth, json!(2));

        // A stateless call: only the response check can see it.
        let v = judge(&[&[LOGIN, CREATE], &[], &[CLOSE]]);
        assert_eq!(
            v.failure,
            Some((
                2,
                FailureReason::ResponseMismatch {
                    missing: vec![r#"{"result": 5}"#.into()]
                }
            ))
        );
        assert!(v.turns[0].passed() && v.turns[1].passed());
    }

    #[test]
    fn wrong_arguments_fail_with_the_right_reason() {
        let v = judge(&[&[LOGIN, CREATE], &[], &["add(a=2, b=4)", CLOSE]]);
        let (turn, reason) = v.failure.unwrap();
        assert_eq!(turn, 2);
        assert_eq!(
            reason,
            FailureReason::ResponseMismatch {
                missing: vec![r#"{"result": 5}"#.into()]
            }
        );
        let wrong = "create_ticket(title='Printer jam', description='Floor 2', priority=4)";
        let v = judge(&[&[LOGIN, wrong], &[], &[ADD, CLOSE]]);
        let (turn, reason) = v.failure.unwrap();
        assert_eq!(turn, 0);
        assert!(
            matches!(&reason, FailureReason::StateMismatch { class, differences }
                if class == "TicketAPI" && differences.len() == 1
                    && differences[0].attribute == "ticket_queue"),
            "{reason}"
        );
        // The verdict keeps judging later turns against the ground truth.
        assert_eq!(v.turns.len(), 3);
    }

    #[test]
    fn empty_turn_rules_and_termination() {
        let v = judge(&[&[LOGIN, CREATE], &["get_user_tickets()"], &[ADD, CLOSE]]);
        assert_eq!(
            v.failure,
            Some((1, FailureReason::Irrelevance { calls: 1 }))
        );
        assert_eq!(
            v.failure.unwrap().1.error_type(),
            "multi_turn:irrelevance_error:decoder_success"
        );
        let lenient = check_episode(
            &mut env(),
            &synthetic_task(),
            &calls(&[&[LOGIN, CREATE], &["get_user_tickets()"], &[ADD, CLOSE]]),
            CheckerConfig { irrelevance: false },
        )
        .unwrap();
        assert!(lenient.passed(), "{:?}", lenient.failure);

        let v = judge(&[&[], &[], &[ADD, CLOSE]]);
        assert_eq!(v.failure, Some((0, FailureReason::EmptyTurn)));

        let v = judge(&[&[LOGIN, CREATE], &[]]);
        assert_eq!(
            v.failure,
            Some((
                2,
                FailureReason::ForceTerminated {
                    turns_run: 2,
                    turns: 3
                }
            ))
        );
    }

    /// On installed tasks whose classes are ported: dropping the last ground-truth call of the
    /// first checked turn fails that turn by state or by response (true of every such task in
    /// the shipped data; a task whose classes are not ported yet is skipped).
    #[test]
    fn installed_tasks_fail_when_a_call_is_dropped() {
        let mut env = env();
        let mut failed = 0;
        for task in load_installed(Category::Base).unwrap() {
            let Some(turn) = task.ground_truth.iter().position(|t| !t.is_empty()) else {
                continue;
            };
            let mut turns: Vec<Vec<ToolCall>> = task
                .ground_truth
                .iter()
                .map(|t| {
                    t.iter()
                        .map(|c| tool_call_from_python(c).unwrap())
                        .collect()
                })
                .collect();
            turns[turn].pop();
            if turns[turn].is_empty() {
                // Dropping the only call is the empty-turn rule.
                turns[turn].push(ToolCall::new(
                    "nonexistent_probe_function",
                    Default::default(),
                ));
            }
            let verdict = match check_episode(&mut env, &task, &turns, CheckerConfig::default()) {
                Err(e) if e.is_unsupported() => continue,
                other => other.unwrap(),
            };
            match verdict.failure {
                Some((t, FailureReason::StateMismatch { .. }))
                | Some((t, FailureReason::ResponseMismatch { .. })) => {
                    assert_eq!(t, turn, "{}", task.id);
                    failed += 1;
                }
                other => panic!("{}: dropping a call gave {other:?}", task.id),
            }
        }
        eprintln!("dropped-call variants failing as expected: {failed}");
    }

    /// Every installed task (all eight classes are ported) replays its ground truth through
    /// the environment and passes.
    #[test]
    fn installed_ground_truth_replays_pass() {
        let mut env = env();
        let (mut passed, mut skipped) = (0, 0);
        for c in Category::ALL {
            for task in load_installed(c).unwrap() {
                match replay_ground_truth(&mut env, &task) {
                    Err(e) if e.is_unsupported() => skipped += 1,
                    Err(e) => panic!("{}: {e}", task.id),
                    Ok(v) => {
                        assert!(v.passed(), "{}: {:?}", task.id, v.failure);
                        passed += 1;
                    }
                }
            }
        }
        eprintln!("ground-truth replay: {passed} pass, {skipped} skipped (unported classes)");
        assert_eq!((passed, skipped), (800, 0));
    }

    #[test]
    fn python_equality_on_encoded_values() {
        assert!(py_eq(&json!(1), &json!(1.0)));
        assert!(py_eq(&json!(true), &json!(1)));
        assert!(!py_eq(&json!("1"), &json!(1)));
        assert!(py_eq(
            &json!({"a": 1, "b": [1, 2]}),
            &json!({"b": [1, 2.0], "a": 1})
        ));
        assert!(!py_eq(&json!([1, 2]), &json!([2, 1])));
        assert!(py_eq(
            &json!({"__pydict__": [[1, "x"], ["order_type", "Buy"]]}),
            &json!({"__pydict__": [["order_type", "Buy"], [1.0, "x"]]})
        ));
        assert!(!py_eq(
            &json!({"__pydict__": [[1, "x"]]}),
            &json!({"1": "x"})
        ));
        assert!(py_eq(&json!({"__pydict__": [["a", 1]]}), &json!({"a": 1})));
        assert!(py_eq(
            &json!({"__pyset__": [1, 2]}),
            &json!({"__pyset__": [2, 1]})
        ));
        assert!(!py_eq(&json!({"__pyset__": [1]}), &json!([1])));
        assert!(!py_eq(
            &json!({"__pyfloat__": "nan"}),
            &json!({"__pyfloat__": "nan"})
        ));
        assert!(py_eq(
            &json!({"__pyobj__": "Directory", "name": "d", "contents": {"a": 1, "b": 2}}),
            &json!({"__pyobj__": "Directory", "name": "d", "contents": {"b": 2, "a": 1}})
        ));
    }

    #[test]
    fn unordered_sub_multiset() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert!(missing_results(&s(&["a", "b"]), &s(&["b", "x", "a"])).is_empty());
        assert_eq!(missing_results(&s(&["a", "a"]), &s(&["a"])), s(&["a"]));
        assert_eq!(missing_results(&s(&["c"]), &s(&[])), s(&["c"]));
    }

    #[test]
    fn state_differences_name_class_and_attribute() {
        let gt = json!({"TicketAPI": {"ticket_counter": 2, "current_user": "ann"}});
        let model = json!({"TicketAPI": {"ticket_counter": 2.0, "current_user": "bob"}});
        let (class, d) = state_differences(&model, &gt).unwrap();
        assert_eq!(class, "TicketAPI");
        assert_eq!(
            d,
            vec![AttrDiff {
                attribute: "current_user".into(),
                model: json!("bob"),
                ground_truth: json!("ann")
            }]
        );
        assert!(state_differences(&gt, &gt).is_none());
    }
}
