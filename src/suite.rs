//! Task suites: where a run's tasks, their real environment and their evaluation judge come
//! from, so the pipeline runs any domain and BFCL is one implementation ([`crate::bfcl::suite`]).
//!
//! A [`TaskSuite`] gives the tasks of each split as [`EpisodeTask`]s (tools, user turns, the
//! checklist the training judge scores), a factory of its real [`Environment`], the replay of a
//! task's reference solution as its seed trajectory (the only real environment calls before
//! training, DESIGN.md §1), and the judge of real-environment evaluation. A run names its suite
//! with `environment = "…"` in the config; the registry ([`crate::registry`]) builds it when the
//! run opens, and a user's crate registers its own.

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::actors::env_actor::EnvFactory;
use crate::actors::environment::Environment;
use crate::actors::{EpisodeTask, Judge, Split};
use crate::kernels::pyjson;
use crate::storage::records::{SeedTrajectory, Task};

/// The final answer a seed trajectory gives after each user turn's calls (the ground truth has
/// calls only; the reference conversation still needs the agent to close every turn so the
/// next user turn follows an assistant message).
pub const SEED_FINAL_ANSWER: &str = "Done.";

/// The Hermes (Qwen) text of one Act turn's calls: per call
/// `<tool_call>\n{"name": NAME, "arguments": {…}}\n</tool_call>`, joined by `"\n"`, the JSON
/// written as Python's `json.dumps` writes it (separators `", "` and `": "`, non-ASCII kept),
/// which is what Qwen's chat template renders.
pub fn hermes_tool_calls<'a>(
    calls: impl IntoIterator<Item = (&'a str, &'a Map<String, Value>)>,
) -> String {
    calls
        .into_iter()
        .map(|(name, arguments)| {
            format!(
                "<tool_call>\n{{\"name\": {}, \"arguments\": {}}}\n</tool_call>",
                pyjson::compact(&Value::from(name)),
                pyjson::compact(&Value::Object(arguments.clone()))
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A seed trajectory and how many real environment calls collecting it made.
#[derive(Debug, Clone, PartialEq)]
pub struct CollectedSeed {
    /// The reference conversation with the real tool results (seed 0 of its task).
    pub seed: SeedTrajectory,
    /// Number of [`Environment::execute`] calls made.
    pub env_calls: usize,
}

/// What a suite could not do for one task.
#[derive(Debug, thiserror::Error)]
pub enum SuiteError {
    /// `environment = name` names no registered suite.
    #[error(transparent)]
    Unregistered(#[from] crate::registry::RegistryError),
    /// The suite could not be loaded (its files, its split).
    #[error("loading the {suite} suite: {source}")]
    Load {
        suite: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The task is not one of the suite's.
    #[error("task {task} is not in the {suite} suite")]
    UnknownTask { suite: String, task: String },
    /// The task's reference solution did not replay in the real environment.
    #[error("replaying the reference solution of task {task}: {source}")]
    Collect {
        task: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// A source of tasks with their real environment and evaluation judge (see the module doc).
///
/// Object-safe: a run holds an `Arc<dyn TaskSuite>`.
pub trait TaskSuite: Send + Sync + 'static {
    /// The suite's name in messages and reports (e.g. `bfcl_base`).
    fn name(&self) -> &str;

    /// The tasks of `split`, in a fixed order: training draws train tasks round-robin in this
    /// order and evaluation takes evenly spaced tasks of its split. The two splits are
    /// disjoint; test tasks never reach training (no seeds are collected for them).
    fn tasks(&self, split: Split) -> &[EpisodeTask];

    /// Builds a fresh real environment (one per Environment actor and per collection).
    fn environment(&self) -> EnvFactory;

    /// Plays `task`'s reference solution in `env` (reset to the task first) and records it
    /// with the real results as the task's seed trajectory.
    ///
    /// # Errors
    /// [`SuiteError::UnknownTask`], or [`SuiteError::Collect`] when a reference call fails.
    fn collect_seed(
        &self,
        task: &EpisodeTask,
        env: &mut dyn Environment,
    ) -> Result<CollectedSeed, SuiteError>;

    /// The judge of real-environment evaluation (for BFCL its own checker, which re-executes
    /// the agent's calls).
    fn evaluation_judge(&self) -> Arc<dyn Judge>;

    /// The stratum of a train task, for the warm-up's stratified choice of seeds; `None` puts
    /// every task in one stratum.
    fn stratum(&self, _task: &EpisodeTask) -> Option<String> {
        None
    }

    /// The group a tool of `task` belongs to (for BFCL its API class), for per-group
    /// breakdowns such as rehearsal fidelity; `None` when the suite has no groups.
    fn tool_group(&self, _task: &EpisodeTask, _tool: &str) -> Option<String> {
        None
    }

    /// `task` as stored in the run's database: the suite's name as its category and the
    /// environment's task description as its payload.
    fn stored_task(&self, task: &EpisodeTask) -> Task {
        Task {
            id: task.id.clone(),
            category: self.name().to_string(),
            split: task.split.name().into(),
            payload_json: task.env.spec.to_string(),
        }
    }
}

/// The split of the stored task `id`: train when `suite` lists it among its train tasks.
pub fn split_of(suite: &dyn TaskSuite, id: &crate::storage::records::TaskId) -> Split {
    if suite.tasks(Split::Train).iter().any(|t| &t.id == id) {
        Split::Train
    } else {
        Split::Test
    }
}
