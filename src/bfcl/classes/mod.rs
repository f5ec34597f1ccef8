//! The BFCL multi-turn API classes, one module each, behind one trait.
//!
//! Each class keeps its compared (public) state as Python values and exposes it in `vars()`
//! order through [`ApiClass::snapshot`]; private state (`_random`, …) stays in the struct and
//! out of the snapshot, as BFCL's state checker skips names starting with `_`.

mod gorilla_file_system;
mod long_context;
mod math_api;
mod message_api;
mod posting_api;
mod ticket_api;
mod trading_bot;
mod travel_booking;
mod vehicle_control;

pub use gorilla_file_system::GorillaFileSystem;
pub use math_api::MathApi;
pub use message_api::MessageApi;
pub use posting_api::TwitterApi;
pub use ticket_api::TicketApi;
pub use trading_bot::TradingBot;
pub use travel_booking::TravelApi;
pub use vehicle_control::VehicleControlApi;

use serde_json::{Map, Value};

use super::error::BfclError;
use super::exception::PyErr;
use super::signature::{bind, Bound, Param};
use super::value::{PyDict, PyValue};

/// One BFCL API class instance.
pub trait ApiClass: Send {
    /// The Python class name (`TicketAPI`).
    fn class_name(&self) -> &'static str;
    /// Its public method names (the tools it contributes).
    fn method_names(&self) -> &'static [&'static str];
    /// Calls `method` with positional and keyword arguments, as the bound Python method would.
    ///
    /// # Errors
    /// The Python exception the reference raises (argument `TypeError`s, `KeyError`s, …).
    fn call(
        &mut self,
        method: &str,
        args: Vec<PyValue>,
        kwargs: Vec<(String, PyValue)>,
    ) -> Result<PyValue, PyErr>;
    /// The compared attributes in `vars()` order, in the trace value encoding.
    fn snapshot(&self) -> Map<String, Value>;
    /// A deep copy (`copy.deepcopy`, random state included).
    fn box_clone(&self) -> Box<dyn ApiClass>;
}

/// What one class of the port defines: its name, methods, signatures, the call of a bound
/// method and its compared state. Every `PythonClass` is an [`ApiClass`]: arguments are bound
/// to the signature as Python binds them ([`bind`], with its `TypeError`s) before
/// [`PythonClass::call_bound`] runs.
pub trait PythonClass: Clone + Send + 'static {
    /// The Python class name (`TicketAPI`).
    const CLASS: &'static str;
    /// Its public method names (the tools it contributes).
    const METHODS: &'static [&'static str];
    /// The signature of `method` (empty for a name outside [`PythonClass::METHODS`]).
    fn params(method: &str) -> &'static [Param];
    /// Runs `method` on arguments already bound to its signature.
    ///
    /// # Errors
    /// The Python exception the reference raises.
    fn call_bound(&mut self, method: &str, bound: Bound) -> Result<PyValue, PyErr>;
    /// The compared attributes in `vars()` order, in the trace value encoding
    /// ([`ApiClass::snapshot`]).
    fn vars(&self) -> Map<String, Value>;
}

impl<T: PythonClass> ApiClass for T {
    fn class_name(&self) -> &'static str {
        T::CLASS
    }

    fn method_names(&self) -> &'static [&'static str] {
        T::METHODS
    }

    fn call(
        &mut self,
        method: &str,
        args: Vec<PyValue>,
        kwargs: Vec<(String, PyValue)>,
    ) -> Result<PyValue, PyErr> {
        let bound = bind(T::CLASS, method, T::params(method), args, kwargs)?;
        self.call_bound(method, bound)
    }

    fn snapshot(&self) -> Map<String, Value> {
        self.vars()
    }

    fn box_clone(&self) -> Box<dyn ApiClass> {
        Box::new(self.clone())
    }
}

impl Clone for Box<dyn ApiClass> {
    fn clone(&self) -> Self {
        self.box_clone()
    }
}

/// Class names this port implements, in the order of the BFCL docs.
pub const IMPLEMENTED: &[&str] = &[
    "GorillaFileSystem",
    "MathAPI",
    "MessageAPI",
    "TwitterAPI",
    "TicketAPI",
    "TradingBot",
    "TravelAPI",
    "VehicleControlAPI",
];

