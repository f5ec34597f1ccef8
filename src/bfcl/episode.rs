//! BFCL tasks as episodes: the [`EpisodeTask`]s the episode driver plays, the seed
//! trajectories collected once in the real environment, and the checker judge that scores a
//! transcript by re-executing it.
//!
//! * [`episode_task`] turns a [`BfclTask`] into an [`EpisodeTask`] (tools, user turns, the
//!   rule checklist, the environment's task), and [`BfclSuite::load_base`] does so for the
//!   installed `multi_turn_base` category with its fixed split (150 train, 50 test scenarios,
//!   stratified by class, see [`super::split`]).
//! * [`collect_seed`] replays a task's ground truth in a real [`Environment`] and records the
//!   conversation with the real results as a [`SeedTrajectory`] (DESIGN.md §1: the real
//!   environment is used once, before training, to ground the Rehearse role). Every executed
//!   call is counted ([`CollectedSeed::env_calls`]) so a run can report its real calls.
//! * [`BfclSuite::checker_judge`] gives the judge of real-environment evaluation
//!   ([`BfclCheckerJudge`], in [`super::judge`] with the other BFCL judges): it replays the
//!   agent's calls in its own sandbox and applies BFCL's multi-turn checker turn by turn.
//!
//! ```no_run
//! use envace::bfcl::episode::{collect_seed, BfclSuite};
//! use envace::bfcl::env::BfclEnv;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let suite = BfclSuite::load_base()?;
//! assert_eq!(suite.train.len(), 150);
//! let mut env = BfclEnv::new(suite.docs.clone());
//! let collected = collect_seed(&suite.tasks["multi_turn_base_0"], &mut env)?;
//! println!("{} real calls", collected.env_calls);
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use envace_actors::environment::{Environment, EnvironmentError};
use envace_actors::judge::JudgeTask;
use envace_actors::task::{EpisodeTask, Split};
use envace_kernels::pyjson;
use envace_storage::records::{Message, MessageRole, SeedTrajectory, TaskId, ToolExchange};
use serde_json::Value;

use super::checker::CheckerConfig;
use super::env::tool_call_from_python;
use super::error::BfclError;
use super::judge::{checklist_from_task, BfclCheckerJudge, JudgeError};
use super::parse::ParseError;
use super::schema::FuncDocs;
use super::split::{ScenarioSplit, SplitError};
use super::tasks::{load_installed, BfclTask, Category};

