//! [`BfclEnv`]: a BFCL multi-turn task as an [`Environment`].
//!
//! `reset` instantiates the task's `involved_classes` from its `initial_config` through the
//! class registry ([`super::classes::instantiate`]; a class that is not ported yet makes
//! `reset` fail with [`EnvironmentError::Unsupported`] naming it), `begin_turn` updates the
//! tool list for miss-func tasks, `execute` runs one [`ToolCall`] through the [`Executor`]
//! with BFCL's result text, and `snapshot` is the compared state,
//! `{class: {attribute: value}}` in the trace value encoding.
//!
//! As in BFCL, the tool list only shapes what the model is told: execution always exposes
//! every method of the involved classes, so an excluded or not-yet-offered function still runs
//! when called by name (BFCL's executor does the same), and any other name gets the reference's
//! `NameError` text.
//!
//! ```no_run
//! use envace::actors::environment::{Environment, ToolCall};
//! use envace::bfcl::env::BfclEnv;
//! use envace::bfcl::tasks::{load_installed, Category};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let tasks = load_installed(Category::Base)?;
//! let task = tasks.iter().find(|t| t.involved_classes.iter().any(|c| c == "TicketAPI")).unwrap();
//! let mut env = BfclEnv::from_installed()?;
//! env.reset(&task.to_env_task())?;
//! env.begin_turn(0);
//! let call: ToolCall = serde_json::from_str(
//!     r#"{"name": "ticket_login", "arguments": {"username": "ann", "password": "pw"}}"#)?;
//! assert_eq!(env.execute(&call).text, r#"{"success": true}"#);
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;

use envace_actors::environment::{EnvTask, Environment, EnvironmentError, Observation, ToolCall};
use serde_json::{Map, Value};

use super::error::BfclError;
use super::executor::{CallOutcome, Executor, ResultKind};
use super::parse::{parse_python_call, ParseError, PyCall};
use super::schema::FuncDocs;
use super::tasks::TaskSpec;
use super::value::PyValue;

/// The BFCL multi-turn environment (one task at a time).
pub struct BfclEnv {
    docs: Arc<FuncDocs>,
    active: Option<Active>,
}

struct Active {
    spec: TaskSpec,
    missed: BTreeMap<usize, Vec<String>>,
    executor: Executor,
    tools: Vec<Value>,
}

impl BfclEnv {
    /// An environment offering tools from `docs` (share one [`FuncDocs`] between many
    /// environments).
    pub fn new(docs: Arc<FuncDocs>) -> Self {
        Self { docs, active: None }
    }

    /// An environment over the installed function docs.
    ///
    /// # Errors
    /// As [`FuncDocs::load_installed`].
    pub fn from_installed() -> Result<Self, BfclError> {
        Ok(Self::new(Arc::new(FuncDocs::load_installed()?)))
    }

    /// The executor of the current task (`None` before the first successful `reset`).
    pub fn executor(&self) -> Option<&Executor> {
        self.active.as_ref().map(|a| &a.executor)
    }

    /// The current task's specification.
    pub fn spec(&self) -> Option<&TaskSpec> {
        self.active.as_ref().map(|a| &a.spec)
    }

    /// Executes one BFCL Python-call string (`cd(folder='document')`) exactly as BFCL's
    /// executor would, forbidden names and `NameError`s included.
    pub fn execute_str(&mut self, src: &str) -> Observation {
        match &mut self.active {
            Some(a) => observation(a.executor.execute_str(src)),
            None => no_task(),
        }
    }

    fn tools_at(
        &self,
        spec: &TaskSpec,
        missed: &BTreeMap<usize, Vec<String>>,
        turn: usize,
    ) -> Result<Vec<Value>, BfclError> {
        self.docs.task_tools(
            &spec.involved_classes,
            &spec.excluded_function,
            missed,
            turn,
        )
    }
}

impl Environment for BfclEnv {
    fn tools(&self) -> Vec<Value> {
        self.active
            .as_ref()
            .map(|a| a.tools.clone())
            .unwrap_or_default()
    }

