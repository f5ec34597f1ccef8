//! The BFCL multi-turn API classes, one module each, behind one trait.
//!
//! Each class keeps its compared (public) state as Python values and exposes it in `vars()`
//! order through [`ApiClass::snapshot`]; private state (`_random`, …) stays in the struct and
//! out of the snapshot, as BFCL's state checker skips names starting with `_`.

mod long_context;
mod math_api;
mod message_api;
mod posting_api;
mod ticket_api;
mod vehicle_control;

pub use math_api::MathApi;
pub use message_api::MessageApi;
pub use posting_api::TwitterApi;
pub use ticket_api::TicketApi;
pub use vehicle_control::VehicleControlApi;

use serde_json::{Map, Value};

use super::error::BfclError;
use super::exception::PyErr;
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

impl Clone for Box<dyn ApiClass> {
    fn clone(&self) -> Self {
        self.box_clone()
    }
}

/// Class names this port implements, in the order of the BFCL docs.
pub const IMPLEMENTED: &[&str] = &[
    "MathAPI",
    "MessageAPI",
    "TwitterAPI",
    "TicketAPI",
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
        "MathAPI" => Box::new(MathApi),
        "MessageAPI" => Box::new(MessageApi::load(&config)?),
        "TwitterAPI" => Box::new(TwitterApi::load(&config)?),
        "TicketAPI" => Box::new(TicketApi::load(&config)),
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
