//! Conformance of the ported BFCL classes with the reference traces (base category).
//!
//! For every task involving a ported class, runs that class's ground-truth calls and probes
//! (each probe on a copy of the pre-turn instances, as the trace generator did) and compares
//! every result string and every state with the trace. Counts are per class; the executor's
//! own probes (unknown and forbidden names) count as `executor`.

use std::collections::BTreeMap;

use envace::bfcl::Executor;
use serde_json::{Map, Value};

const FIXTURE: &str = include_str!("fixtures/bfcl/conformance_base.jsonl");

#[derive(Default, Debug)]
struct Tally {
    calls: usize,
    calls_ok: usize,
    states: usize,
    states_ok: usize,
}

/// Same characters in any order (records whose text holds a Python set of strings).
fn same_multiset(a: &str, b: &str) -> bool {
    let mut x: Vec<char> = a.chars().collect();
    let mut y: Vec<char> = b.chars().collect();
    x.sort_unstable();
    y.sort_unstable();
    x == y
}

fn run_fixture() -> (BTreeMap<String, Tally>, Vec<String>) {
    let mut tally: BTreeMap<String, Tally> = BTreeMap::new();
    let mut mismatches = Vec::new();
    for line in FIXTURE.lines() {
        let task: Value = serde_json::from_str(line).expect("fixture line is JSON");
        let id = task["id"].as_str().expect("id");
        let classes: Vec<String> = task["classes"]
            .as_array()
            .expect("classes")
            .iter()
            .filter_map(|c| c.as_str().map(String::from))
            .collect();
        let long_context = task["long_context"].as_bool().unwrap_or(false);
        let mut exec = Executor::new(&classes, &task["initial_config"], long_context)
            .expect("ported classes load");
        let mut expected_state = task["initial_state"].clone();
        for class in &classes {
            let t = tally.entry(class.clone()).or_default();
            t.states += 1;
            if exec.snapshot()[class] == expected_state[class] {
                t.states_ok += 1;
            } else {
                mismatches.push(format!("{id} initial state of {class}"));
            }
        }
        for (turn_no, turn) in task["turns"].as_array().expect("turns").iter().enumerate() {
            let pre = exec.clone();
            for probe in turn["probes"].as_array().expect("probes") {
                let class = probe["class"].as_str().unwrap_or("");
                let key = if class.is_empty() { "executor" } else { class };
                let mut copy = pre.clone();
                let call = probe["call"].as_str().expect("call");
                let out = copy.execute_str(call);
                let want = probe["result"].as_str().expect("result");
                let ok = out.text == want
                    || (probe["hash_order_dependent"] == true && same_multiset(&out.text, want));
                let t = tally.entry(key.to_string()).or_default();
                t.calls += 1;
                if ok {
                    t.calls_ok += 1;
                } else {
                    mismatches.push(format!(
                        "{id} turn {turn_no} probe {call}\n  want {want}\n  got  {}",
                        out.text
                    ));
                }
                let snapshot = copy.snapshot();
                for c in &classes {
                    let mut want_state: Map<String, Value> =
                        expected_state[c].as_object().cloned().unwrap_or_default();
                    if let Some(delta) = probe["state_delta"][c].as_object() {
                        for (k, v) in delta {
                            want_state.insert(k.clone(), v.clone());
                        }
                    }
                    let t = tally.entry(c.clone()).or_default();
                    t.states += 1;
                    if snapshot[c] == Value::Object(want_state) {
                        t.states_ok += 1;
                    } else {
                        mismatches.push(format!("{id} turn {turn_no} state after probe {call}"));
                    }
                }
            }
            for gt in turn["calls"].as_array().expect("calls") {
                let class = gt["class"].as_str().unwrap_or("executor");
                let call = gt["call"].as_str().expect("call");
                let out = exec.execute_str(call);
                let want = gt["result"].as_str().expect("result");
                let t = tally.entry(class.to_string()).or_default();
                t.calls += 1;
                if out.text == want {
                    t.calls_ok += 1;
                } else {
                    mismatches.push(format!(
                        "{id} turn {turn_no} GT {call}\n  want {want}\n  got  {}",
                        out.text
                    ));
                }
            }
            expected_state = turn["state_after"].clone();
            let snapshot = exec.snapshot();
            for c in &classes {
                let t = tally.entry(c.clone()).or_default();
                t.states += 1;
                if snapshot[c] == expected_state[c] {
                    t.states_ok += 1;
                } else {
                    mismatches.push(format!(
                        "{id} turn {turn_no} state of {c}\n  want {}\n  got  {}",
                        expected_state[c], snapshot[c]
                    ));
                }
            }
        }
    }
    (tally, mismatches)
}

#[test]
fn ported_classes_conform_to_base_traces() {
    let (tally, mismatches) = run_fixture();
    for (class, t) in &tally {
        eprintln!(
            "{class}: calls {}/{} match, states {}/{} match",
            t.calls_ok, t.calls, t.states_ok, t.states
        );
    }
    for m in mismatches.iter().take(40) {
        eprintln!("MISMATCH {m}");
    }
    eprintln!("{} mismatches", mismatches.len());
    assert!(
        tally.len() >= 4,
        "fixture covers MathAPI, MessageAPI, TicketAPI and executor"
    );
    assert!(mismatches.is_empty(), "{} mismatches", mismatches.len());
}
