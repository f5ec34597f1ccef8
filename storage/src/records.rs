//! The records envace persists: plain serde data, encoded with bincode 2 behind the value header
//! of [`crate::codec`]. The data path reads `Task → Trajectory → Row`; rehearsal memories, seed
//! trajectories, run state and checkpoints sit beside it.
//!
//! bincode cannot encode self-describing types (`serde_json::Value`, untagged enums,
//! `skip_serializing_if`), so JSON payloads travel as strings and every field is always present.
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Which role of the shared policy produced a generation (EnvACE §3: Act emits tool calls or a
/// final answer, Rehearse predicts a tool's result).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The agent's turn: tool calls or a final answer.
    Act,
    /// The policy's own prediction of a tool result.
    Rehearse,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Act => "act",
            Role::Rehearse => "rehearse",
        })
    }
}

/// The optimizer step whose weights sampled a row (0 = the initial weights).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct PolicyVersion(pub u64);

/// A task's identifier, e.g. a BFCL id such as `multi_turn_base_12`. Any UTF-8 text.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TaskId(pub String);

/// A training or evaluation run's name, e.g. `tau2-grpo-8b`. Any UTF-8 text.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RunId(pub String);

macro_rules! string_id {
    ($t:ident) => {
        impl From<&str> for $t {
            fn from(s: &str) -> Self {
                $t(s.to_owned())
            }
        }
        impl From<String> for $t {
            fn from(s: String) -> Self {
                $t(s)
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}
string_id!(TaskId);
string_id!(RunId);

/// One generation call: one training row with its role tag. Token ids and log-probs are the
/// exact sampled ones (the learner never re-tokenizes decoded text).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// Which role generated this row.
    pub role: Role,
    /// The prompt's token ids, as fed to the model.
    pub prompt_ids: Vec<u32>,
    /// The sampled token ids.
    pub completion_ids: Vec<u32>,
    /// Sampling log-probability (natural log) of each completion token; same length as
    /// `completion_ids`.
    pub logprobs: Vec<f32>,
    /// The weights that sampled this row.
    pub policy_version: PolicyVersion,
}

/// A chat message's speaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageRole {
    /// System prompt.
    System,
    /// A user turn of the task.
    User,
    /// The agent (Act role): tool calls or a final answer.
    Assistant,
    /// A tool result: real, or rehearsed by the policy.
    Tool,
}

impl fmt::Display for MessageRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MessageRole::System => "system",
            MessageRole::User => "user",
            MessageRole::Assistant => "assistant",
            MessageRole::Tool => "tool",
        })
    }
}

/// One message of a conversation, as the agent saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who speaks.
    pub role: MessageRole,
    /// The text (for assistant turns the raw Act output, `<tool_call>` blocks included).
    pub content: String,
    /// For tool messages: the tool that answered.
    pub tool_name: Option<String>,
    /// Index into the trajectory's `rows` of the generation that produced this message; `None`
    /// for system and user messages and for real tool results.
    pub row: Option<u32>,
}

impl Message {
    /// A message of `role` saying `content`, naming no tool and no row.
    pub fn new(role: MessageRole, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            tool_name: None,
            row: None,
        }
    }

    /// This message, produced by the trajectory's row `row` (`None`: not generated).
    pub fn with_row(mut self, row: Option<u32>) -> Self {
        self.row = row;
        self
    }

    /// This message, answered by the tool `name`.
    pub fn with_tool(mut self, name: impl Into<String>) -> Self {
        self.tool_name = Some(name.into());
        self
    }
}

/// The judge's verdict on one user turn (reference: a weighted checklist per user turn).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnVerdict {
    /// 0-based index of the user turn.
    pub user_turn: u32,
    /// Σ weight·pass of the turn's checklist, in [0, 1].
    pub score: f32,
    /// Whether every item required for the next turn passed.
    pub passed: bool,
    /// The judge's explanation.
    pub reason: String,
}

/// Why an episode ended (reference behaviours, DESIGN §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Termination {
    /// Every user turn got a final answer.
    Completed,
    /// A required checklist item failed, so later user turns were not played.
    RequiredCheckFailed,
    /// The Act output had a malformed tool call (turn reward 0).
    ActParseError,
    /// The Rehearse output was not an `<execution_result>` block (turn reward 0).
    RehearseFormatError,
    /// The episode hit the cap on generation calls (reference: 200), or on Act turns in one
    /// user turn.
    MaxGenerationCalls,
    /// Prompt + max new tokens would exceed the model's context.
    LengthExceeded,
    /// The real environment failed (seed collection, evaluation).
    EnvironmentError,
    /// An actor failed under the episode more often than it was retried; the reason is the
    /// trajectory's last (system) message.
    ActorFailed,
}

