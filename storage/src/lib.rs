//! envace storage: sled trees for tasks, seed trajectories, rollouts, rehearsal memories, run
//! state and checkpoints (issue 4). It knows bytes and keys, never tensors or actors.
//!
//! * [`records`]: the plain serde records ([`Trajectory`], [`Row`], [`RehearsalMemory`], …).
//! * [`Store`]: one sled directory, a tree per record type ([`TreeName`]); keys sort
//!   run → step → task → sample ([`keys`]); values are bincode 2 behind a versioned, checksummed
//!   header ([`codec`]).
//! * Durability: under the default [`FlushPolicy::EveryWrite`] a write that returns `Ok` is on
//!   disk and survives a crash, `SIGKILL` or power loss, whatever its size: the store also
//!   fsyncs the blob files sled 0.34 leaves unsynced ([`disk`]). The crash test exercises
//!   `SIGKILL`; power loss is argued from what is fsynced. A batch ([`Store::put_many`],
//!   [`Store::commit`]) is all-or-nothing.
//! * Damage stays local: a corrupt record or one from a newer schema is an error naming its tree
//!   and key, a part of a tree sled cannot read is one error naming the keys around it, and
//!   scans go on past both ([`scan`]).
//! * Every commit is first appended to a checksummed journal ([`journal`]); [`repair`]
//!   rebuilds a damaged database from the journal and what sled can still read, and reports
//!   exactly what was lost (nothing when only one of the two is damaged).
//! * Read-only commands use [`Store::open_existing`], which refuses, before sled touches it, a
//!   directory that is not a sound database, then works on a private copy: sled has no
//!   read-only mode and its recovery rewrites the log it opens (it zeroes what follows a
//!   damaged entry), so only the copy is ever opened, and what recovery discarded of it is
//!   reported ([`Store::discarded`]). The database must not be open elsewhere (sled's exclusive
//!   lock: [`Error::Locked`]).
//!
//! ```
//! use envace_storage::{
//!     ExecutionMode, PolicyVersion, Prefix, Role, Row, SampleKey, Store, StoreOptions,
//!     Termination, Timings, Trajectory,
//! };
//! # fn main() -> Result<(), envace_storage::Error> {
//! # let dir = std::env::temp_dir().join(format!("envace-doc-{}", std::process::id()));
//! let store = Store::open(&dir, StoreOptions::default())?;
//! let trajectory = Trajectory {
//!     run: "demo".into(), step: 3, task: "multi_turn_base_0".into(), sample: 1,
//!     mode: ExecutionMode::Rehearsal,
//!     rows: vec![Row { role: Role::Act, prompt_ids: vec![1, 2, 3], completion_ids: vec![4, 5],
//!                      logprobs: vec![-0.1, -0.7], policy_version: PolicyVersion(3) }],
//!     messages: vec![], reward: 0.5, verdicts: vec![],
//!     termination: Termination::Completed, timings: Timings::default(),
//! };
//! let key = store.put(&trajectory)?; // on disk when this returns
//! assert_eq!(key.to_string(), "demo/3/multi_turn_base_0/1");
//! for item in store.scan::<Trajectory>(&SampleKey::step_prefix(&"demo".into(), 3)) {
//!     let (key, t) = item?;
//!     println!("{key}: reward {}", t.reward);
//! }
//! # drop(store); std::fs::remove_dir_all(&dir).ok();
//! # Ok(()) }
//! ```
pub mod codec;
pub mod disk;
pub mod error;
pub mod journal;
pub mod keys;
pub mod records;
pub mod repair;
pub mod scan;
pub mod schema;
pub mod store;

pub use codec::{HEADER_LEN, MAGIC, SCHEMA_VERSION};
pub use disk::SEGMENT_SIZE;
pub use error::{Damage, Error, KeyError, Result};
pub use keys::{CheckpointKey, Prefix, RecordKey, SampleKey, SeedKey};
pub use records::{
    Checkpoint, ExecutionMode, Message, MessageRole, PolicyVersion, RehearsalMemory, RehearsalMode,
    Role, Row, RunId, RunState, SeedTrajectory, Task, TaskId, Termination, Timings, ToolExchange,
    Trajectory, TurnVerdict,
};
pub use repair::{rebuild, repair_in_place, JournalState, Lost, RepairReport, SledState};
pub use scan::{Keys, Scan};
pub use schema::{Record, TreeName};
pub use store::{Discarded, FlushPolicy, Store, StoreOptions, WriteSet};
