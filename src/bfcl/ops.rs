//! Python operators on [`PyValue`]s where BFCL methods apply them to caller-supplied values,
//! with CPython's `TypeError` messages (probes pass strings where numbers belong).

use std::cmp::Ordering;

use super::exception::{ExcKind, PyErr};
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

/// A Python binary arithmetic operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArithOp {
    Add,
    Sub,
    Mul,
    Div,
}

impl ArithOp {
    fn symbol(self) -> &'static str {
        match self {
            ArithOp::Add => "+",
            ArithOp::Sub => "-",
            ArithOp::Mul => "*",
            ArithOp::Div => "/",
        }
    }
}

/// `a <op> b` for numbers (`bool`/`int`/`float`; `int` results stay `int` except for `/`),
/// with CPython's `TypeError`s for the operand mixes probes produce (`str + int`,
/// `str * float`, …).
///
/// # Errors
/// `TypeError` for unsupported operands, `ZeroDivisionError` for `/ 0`.
pub fn arith(op: ArithOp, a: &PyValue, b: &PyValue) -> Result<PyValue, PyErr> {
    let int = |v: &PyValue| match v {
        PyValue::Int(i) => Some(*i),
        PyValue::Bool(x) => Some(i64::from(*x)),
        _ => None,
    };
    if let (Some(x), Some(y)) = (int(a), int(b)) {
        let r = match op {
            ArithOp::Add => x.checked_add(y),
            ArithOp::Sub => x.checked_sub(y),
            ArithOp::Mul => x.checked_mul(y),
            ArithOp::Div => None,
        };
        if let Some(r) = r {
            return Ok(PyValue::Int(r));
        }
    }
    if let (Some(x), Some(y)) = (a.as_number(), b.as_number()) {
        return match op {
            ArithOp::Add => Ok(PyValue::Float(x + y)),
            ArithOp::Sub => Ok(PyValue::Float(x - y)),
            ArithOp::Mul => Ok(PyValue::Float(x * y)),
            ArithOp::Div if y == 0.0 => Err(PyErr::new(
                ExcKind::ZeroDivisionError,
                if int(a).is_some() && int(b).is_some() {
                    "division by zero"
                } else {
                    "float division by zero"
                },
            )),
            ArithOp::Div => Ok(PyValue::Float(x / y)),
        };
    }
    match (op, a, b) {
        (ArithOp::Add, PyValue::Str(x), PyValue::Str(y)) => {
            return Ok(PyValue::Str(format!("{x}{y}")))
        }
        (ArithOp::Add, PyValue::List(x), PyValue::List(y)) => {
            return Ok(PyValue::List(x.iter().chain(y).cloned().collect()))
        }
        _ => {}
    }
    let seq = |v: &PyValue| matches!(v, PyValue::Str(_) | PyValue::List(_) | PyValue::Tuple(_));
    let message = match (op, a, b) {
        (ArithOp::Add, PyValue::Str(_), _) => format!(
            "can only concatenate str (not \"{}\") to str",
            b.type_name()
        ),
        (ArithOp::Add, PyValue::List(_), _) => format!(
            "can only concatenate list (not \"{}\") to list",
            b.type_name()
        ),
        (ArithOp::Mul, s, PyValue::Float(_)) if seq(s) => {
            "can't multiply sequence by non-int of type 'float'".to_string()
        }
        (ArithOp::Mul, PyValue::Float(_), s) if seq(s) => {
            "can't multiply sequence by non-int of type 'float'".to_string()
        }
        _ => format!(
            "unsupported operand type(s) for {}: '{}' and '{}'",
            op.symbol(),
            a.type_name(),
            b.type_name()
        ),
    };
    Err(PyErr::type_error(message))
}

/// `float(v)`: numbers convert, strings parse as CPython's `float()` does (surrounding
/// whitespace, `inf`/`nan`, underscores between digits).
///
/// # Errors
/// `ValueError: could not convert string to float: '…'`, or `TypeError` for other types.
pub fn py_float(v: &PyValue) -> Result<f64, PyErr> {
    if let Some(f) = v.as_number() {
        return Ok(f);
    }
    match v {
        PyValue::Str(s) => {
            let t = s.trim();
            let cleaned: String = t.chars().filter(|c| *c != '_').collect();
            let lower = cleaned.to_ascii_lowercase();
            let special = match lower.trim_start_matches(['+', '-']) {
                "inf" | "infinity" => Some(f64::INFINITY),
                "nan" => Some(f64::NAN),
                _ => None,
            };
            let parsed = match special {
                Some(x) if lower.starts_with('-') => Some(-x),
                Some(x) => Some(x),
                None if !t.contains("__") && !t.starts_with('_') && !t.ends_with('_') => {
                    cleaned.parse::<f64>().ok().filter(|_| {
                        cleaned
                            .chars()
                            .all(|c| c.is_ascii_digit() || "+-.eE".contains(c))
                    })
                }
                None => None,
            };
            parsed.ok_or_else(|| {
                PyErr::value_error(format!("could not convert string to float: {}", v.repr()))
            })
        }
        other => Err(PyErr::type_error(format!(
            "float() argument must be a string or a real number, not '{}'",
            other.type_name()
        ))),
    }
}

/// `iter(v)` collected: list/tuple/set items, a string's characters, a dict's keys.
///
/// # Errors
/// `TypeError: '<type>' object is not iterable`.
pub fn py_iter(v: &PyValue) -> Result<Vec<PyValue>, PyErr> {
    match v {
        PyValue::List(items) | PyValue::Tuple(items) | PyValue::Set(items) => Ok(items.clone()),
        PyValue::Str(s) => Ok(s.chars().map(|c| PyValue::Str(c.to_string())).collect()),
        PyValue::Dict(d) => Ok(d.keys().cloned().collect()),
        other => Err(PyErr::type_error(format!(
            "'{}' object is not iterable",
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

    #[test]
    fn arithmetic_and_conversions_match_cpython() {
        let add = |a: PyValue, b: PyValue| arith(ArithOp::Add, &a, &b);
        assert!(matches!(
            add(PyValue::Int(2), PyValue::Int(3)),
            Ok(PyValue::Int(5))
        ));
        assert_eq!(
            add(PyValue::Float(2.0), PyValue::Float(2.64))
                .expect("floats")
                .repr(),
            "4.640000000000001"
        );
        assert_eq!(
            add(PyValue::str("a"), PyValue::str("b"))
                .expect("str")
                .repr(),
            "'ab'"
        );
        assert_eq!(
            add(PyValue::str("a"), PyValue::Int(1))
                .expect_err("str + int")
                .message,
            "can only concatenate str (not \"int\") to str"
        );
        assert_eq!(
            arith(ArithOp::Mul, &PyValue::str("3"), &PyValue::Float(1.5))
                .expect_err("str * float")
                .message,
            "can't multiply sequence by non-int of type 'float'"
        );
        assert_eq!(
            arith(ArithOp::Div, &PyValue::Int(1), &PyValue::Int(0))
                .expect_err("1 / 0")
                .message,
            "division by zero"
        );
        assert_eq!(py_float(&PyValue::str(" 1_000.5 ")), Ok(1000.5));
        assert_eq!(
            py_float(&PyValue::str("abc")).expect_err("abc").message,
            "could not convert string to float: 'abc'"
        );
        assert_eq!(py_iter(&PyValue::str("ab")).expect("chars").len(), 2);
        assert_eq!(
            py_iter(&PyValue::Int(1)).expect_err("int").message,
            "'int' object is not iterable"
        );
    }
}
