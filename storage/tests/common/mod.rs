//! Fixtures shared by the storage integration tests: temporary directories and deterministic
//! records (every field derives from the key, so a reader can rebuild what the writer wrote).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use envace_storage::{
    ExecutionMode, Message, MessageRole, PolicyVersion, Role, Row, RunId, SampleKey, TaskId,
    Termination, Timings, Trajectory, TurnVerdict,
};

/// A directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("envace-storage-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A realistic trajectory: `rows` rows alternating Act / Rehearse, each with `prompt` prompt
/// tokens and `completion` completion tokens; ids, log-probs and text all derive from the key.
pub fn trajectory(
    run: &str,
    step: u64,
    task: &str,
    sample: u32,
    rows: usize,
    prompt: usize,
    completion: usize,
) -> Trajectory {
    let seed = step
        .wrapping_mul(1_000_003)
        .wrapping_add(u64::from(sample) * 7919)
        .wrapping_add(task.bytes().map(u64::from).sum::<u64>());
    let id = |i: usize| ((seed.wrapping_add(i as u64 * 2_654_435_761)) % 49_152) as u32;
    let rows: Vec<Row> = (0..rows)
        .map(|r| Row {
            role: if r % 2 == 0 {
                Role::Act
            } else {
                Role::Rehearse
            },
            prompt_ids: (0..prompt).map(|i| id(r * 100_000 + i)).collect(),
            completion_ids: (0..completion)
                .map(|i| id(r * 100_000 + 50_000 + i))
                .collect(),
            logprobs: (0..completion)
                .map(|i| -((id(r * 100_000 + 70_000 + i) % 1000) as f32) / 100.0)
                .collect(),
            policy_version: PolicyVersion(step),
        })
        .collect();
    let mut messages = vec![
        Message {
            role: MessageRole::System,
            content: "You are a helpful assistant with tools.".into(),
            tool_name: None,
            row: None,
        },
        Message {
            role: MessageRole::User,
            content: format!("Please do task {task}."),
            tool_name: None,
            row: None,
        },
    ];
    for (r, row) in rows.iter().enumerate() {
        messages.push(match row.role {
            Role::Act => Message {
                role: MessageRole::Assistant,
                content: format!(
                    "<tool_call>\n{{\"name\": \"ls\", \"arguments\": {{\"depth\": {r}}}}}\n</tool_call>"
                ),
                tool_name: None,
                row: Some(r as u32),
            },
            Role::Rehearse => Message {
                role: MessageRole::Tool,
                content: format!("{{\"files\": [\"a{seed}.txt\"]}}"),
                tool_name: Some("ls".into()),
                row: Some(r as u32),
            },
        });
    }
    Trajectory {
        run: RunId(run.into()),
        step,
        task: TaskId(task.into()),
        sample,
        mode: ExecutionMode::Rehearsal,
        rows,
        messages,
        reward: (seed % 5) as f32 / 4.0,
        verdicts: vec![TurnVerdict {
            user_turn: 0,
            score: (seed % 5) as f32 / 4.0,
            passed: seed % 2 == 0,
            reason: format!("checklist for {task}"),
        }],
        termination: Termination::Completed,
        timings: Timings {
            total_s: 1.5,
            act_s: 1.0,
            rehearse_s: 0.5,
            environment_s: 0.0,
            judge_s: 0.0,
        },
    }
}

/// A small trajectory (2 rows × (8 + 4) tokens).
pub fn small(run: &str, step: u64, task: &str, sample: u32) -> Trajectory {
    trajectory(run, step, task, sample, 2, 8, 4)
}

/// The key a trajectory is stored under.
pub fn key_of(t: &Trajectory) -> SampleKey {
    SampleKey {
        run: t.run.clone(),
        step: t.step,
        task: t.task.clone(),
        sample: t.sample,
    }
}

/// Waits until no handle holds sled's lock on the database. Dropping the last `Store` does not
/// close it at once: sled's background threads hold the database (and finish its last
/// snapshot) a moment longer, and damaging files meanwhile races with that snapshot.
pub fn wait_closed(dir: &Path) {
    use fs2::FileExt;
    let db = std::fs::File::open(dir.join("db")).unwrap();
    let start = std::time::Instant::now();
    while db.try_lock_exclusive().is_err() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "sled never released {}",
            dir.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    FileExt::unlock(&db).unwrap();
}

/// Copies the files under `from` into `to` (created if needed).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}
