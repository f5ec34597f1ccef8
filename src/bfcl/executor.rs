//! BFCL's `execute_multi_turn_func_call` without `eval`: name→instance dispatch, forbidden
//! names, `NameError` for unknown names, and the result stringification.
//!
//! Source: the BFCL trace README, "Executor semantics". Results: a `str` is kept; a `dict`
//! is `json.dumps(v)` (default options) or, if that raises, `str(v)`; anything else `str(v)`;
//! an exception `Error during execution: <str(e)>`.

use serde_json::{Map, Value};

use super::classes::{instantiate, ApiClass};
use super::error::BfclError;
use super::exception::{ExcKind, PyErr};
use super::parse::{parse_python_call, ParseError, PyCall};
use super::value::PyValue;

/// Names the reference refuses to evaluate.
pub const FORBIDDEN: &[&str] = &[
    "kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run",
];

/// How a result string was produced (the trace's `result_kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultKind {
    DictJson,
    DictRepr,
    ListRepr,
    NoneRepr,
    Str,
    OtherRepr,
    Error,
}

/// One executed call: the text BFCL appends, the raw value and the exception, if any.
#[derive(Debug, Clone)]
pub struct CallOutcome {
    pub text: String,
    pub kind: ResultKind,
    /// The returned value (`None` when the call raised).
    pub value: Option<PyValue>,
    /// The raised exception, if any.
    pub error: Option<PyErr>,
}

/// The instances of one task, in `involved_classes` order.
#[derive(Clone)]
pub struct Executor {
    instances: Vec<Box<dyn ApiClass>>,
}

impl Executor {
    /// Instantiates and loads `classes` from `initial_config` (the task's field).
    ///
    /// # Errors
    /// [`BfclError::UnsupportedClass`] / [`BfclError::Config`] from the classes.
    pub fn new(
        classes: &[String],
        initial_config: &Value,
        long_context: bool,
    ) -> Result<Self, BfclError> {
        let instances = classes
            .iter()
            .map(|c| instantiate(c, initial_config.get(c), long_context))
            .collect::<Result<_, _>>()?;
        Ok(Self { instances })
    }

    /// Wraps already-built instances.
    pub fn from_instances(instances: Vec<Box<dyn ApiClass>>) -> Self {
        Self { instances }
    }

    /// The instances, in order.
    pub fn instances(&self) -> &[Box<dyn ApiClass>] {
        &self.instances
    }

    /// The class owning `method`, if any instance has it.
    pub fn owner_of(&self, method: &str) -> Option<&'static str> {
        self.instances
            .iter()
            .find(|i| i.method_names().contains(&method))
            .map(|i| i.class_name())
    }

    /// Executes one Python-call string as the reference executor would.
    pub fn execute_str(&mut self, src: &str) -> CallOutcome {
        let head = src.split('(').next().unwrap_or("");
        let head = head.split_once('.').map_or(head, |(_, rest)| rest).trim();
        if FORBIDDEN.contains(&head) {
            return raised(PyErr::new(
                ExcKind::Exception,
                format!("Function call {head} is not allowed."),
            ));
        }
        match parse_python_call(src) {
            Ok(call) => self.execute(call),
            Err(ParseError::Name { name, .. }) => {
                // Python evaluates the callee before the arguments.
                let callee = src.split('(').next().unwrap_or("").trim();
                let first = callee.split('.').next().unwrap_or("").trim();
                if callee.contains('.') || self.owner_of(callee).is_none() {
                    raised(PyErr::name_error(first))
                } else {
                    raised(PyErr::name_error(&name))
                }
            }
            Err(e) => raised(PyErr::new(ExcKind::SyntaxError, e.to_string())),
        }
    }

    /// Executes a parsed call.
    pub fn execute(&mut self, call: PyCall) -> CallOutcome {
        if let Some((first, _)) = call.name.split_once('.') {
            return raised(PyErr::name_error(first));
        }
        if FORBIDDEN.contains(&call.name.as_str()) {
            return raised(PyErr::new(
                ExcKind::Exception,
                format!("Function call {} is not allowed.", call.name),
            ));
        }
        let Some(instance) = self
            .instances
            .iter_mut()
            .find(|i| i.method_names().contains(&call.name.as_str()))
        else {
            return raised(PyErr::name_error(&call.name));
        };
        match instance.call(&call.name, call.args, call.kwargs) {
            Ok(v) => stringify(v),
            Err(e) => raised(e),
        }
    }

    /// The compared state: `{class: {attr: value}}` in instance order (trace encoding).
    pub fn snapshot(&self) -> Value {
        let mut m = Map::new();
        for i in &self.instances {
            m.insert(i.class_name().to_string(), Value::Object(i.snapshot()));
        }
        Value::Object(m)
    }
}

fn raised(e: PyErr) -> CallOutcome {
    CallOutcome {
        text: e.to_result_text(),
        kind: ResultKind::Error,
        value: None,
        error: Some(e),
    }
}

/// The executor's stringification of a returned value.
pub fn stringify(v: PyValue) -> CallOutcome {
    let (text, kind) = match &v {
        PyValue::Str(s) => (s.clone(), ResultKind::Str),
        PyValue::Dict(_) => match v.json_dumps() {
            Ok(t) => (t, ResultKind::DictJson),
            Err(_) => (v.repr(), ResultKind::DictRepr),
        },
        PyValue::List(_) => (v.repr(), ResultKind::ListRepr),
        PyValue::None => (v.repr(), ResultKind::NoneRepr),
        _ => (v.repr(), ResultKind::OtherRepr),
    };
    CallOutcome {
        text,
        kind,
        value: Some(v),
        error: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec() -> Executor {
        Executor::new(
            &["MathAPI".to_string(), "TicketAPI".to_string()],
            &serde_json::json!({}),
            false,
        )
        .expect("classes")
    }

    #[test]
    fn reference_error_strings() {
        let mut e = exec();
        assert_eq!(
            e.execute_str("exit()").text,
            "Error during execution: Function call exit is not allowed."
        );
        assert_eq!(
            e.execute_str("nonexistent_probe_function(x=1)").text,
            "Error during execution: name 'nonexistent_probe_function' is not defined"
        );
        assert_eq!(
            e.execute_str("len('abc')").text,
            "Error during execution: name 'len' is not defined"
        );
        assert_eq!(
            e.execute_str("add(a=x, b=1)").text,
            "Error during execution: name 'x' is not defined"
        );
        assert_eq!(
            e.execute_str("os.remove('a')").text,
            "Error during execution: Function call remove is not allowed."
        );
    }

    #[test]
    fn results_are_stringified_like_bfcl() {
        let mut e = exec();
        assert_eq!(
            e.execute_str("add(a=True, b=1e-07)").text,
            "{\"result\": 1.0000001}"
        );
        assert_eq!(
            e.execute_str("get_user_tickets()").text,
            "[{'error': 'User not authenticated. Please log in to view tickets.'}]"
        );
        let out = e.execute_str("mean()");
        assert_eq!(out.kind, ResultKind::Error);
        assert_eq!(
            out.text,
            "Error during execution: MathAPI.mean() missing 1 required positional argument: 'numbers'"
        );
    }
}