    fn reset(&mut self, task: &EnvTask) -> Result<(), EnvironmentError> {
        self.active = None;
        let invalid = |reason: String| EnvironmentError::InvalidTask {
            id: task.id.clone(),
            reason,
        };
        let spec: TaskSpec =
            serde_json::from_value(task.spec.clone()).map_err(|e| invalid(e.to_string()))?;
        if spec.id != task.id {
            return Err(invalid(format!(
                "spec id {} differs from the task id",
                spec.id
            )));
        }
        let missed = spec.missed_by_turn().map_err(invalid)?;
        let unsupported = |e: BfclError| match e {
            BfclError::UnsupportedClass(_) | BfclError::NoFuncDoc(_) => {
                EnvironmentError::Unsupported {
                    id: task.id.clone(),
                    reason: e.to_string(),
                }
            }
            other => invalid(other.to_string()),
        };
        let tools = self.tools_at(&spec, &missed, 0).map_err(unsupported)?;
        let executor = Executor::new(
            &spec.involved_classes,
            &spec.initial_config,
            spec.long_context(),
        )
        .map_err(unsupported)?;
        self.active = Some(Active {
            spec,
            missed,
            executor,
            tools,
        });
        Ok(())
    }

    fn begin_turn(&mut self, turn: usize) {
        let Some(a) = &self.active else { return };
        if let Ok(tools) = self.tools_at(&a.spec, &a.missed, turn) {
            if let Some(a) = &mut self.active {
                a.tools = tools;
            }
        }
    }

    fn execute(&mut self, call: &ToolCall) -> Observation {
        match &mut self.active {
            Some(a) => observation(a.executor.execute(to_py_call(call))),
            None => no_task(),
        }
    }

    fn snapshot(&self) -> Value {
        self.active
            .as_ref()
            .map_or(Value::Null, |a| a.executor.snapshot())
    }
}

fn no_task() -> Observation {
    Observation {
        value: Value::Null,
        text: "Error during execution: no BFCL task is active (call reset first)".into(),
        is_error: true,
    }
}

/// The observation of an executed call: BFCL's result text, the returned value in the trace
/// encoding (`null` when the call raised), `is_error` only for raised exceptions (soft errors
/// such as `{"error": …}` results are ordinary results, as in BFCL).
pub fn observation(out: CallOutcome) -> Observation {
    Observation {
        value: out.value.as_ref().map_or(Value::Null, PyValue::to_encoded),
        is_error: out.kind == ResultKind::Error,
        text: out.text,
    }
}

/// A [`ToolCall`] as the executor's call: JSON arguments become Python values as
/// `json.loads` would make them (objects → `dict`, integral numbers → `int`).
pub fn to_py_call(call: &ToolCall) -> PyCall {
    PyCall {
        name: call.name.clone(),
        args: call.positional.iter().map(PyValue::from_json).collect(),
        kwargs: call
            .arguments
            .iter()
            .map(|(k, v)| (k.clone(), PyValue::from_json(v)))
            .collect(),
    }
}

/// Parses a BFCL Python-call string (a ground-truth call) into a [`ToolCall`].
///
/// # Errors
/// [`ParseError`] when the string does not parse, or
/// [`ParseError::Unsupported`] when an argument has no JSON form (a dict with non-`str` keys,
/// a set, a non-finite float).
pub fn tool_call_from_python(src: &str) -> Result<ToolCall, ParseError> {
    let call = parse_python_call(src)?;
    let convert = |v: &PyValue| {
        py_to_json(v).ok_or_else(|| ParseError::Unsupported {
            offset: 0,
            what: format!("argument {} has no JSON form", v.repr()),
        })
    };
    let positional = call.args.iter().map(convert).collect::<Result<_, _>>()?;
    let arguments = call
        .kwargs
        .iter()
        .map(|(k, v)| convert(v).map(|v| (k.clone(), v)))
        .collect::<Result<Map<_, _>, _>>()?;
    Ok(ToolCall {
        name: call.name,
        positional,
        arguments,
    })
}

