//! Crash safety: a child process writes trajectory batches under the default flush policy and
//! prints `ACK STEP N` after each `put_many` returns; the parent SIGKILLs it mid-stream, reopens
//! the database and checks that every acknowledged batch is there and decodes to exactly what
//! was written, and that no batch is partial. The child is this test binary re-executed with
//! `CHILD_DB` set (so no extra binary is needed).
mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{trajectory, TempDir};
use envace_storage::{Error, Prefix, SampleKey, Store, StoreOptions, Trajectory};

const CHILD_DB: &str = "ENVACE_STORAGE_CRASH_CHILD_DB";
const CHILD_RUN: &str = "ENVACE_STORAGE_CRASH_CHILD_RUN";

/// Trajectories written at `step`: 1 to 8, so batches differ in size.
fn batch_len(step: u64) -> u32 {
    1 + (step % 8) as u32
}

/// The i-th trajectory of a step: realistic size (8 rows × (384 + 128) tokens).
fn record(run: &str, step: u64, i: u32) -> Trajectory {
    trajectory(run, step, &format!("task-{}", i / 2), i % 2, 8, 384, 128)
}

/// Rebuilds what the writer wrote under `key`.
fn expected(key: &SampleKey) -> Trajectory {
    let i = key.sample
        + 2 * key
            .task
            .0
            .strip_prefix("task-")
            .and_then(|n| n.parse::<u32>().ok())
            .expect("task names are task-N");
    record(&key.run.0, key.step, i)
}

/// The child side; a no-op in a normal test run.
#[test]
fn crash_child_writer() {
    let Ok(dir) = std::env::var(CHILD_DB) else {
        return;
    };
    let run = std::env::var(CHILD_RUN).unwrap();
    let store = Store::open(&dir, StoreOptions::default()).unwrap();
    let mut out = std::io::stdout().lock();
    writeln!(out, "READY").unwrap();
    out.flush().unwrap();
    for step in 0.. {
        let batch: Vec<Trajectory> = (0..batch_len(step))
            .map(|i| record(&run, step, i))
            .collect();
        store.put_many(&batch).unwrap();
        writeln!(out, "ACK {step} {}", batch.len()).unwrap();
        out.flush().unwrap();
    }
}

#[test]
fn sigkill_mid_stream_loses_no_acknowledged_write() {
    let dir = TempDir::new("crash");
    let exe = std::env::current_exe().unwrap();
    // Rounds append to the same database, so recovery also has to keep earlier rounds intact.
    // (run, acknowledgements to wait for, extra milliseconds before the kill)
    let rounds: [(&str, usize, u64); 6] = [
        ("crash-0", 5, 0),
        ("crash-1", 17, 1),
        ("crash-2", 23, 3),
        ("crash-3", 31, 0),
        ("crash-4", 41, 7),
        ("crash-5", 60, 2),
    ];
    let mut acked_total = 0;
    for (round, &(run, acks_before_kill, extra_ms)) in rounds.iter().enumerate() {
        let mut child = Command::new(&exe)
            .args([
                "crash_child_writer",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_DB, dir.path())
            .env(CHILD_RUN, run)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut acked: BTreeMap<u64, u32> = BTreeMap::new();
        let mut ready = false;
        let read_ack = |line: &str, acked: &mut BTreeMap<u64, u32>| {
            if let Some(rest) = line.strip_prefix("ACK ") {
                let (step, n) = rest.split_once(' ').unwrap();
                acked.insert(step.parse().unwrap(), n.parse().unwrap());
            }
        };
        for line in lines.by_ref() {
            let line = line.unwrap();
            // libtest prints `test crash_child_writer ... ` before the child's first line.
            if line.ends_with("READY") {
                ready = true;
                if round == 0 {
                    // While the child holds the database, another process is refused clearly.
                    let err = Store::open(dir.path(), StoreOptions::default()).unwrap_err();
                    assert!(matches!(err, Error::Locked { .. }), "{err}");
                    assert!(err.to_string().contains("locked by another process"));
                }
            }
            read_ack(&line, &mut acked);
            if acked.len() >= acks_before_kill {
                break;
            }
        }
        assert!(ready, "child never opened the database");
        std::thread::sleep(Duration::from_millis(extra_ms));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        // Acknowledgements already in the pipe were given before the kill: they count too.
        for line in lines {
            read_ack(&line.unwrap(), &mut acked);
        }
        assert!(acked.len() >= acks_before_kill);
        acked_total += acked.values().sum::<u32>();

        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        for (&step, &n) in &acked {
            for i in 0..n {
                let want = record(run, step, i);
                let got = store.get::<Trajectory>(&want_key(&want)).unwrap();
                assert_eq!(
                    got.as_ref(),
                    Some(&want),
                    "acknowledged {run} step {step} #{i}"
                );
            }
        }
        // Everything on disk decodes to what was written, and batches are all-or-nothing; at
        // most the one batch in flight at the kill may exist beyond the acknowledged ones.
        let mut found: BTreeMap<u64, u32> = BTreeMap::new();
        for item in store.scan::<Trajectory>(&SampleKey::run_prefix(&run.into())) {
            let (key, t) = item.unwrap();
            assert_eq!(
                t,
                expected(&key),
                "record {key} differs from what was written"
            );
            *found.entry(key.step).or_default() += 1;
        }
        let last_acked = *acked.keys().next_back().unwrap();
        for (&step, &n) in &found {
            assert_eq!(
                n,
                batch_len(step),
                "step {step} of {run} is a partial batch"
            );
            assert!(step <= last_acked + 1, "step {step} was never written");
        }
        assert_eq!(
            found.keys().copied().collect::<Vec<_>>(),
            (0..found.len() as u64).collect::<Vec<_>>()
        );
        let all = store.scan::<Trajectory>(&Prefix::all()).count();
        assert!(all >= acked_total as usize);
        for item in store.scan::<Trajectory>(&Prefix::all()) {
            item.unwrap();
        }
    }
}

fn want_key(t: &Trajectory) -> SampleKey {
    SampleKey {
        run: t.run.clone(),
        step: t.step,
        task: t.task.clone(),
        sample: t.sample,
    }
}
