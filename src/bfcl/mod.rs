//! The BFCL v4 multi-turn environment (Berkeley Function Calling Leaderboard, Apache-2.0),
//! ported from the behaviour recorded in its reference traces.
//!
//! One module per concern: [`value`] (Python values and their exact text), [`parse`] (call
//! strings and JSON calls, never evaluated), [`signature`] (argument binding with CPython's
//! messages), [`pyrandom`] (CPython's Mersenne Twister), [`ops`] (Python operators with their
//! `TypeError`s), [`classes`] (the API classes), [`executor`] (BFCL's executor semantics),
//! [`tasks`] (the four categories with ground truth), [`split`] (the stratified train/test
//! split), [`suite`] (`multi_turn_base` as the pipeline's task suite), [`schema`]
//! (OpenAI tool schemas per task and turn), [`env`](mod@env) (the [`Environment`] implementation),
//! [`checker`] (BFCL's multi-turn verdicts), [`judge`] (the rule-based checklist judge that
//! scores calls against the ground truth without executing them), [`dense`] (the same
//! checklists with partial credit, the training judge of the presets), [`conform`] (comparison
//! with the reference traces).
//!
//! [`Environment`]: envace_actors::environment::Environment
//!
//! ```
//! use envace::bfcl::executor::Executor;
//! let mut exec = Executor::new(&["TicketAPI".into()], &serde_json::json!({}), false).unwrap();
//! let out = exec.execute_str("ticket_login(username='ann', password='pw')");
//! assert_eq!(out.text, r#"{"success": true}"#);
//! ```

pub mod checker;
pub mod classes;
pub mod conform;
pub mod dense;
pub mod env;
pub mod episode;
pub mod error;
pub mod exception;
pub mod executor;
pub mod judge;
pub mod ops;
pub mod parse;
pub mod pyrandom;
pub mod schema;
pub mod signature;
pub mod split;
pub mod suite;
pub mod tasks;
pub mod value;

pub use error::BfclError;
pub use executor::{CallOutcome, Executor, ResultKind};
pub use parse::{parse_json_call, parse_python_call, ParseError, PyCall};
pub use value::{PyDict, PyValue};
