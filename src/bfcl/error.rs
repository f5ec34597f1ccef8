//! Errors of the BFCL environment (loading data, decoding values, unsupported classes).
//!
//! Errors a *call* raises are not here: they are observations (see
//! [`super::exception::PyErr`] and [`super::parse::ParseError`]).

use std::path::PathBuf;

/// Why BFCL data could not be loaded or a task could not be started.
#[derive(Debug, thiserror::Error)]
pub enum BfclError {
    /// A data file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A JSON line of a data file did not parse or lacks a field.
    #[error("{path} line {line}: {reason}")]
    Data {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    /// A value in the trace encoding is malformed.
    #[error("value encoding: {0}")]
    Encoding(String),
    /// The task names an API class this port does not implement (yet).
    #[error("API class {0} is not implemented")]
    UnsupportedClass(String),
    /// A class's initial configuration holds a value of the wrong shape.
    #[error("{class}: invalid initial configuration: {reason}")]
    Config { class: String, reason: String },
    /// No function docs are known for this class (it is not one of BFCL's eight).
    #[error("no BFCL function docs for class {0}")]
    NoFuncDoc(String),
    /// A category name that is not one of the four multi-turn categories.
    #[error("unknown BFCL multi-turn category {0:?} (base, miss_param, miss_func, long_context)")]
    UnknownCategory(String),
}
