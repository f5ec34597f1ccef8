//! Conformance with the reference traces: every ground-truth call, every probe and every
//! per-turn state of a trace file, compared with what the port produces.
//!
//! Reads both the reference trace lines (`../shared/data/bfcl/traces/*.jsonl`, schema in its
//! README: `involved_classes`, `turns[].calls`, `turns[].probe_calls`, `state_after`; the
//! `initial_config` comes from the task file) and the slimmed fixtures of
//! `tests/fixtures/bfcl/` (`classes`, `probes`, an inline `initial_config`, a `class` on each
//! record). Probes run on a copy of the pre-turn instances, as the trace generator did, and
//! their expected state is the pre-turn state with the probe's `state_delta` applied. Records
//! flagged `hash_order_dependent` (a Python set's order in the text) match in any character
//! order.
//!
//! Classes the port does not implement yet are left out: their calls and states are not run,
//! and the report counts them in [`ConformReport::skipped_calls`]. The classes are independent
//! (no method touches another class), so the rest of the task still runs faithfully.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;
use serde_json::{Map, Value};

use super::classes::instantiate;
use super::error::BfclError;
use super::executor::Executor;

/// One task of a trace file.
#[derive(Debug, Clone, Deserialize)]
pub struct TraceTask {
    pub id: String,
    #[serde(default)]
    pub long_context: bool,
    #[serde(alias = "classes")]
    pub involved_classes: Vec<String>,
    /// Inline in the fixtures; absent in the reference traces (take it from the task file).
    #[serde(default)]
    pub initial_config: Option<Value>,
    pub initial_state: Value,
    pub turns: Vec<TraceTurn>,
}

/// One user turn of a trace.
#[derive(Debug, Clone, Deserialize)]
pub struct TraceTurn {
    /// Ground-truth calls, in order.
    pub calls: Vec<TraceCall>,
    /// Probe calls, each on its own copy of the pre-turn state.
    #[serde(alias = "probes", default)]
    pub probe_calls: Vec<TraceCall>,
    pub state_after: Value,
}

/// One call record (ground truth or probe).
#[derive(Debug, Clone, Deserialize)]
pub struct TraceCall {
    /// The call string as executed.
    pub call: String,
    /// The owning class (fixtures only; `""` for executor-level probes).
    #[serde(default)]
    pub class: Option<String>,
    /// The called name (reference traces).
    #[serde(default)]
    pub name: Option<String>,
    /// The exact result text.
    pub result: String,
    #[serde(default)]
    pub hash_order_dependent: bool,
    /// Probes: `{class: {attribute: new value}}` relative to the pre-turn state.
    #[serde(default)]
    pub state_delta: Option<Map<String, Value>>,
}

/// Matches and totals for one class (`executor` for the executor's own probes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub calls: usize,
    pub calls_ok: usize,
    pub states: usize,
    pub states_ok: usize,
}

/// The outcome of a conformance run.
#[derive(Debug, Clone, Default)]
pub struct ConformReport {
    /// Per class (and `executor`).
    pub per_class: BTreeMap<String, Tally>,
    /// One entry per mismatch, in full (call, expected and actual text or state).
    pub mismatches: Vec<String>,
    /// Calls not run because their class is not ported, per class.
    pub skipped_calls: BTreeMap<String, usize>,
    /// Tasks run (at least partly).
    pub tasks: usize,
}

impl ConformReport {
    /// All classes together.
    pub fn total(&self) -> Tally {
        self.per_class
            .values()
            .fold(Tally::default(), |a, t| Tally {
                calls: a.calls + t.calls,
                calls_ok: a.calls_ok + t.calls_ok,
                states: a.states + t.states,
                states_ok: a.states_ok + t.states_ok,
            })
    }
}

/// Which class owns a function name (from the function docs), for records without `class`.
pub type Owners = HashMap<String, String>;

/// The owner map of the function docs.
pub fn owners(docs: &super::schema::FuncDocs) -> Owners {
    super::schema::DOC_FILES
        .iter()
        .filter_map(|(c, _)| docs.class(c))
        .flatten()
        .map(|d| (d.name.clone(), d.class.clone()))
        .collect()
}

/// True when the port implements `class`.
pub fn is_ported(class: &str) -> bool {
    !matches!(
        instantiate(class, None, false),
        Err(BfclError::UnsupportedClass(_))
    )
}

/// Same characters in any order (texts holding a Python set of strings).
fn same_multiset(a: &str, b: &str) -> bool {
    let mut x: Vec<char> = a.chars().collect();
    let mut y: Vec<char> = b.chars().collect();
    x.sort_unstable();
    y.sort_unstable();
    x == y
}

impl TraceCall {
    /// The class a record's tally goes to: its `class`, else its name's owner, else
    /// `executor` (unknown and forbidden names).
    fn owner(&self, owners: &Owners) -> String {
        match &self.class {
            Some(c) if c.is_empty() => "executor".into(),
            Some(c) => c.clone(),
            None => {
                let name = self.name.clone().unwrap_or_else(|| {
                    self.call.split('(').next().unwrap_or("").trim().to_string()
                });
                owners
                    .get(&name)
                    .cloned()
                    .unwrap_or_else(|| "executor".into())
            }
        }
    }

    fn matches(&self, got: &str) -> bool {
        got == self.result || (self.hash_order_dependent && same_multiset(got, &self.result))
    }
}

