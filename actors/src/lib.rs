//! envace actors: the Engine, Acting, Rehearsal, Environment, Judge, Learner and Memory actors
//! that exchange messages over ractor around one shared model handle.
//!
//! This crate is the home of the actor layer (issue 5); the kernels it hosts live in
//! [`envace_kernels`], the records it persists in [`envace_storage`].

pub use envace_kernels as kernels;
pub use envace_storage as storage;

pub mod acting;
pub mod engine;
pub mod env_actor;
pub mod environment;
pub mod episode;
pub mod judge;
pub mod judge_actor;
pub mod learner;
pub mod memory;
pub mod protocol;
pub mod rehearsal;
pub mod slot;
pub mod supervisor;
pub mod task;
pub mod topology;
pub mod worker;

pub use environment::{EnvTask, Environment, EnvironmentError, Observation, ToolCall};
pub use judge::{ChecklistItem, Judge, JudgeTask, TurnCalls, TurnScore, Verdict};
pub use task::{tool_name, EpisodeTask, Split};