/// Plain JSON for a literal value (`None` when JSON cannot carry it faithfully; tuples become
/// arrays).
fn py_to_json(v: &PyValue) -> Option<Value> {
    Some(match v {
        PyValue::None => Value::Null,
        PyValue::Bool(b) => Value::Bool(*b),
        PyValue::Int(i) => Value::from(*i),
        PyValue::Float(f) => Value::Number(serde_json::Number::from_f64(*f)?),
        PyValue::Str(s) => Value::String(s.clone()),
        PyValue::List(items) | PyValue::Tuple(items) => {
            Value::Array(items.iter().map(py_to_json).collect::<Option<_>>()?)
        }
        PyValue::Dict(d) => Value::Object(
            d.iter()
                .map(|(k, v)| Some((k.as_str()?.to_string(), py_to_json(v)?)))
                .collect::<Option<_>>()?,
        ),
        PyValue::Set(_) | PyValue::Opaque { .. } => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bfcl::tasks::{load_installed, Category};

    fn env() -> BfclEnv {
        BfclEnv::from_installed().expect("installed by `make setup`")
    }

    #[test]
    fn python_calls_convert_to_tool_calls() {
        let c = tool_call_from_python("sort('final_report.pdf')").unwrap();
        assert_eq!(c.name, "sort");
        assert_eq!(c.positional, vec![Value::from("final_report.pdf")]);
        let c = tool_call_from_python(
            "lockDoors(unlock=True, door=['driver', 'passenger'], speed=1.0, n=None)",
        )
        .unwrap();
        assert_eq!(
            Value::Object(c.arguments),
            serde_json::json!({"unlock": true, "door": ["driver", "passenger"], "speed": 1.0, "n": null})
        );
        assert!(tool_call_from_python("f(x={1: 2})").is_err());
        assert!(tool_call_from_python("f(").is_err());
    }

    #[test]
    fn runs_a_ticket_task_through_json_calls() {
        let task = crate::bfcl::tasks::synthetic_task();
        let mut env = env();
        let before = env.execute(&ToolCall::new("ticket_login", Map::new()));
        assert!(before.is_error);
        env.reset(&task.to_env_task()).unwrap();
        let names: Vec<String> = env
            .tools()
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap().to_string())
            .collect();
        assert!(names.contains(&"create_ticket".to_string()));
        assert!(names.contains(&"add".to_string()));
        assert!(!names.contains(&"logout".to_string()), "excluded");
        let login: ToolCall = serde_json::from_str(
            r#"{"name": "ticket_login", "arguments": {"username": "ann", "password": "pw"}}"#,
        )
        .unwrap();
        let obs = env.execute(&login);
        assert_eq!(obs.text, r#"{"success": true}"#);
        assert_eq!(obs.value, serde_json::json!({"success": true}));
        assert!(!obs.is_error);
        assert_eq!(env.snapshot()["TicketAPI"]["current_user"], "ann");
        let missing = env.execute(&ToolCall::new("create_ticket", Map::new()));
        assert!(missing.is_error);
        assert_eq!(
            missing.text,
            "Error during execution: TicketAPI.create_ticket() missing 1 required positional argument: 'title'"
        );
        let unknown = env.execute(&ToolCall::new("cd", Map::new()));
        assert_eq!(
            unknown.text,
            "Error during execution: name 'cd' is not defined"
        );
        // Reset starts over.
        env.reset(&task.to_env_task()).unwrap();
        assert_eq!(env.snapshot()["TicketAPI"]["current_user"], Value::Null);
    }

    #[test]
    fn unported_classes_are_named_and_miss_func_tools_grow() {
        let mf = load_installed(Category::MissFunc).unwrap();
        let mut env = env();
        for task in &mf {
            let res = env.reset(&task.to_env_task());
            match res {
                Err(EnvironmentError::Unsupported { id, reason }) => {
                    assert_eq!(id, task.id);
                    assert!(reason.contains("is not implemented"), "{reason}");
                    assert!(
                        task.involved_classes
                            .iter()
                            .any(|c| reason.contains(c.as_str())),
                        "{reason}"
                    );
                    assert!(env.tools().is_empty());
                }
                Err(e) => panic!("{e}"),
                Ok(()) => {
                    let (&turn, missed) = task.missed_functions.iter().next().unwrap();
                    let has = |env: &BfclEnv| {
                        env.tools()
                            .iter()
                            .any(|t| t["function"]["name"] == missed[0].as_str())
                    };
                    assert!(!has(&env));
                    env.begin_turn(turn - 1);
                    assert!(!has(&env));
                    env.begin_turn(turn);
                    assert!(has(&env));
                }
            }
        }
        let bad = EnvTask {
            id: "x".into(),
            spec: serde_json::json!({"id": "x"}),
        };
        assert!(matches!(
            env.reset(&bad),
            Err(EnvironmentError::InvalidTask { .. })
        ));
    }
}
