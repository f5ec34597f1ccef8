//! The environment-agnostic task an episode runs: tools, user turns, checklist and the
//! environment's own task description.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::environment::EnvTask;
use crate::judge::JudgeTask;
use crate::storage::TaskId;

/// Which side of the fixed train/test split a task is on. Seeds are collected, and warm-up and
/// training run, on [`Split::Train`] only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    Train,
    Test,
}

impl Split {
    /// `"train"` or `"test"`.
    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Test => "test",
        }
    }
}

impl std::str::FromStr for Split {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "train" => Ok(Split::Train),
            "test" => Ok(Split::Test),
            other => Err(format!("unknown split {other:?} (expected train or test)")),
        }
    }
}

/// One task as the episode driver sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeTask {
    /// The task's id (e.g. `multi_turn_base_0`).
    pub id: TaskId,
    /// Train or test.
    pub split: Split,
    /// OpenAI function schemas (`{"type": "function", "function": {name, description,
    /// parameters}}`) offered to the agent: the whitelist of both roles.
    pub tools: Vec<Value>,
    /// The user messages of each user turn (one or more per turn; the next turn's messages
    /// follow the agent's final answer).
    pub user_turns: Vec<Vec<String>>,
    /// The checklist the judge scores the episode against (one list per user turn).
    pub judge: JudgeTask,
    /// The real environment's description of the task (used only in real mode).
    pub env: EnvTask,
}

impl EpisodeTask {
    /// Tool names of the whitelist, in schema order.
    pub fn tool_names(&self) -> Vec<&str> {
        self.tools.iter().filter_map(tool_name).collect()
    }

    /// The schema of tool `name`, if whitelisted.
    pub fn tool(&self, name: &str) -> Option<&Value> {
        self.tools.iter().find(|t| tool_name(t) == Some(name))
    }
}

/// The `function.name` (or top-level `name`) of an OpenAI tool schema.
pub fn tool_name(tool: &Value) -> Option<&str> {
    tool.get("function")
        .and_then(|f| f.get("name"))
        .or_else(|| tool.get("name"))
        .and_then(Value::as_str)
}
