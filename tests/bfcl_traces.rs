//! Every shipped reference trace conforms: all ground-truth calls, probes and per-turn states
//! of `base`, `miss_param`, `miss_func` and `long_context` (all eight classes).
//!
//! Fixtures: `tests/fixtures/bfcl/traces/*.jsonl.xz`, the reference traces of
//! `shared/data/bfcl/traces/` compressed with `xz -9e` (Apache-2.0, see
//! `tests/fixtures/bfcl/README.md`). Initial configurations come from the installed BFCL data.

use std::collections::BTreeMap;
use std::path::PathBuf;

use envace::bfcl::conform::{conform_lines, owners, read_trace_file};
use envace::bfcl::schema::FuncDocs;
use envace::bfcl::tasks::{data_dir, load_category, Category};

/// (category, file, calls, states): the totals the reference traces hold.
const TRACES: [(Category, &str, usize, usize); 4] = [
    (Category::Base, "base", 4475, 7202),
    (Category::MissParam, "miss_param", 5273, 8877),
    (Category::MissFunc, "miss_func", 5273, 8877),
    (Category::LongContext, "long_context", 4536, 7202),
];

#[test]
fn every_reference_trace_conforms() {
    let data = data_dir();
    let docs = FuncDocs::load(&data.join("multi_turn_func_doc"))
        .expect("BFCL data installed by `make setup`");
    let owners = owners(&docs);
    for (category, name, calls, states) in TRACES {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join(format!("tests/fixtures/bfcl/traces/{name}.jsonl.xz"));
        let text = read_trace_file(&path).unwrap();
        let configs: BTreeMap<String, _> = load_category(&data, category)
            .unwrap()
            .into_iter()
            .map(|t| (t.id, t.initial_config))
            .collect();
        let report = conform_lines(&text, &path, &owners, &|id| configs.get(id).cloned()).unwrap();
        for m in report.mismatches.iter().take(5) {
            eprintln!("{name}: MISMATCH {m}");
        }
        let total = report.total();
        assert!(
            report.skipped_calls.is_empty(),
            "{name}: skipped {:?}",
            report.skipped_calls
        );
        assert_eq!(report.mismatches.len(), 0, "{name}: mismatches");
        assert_eq!(
            (total.calls, total.states),
            (calls, states),
            "{name}: every call and state ran"
        );
        assert_eq!(
            (total.calls_ok, total.states_ok),
            (calls, states),
            "{name}: all match"
        );
    }
}
