//! Fault injection for the crash tests: [`crash_point`] ends the process on the spot (no
//! destructor, no flush, like `SIGKILL`) when `ENVACE_CRASH_AT` names the point, so a test can
//! stop a run between any two durable writes and check that the same command resumes.
//!
//! `ENVACE_CRASH_AT=name@N` crashes at the point's N-th pass (1-based) instead of its first,
//! and `ENVACE_CRASH_SIGNAL=kill` ends the process with a real `SIGKILL` instead of an abort.

use std::sync::atomic::{AtomicU64, Ordering};

/// The environment variable naming the point to crash at.
pub const CRASH_AT: &str = "ENVACE_CRASH_AT";
/// `kill`: crash with `SIGKILL` (the default is `abort`, `SIGABRT`).
pub const CRASH_SIGNAL: &str = "ENVACE_CRASH_SIGNAL";

/// Passes through crash points named by `ENVACE_CRASH_AT` so far.
static PASSES: AtomicU64 = AtomicU64::new(0);

/// Ends the process when `ENVACE_CRASH_AT` names this point (at its N-th pass with `@N`);
/// does nothing otherwise (one environment lookup). Points: `checkpoint-file-written` (a
/// checkpoint's temporary file is written, not yet fsynced or renamed), `sft-saved` (the
/// warm-up's weights are in place, their record not committed), `train-step-played` (a
/// training step's rollouts and update are done, not yet committed), `train-weights-saved`
/// (a checkpoint's weights are in place, its learner state not yet written),
/// `train-state-saved` (both files are in place, the step not committed), `train-committed`
/// (the step is committed, old checkpoints not yet removed).
pub fn crash_point(name: &str) {
    let Some(spec) = std::env::var_os(CRASH_AT) else {
        return;
    };
    let spec = spec.to_string_lossy();
    let (point, nth) = match spec.split_once('@') {
        Some((p, n)) => (p, n.parse::<u64>().unwrap_or(1)),
        None => (spec.as_ref(), 1),
    };
    if point != name || PASSES.fetch_add(1, Ordering::SeqCst) + 1 != nth {
        return;
    }
    let kill = std::env::var_os(CRASH_SIGNAL).is_some_and(|v| v == "kill");
    eprintln!(
        "{CRASH_AT}={spec}: aborting here{}",
        if kill { " with SIGKILL" } else { "" }
    );
    if kill {
        // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
    std::process::abort();
}