/// Runs one trace task, adding to `report`.
///
/// # Errors
/// [`BfclError::Config`] when a ported class rejects the initial configuration, and
/// [`BfclError::Encoding`] when the task has no `initial_config`.
pub fn conform_task(
    task: &TraceTask,
    owners: &Owners,
    report: &mut ConformReport,
) -> Result<(), BfclError> {
    let id = &task.id;
    let config = task
        .initial_config
        .as_ref()
        .ok_or_else(|| BfclError::Encoding(format!("{id}: no initial_config")))?;
    let classes: Vec<String> = task
        .involved_classes
        .iter()
        .filter(|c| is_ported(c))
        .cloned()
        .collect();
    let runs = |owner: &str| owner == "executor" || classes.iter().any(|c| c == owner);
    let mut exec = Executor::new(&classes, config, task.long_context)?;
    report.tasks += 1;

    let mut expected = task.initial_state.clone();
    let snapshot = exec.snapshot();
    for class in &classes {
        let t = report.per_class.entry(class.clone()).or_default();
        t.states += 1;
        if snapshot[class] == expected[class] {
            t.states_ok += 1;
        } else {
            report.mismatches.push(format!(
                "{id} initial state of {class}\n  want {}\n  got  {}",
                expected[class], snapshot[class]
            ));
        }
    }

    for (turn_no, turn) in task.turns.iter().enumerate() {
        let pre = exec.clone();
        for probe in &turn.probe_calls {
            let owner = probe.owner(owners);
            if !runs(&owner) {
                *report.skipped_calls.entry(owner).or_default() += 1;
                continue;
            }
            let mut copy = pre.clone();
            let got = copy.execute_str(&probe.call).text;
            let t = report.per_class.entry(owner).or_default();
            t.calls += 1;
            if probe.matches(&got) {
                t.calls_ok += 1;
            } else {
                report.mismatches.push(format!(
                    "{id} turn {turn_no} probe {}\n  want {}\n  got  {got}",
                    probe.call, probe.result
                ));
            }
            let snapshot = copy.snapshot();
            for c in &classes {
                let mut want: Map<String, Value> =
                    expected[c].as_object().cloned().unwrap_or_default();
                if let Some(delta) = probe
                    .state_delta
                    .as_ref()
                    .and_then(|d| d.get(c))
                    .and_then(Value::as_object)
                {
                    for (k, v) in delta {
                        want.insert(k.clone(), v.clone());
                    }
                }
                let want = Value::Object(want);
                let t = report.per_class.entry(c.clone()).or_default();
                t.states += 1;
                if snapshot[c] == want {
                    t.states_ok += 1;
                } else {
                    report.mismatches.push(format!(
                        "{id} turn {turn_no} state of {c} after probe {}\n  want {want}\n  got  {}",
                        probe.call, snapshot[c]
                    ));
                }
            }
        }
        for gt in &turn.calls {
            let owner = gt.owner(owners);
            if !runs(&owner) {
                *report.skipped_calls.entry(owner).or_default() += 1;
                continue;
            }
            let got = exec.execute_str(&gt.call).text;
            let t = report.per_class.entry(owner).or_default();
            t.calls += 1;
            if gt.matches(&got) {
                t.calls_ok += 1;
            } else {
                report.mismatches.push(format!(
                    "{id} turn {turn_no} GT {}\n  want {}\n  got  {got}",
                    gt.call, gt.result
                ));
            }
        }
        expected = turn.state_after.clone();
        let snapshot = exec.snapshot();
        for c in &classes {
            let t = report.per_class.entry(c.clone()).or_default();
            t.states += 1;
            if snapshot[c] == expected[c] {
                t.states_ok += 1;
            } else {
                report.mismatches.push(format!(
                    "{id} turn {turn_no} state of {c}\n  want {}\n  got  {}",
                    expected[c], snapshot[c]
                ));
            }
        }
    }
    Ok(())
}

/// Reads a trace file's text; a `.xz` file (the compressed fixtures) is decompressed.
///
/// # Errors
/// [`BfclError::Io`] naming the file when it cannot be read or decompressed, or is not UTF-8.
pub fn read_trace_file(path: &std::path::Path) -> Result<String, BfclError> {
    use std::io::Read;
    let io = |source| BfclError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut text = String::new();
    if path.extension().is_some_and(|e| e == "xz") {
        xz2::read::XzDecoder::new(file)
            .read_to_string(&mut text)
            .map_err(io)?;
    } else {
        std::io::BufReader::new(file)
            .read_to_string(&mut text)
            .map_err(io)?;
    }
    Ok(text)
}

/// Runs every line of a trace (or fixture) file's text. `initial_config` supplies the
/// configuration of tasks whose line lacks one (the reference traces).
///
/// # Errors
/// [`BfclError::Data`] (with `path` and line) for a line that is not a trace task, else as
/// [`conform_task`].
pub fn conform_lines(
    text: &str,
    path: &std::path::Path,
    owners: &Owners,
    initial_config: &dyn Fn(&str) -> Option<Value>,
) -> Result<ConformReport, BfclError> {
    let mut report = ConformReport::default();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut task: TraceTask = serde_json::from_str(line).map_err(|e| BfclError::Data {
            path: path.to_path_buf(),
            line: i + 1,
            reason: e.to_string(),
        })?;
        if task.initial_config.is_none() {
            task.initial_config = initial_config(&task.id);
        }
        conform_task(&task, owners, &mut report)?;
    }
    Ok(report)
}
