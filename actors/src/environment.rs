//! The real-environment interface the Environment actor hosts.
//!
//! An [`Environment`] is a tool-using world the agent acts in: it lists the tools it offers
//! (OpenAI function schemas), starts from a task's initial configuration ([`Environment::reset`]),
//! answers one [`ToolCall`] at a time with an [`Observation`] and exposes the state a checker
//! compares ([`Environment::snapshot`]). Implementations live outside this crate (BFCL in the
//! `envace` crate, a user's own environment in theirs); the trait is object-safe and `Send`, so an
//! actor can own a `Box<dyn Environment>`.
//!
//! Determinism is part of the contract: the same task and the same calls give the same
//! observations and the same snapshots (seeded generators, frozen clocks).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// One tool call, as the Act role (or a ground-truth replay) issues it.
///
/// JSON tool calls (`{"name": …, "arguments": {…}}`) only fill `arguments`; call forms that
/// allow positional arguments (BFCL's Python-call strings) put them in `positional`, in order,
/// before the keyword arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The tool (function) name.
    pub name: String,
    /// Positional arguments, in call order (empty for JSON tool calls).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub positional: Vec<Value>,
    /// Keyword arguments, in call order (`serde_json` keeps insertion order in this workspace).
    #[serde(default)]
    pub arguments: Map<String, Value>,
}

impl ToolCall {
    /// A call with keyword arguments only.
    pub fn new(name: impl Into<String>, arguments: Map<String, Value>) -> Self {
        Self {
            name: name.into(),
            positional: Vec::new(),
            arguments,
        }
    }
}

/// What the environment answered to one call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// The structured result (environment-specific encoding; `Value::Null` when the call
    /// failed before producing one).
    pub value: Value,
    /// The exact text the agent sees in its tool turn.
    pub text: String,
    /// True when the call failed (an exception-style error, a parse failure, an unknown tool).
    pub is_error: bool,
}

/// A task as an environment receives it: its id and the environment-specific specification
/// (for BFCL, the task's line of the question file).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnvTask {
    /// The task id (e.g. `multi_turn_base_0`).
    pub id: String,
    /// The environment-specific task specification.
    pub spec: Value,
}

/// Why an environment could not start a task.
#[derive(Debug, thiserror::Error)]
pub enum EnvironmentError {
    /// The task specification is missing a field or holds a value the environment rejects.
    #[error("task {id}: invalid specification: {reason}")]
    InvalidTask { id: String, reason: String },
    /// The task needs something this environment does not provide (e.g. an API class that is
    /// not implemented).
    #[error("task {id}: unsupported: {reason}")]
    Unsupported { id: String, reason: String },
}

/// A real, deterministic tool environment.
pub trait Environment: Send {
    /// The tools available now, as OpenAI function schemas
    /// (`{"type": "function", "function": {"name", "description", "parameters"}}`).
    fn tools(&self) -> Vec<Value>;

    /// Starts `task` from its initial configuration, discarding all previous state.
    ///
    /// # Errors
    /// [`EnvironmentError`] when the specification is invalid or unsupported.
    fn reset(&mut self, task: &EnvTask) -> Result<(), EnvironmentError>;

    /// Tells the environment that user turn `turn` (0-based) starts; environments whose tool
    /// list changes between turns (BFCL's miss-func tasks) update [`Environment::tools`].
    fn begin_turn(&mut self, _turn: usize) {}

    /// Executes one call and returns what the agent observes. Failures are observations
    /// (`is_error: true`), never panics or `Err`: a wrong call is part of an episode.
    fn execute(&mut self, call: &ToolCall) -> Observation;

    /// The state a checker compares, as JSON (environment-specific encoding).
    fn snapshot(&self) -> Value;
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Counter(i64);

    impl Environment for Counter {
        fn tools(&self) -> Vec<Value> {
            vec![serde_json::json!({"type": "function", "function": {"name": "inc"}})]
        }
        fn reset(&mut self, _task: &EnvTask) -> Result<(), EnvironmentError> {
            self.0 = 0;
            Ok(())
        }
        fn execute(&mut self, call: &ToolCall) -> Observation {
            self.0 += call
                .arguments
                .get("by")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            Observation {
                value: Value::from(self.0),
                text: self.0.to_string(),
                is_error: false,
            }
        }
        fn snapshot(&self) -> Value {
            Value::from(self.0)
        }
    }

    #[test]
    fn trait_objects_run_calls_and_snapshot() {
        let mut env: Box<dyn Environment> = Box::new(Counter(7));
        let task = EnvTask {
            id: "t".into(),
            spec: Value::Null,
        };
        env.reset(&task).expect("reset");
        let mut args = Map::new();
        args.insert("by".into(), Value::from(3));
        let obs = env.execute(&ToolCall::new("inc", args));
        assert_eq!(obs.text, "3");
        assert_eq!(env.snapshot(), Value::from(3));
        assert_eq!(env.tools().len(), 1);
    }

    #[test]
    fn tool_call_json_form_round_trips() {
        let call: ToolCall =
            serde_json::from_str(r#"{"name":"cd","arguments":{"folder":"document"}}"#)
                .expect("parse");
        assert!(call.positional.is_empty());
        assert_eq!(call.arguments["folder"], "document");
    }
}
