//! Python exceptions as values: what a method "raises", and the message BFCL's executor
//! appends (`Error during execution: <str(e)>`).

use super::value::{str_repr, PyValue};

/// The Python exception types the reference environments raise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExcKind {
    TypeError,
    NameError,
    KeyError,
    ValueError,
    AttributeError,
    IndexError,
    ZeroDivisionError,
    SyntaxError,
    /// A bare `Exception` (the executor's forbidden-name check).
    Exception,
}

impl ExcKind {
    /// The Python type name (`TypeError`, …).
    pub fn name(self) -> &'static str {
        match self {
            ExcKind::TypeError => "TypeError",
            ExcKind::NameError => "NameError",
            ExcKind::KeyError => "KeyError",
            ExcKind::ValueError => "ValueError",
            ExcKind::AttributeError => "AttributeError",
            ExcKind::IndexError => "IndexError",
            ExcKind::ZeroDivisionError => "ZeroDivisionError",
            ExcKind::SyntaxError => "SyntaxError",
            ExcKind::Exception => "Exception",
        }
    }
}

/// A raised Python exception: its type and `str(e)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PyErr {
    pub kind: ExcKind,
    /// `str(e)`; for `KeyError` this is the key's repr, quotes included.
    pub message: String,
}

impl PyErr {
    /// An exception of `kind` with message `message`.
    pub fn new(kind: ExcKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// `TypeError(message)`.
    pub fn type_error(message: impl Into<String>) -> Self {
        Self::new(ExcKind::TypeError, message)
    }

    /// `ValueError(message)`.
    pub fn value_error(message: impl Into<String>) -> Self {
        Self::new(ExcKind::ValueError, message)
    }

    /// `KeyError(key)`: `str()` of it is `repr(key)`.
    pub fn key_error(key: &PyValue) -> Self {
        Self::new(ExcKind::KeyError, key.repr())
    }

    /// `NameError`: `name 'x' is not defined`.
    pub fn name_error(name: &str) -> Self {
        Self::new(
            ExcKind::NameError,
            format!("name {} is not defined", str_repr(name)),
        )
    }

    /// `AttributeError`: `'<type>' object has no attribute '<attr>'`.
    pub fn no_attribute(value: &PyValue, attr: &str) -> Self {
        Self::new(
            ExcKind::AttributeError,
            format!("'{}' object has no attribute '{attr}'", value.type_name()),
        )
    }

    /// The executor's text for this exception: `Error during execution: <str(e)>`.
    pub fn to_result_text(&self) -> String {
        format!("Error during execution: {}", self.message)
    }
}