/// Why an episode task or a seed could not be built.
#[derive(Debug, thiserror::Error)]
pub enum EpisodeError {
    /// Loading the installed tasks or docs, or building a task's tools, failed.
    #[error(transparent)]
    Bfcl(#[from] BfclError),
    /// The task's checklist could not be built.
    #[error(transparent)]
    Judge(#[from] JudgeError),
    /// The train/test split could not be drawn.
    #[error(transparent)]
    Split(#[from] SplitError),
    /// The task cannot be an episode task (yet).
    #[error("task {task} is unsupported in episodes yet: {reason}")]
    Unsupported { task: String, reason: String },
    /// A ground-truth call string did not parse (or has no JSON form).
    #[error("task {task}, turn {turn}: ground-truth call {call:?}: {source}")]
    GroundTruth {
        task: String,
        turn: usize,
        call: String,
        #[source]
        source: ParseError,
    },
    /// A ground-truth call passes positional arguments to a function whose parameter names
    /// the environment's tools do not give, so its arguments cannot be recorded by name.
    #[error("task {task}, turn {turn}: cannot name the positional arguments of {call:?}")]
    UnnamedArguments {
        task: String,
        turn: usize,
        call: String,
    },
    /// The environment refused the task.
    #[error("task {task}: {source}")]
    Env {
        task: String,
        #[source]
        source: EnvironmentError,
    },
}

/// The episode form of `task`.
///
/// * `tools`: the tools offered at turn 0 ([`FuncDocs::task_tools`]). Tasks without missed
///   functions (all of `base`, `miss_param` and `long_context`) offer the same tools at every
///   turn, so one list is the whole truth for them.
/// * `user_turns`: each turn's user message contents ([`BfclTask::user_messages`]).
/// * `judge`: [`checklist_from_task`] with `docs` (positional arguments named).
/// * `env`: [`BfclTask::to_env_task`].
///
/// # Errors
/// [`EpisodeError::Unsupported`] for a task with missed functions (miss-func tasks change
/// their tools between turns, which [`EpisodeTask`] cannot express yet);
/// [`EpisodeError::Bfcl`] when a class has no docs; [`EpisodeError::Judge`] when a
/// ground-truth call does not parse.
pub fn episode_task(
    task: &BfclTask,
    docs: &FuncDocs,
    split: Split,
) -> Result<EpisodeTask, EpisodeError> {
    if !task.missed_functions.is_empty() {
        return Err(EpisodeError::Unsupported {
            task: task.id.clone(),
            reason: "its tools change between turns (missed functions)".into(),
        });
    }
    let tools = docs.task_tools(
        &task.involved_classes,
        &task.excluded_functions,
        &task.missed_functions,
        0,
    )?;
    let user_turns = (0..task.num_turns())
        .map(|t| {
            task.user_messages(t)
                .into_iter()
                .map(|m| m.content)
                .collect()
        })
        .collect();
    Ok(EpisodeTask {
        id: TaskId(task.id.clone()),
        split,
        tools,
        user_turns,
        judge: checklist_from_task(task, Some(docs))?,
        env: task.to_env_task(),
    })
}

/// The `multi_turn_base` category as episodes, with its fixed split.
#[derive(Clone)]
pub struct BfclSuite {
    /// The 150 training scenarios ([`ScenarioSplit`]), by numeric id.
    pub train: Vec<EpisodeTask>,
    /// The 50 test scenarios, by numeric id.
    pub test: Vec<EpisodeTask>,
    /// The split itself (scenario indices per side and per stratum).
    pub split: ScenarioSplit,
    /// Every task of the suite by id, with its ground truth (what [`collect_seed`] and
    /// [`BfclCheckerJudge`] need).
    pub tasks: Arc<HashMap<String, BfclTask>>,
    /// The installed function docs (share them with [`super::env::BfclEnv::new`]).
    pub docs: Arc<FuncDocs>,
}

impl BfclSuite {
    /// Loads the installed `multi_turn_base` tasks and function docs and splits them
    /// ([`ScenarioSplit`]: 150 train and 50 test scenarios, stratified by class).
    ///
    /// # Errors
    /// As [`load_installed`], [`FuncDocs::load_installed`], [`ScenarioSplit::from_base`] and
    /// [`episode_task`].
    pub fn load_base() -> Result<Self, EpisodeError> {
        let docs = Arc::new(FuncDocs::load_installed()?);
        let mut base = load_installed(Category::Base)?;
        base.sort_by_key(|t| (t.index().unwrap_or(usize::MAX), t.id.clone()));
        let split = ScenarioSplit::from_base(&base)?;
        let (train_tasks, test_tasks): (Vec<BfclTask>, Vec<BfclTask>) =
            base.into_iter().partition(|t| split.of(t) == Split::Train);
        let convert = |tasks: &[BfclTask], split: Split| {
            tasks
                .iter()
                .map(|t| episode_task(t, &docs, split))
                .collect::<Result<Vec<_>, _>>()
        };
        let train = convert(&train_tasks, Split::Train)?;
        let test = convert(&test_tasks, Split::Test)?;
        let tasks = train_tasks
            .into_iter()
            .chain(test_tasks)
            .map(|t| (t.id.clone(), t))
            .collect();
        Ok(Self {
            train,
            test,
            split,
            tasks: Arc::new(tasks),
            docs,
        })
    }

    /// The BFCL task behind an episode task id.
    pub fn task(&self, id: &str) -> Option<&BfclTask> {
        self.tasks.get(id)
    }

    /// A checker judge over this suite's tasks.
    pub fn checker_judge(&self, config: CheckerConfig) -> BfclCheckerJudge {
        BfclCheckerJudge::new(self.tasks.clone(), config)
    }
}

/// The (train, test) episode tasks of the installed `multi_turn_base` category
/// ([`BfclSuite::load_base`] without the task map and docs).
///
/// # Errors
/// As [`BfclSuite::load_base`].
pub fn base_episode_tasks() -> Result<(Vec<EpisodeTask>, Vec<EpisodeTask>), EpisodeError> {
    let suite = BfclSuite::load_base()?;
    Ok((suite.train, suite.test))
}

pub use crate::suite::{hermes_tool_calls, CollectedSeed, SEED_FINAL_ANSWER};

/// Replays `task`'s ground truth in the real environment `env` (a
/// [`super::env::BfclEnv`], or any environment offering the task's classes) and records the
/// reference conversation as seed 0 of the task.
///
/// `env` is reset to the task; for each user turn `t`: `begin_turn(t)`, one
/// [`MessageRole::User`] message per user message, then — when the turn has ground-truth
/// calls — one [`MessageRole::Assistant`] message holding all the turn's calls as Hermes
/// blocks ([`hermes_tool_calls`]), the calls executed in order with one [`MessageRole::Tool`]
/// message each (`tool_name` = the call's name, content = the observation text), and finally
/// an assistant [`SEED_FINAL_ANSWER`]. Each executed call is also a [`ToolExchange`]:
/// `arguments_json` = the call's arguments by name (positional arguments named by the
/// parameter order of the environment's tool schemas at that turn), written as Python's
/// `json.dumps` writes them; `result_json` = the observation text, as the agent sees it
/// (BFCL results are `json.dumps` text; an error result is its plain message).
///
/// # Errors
/// [`EpisodeError::Env`] when `env` refuses the task; [`EpisodeError::GroundTruth`] for a
/// ground-truth call that does not parse; [`EpisodeError::UnnamedArguments`] for positional
/// arguments the tools cannot name. Error *observations* are recorded, not errors.
pub fn collect_seed(
    task: &BfclTask,
    env: &mut dyn Environment,
) -> Result<CollectedSeed, EpisodeError> {
    env.reset(&task.to_env_task())
        .map_err(|source| EpisodeError::Env {
            task: task.id.clone(),
            source,
        })?;
    let mut messages = Vec::new();
    let mut exchanges = Vec::new();
    let mut env_calls = 0;
    for (turn, gt) in task.ground_truth.iter().enumerate() {
        env.begin_turn(turn);
        for m in task.user_messages(turn) {
            messages.push(Message::new(MessageRole::User, m.content));
        }
        let order = JudgeTask {
            parameter_order: parameter_order(&env.tools()),
            ..JudgeTask::default()
        };
        let mut named_calls = Vec::with_capacity(gt.len());
        for src in gt {
            let call = tool_call_from_python(src).map_err(|source| EpisodeError::GroundTruth {
                task: task.id.clone(),
                turn,
                call: src.clone(),
                source,
            })?;
            let arguments = order.named_arguments(&call);
            if arguments.len() < call.positional.len() + call.arguments.len() {
                return Err(EpisodeError::UnnamedArguments {
                    task: task.id.clone(),
                    turn,
                    call: src.clone(),
                });
            }
            named_calls.push((call, arguments));
        }
        if !named_calls.is_empty() {
            let text = hermes_tool_calls(
                named_calls
                    .iter()
                    .map(|(call, args)| (call.name.as_str(), args)),
            );
            messages.push(Message::new(MessageRole::Assistant, text));
        }
        for (call, arguments) in named_calls {
            let obs = env.execute(&call);
            env_calls += 1;
            messages.push(Message::new(MessageRole::Tool, obs.text.clone()).with_tool(&call.name));
            exchanges.push(ToolExchange {
                arguments_json: pyjson::compact(&Value::Object(arguments)),
                name: call.name,
                result_json: obs.text,
            });
        }
        messages.push(Message::new(MessageRole::Assistant, SEED_FINAL_ANSWER));
    }
    Ok(CollectedSeed {
        seed: SeedTrajectory {
            task: TaskId(task.id.clone()),
            index: 0,
            messages,
            tool_calls: exchanges,
        },
        env_calls,
    })
}

/// Function name → parameter names in schema order, from OpenAI tool schemas
/// (`function.parameters.properties`).
fn parameter_order(tools: &[Value]) -> BTreeMap<String, Vec<String>> {
    tools
        .iter()
        .filter_map(|tool| {
            let f = tool.get("function").unwrap_or(tool);
            let name = f.get("name")?.as_str()?;
            let params = f
                .pointer("/parameters/properties")
                .and_then(Value::as_object)
                .map(|p| p.keys().cloned().collect())
                .unwrap_or_default();
            Some((name.to_string(), params))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bfcl::env::BfclEnv;
    use envace_actors::environment::ToolCall;
    use envace_actors::judge::{Judge, TurnCalls};
    use serde_json::Map;

    fn suite() -> BfclSuite {
        BfclSuite::load_base().expect("installed by `make setup`")
    }

    fn gt_transcript(task: &BfclTask) -> Vec<TurnCalls> {
        task.ground_truth
            .iter()
            .map(|turn| {
                TurnCalls::answered(
                    turn.iter()
                        .map(|c| tool_call_from_python(c).unwrap())
                        .collect(),
                )
            })
            .collect()
    }

    #[test]
    fn base_suite_splits_and_converts() {
        let suite = suite();
        assert_eq!(suite.train.len(), 150);
        assert_eq!(suite.test.len(), 50);
        assert_eq!(suite.tasks.len(), 200);
        // The stratified split, each side in id order.
        assert_eq!(suite.train[0].id.0, "multi_turn_base_0");
        assert_eq!(suite.train[149].id.0, "multi_turn_base_199");
        assert_eq!(suite.test[0].id.0, "multi_turn_base_5");
        assert_eq!(suite.test[49].id.0, "multi_turn_base_197");
        assert!(suite
            .test
            .iter()
            .all(|t| suite.split.of(&suite.tasks[&t.id.0]) == Split::Test));
        for (tasks, split) in [(&suite.train, Split::Train), (&suite.test, Split::Test)] {
            for ep in tasks {
                let bfcl = &suite.tasks[&ep.id.0];
                assert_eq!(ep.split, split);
                assert!(!ep.tools.is_empty(), "{}", ep.id.0);
                assert_eq!(ep.user_turns.len(), bfcl.num_turns());
                assert!(ep.user_turns.iter().all(|t| !t.is_empty()));
                assert_eq!(ep.judge.num_turns(), bfcl.num_turns());
                assert_eq!(ep.judge.id, ep.id.0);
                assert_eq!(ep.env, bfcl.to_env_task());
                // Base tasks offer the same tools at every turn.
                let last = suite
                    .docs
                    .task_tools(
                        &bfcl.involved_classes,
                        &bfcl.excluded_functions,
                        &bfcl.missed_functions,
                        bfcl.num_turns() - 1,
                    )
                    .unwrap();
                assert_eq!(ep.tools, last);
            }
        }
        let (train, test) = base_episode_tasks().unwrap();
        assert_eq!((train.len(), test.len()), (150, 50));
    }

    #[test]
    fn miss_func_tasks_are_unsupported() {
        let docs = FuncDocs::load_installed().unwrap();
        let task = load_installed(Category::MissFunc).unwrap().remove(0);
        let err = episode_task(&task, &docs, Split::Test).unwrap_err();
        assert!(matches!(err, EpisodeError::Unsupported { .. }), "{err}");
        assert!(err.to_string().contains("unsupported in episodes yet"));
    }

    #[test]
    fn seeds_replay_every_ground_truth_call() {
        let suite = suite();
        let mut env = BfclEnv::new(suite.docs.clone());
        let mut total = 0;
        for ep in &suite.train {
            let task = &suite.tasks[&ep.id.0];
            let CollectedSeed { seed, env_calls } = collect_seed(task, &mut env).unwrap();
            let gt: Vec<&String> = task.ground_truth.iter().flatten().collect();
            assert_eq!(seed.task, ep.id);
            assert_eq!(seed.tool_calls.len(), gt.len(), "{}", task.id);
            assert_eq!(env_calls, gt.len());
            total += env_calls;
            // The recorded arguments are the checklist's (named the same way).
            let items: Vec<_> = ep.judge.checklist.iter().flatten().collect();
            for (ex, item) in seed.tool_calls.iter().zip(&items) {
                assert_eq!(ex.name, item.function);
                let args: Value = serde_json::from_str(&ex.arguments_json).unwrap();
                assert_eq!(args, Value::Object(item.arguments.clone()), "{}", task.id);
                assert!(!ex.result_json.is_empty(), "{}: {}", task.id, ex.name);
            }
            let count = |role| seed.messages.iter().filter(|m| m.role == role).count();
            let turns = task.num_turns();
            let calling_turns = task.ground_truth.iter().filter(|t| !t.is_empty()).count();
            assert_eq!(count(MessageRole::Tool), gt.len());
            assert_eq!(count(MessageRole::Assistant), turns + calling_turns);
            assert!(count(MessageRole::User) >= turns);
            assert_eq!(seed.messages.last().unwrap().content, SEED_FINAL_ANSWER);
        }
        eprintln!("real environment calls for 150 train seeds: {total}");
    }

    #[test]
    fn first_seed_matches_direct_execution() {
        let suite = suite();
        let task = &suite.tasks["multi_turn_base_0"];
        let mut env = BfclEnv::new(suite.docs.clone());
        let seed = collect_seed(task, &mut env).unwrap().seed;
        let first_gt = tool_call_from_python(&task.ground_truth[0][0]).unwrap();
        let first = &seed.tool_calls[0];
        assert_eq!(first.name, first_gt.name);

        let mut direct = BfclEnv::new(suite.docs.clone());
        direct.reset(&task.to_env_task()).unwrap();
        direct.begin_turn(0);
        assert_eq!(first.result_json, direct.execute(&first_gt).text);

        // User message, then the turn's calls as one Hermes assistant message.
        assert_eq!(seed.messages[0].role, MessageRole::User);
        assert_eq!(seed.messages[0].content, task.turns[0][0].content);
        let act = &seed.messages[1];
        assert_eq!(act.role, MessageRole::Assistant);
        assert_eq!(
            act.content.matches("<tool_call>\n").count(),
            task.ground_truth[0].len()
        );
        assert!(act.content.starts_with(&format!(
            "<tool_call>\n{{\"name\": \"{}\", \"arguments\": {{",
            first.name
        )));
        assert_eq!(seed.messages[2].role, MessageRole::Tool);
        assert_eq!(
            seed.messages[2].tool_name.as_deref(),
            Some(first.name.as_str())
        );
        assert_eq!(seed.messages[2].content, first.result_json);
    }

    #[test]
    fn hermes_text_uses_python_separators() {
        let args = serde_json::json!({"folder": "doc", "n": [1, 2.5], "é": null});
        let text = hermes_tool_calls([("cd", args.as_object().unwrap())]);
        assert_eq!(
            text,
            "<tool_call>\n{\"name\": \"cd\", \"arguments\": {\"folder\": \"doc\", \"n\": [1, 2.5], \"é\": null}}\n</tool_call>"
        );
        let two = hermes_tool_calls([("a", &Map::new()), ("b", &Map::new())]);
        assert_eq!(
            two,
            "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>"
        );
    }

    #[test]
    fn checker_judge_passes_ground_truth_of_every_base_task() {
        let suite = suite();
        let judge = suite.checker_judge(CheckerConfig::default());
        for ep in suite.train.iter().chain(&suite.test) {
            let task = &suite.tasks[&ep.id.0];
            let verdict = judge.judge(&ep.judge, &gt_transcript(task));
            assert_eq!(
                verdict.reward, 1.0,
                "{}: {:?}",
                task.id, verdict.turn_scores
            );
            assert_eq!(verdict.turn_scores.len(), task.num_turns());
            assert!(verdict.turn_scores.iter().all(|s| s.passed_required));
        }
    }

    #[test]
    fn checker_judge_fails_a_dropped_call_and_later_turns() {
        let suite = suite();
        let judge = suite.checker_judge(CheckerConfig::default());
        let ep = &suite.train[0];
        let task = &suite.tasks[&ep.id.0];
        let mut transcript = gt_transcript(task);
        assert!(!transcript[1].calls.is_empty());
        transcript[1].calls.pop();
        if transcript[1].calls.is_empty() {
            transcript[1]
                .calls
                .push(ToolCall::new("nonexistent_probe", Map::new()));
        }
        let verdict = judge.judge(&ep.judge, &transcript);
        let scores = &verdict.turn_scores;
        assert_eq!(scores[0].score, 1.0);
        assert!(scores[0].passed_required);
        assert_eq!(scores[1].score, 0.0);
        assert!(!scores[1].passed_required);
        assert!(
            scores[1].reason.starts_with("multi_turn:"),
            "{}",
            scores[1].reason
        );
        for s in &scores[2..] {
            assert_eq!(s.score, 0.0);
            assert!(s.reason.starts_with("not reached"), "{}", s.reason);
        }
        assert_eq!(verdict.reward, 1.0 / task.num_turns() as f32);

        // A transcript that stops early, one without a final answer, and an unknown task.
        let short = judge.judge(&ep.judge, &gt_transcript(task)[..1]);
        assert_eq!(short.reward, 1.0 / task.num_turns() as f32);
        let mut unfinished = gt_transcript(task);
        unfinished[0].final_answer = false;
        assert_eq!(judge.judge(&ep.judge, &unfinished).reward, 0.0);
        let unknown = JudgeTask {
            id: "multi_turn_base_9999".into(),
            checklist: vec![Vec::new(); 2],
            ..JudgeTask::default()
        };
        let v = judge.judge(&unknown, &[]);
        assert_eq!(v.reward, 0.0);
        assert_eq!(v.turn_scores.len(), 2);
        assert!(v.turn_scores[0].reason.contains("unknown BFCL task"));
    }
}
