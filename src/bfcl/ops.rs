//! Python operators on [`PyValue`]s where BFCL methods apply them to caller-supplied values,
//! with CPython's `TypeError` messages (probes pass strings where numbers belong).

use std::cmp::Ordering;

use super::exception::PyErr;
use super::value::PyValue;

/// A comparison operator, for the `'<' not supported between …` message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    fn symbol(self) -> &'static str {
        match self {
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
        }
    }
}

fn ordering(a: &PyValue, b: &PyValue) -> Option<Ordering> {
    match (a, b) {
        (PyValue::Str(x), PyValue::Str(y)) => Some(x.cmp(y)),
        (PyValue::List(x), PyValue::List(y)) | (PyValue::Tuple(x), PyValue::Tuple(y)) => {
            for (p, q) in x.iter().zip(y) {
                if !p.py_eq(q) {
                    return ordering(p, q);
                }
            }
            Some(x.len().cmp(&y.len()))
        }
        (PyValue::Int(x), PyValue::Int(y)) => Some(x.cmp(y)),
        _ => match (a.as_number(), b.as_number()) {
            (Some(x), Some(y)) => x.partial_cmp(&y),
            _ => None,
        },
    }
}

/// `a <op> b`.
///
/// # Errors
/// `TypeError: '<' not supported between instances of 'str' and 'int'` for unorderable types.
pub fn compare(op: CmpOp, a: &PyValue, b: &PyValue) -> Result<bool, PyErr> {
    let both_numbers = a.as_number().is_some() && b.as_number().is_some();
    match ordering(a, b) {
        Some(o) => Ok(match op {
            CmpOp::Lt => o == Ordering::Less,
            CmpOp::Le => o != Ordering::Greater,
            CmpOp::Gt => o == Ordering::Greater,
            CmpOp::Ge => o != Ordering::Less,
        }),
        // NaN compares false with everything.
        None if both_numbers => Ok(false),
        None => Err(PyErr::type_error(format!(
            "'{}' not supported between instances of '{}' and '{}'",
            op.symbol(),
            a.type_name(),
            b.type_name()
        ))),
    }
}

/// `s.lower()`.
///
/// # Errors
/// `AttributeError` when `s` is not a `str`.
pub fn lower(s: &PyValue) -> Result<String, PyErr> {
    match s {
        PyValue::Str(s) => Ok(s.to_lowercase()),
        other => Err(PyErr::no_attribute(other, "lower")),
    }
}

/// `needle in haystack` for a `str` haystack.
///
/// # Errors
/// `TypeError: 'in <string>' requires string as left operand, not int`.
pub fn str_contains(haystack: &str, needle: &PyValue) -> Result<bool, PyErr> {
    match needle {
        PyValue::Str(n) => Ok(haystack.contains(n.as_str())),
        other => Err(PyErr::type_error(format!(
            "'in <string>' requires string as left operand, not {}",
            other.type_name()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparisons_and_messages() {
        assert_eq!(
            compare(CmpOp::Lt, &PyValue::Int(1), &PyValue::Float(1.5)),
            Ok(true)
        );
        assert_eq!(
            compare(CmpOp::Gt, &PyValue::Bool(true), &PyValue::Int(0)),
            Ok(true)
        );
        let err = compare(CmpOp::Lt, &PyValue::str("5"), &PyValue::Int(1)).expect_err("str<int");
        assert_eq!(
            err.message,
            "'<' not supported between instances of 'str' and 'int'"
        );
        assert_eq!(
            lower(&PyValue::List(vec![])).expect_err("list").message,
            "'list' object has no attribute 'lower'"
        );
    }
}