/// All eight BFCL multi-turn class names.
pub const ALL_CLASSES: &[&str] = &[
    "GorillaFileSystem",
    "MathAPI",
    "MessageAPI",
    "TwitterAPI",
    "TicketAPI",
    "TradingBot",
    "TravelAPI",
    "VehicleControlAPI",
];

/// Instantiates `class` and loads its scenario from `config` (the task's
/// `initial_config[class]`, plain JSON; missing keys take the class's defaults), as
/// `cls()._load_scenario(deepcopy(config), long_context=…)` does.
///
/// # Errors
/// [`BfclError::UnsupportedClass`] for a class this port lacks; [`BfclError::Config`] for a
/// malformed configuration.
pub fn instantiate(
    class: &str,
    config: Option<&Value>,
    long_context: bool,
) -> Result<Box<dyn ApiClass>, BfclError> {
    let config = match config.map(PyValue::from_json) {
        None => PyDict::new(),
        Some(PyValue::Dict(d)) => d,
        Some(other) => {
            return Err(BfclError::Config {
                class: class.to_string(),
                reason: format!("expected an object, got {}", other.type_name()),
            })
        }
    };
    Ok(match class {
        "GorillaFileSystem" => Box::new(GorillaFileSystem::load(&config, long_context)?),
        "MathAPI" => Box::new(MathApi),
        "MessageAPI" => Box::new(MessageApi::load(&config)?),
        "TwitterAPI" => Box::new(TwitterApi::load(&config)?),
        "TicketAPI" => Box::new(TicketApi::load(&config)),
        "TradingBot" => Box::new(TradingBot::load(&config, long_context)),
        "TravelAPI" => Box::new(TravelApi::load(&config, long_context)),
        "VehicleControlAPI" => Box::new(VehicleControlApi::load(&config, long_context)),
        other => return Err(BfclError::UnsupportedClass(other.to_string())),
    })
}

/// `config.get(key, default)`.
pub(crate) fn cfg(config: &PyDict, key: &str, default: PyValue) -> PyValue {
    config.get_str(key).cloned().unwrap_or(default)
}

/// Builds a snapshot map from `(attribute, value)` pairs.
pub(crate) fn snapshot_of(attrs: &[(&str, &PyValue)]) -> Map<String, Value> {
    attrs
        .iter()
        .map(|(k, v)| ((*k).to_string(), v.to_encoded()))
        .collect()
}

/// `{"error": message}`, the soft-error result of most methods.
pub(crate) fn error_dict(message: impl Into<String>) -> PyValue {
    PyValue::dict([("error", PyValue::Str(message.into()))])
}

/// `datetime.strptime(s, "%Y-%m-%d")` as `(year, month, day)`, with CPython's messages.
///
/// # Errors
/// `ValueError: time data '…' does not match format '%Y-%m-%d'` (or `day is out of range for
/// month`); `TypeError` for a non-string.
pub(crate) fn strptime_ymd(s: &PyValue) -> Result<(i64, i64, i64), PyErr> {
    let text = match s {
        PyValue::Str(t) => t.as_str(),
        other => {
            return Err(PyErr::type_error(format!(
                "strptime() argument 1 must be str, not {}",
                other.type_name()
            )))
        }
    };
    let bad = || {
        PyErr::value_error(format!(
            "time data {} does not match format '%Y-%m-%d'",
            s.repr()
        ))
    };
    let parts: Vec<&str> = text.split('-').collect();
    let [y, m, d] = parts.as_slice() else {
        return Err(bad());
    };
    let num = |p: &str, min_len: usize, max_len: usize| -> Option<i64> {
        (p.len() >= min_len && p.len() <= max_len && p.bytes().all(|b| b.is_ascii_digit()))
            .then(|| p.parse().ok())
            .flatten()
    };
    let (Some(y), Some(m), Some(d)) = (num(y, 4, 4), num(m, 1, 2), num(d, 1, 2)) else {
        return Err(bad());
    };
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return Err(bad());
    }
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let days = match m {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    if d > days {
        return Err(PyErr::value_error("day is out of range for month"));
    }
    Ok((y, m, d))
}
