//! Fuzzes both BFCL call parsers (Python-call strings and JSON tool calls): any input must give
//! a call or a structured parse error, never a panic (`tests/bfcl_parser.rs` is the proptest
//! counterpart that runs in CI).
#![no_main]

use libfuzzer_sys::fuzz_target;

// The parser's own source files, as crate-root modules (they refer to each other as `super::`).
#[allow(dead_code)]
#[path = "../../src/bfcl/error.rs"]
mod error;
#[allow(dead_code)]
#[path = "../../src/bfcl/parse.rs"]
mod parse;
#[allow(dead_code)]
#[path = "../../src/bfcl/value.rs"]
mod value;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = parse::parse_python_call(text);
        let _ = parse::parse_json_call(text);
    }
});
