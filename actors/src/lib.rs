//! envace actors: the Engine, Acting, Rehearsal, Environment, Judge, Learner and Memory actors
//! that exchange messages over ractor around one shared model handle.
//!
//! The data path: an [`EpisodeTask`] is played by the [`episode`] driver — Act turns from the
//! [`acting`] actor, tool results from the [`rehearsal`] actor (self-rehearsal) or the
//! [`env_actor`] (real), turn scores from the [`judge_actor`] — into a
//! [`storage::Trajectory`] whose rows (role, exact ids, log-probs, policy version) the
//! [`learner`] actor turns into role-wise GRPO steps on the weights the [`worker`] thread owns;
//! the [`memory`] actor persists it all in sled. The [`supervisor`] restarts failed actors and
//! a [`topology`] starts one run's set. The kernels it hosts live in [`envace_kernels`], the
//! records it persists in [`envace_storage`].
//!
//! ```
//! use envace_actors::protocol::{parse_act, ActErrorCode};
//!
//! let turn = "<tool_call>\n{\"name\": \"ls\", \"arguments\": {}}\n</tool_call>";
//! let parsed = parse_act(turn, &["ls", "cd"]).expect("a valid turn");
//! assert_eq!(parsed.calls[0].name, "ls");
//! let err = parse_act("<tool_call>\n{\"name\": \"rm\", \"arguments\": {}}\n</tool_call>", &["ls"]);
//! assert_eq!(err.unwrap_err().code, ActErrorCode::UnknownTool);
//! ```

pub use envace_kernels as kernels;
pub use envace_storage as storage;

pub mod acting;
pub mod engine;
pub mod env_actor;
pub mod environment;
pub mod episode;
mod generation;
pub mod judge;
pub mod judge_actor;
pub mod learner;
pub mod memory;
pub mod protocol;
pub mod rehearsal;
pub mod slot;
pub mod supervisor;
pub mod task;
pub mod topology;
pub mod worker;

pub use environment::{EnvTask, Environment, EnvironmentError, Observation, ToolCall};
pub use judge::{ChecklistItem, Judge, JudgeTask, PassThroughJudge, TurnCalls, TurnScore, Verdict};
pub use task::{tool_name, EpisodeTask, Split};
