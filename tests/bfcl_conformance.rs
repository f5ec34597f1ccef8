//! Conformance of the ported BFCL classes with the reference traces (base category).
//!
//! For every task involving a ported class, runs that class's ground-truth calls and probes
//! (each probe on a copy of the pre-turn instances, as the trace generator did) and compares
//! every result string and every state with the trace ([`envace::bfcl::conform`]). Counts are
//! per class; the executor's own probes (unknown and forbidden names) count as `executor`.

use std::path::Path;

use envace::bfcl::conform::{conform_lines, Owners};

const FIXTURE: &str = include_str!("fixtures/bfcl/conformance_base.jsonl");

#[test]
fn ported_classes_conform_to_base_traces() {
    let report = conform_lines(
        FIXTURE,
        Path::new("tests/fixtures/bfcl/conformance_base.jsonl"),
        &Owners::new(),
        &|_| None,
    )
    .expect("fixture lines are trace tasks");
    for (class, t) in &report.per_class {
        eprintln!(
            "{class}: calls {}/{} match, states {}/{} match",
            t.calls_ok, t.calls, t.states_ok, t.states
        );
    }
    for m in report.mismatches.iter().take(40) {
        eprintln!("MISMATCH {m}");
    }
    eprintln!("{} mismatches", report.mismatches.len());
    for class in [
        "executor",
        "GorillaFileSystem",
        "MathAPI",
        "MessageAPI",
        "TwitterAPI",
        "TicketAPI",
        "TradingBot",
        "TravelAPI",
        "VehicleControlAPI",
    ] {
        assert!(
            report.per_class.get(class).is_some_and(|t| t.calls > 0),
            "fixture covers {class}"
        );
    }
    assert!(
        report.skipped_calls.is_empty(),
        "{:?}",
        report.skipped_calls
    );
    assert!(
        report.mismatches.is_empty(),
        "{} mismatches",
        report.mismatches.len()
    );
}
