//! A task suite of a user's own, outside BFCL: a counter that tools add to, with one user turn
//! per task ("the counter starts at S; add N"), its reference solution replayed as the seed and
//! the rule checklist as both training and evaluation judge. Shared by
//! `examples/custom_suite.rs` and `tests/custom_suite.rs`.

use std::sync::Arc;

use envace::actors::env_actor::EnvFactory;
use envace::actors::{
    ChecklistItem, EnvTask, Environment, EnvironmentError, EpisodeTask, Judge, JudgeTask,
    Observation, Split, ToolCall,
};
use envace::bfcl::judge::RuleChecklistJudge;
use envace::kernels::pyjson;
use envace::storage::records::{Message, MessageRole, SeedTrajectory, TaskId, ToolExchange};
use envace::suite::{hermes_tool_calls, CollectedSeed, SuiteError, TaskSuite, SEED_FINAL_ANSWER};
use serde_json::{json, Map, Value};

/// The suite's name in a run config: `environment = "counter"`.
pub const COUNTER: &str = "counter";

/// A counter with `add(n)` and `get_count()`; a task's spec gives its start value.
#[derive(Default)]
pub struct Counter {
    count: i64,
}

impl Environment for Counter {
    fn tools(&self) -> Vec<Value> {
        tools()
    }

    fn reset(&mut self, task: &EnvTask) -> Result<(), EnvironmentError> {
        self.count = task.spec["start"]
            .as_i64()
            .ok_or_else(|| EnvironmentError::InvalidTask {
                id: task.id.clone(),
                reason: "spec.start must be an integer".into(),
            })?;
        Ok(())
    }

    fn execute(&mut self, call: &ToolCall) -> Observation {
        let n = call
            .arguments
            .get("n")
            .or(call.positional.first())
            .and_then(Value::as_i64);
        let value = match (call.name.as_str(), n) {
            ("add", Some(n)) => {
                self.count += n;
                json!({"count": self.count})
            }
            ("add", None) => return error("add needs an integer n"),
            ("get_count", _) => json!({"count": self.count}),
            (other, _) => return error(&format!("no tool named {other}")),
        };
        Observation {
            text: pyjson::compact(&value),
            value,
            is_error: false,
        }
    }

    fn snapshot(&self) -> Value {
        json!({"count": self.count})
    }
}

fn error(message: &str) -> Observation {
    Observation {
        value: Value::from(message),
        text: message.to_string(),
        is_error: true,
    }
}

fn tools() -> Vec<Value> {
    vec![
        json!({"type": "function", "function": {
            "name": "add", "description": "Adds n to the counter and returns the new count.",
            "parameters": {"type": "object", "properties": {"n": {"type": "integer"}},
                           "required": ["n"]}}}),
        json!({"type": "function", "function": {
            "name": "get_count", "description": "Returns the counter's value.",
            "parameters": {"type": "object", "properties": {}}}}),
    ]
}

/// `train` tasks and `test` tasks with distinct (start, n); task `i` is `counter_i`.
pub struct CounterSuite {
    train: Vec<EpisodeTask>,
    test: Vec<EpisodeTask>,
}

impl CounterSuite {
    pub fn new(train: usize, test: usize) -> Self {
        let task = |i: usize, split: Split| {
            let (start, n) = (i as i64 * 3 % 17, 1 + i as i64 % 9);
            let mut arguments = Map::new();
            arguments.insert("n".into(), Value::from(n));
            let id = format!("counter_{i}");
            EpisodeTask {
                id: TaskId(id.clone()),
                split,
                tools: tools(),
                user_turns: vec![vec![format!(
                    "The counter starts at {start}. Add {n} to it."
                )]],
                judge: JudgeTask {
                    id: id.clone(),
                    checklist: vec![vec![ChecklistItem {
                        function: "add".into(),
                        arguments,
                        weight: 1.0,
                        required: true,
                    }]],
                    parameter_order: [("add".to_string(), vec!["n".to_string()])].into(),
                },
                env: EnvTask {
                    id,
                    spec: json!({"start": start}),
                },
            }
        };
        Self {
            train: (0..train).map(|i| task(i, Split::Train)).collect(),
            test: (train..train + test)
                .map(|i| task(i, Split::Test))
                .collect(),
        }
    }
}

impl TaskSuite for CounterSuite {
    fn name(&self) -> &str {
        COUNTER
    }

    fn tasks(&self, split: Split) -> &[EpisodeTask] {
        match split {
            Split::Train => &self.train,
            Split::Test => &self.test,
        }
    }

    fn environment(&self) -> EnvFactory {
        Arc::new(|| Box::new(Counter::default()) as Box<dyn Environment>)
    }

    fn collect_seed(
        &self,
        task: &EpisodeTask,
        env: &mut dyn Environment,
    ) -> Result<CollectedSeed, SuiteError> {
        let failed = |e: String| SuiteError::Collect {
            task: task.id.0.clone(),
            source: e.into(),
        };
        env.reset(&task.env).map_err(|e| failed(e.to_string()))?;
        let mut messages = vec![Message::new(MessageRole::User, &task.user_turns[0][0])];
        let item = &task.judge.checklist[0][0];
        messages.push(Message::new(
            MessageRole::Assistant,
            hermes_tool_calls([(item.function.as_str(), &item.arguments)]),
        ));
        let obs = env.execute(&ToolCall::new(&item.function, item.arguments.clone()));
        if obs.is_error {
            return Err(failed(obs.text));
        }
        messages.push(Message::new(MessageRole::Tool, &obs.text).with_tool(&item.function));
        messages.push(Message::new(MessageRole::Assistant, SEED_FINAL_ANSWER));
        Ok(CollectedSeed {
            seed: SeedTrajectory {
                task: task.id.clone(),
                index: 0,
                messages,
                tool_calls: vec![ToolExchange {
                    name: item.function.clone(),
                    arguments_json: pyjson::compact(&Value::Object(item.arguments.clone())),
                    result_json: obs.text,
                }],
            },
            env_calls: 1,
        })
    }

    fn evaluation_judge(&self) -> Arc<dyn Judge> {
        Arc::new(RuleChecklistJudge)
    }
}
