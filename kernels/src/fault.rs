//! Fault injection for the crash tests: [`crash_point`] ends the process on the spot (no
//! destructor, no flush, like `SIGKILL`) when `ENVACE_CRASH_AT` names the point, so a test can
//! stop a run between any two durable writes and check that the same command resumes.

/// The environment variable naming the point to crash at.
pub const CRASH_AT: &str = "ENVACE_CRASH_AT";

/// Aborts the process when `ENVACE_CRASH_AT` equals `name`; does nothing otherwise (one
/// environment lookup). Points: `checkpoint-file-written` (a checkpoint's temporary file is
/// written, not yet fsynced or renamed), `sft-saved` (the warm-up's weights are in place, their
/// record not committed), `train-weights-saved` (a step's weights are in place, its learner
/// state not yet written), `train-state-saved` (both files are in place, the step not
/// committed), `train-committed` (the step is committed, the previous checkpoint not yet
/// removed).
pub fn crash_point(name: &str) {
    if std::env::var_os(CRASH_AT).is_some_and(|v| v == name) {
        eprintln!("{CRASH_AT}={name}: aborting here");
        std::process::abort();
    }
}