/// Whether observations came from the policy's rehearsal or from the real environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionMode {
    /// Tool results rehearsed by the policy (training; test-time rehearsal).
    Rehearsal,
    /// Tool results from the real environment (seeds, committed execution, evaluation).
    Real,
}

/// Wall-clock time spent per stage of an episode, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    /// Whole episode, seconds.
    pub total_s: f64,
    /// Act generations, seconds.
    pub act_s: f64,
    /// Rehearse generations, seconds.
    pub rehearse_s: f64,
    /// Real environment calls, seconds.
    pub environment_s: f64,
    /// Judging, seconds.
    pub judge_s: f64,
}

/// One rollout: a finished trajectory with its role-tagged rows. Keyed by
/// (run, step, task, sample) in the `rollouts` tree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trajectory {
    /// The run that sampled it.
    pub run: RunId,
    /// The optimizer step it was sampled for.
    pub step: u64,
    /// The task it plays.
    pub task: TaskId,
    /// Index among the K samples of this task at this step.
    pub sample: u32,
    /// Rehearsed or real observations.
    pub mode: ExecutionMode,
    /// One row per generation call, in call order.
    pub rows: Vec<Row>,
    /// The conversation.
    pub messages: Vec<Message>,
    /// Trajectory reward R (Σ turn scores / user turns), put on every row.
    pub reward: f32,
    /// One verdict per judged user turn.
    pub verdicts: Vec<TurnVerdict>,
    /// Why the episode ended.
    pub termination: Termination,
    /// Time per stage.
    pub timings: Timings,
}

/// A real tool call and its real result, as recorded in a seed trajectory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolExchange {
    /// Tool name.
    pub name: String,
    /// The call's arguments, JSON text.
    pub arguments_json: String,
    /// The environment's result, JSON text.
    pub result_json: String,
}

/// A real-environment reference conversation for a task, collected once before training; it
/// grounds the Rehearse role (few-shot facts, warm-up data). Keyed by (task, index).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeedTrajectory {
    /// The task.
    pub task: TaskId,
    /// 0 for a task's first (usually only) seed.
    pub index: u32,
    /// The conversation with real observations.
    pub messages: Vec<Message>,
    /// Every tool call with its real result, in call order.
    pub tool_calls: Vec<ToolExchange>,
}

/// A benchmark task. The payload keeps the source's JSON untouched.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    /// Unique id.
    pub id: TaskId,
    /// Source category, e.g. `multi_turn_base`.
    pub category: String,
    /// `train`, `eval`, …
    pub split: String,
    /// The task as its source wrote it, JSON text.
    pub payload_json: String,
}

/// How the N rehearsals of test-time scaling relate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RehearsalMode {
    /// N independent rehearsals.
    Parallel,
    /// Rehearsal n sees rehearsals and critiques < n.
    Sequential,
}

/// The rehearsal memory m_x built before one committed real execution. Keyed like the
/// trajectory it prepares: (run, step, task, sample) in the `memories` tree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RehearsalMemory {
    /// The run.
    pub run: RunId,
    /// The step (policy version under evaluation).
    pub step: u64,
    /// The task.
    pub task: TaskId,
    /// Which real execution of the task this memory prepared.
    pub sample: u32,
    /// Parallel or sequential rehearsals.
    pub mode: RehearsalMode,
    /// Configured number of rehearsals N.
    pub n: u32,
    /// Each imagined conversation.
    pub rehearsals: Vec<Vec<Message>>,
    /// The model's critique f^(n) of each rehearsal.
    pub critiques: Vec<String>,
    /// The condensed memory put in the real execution's prompt.
    pub summary: String,
    /// The weights that rehearsed.
    pub policy_version: PolicyVersion,
}

/// Where a run stands, enough to resume it. One record per run in the `runs` tree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunState {
    /// The run.
    pub run: RunId,
    /// Last completed optimizer step.
    pub step: u64,
    /// Position in the task stream (tasks consumed so far).
    pub data_cursor: u64,
    /// The RNG's serialized state.
    pub rng_state: Vec<u8>,
    /// Hash of the run's configuration, hex; a resume with another config is refused upstream.
    pub config_hash: String,
}

/// One saved model checkpoint. Keyed by (run, step) in the `checkpoints` tree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The run.
    pub run: RunId,
    /// The step the weights are from.
    pub step: u64,
    /// Where the weights are.
    pub path: PathBuf,
    /// Metrics at that step (name → value).
    pub metrics: BTreeMap<String, f64>,
}
