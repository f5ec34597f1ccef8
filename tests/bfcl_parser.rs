//! Property tests of the BFCL call parser: no panic on any input, and rendered literals parse
//! back to the same values.

use envace::bfcl::{parse_json_call, parse_python_call, PyValue};
use proptest::prelude::*;

fn literal() -> impl Strategy<Value = PyValue> {
    let leaf = prop_oneof![
        Just(PyValue::None),
        any::<bool>().prop_map(PyValue::Bool),
        any::<i64>().prop_map(PyValue::Int),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(PyValue::Float),
        any::<String>().prop_map(PyValue::Str),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(PyValue::List),
            prop::collection::vec(("[a-z]{1,6}", inner), 0..4).prop_map(PyValue::dict),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn python_parser_never_panics(s in any::<String>()) {
        let _ = parse_python_call(&s);
    }

    #[test]
    fn python_parser_never_panics_on_call_like_input(s in r"[a-z_]{1,8}\([\[\]{}(),:='0-9a-zA-Z.\-+eE\\ ]{0,40}\)?") {
        let _ = parse_python_call(&s);
    }

    #[test]
    fn json_parser_never_panics(s in any::<String>()) {
        let _ = parse_json_call(&s);
    }

    #[test]
    fn repr_round_trips(v in literal(), name in "[a-z_][a-z0-9_]{0,10}") {
        let src = format!("{name}(x={})", v.repr());
        let call = parse_python_call(&src).map_err(|e| TestCaseError::fail(format!("{src}: {e}")))?;
        prop_assert_eq!(&call.name, &name);
        prop_assert_eq!(call.kwargs.len(), 1);
        prop_assert_eq!(call.kwargs[0].1.repr(), v.repr());
    }
}
