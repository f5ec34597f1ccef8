//! The run's control history (`DIR/control.json`): what changed while a training run went on —
//! the judge swapped (`envace ctl judge NAME`) and task batches added (`envace ctl add-tasks
//! FILE`, copied to `DIR/added-tasks/`) — each with the step from which it is in force.
//!
//! Training reads it at every step boundary, and a resumed run replays it: the judge of step
//! `s` is the last change with `step <= s` (the config's `judge` before any), and a batch
//! joins the train pool at its step, the draw cursor jumping to its first task so the new
//! tasks are drawn first. A run resumed from an older checkpoint therefore meets the same
//! changes at the same steps as the uninterrupted run. A change is written (atomically, fsynced)
//! before `ctl` is told it was accepted, so an acknowledged change survives a SIGKILL.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::actors::task::EpisodeTask;
use crate::storage::SeedTrajectory;

/// The history file in a run folder.
pub const HISTORY_FILE: &str = "control.json";
/// Where added task batches are copied, one JSON-lines file each.
pub const ADDED_TASKS_DIR: &str = "added-tasks";
/// The largest add-tasks file read, bytes.
pub const MAX_TASK_FILE_BYTES: u64 = 256 << 20;

/// Every change of a run, in the order they were made.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ControlHistory {
    pub judges: Vec<JudgeChange>,
    pub task_batches: Vec<TaskBatch>,
}

/// The judge `judge` (a registry name) is in force from training step `step` (0-based).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JudgeChange {
    pub step: u64,
    pub judge: String,
    /// When it was asked for, seconds since the Unix epoch.
    pub requested_unix_s: u64,
}

/// A batch of tasks that joins the train pool at training step `step`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskBatch {
    pub step: u64,
    /// The batch's copy, relative to the run folder (`added-tasks/0001.jsonl`).
    pub file: PathBuf,
    /// Tasks in it, and how many of them came with a seed trajectory.
    pub tasks: u64,
    pub seeds: u64,
    pub requested_unix_s: u64,
}

/// One line of an add-tasks file: a task in [`EpisodeTask`]'s JSON form and, optionally, a
/// seed trajectory with real observations (its few-shot facts feed every later rollout).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddedTask {
    pub task: EpisodeTask,
    #[serde(default)]
    pub seed: Option<SeedTrajectory>,
}

impl ControlHistory {
    /// The history of the run in `dir` (empty when it has none).
    ///
    /// # Errors
    /// The file exists but cannot be read or is not a history (the message names it).
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join(HISTORY_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text)
                .with_context(|| format!("{} is not a control history", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// Writes the history to `dir` durably and atomically.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let path = dir.join(HISTORY_FILE);
        let text = serde_json::to_string_pretty(self)?;
        crate::kernels::model::write_atomically(&path, |tmp| {
            std::fs::write(tmp, &text).map_err(|source| crate::kernels::Error::Io {
                path: tmp.to_path_buf(),
                source,
            })
        })
        .with_context(|| format!("writing {}", path.display()))
    }

    /// The judge in force at step `step`: the last change at or before it.
    pub fn judge_at(&self, step: u64) -> Option<&JudgeChange> {
        // The latest step at or before `step`; of changes at the same step, the last made.
        self.judges
            .iter()
            .enumerate()
            .filter(|(_, j)| j.step <= step)
            .max_by_key(|(i, j)| (j.step, *i))
            .map(|(_, j)| j)
    }
}

/// Reads and checks an add-tasks file: one [`AddedTask`] per non-empty line; every task id
/// distinct, not among `known` (the pool's ids), and every seed naming its line's task.
///
/// # Errors
/// The file is not a regular file of at most [`MAX_TASK_FILE_BYTES`] or cannot be read, a
/// line is not an [`AddedTask`] (the message gives the line number), a task has no user
/// turn, an id repeats or is already taken, or a seed names another task. Nothing is added on
/// an error.
pub fn read_added_tasks(path: &Path, known: &[&str]) -> Result<Vec<AddedTask>> {
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    if !meta.is_file() {
        bail!("{}: not a regular file", path.display());
    }
    if meta.len() > MAX_TASK_FILE_BYTES {
        bail!(
            "{}: {} bytes, more than the {} MB an add-tasks file may have",
            path.display(),
            meta.len(),
            MAX_TASK_FILE_BYTES >> 20
        );
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out: Vec<AddedTask> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let t: AddedTask = serde_json::from_str(line).with_context(|| {
            format!(
                "{} line {}: not a task line ({{\"task\": {{...}}, \"seed\": {{...}}}})",
                path.display(),
                i + 1
            )
        })?;
        let id = t.task.id.0.as_str();
        if known.contains(&id) || out.iter().any(|o| o.task.id == t.task.id) {
            bail!(
                "{} line {}: task id {id} is taken (by the suite's tasks or an added one)",
                path.display(),
                i + 1
            );
        }
        if t.task.user_turns.is_empty() {
            bail!(
                "{} line {}: task {id} has no user turn",
                path.display(),
                i + 1
            );
        }
        if let Some(seed) = &t.seed {
            if seed.task != t.task.id {
                bail!(
                    "{} line {}: the seed is of task {}, not {id}",
                    path.display(),
                    i + 1,
                    seed.task.0
                );
            }
        }
        out.push(t);
    }
    if out.is_empty() {
        bail!("{}: no task in it", path.display());
    }
    Ok(out)
}

/// What a training loop shares with `envace ctl` and the metrics: the run's history (the ctl
/// server appends to it) and where the run stands. One lock orders a change against the step
/// boundaries, so a change asked for while step `s` runs is in force from `s + 1`, exactly.
pub struct Control {
    dir: PathBuf,
    inner: Mutex<Inner>,
}

struct Inner {
    history: ControlHistory,
    status: RunStatus,
    /// Task ids of the suite and of every batch added.
    task_ids: Vec<String>,
    /// The loop has resumed and set the step: changes can be placed at a step.
    ready: bool,
}

/// Where a training run stands (`envace ctl status`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunStatus {
    pub pid: u32,
    pub started_unix_s: u64,
    /// The step being played now (0-based), if one is.
    pub step_in_flight: Option<u64>,
    /// Steps done (committed or not) and steps committed with a checkpoint.
    pub steps_done: u64,
    pub committed_steps: u64,
    pub policy_version: u64,
    pub judge: String,
    pub train_tasks: usize,
    /// The last step's numbers: mean reward per role, informative groups of groups drawn,
    /// tokens per second, whether it was skipped.
    #[serde(deserialize_with = "crate::report::f64_nan_if_null")]
    pub reward_act: f64,
    #[serde(deserialize_with = "crate::report::f64_nan_if_null")]
    pub reward_rehearse: f64,
    pub informative_groups: u64,
    pub groups: u64,
    #[serde(deserialize_with = "crate::report::f64_nan_if_null")]
    pub tokens_per_s: f64,
    pub skipped: bool,
    /// The last periodic evaluation: after how many steps, and its checklist score (0–1).
    pub last_eval: Option<(u64, f64)>,
    /// The last checkpoint: its step, when it was written (Unix s), bytes and write seconds.
    pub checkpoint_step: Option<u64>,
    pub checkpoint_unix_s: u64,
    pub checkpoint_bytes: u64,
    #[serde(deserialize_with = "crate::report::f64_nan_if_null")]
    pub checkpoint_write_s: f64,
    /// Bytes of the run folder's checkpoints and database.
    pub disk_bytes: u64,
    /// A stop was asked for: the step in flight finishes, a checkpoint is written.
    pub stopping: bool,
}

