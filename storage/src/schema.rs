//! Which record lives in which tree under which key.
use std::fmt;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::keys::{CheckpointKey, RecordKey, SampleKey, SeedKey};
use crate::records::{
    Checkpoint, RehearsalMemory, RunId, RunState, SeedTrajectory, Task, TaskId, Trajectory,
};

/// The named sled trees of an envace database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TreeName {
    /// [`Task`] by [`TaskId`].
    Tasks,
    /// [`SeedTrajectory`] by [`SeedKey`].
    Seeds,
    /// [`Trajectory`] by [`SampleKey`].
    Rollouts,
    /// [`RehearsalMemory`] by [`SampleKey`].
    Memories,
    /// [`RunState`] by [`RunId`].
    Runs,
    /// [`Checkpoint`] by [`CheckpointKey`].
    Checkpoints,
}

impl TreeName {
    /// Every tree, in display order.
    pub const ALL: [TreeName; 6] = [
        TreeName::Tasks,
        TreeName::Seeds,
        TreeName::Rollouts,
        TreeName::Memories,
        TreeName::Runs,
        TreeName::Checkpoints,
    ];

    /// Trees whose keys start with a run id.
    pub const RUN_SCOPED: [TreeName; 4] = [
        TreeName::Rollouts,
        TreeName::Memories,
        TreeName::Runs,
        TreeName::Checkpoints,
    ];

    /// The tree's name in sled (and in messages).
    pub fn as_str(self) -> &'static str {
        match self {
            TreeName::Tasks => "tasks",
            TreeName::Seeds => "seeds",
            TreeName::Rollouts => "rollouts",
            TreeName::Memories => "memories",
            TreeName::Runs => "runs",
            TreeName::Checkpoints => "checkpoints",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for TreeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A record type the store persists: its tree and how its key derives from its fields (so a
/// record can never be filed under another record's key).
pub trait Record: Serialize + DeserializeOwned {
    /// The tree it lives in.
    const TREE: TreeName;
    /// Its key type.
    type Key: RecordKey;
    /// The key this record is stored under.
    fn key(&self) -> Self::Key;
}

impl Record for Task {
    const TREE: TreeName = TreeName::Tasks;
    type Key = TaskId;
    fn key(&self) -> TaskId {
        self.id.clone()
    }
}

impl Record for SeedTrajectory {
    const TREE: TreeName = TreeName::Seeds;
    type Key = SeedKey;
    fn key(&self) -> SeedKey {
        SeedKey {
            task: self.task.clone(),
            index: self.index,
        }
    }
}

impl Record for Trajectory {
    const TREE: TreeName = TreeName::Rollouts;
    type Key = SampleKey;
    fn key(&self) -> SampleKey {
        SampleKey {
            run: self.run.clone(),
            step: self.step,
            task: self.task.clone(),
            sample: self.sample,
        }
    }
}

impl Record for RehearsalMemory {
    const TREE: TreeName = TreeName::Memories;
    type Key = SampleKey;
    fn key(&self) -> SampleKey {
        SampleKey {
            run: self.run.clone(),
            step: self.step,
            task: self.task.clone(),
            sample: self.sample,
        }
    }
}

impl Record for RunState {
    const TREE: TreeName = TreeName::Runs;
    type Key = RunId;
    fn key(&self) -> RunId {
        self.run.clone()
    }
}

impl Record for Checkpoint {
    const TREE: TreeName = TreeName::Checkpoints;
    type Key = CheckpointKey;
    fn key(&self) -> CheckpointKey {
        CheckpointKey {
            run: self.run.clone(),
            step: self.step,
        }
    }
}
