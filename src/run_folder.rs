//! A run folder's ownership and its configuration across processes.
//!
//! * One envace process at a time works in a run folder: it holds an advisory lock on
//!   `DIR/.lock` ([`RunLock`]) from before it reads, deletes or writes anything there until it
//!   exits. A second process is refused before it changes a byte (`--fresh` included).
//! * A run resumes only with the configuration it started with, up to the keys listed in
//!   [`RESUME_SAFE`] (the step budget, evaluation settings): [`config_changes`] lists the keys
//!   whose values differ from the folder's `config.toml`, and [`config_hash`] is what the run
//!   state records.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

/// The file whose lock marks a run folder as in use.
pub const LOCK_FILE: &str = ".lock";

/// The lock of one run folder, held while this value lives (the OS releases it when the
/// process dies, so a killed run never leaves a stale lock).
#[derive(Debug)]
pub struct RunLock {
    _file: File,
    path: PathBuf,
}

impl RunLock {
    /// Takes the lock of the existing folder `dir` without waiting, and writes this process's
    /// id into the lock file (for the message another process gets).
    ///
    /// # Errors
    /// Another process holds the lock (the message names its pid); the lock file cannot be
    /// opened or written.
    pub fn acquire(dir: &Path) -> Result<RunLock> {
        let path = dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("opening the run lock {}", path.display()))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = match holder.trim() {
                    "" => String::new(),
                    pid => format!(" (pid {pid})"),
                };
                bail!(
                    "run folder {} is in use by another envace process{holder}; nothing was \
                     changed: wait for it to finish, stop it, or use another --out",
                    dir.display()
                );
            }
            Err(TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("locking {}", path.display()))
            }
        }
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| writeln!(file, "{}", std::process::id()))
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(RunLock { _file: file, path })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Keys a run may change between its processes: the step budget (to extend a run),
/// evaluation settings, worker counts, engine batching and the daemon's checkpoint cadence. Every other key changes what the
/// steps already taken mean (`train.k`, `seed`, a learning rate, the judge, …).
pub const RESUME_SAFE: &[&str] = &[
    "train.steps",
    "train.eval_every",
    "train.eval_tasks",
    "eval.",
    "tts.",
    "topology.",
    "engine.",
    "daemon.",
];

/// `key → value` (as TOML text) of every key of `toml_text` outside [`RESUME_SAFE`], dotted
/// (e.g. `train.learner.lr`), in key order.
///
/// # Errors
/// The text is not TOML.
fn resume_keys(toml_text: &str) -> Result<BTreeMap<String, String>> {
    let table: toml::Table = toml::from_str(toml_text).context("reading a config as TOML")?;
    let mut out = Vec::new();
    flatten("", &toml::Value::Table(table), &mut out);
    Ok(out
        .into_iter()
        .filter(|(k, _)| {
            !RESUME_SAFE
                .iter()
                .any(|safe| k == safe || (safe.ends_with('.') && k.starts_with(safe)))
        })
        .collect())
}

/// SHA-256, hex (64 characters), of a configuration's keys outside [`RESUME_SAFE`] (one
/// `key = value` line each, in key order): what a run state records as its `config_hash`.
///
/// # Errors
/// The text is not TOML.
pub fn config_hash(toml_text: &str) -> Result<String> {
    let lines: String = resume_keys(toml_text)?
        .iter()
        .map(|(k, v)| format!("{k} = {v}\n"))
        .collect();
    Ok(Sha256::digest(lines.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// The keys outside [`RESUME_SAFE`] whose values differ between two configurations' TOML
/// texts, as `key: old → new` (`(unset)` for a key one side lacks), in key order. Empty when a
/// run may go on under `new`.
///
/// # Errors
/// Either text is not TOML.
pub fn config_changes(old: &str, new: &str) -> Result<Vec<String>> {
    let old = resume_keys(old).context("the run's config.toml")?;
    let new = resume_keys(new)?;
    let keys: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    let unset = "(unset)".to_string();
    Ok(keys
        .into_iter()
        .filter_map(|k| {
            let (a, b) = (old.get(k).unwrap_or(&unset), new.get(k).unwrap_or(&unset));
            (a != b).then(|| format!("{k}: {a} → {b}"))
        })
        .collect())
}

fn flatten(prefix: &str, value: &toml::Value, out: &mut Vec<(String, String)>) {
    match value {
        toml::Value::Table(table) => {
            for (k, v) in table {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        other => out.push((prefix.to_string(), other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_a_folder_is_refused_and_names_the_holder() {
        let dir = std::env::temp_dir().join(format!("envace-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let held = RunLock::acquire(&dir).expect("first lock");
        // A second open file description conflicts like another process would.
        let e = RunLock::acquire(&dir).unwrap_err().to_string();
        assert!(e.contains("in use by another envace process"), "{e}");
        assert!(e.contains(&format!("pid {}", std::process::id())), "{e}");
        drop(held);
        RunLock::acquire(&dir).expect("free again once dropped");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn config_changes_name_every_differing_key_but_the_resume_safe_ones() {
        let old =
            "seed = 0\n[train]\nk = 4\nsteps = 2\n[train.learner]\nlr = 1e-5\n[eval]\ntasks = 3\n";
        let new = "seed = 0\njudge = \"x\"\n[train]\nk = 8\nsteps = 9\n[train.learner]\nlr = 0.5\n[eval]\ntasks = 30\n";
        let changes = config_changes(old, new).unwrap();
        assert_eq!(changes.len(), 3, "{changes:?}");
        assert_eq!(changes[0], "judge: (unset) → \"x\"");
        assert_eq!(changes[1], "train.k: 4 → 8");
        assert!(changes[2].starts_with("train.learner.lr: ") && changes[2].ends_with(" → 0.5"));
        assert!(config_changes(old, old).unwrap().is_empty());
        // Extending a run and evaluating differently are not changes of the run.
        assert!(config_changes(
            old,
            &old.replace("steps = 2", "steps = 5")
                .replace("tasks = 3", "tasks = 1")
        )
        .unwrap()
        .is_empty());
        assert!(config_changes("[train", old).is_err());
    }

    #[test]
    fn the_config_hash_covers_the_run_keys_only() {
        let a = config_hash("seed = 0\n[train]\nsteps = 2\n").unwrap();
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(a, config_hash("seed = 0\n[train]\nsteps = 7\n").unwrap());
        assert_ne!(a, config_hash("seed = 1\n[train]\nsteps = 2\n").unwrap());
    }
}