impl Control {
    /// The control of the run in `dir`, its history loaded; `task_ids` are the suite's (train
    /// and test: an added task may not reuse one), to which the ids of the batches already
    /// added are joined.
    ///
    /// # Errors
    /// As [`ControlHistory::load`].
    pub fn open(dir: &Path, judge: &str, mut task_ids: Vec<String>) -> Result<Arc<Self>> {
        let history = ControlHistory::load(dir)?;
        for batch in &history.task_batches {
            let added = read_added_tasks(&dir.join(&batch.file), &[])?;
            task_ids.extend(added.into_iter().map(|t| t.task.id.0));
        }
        let status = RunStatus {
            pid: std::process::id(),
            started_unix_s: unix_now(),
            judge: judge.to_string(),
            ..RunStatus::default()
        };
        Ok(Arc::new(Self {
            dir: dir.to_path_buf(),
            inner: Mutex::new(Inner {
                history,
                status,
                task_ids,
                ready: false,
            }),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent data (every change is one push).
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A copy of the history.
    pub fn history(&self) -> ControlHistory {
        self.lock().history.clone()
    }

    /// A copy of the status.
    pub fn status(&self) -> RunStatus {
        self.lock().status.clone()
    }

    /// Changes the status.
    pub fn update(&self, f: impl FnOnce(&mut RunStatus)) {
        f(&mut self.lock().status)
    }

    /// The loop resumed at step `first_step` with `committed` steps committed: from now on a
    /// change is placed at the next step.
    pub fn start(&self, first_step: u64, committed: u64) {
        let mut inner = self.lock();
        inner.status.steps_done = first_step;
        inner.status.committed_steps = committed;
        inner.ready = true;
    }

    /// Refuses a change while the run is still starting (its step is not known yet).
    fn check_ready(inner: &Inner) -> Result<()> {
        if !inner.ready {
            bail!(
                "the daemon is still starting (loading, collecting or warming up): its step is \
                 not known yet; try again when `envace ctl status` shows steps"
            );
        }
        Ok(())
    }

    /// The step a change asked for now is in force from.
    fn next_step(status: &RunStatus) -> u64 {
        status.step_in_flight.map_or(status.steps_done, |s| s + 1)
    }

    /// Step boundary: step `step` starts now. Returns the judge change and the task batches
    /// in force from exactly this step.
    pub fn begin_step(&self, step: u64) -> (Option<JudgeChange>, Vec<TaskBatch>) {
        let mut inner = self.lock();
        inner.status.step_in_flight = Some(step);
        let judge = inner
            .history
            .judges
            .iter()
            .rev()
            .find(|j| j.step == step)
            .cloned();
        let batches = inner
            .history
            .task_batches
            .iter()
            .filter(|b| b.step == step)
            .cloned()
            .collect();
        (judge, batches)
    }

    /// Step `step` is done (`steps_done = step + 1`).
    pub fn end_step(&self, step: u64) {
        let mut inner = self.lock();
        inner.status.step_in_flight = None;
        inner.status.steps_done = step + 1;
    }

    /// Records that `judge` (a registered judge name) is in force from the next step, and
    /// returns the change.
    ///
    /// # Errors
    /// The name is not registered (the message lists the registered ones), or the history
    /// cannot be written (nothing changes then).
    pub fn request_judge(&self, judge: &str) -> Result<JudgeChange> {
        crate::registry::installed().check_judge(judge)?;
        let mut inner = self.lock();
        Self::check_ready(&inner)?;
        let change = JudgeChange {
            step: Self::next_step(&inner.status),
            judge: judge.to_string(),
            requested_unix_s: unix_now(),
        };
        let mut history = inner.history.clone();
        history.judges.push(change.clone());
        history.save(&self.dir)?;
        inner.history = history;
        Ok(change)
    }

    /// Checks the add-tasks file `file` ([`read_added_tasks`]: no id of the suite or of an
    /// earlier batch), copies it into
    /// `DIR/added-tasks/`, and records it as a batch in force from the next step.
    ///
    /// # Errors
    /// As [`read_added_tasks`]; the copy or the history cannot be written (nothing changes).
    pub fn request_tasks(&self, file: &Path) -> Result<TaskBatch> {
        // Read without the lock: a slow file must not stall the step boundaries.
        let tasks = read_added_tasks(file, &[])?;
        let mut inner = self.lock();
        Self::check_ready(&inner)?;
        if let Some(t) = tasks.iter().find(|t| inner.task_ids.contains(&t.task.id.0)) {
            bail!(
                "{}: task id {} is taken (by the suite's tasks or an added one)",
                file.display(),
                t.task.id.0
            );
        }
        let n = inner.history.task_batches.len() + 1;
        let relative = Path::new(ADDED_TASKS_DIR).join(format!("{n:04}.jsonl"));
        let copy = self.dir.join(&relative);
        let text = tasks
            .iter()
            .map(serde_json::to_string)
            .collect::<Result<Vec<_>, _>>()?
            .join("\n");
        crate::kernels::model::write_atomically(&copy, |tmp| {
            std::fs::write(tmp, format!("{text}\n")).map_err(|source| crate::kernels::Error::Io {
                path: tmp.to_path_buf(),
                source,
            })
        })
        .with_context(|| format!("writing {}", copy.display()))?;
        let batch = TaskBatch {
            step: Self::next_step(&inner.status),
            file: relative,
            tasks: tasks.len() as u64,
            seeds: tasks.iter().filter(|t| t.seed.is_some()).count() as u64,
            requested_unix_s: unix_now(),
        };
        let mut history = inner.history.clone();
        history.task_batches.push(batch.clone());
        history.save(&self.dir)?;
        inner.history = history;
        inner
            .task_ids
            .extend(tasks.iter().map(|t| t.task.id.0.clone()));
        Ok(batch)
    }

    /// The tasks of `batch`, from its copy in the run folder.
    ///
    /// # Errors
    /// The copy cannot be read or was changed into something else.
    pub fn batch_tasks(&self, batch: &TaskBatch) -> Result<Vec<AddedTask>> {
        read_added_tasks(&self.dir.join(&batch.file), &[])
    }
}

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_judge_in_force_is_the_last_change_at_or_before_a_step() {
        let change = |step, judge: &str| JudgeChange {
            step,
            judge: judge.into(),
            requested_unix_s: 0,
        };
        let h = ControlHistory {
            judges: vec![change(3, "a"), change(7, "b")],
            task_batches: Vec::new(),
        };
        assert_eq!(h.judge_at(2), None);
        assert_eq!(h.judge_at(3).map(|j| j.judge.as_str()), Some("a"));
        assert_eq!(h.judge_at(6).map(|j| j.judge.as_str()), Some("a"));
        assert_eq!(h.judge_at(100).map(|j| j.judge.as_str()), Some("b"));
        let dir = std::env::temp_dir().join(format!("envace-history-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(
            ControlHistory::load(&dir).unwrap(),
            ControlHistory::default()
        );
        h.save(&dir).unwrap();
        assert_eq!(ControlHistory::load(&dir).unwrap(), h);
        std::fs::write(dir.join(HISTORY_FILE), "{\"judges\": 3}").unwrap();
        let e = format!("{:#}", ControlHistory::load(&dir).unwrap_err());
        assert!(e.contains("is not a control history"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
