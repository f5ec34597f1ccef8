//! envace actors: the Engine, Acting, Rehearsal, Environment, Judge, Learner and Memory actors
//! that exchange messages over ractor around one shared model handle.
//!
//! This crate is the home of the actor layer (issue 5); the kernels it hosts live in
//! [`envace_kernels`], the records it persists in [`envace_storage`].

pub use envace_kernels as kernels;
pub use envace_storage as storage;

pub mod environment;
pub mod judge;

pub use environment::{EnvTask, Environment, EnvironmentError, Observation, ToolCall};
pub use judge::{ChecklistItem, Judge, JudgeTask, TurnCalls, TurnScore, Verdict};
