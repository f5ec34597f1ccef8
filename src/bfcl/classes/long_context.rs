//! The long-context extension data (`func_source_code/long_context.py`): the upper-case
//! constants that the classes append to their state or results when loaded with
//! `long_context=True`.
//!
//! Source: `reference/long_context_constants.json` of the BFCL reference traces (same
//! provenance and Apache-2.0 licence as `tests/fixtures/bfcl/`), embedded in the value
//! encoding of the trace README.

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::bfcl::value::PyValue;

const CONSTANTS_JSON: &str = include_str!("../data/long_context_constants.json");

fn constants() -> &'static HashMap<String, PyValue> {
    static CONSTANTS: OnceLock<HashMap<String, PyValue>> = OnceLock::new();
    CONSTANTS.get_or_init(|| {
        // The file is embedded at compile time and checked by the unit test below.
        let parsed: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(CONSTANTS_JSON).unwrap_or_default();
        parsed
            .iter()
            .filter_map(|(k, v)| PyValue::from_encoded(v).ok().map(|v| (k.clone(), v)))
            .collect()
    })
}

/// The constant `name` (`CAR_STATUS_METADATA_EXTENSION`, …); `None` (Python `None`) for a
/// name the data lacks.
pub(crate) fn constant(name: &str) -> PyValue {
    constants().get(name).cloned().unwrap_or(PyValue::None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_constants_decode() {
        let names = [
            "WATCH_LIST_EXTENSION",
            "TRANSACTION_HISTORY_EXTENSION",
            "MA_5_EXTENSION",
            "MA_20_EXTENSION",
            "TECHNOLOGY_EXTENSION",
            "AUTOMOBILE_EXTENSION",
            "ORDER_DETAIL_EXTENSION",
            "FILE_CONTENT_EXTENSION",
            "POPULATE_FILE_EXTENSION",
            "CAR_STATUS_METADATA_EXTENSION",
            "LONG_WEATHER_EXTENSION",
            "PARKING_BRAKE_INSTRUCTION",
            "INTERMEDIARY_CITIES",
            "CREDIT_CARD_EXTENSION",
            "BOOKING_RECORD_EXTENSION",
            "FILES_TAIL_USED",
        ];
        for n in names {
            assert!(!matches!(constant(n), PyValue::None), "{n}");
        }
        let PyValue::List(w) = constant("WATCH_LIST_EXTENSION") else {
            panic!("list")
        };
        assert!(w.last().is_some_and(|e| e.repr() == "Ellipsis"));
    }
}
