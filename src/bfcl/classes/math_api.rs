//! `MathAPI`: stateless arithmetic and statistics (state `{}`; never loaded).
//!
//! Observed reference behaviour (BFCL trace README, "MathAPI", and the traces): results are
//! `{"result": x}` with Python's numeric types kept (`max_value([3, 16])` is an `int`,
//! `mean` a `float`, `True + -4.0` is `-3.0`); errors are soft (`{"error": …}`);
//! `standard_deviation` is the population deviation; `logarithm` returns an mpmath `mpf`
//! computed as `ln(value)/ln(base)` with each step rounded to `dps = precision` and printed
//! by mpmath's repr; `square_root` returns a `Decimal` at `prec = precision` digits.
//!
//! Approximations of this first port (documented, checked by the conformance counts):
//! `logarithm` uses binary64 logarithms rounded to the mpmath precision (exact for the
//! precisions BFCL uses, up to about 15 digits); `square_root` formats a binary64 square
//! root; the SI/imperial conversion tables are not ported (only the same-unit and
//! unsupported-unit paths the traces reach).

use serde_json::Map;
use serde_json::Value;

use super::{error_dict, PythonClass};
use crate::bfcl::exception::PyErr;
use crate::bfcl::signature::{opt, req, Bound, Param};
use crate::bfcl::value::PyValue;

const CLASS: &str = "MathAPI";
const METHODS: &[&str] = &[
    "absolute_value",
    "add",
    "divide",
    "imperial_si_conversion",
    "logarithm",
    "max_value",
    "mean",
    "min_value",
    "multiply",
    "percentage",
    "power",
    "round_number",
    "si_unit_conversion",
    "square_root",
    "standard_deviation",
    "subtract",
    "sum_values",
];

/// The stateless math API.
#[derive(Debug, Clone, Copy)]
pub struct MathApi;

fn result(v: PyValue) -> PyValue {
    PyValue::dict([("result", v)])
}

fn num(v: &PyValue, op: &str, other: &PyValue) -> Result<f64, PyErr> {
    v.as_number().ok_or_else(|| {
        PyErr::type_error(format!(
            "unsupported operand type(s) for {op}: '{}' and '{}'",
            v.type_name(),
            other.type_name()
        ))
    })
}

/// Python `a <op> b` for numbers: int op int stays int (except `/`), otherwise float.
fn arith(a: &PyValue, b: &PyValue, op: char) -> Result<PyValue, PyErr> {
    let ints = |v: &PyValue| match v {
        PyValue::Int(i) => Some(*i),
        PyValue::Bool(b) => Some(i64::from(*b)),
        _ => None,
    };
    let sym = op.to_string();
    let (x, y) = (num(a, &sym, b)?, num(b, &sym, a)?);
    if let (Some(i), Some(j)) = (ints(a), ints(b)) {
        let r = match op {
            '+' => i.checked_add(j),
            '-' => i.checked_sub(j),
            '*' => i.checked_mul(j),
            _ => None,
        };
        if let Some(r) = r {
            return Ok(PyValue::Int(r));
        }
    }
    Ok(PyValue::Float(match op {
        '+' => x + y,
        '-' => x - y,
        '*' => x * y,
        _ => x / y,
    }))
}

/// The numbers of a list argument, or the "must be numbers" soft error.
fn numbers(v: &PyValue, empty: &str) -> Result<Vec<PyValue>, PyValue> {
    let items: Vec<PyValue> = match v {
        PyValue::List(l) | PyValue::Tuple(l) | PyValue::Set(l) => l.clone(),
        PyValue::Str(s) => s.chars().map(|c| PyValue::Str(c.to_string())).collect(),
        PyValue::Dict(d) => d.keys().cloned().collect(),
        _ => Vec::new(),
    };
    if items.is_empty() {
        return Err(error_dict(empty));
    }
    if items
        .iter()
        .any(|x| !matches!(x, PyValue::Int(_) | PyValue::Float(_) | PyValue::Bool(_)))
    {
        return Err(error_dict("All elements in the list must be numbers"));
    }
    Ok(items)
}

fn sum(items: &[PyValue]) -> PyValue {
    items.iter().fold(PyValue::Int(0), |acc, x| {
        arith(&acc, x, '+').unwrap_or(PyValue::Float(f64::NAN))
    })
}

/// `round(x, ndigits)` for a float (exact decimal rounding, ties to even).
fn round_float(x: f64, ndigits: i64) -> f64 {
    if ndigits <= 0 {
        let p = 10f64.powi(ndigits.unsigned_abs().min(308) as i32);
        let y = x / p;
        let r = y.round();
        let r = if (y - y.trunc()).abs() == 0.5 {
            2.0 * (y / 2.0).round()
        } else {
            r
        };
        return r * p;
    }
    if ndigits > 330 {
        return x;
    }
    format!("{x:.*}", ndigits as usize).parse().unwrap_or(x)
}

/// mpmath's binary precision for `dps` decimal digits (`dps_to_prec`).
fn dps_to_prec(dps: i64) -> u32 {
    (((dps as f64 + 1.0) * std::f64::consts::LOG2_10).round() as i64).max(1) as u32
}

/// Rounds `x` to `prec` significant bits, ties to even.
fn round_bits(x: f64, prec: u32) -> f64 {
    if x == 0.0 || !x.is_finite() || prec >= 53 {
        return x;
    }
    let e = x.abs().log2().floor() as i32;
    let scale = 2f64.powi(prec as i32 - 1 - e);
    let y = x * scale;
    let r = y.round();
    let r = if (y - y.trunc()).abs() == 0.5 {
        2.0 * (y / 2.0).round()
    } else {
        r
    };
    r / scale
}

/// mpmath's `repr` of a value at binary precision `prec`: `mpf('…')` with
/// `prec_to_dps(prec) + 3` significant digits, trailing zeros stripped.
fn mpf_repr(x: f64, prec: u32) -> String {
    let dps = ((f64::from(prec) / std::f64::consts::LOG2_10).round() as i64 - 1).max(1);
    let digits = if dps == 15 { 17 } else { dps + 3 } as usize;
    let s = format!("{:.*e}", digits.saturating_sub(1), x);
    let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let mut digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    while digits.len() > 1 && digits.ends_with('0') {
        digits.pop();
    }
    let point = exp + 1;
    let body = if point <= 0 {
        format!("0.{}{}", "0".repeat(point.unsigned_abs() as usize), digits)
    } else if point as usize >= digits.len() {
        format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
    } else {
        format!(
            "{}.{}",
            &digits[..point as usize],
            &digits[point as usize..]
        )
    };
    format!("mpf('{sign}{body}')")
}

fn to_float_arg(v: &PyValue) -> Option<f64> {
    match v {
        PyValue::Str(s) => s.trim().parse().ok(),
        other => other.as_number(),
    }
}

fn to_int_arg(v: &PyValue) -> Option<i64> {
    match v {
        PyValue::Str(s) => s.trim().parse().ok(),
        PyValue::Float(f) => Some(*f as i64),
        PyValue::Int(i) => Some(*i),
        PyValue::Bool(b) => Some(i64::from(*b)),
        _ => None,
    }
}

/// `str(Decimal(x).sqrt())` at `prec` significant digits (binary64 approximation).
fn decimal_sqrt(x: f64, prec: i64) -> String {
    let r = x.sqrt();
    if r == 0.0 {
        return "0".into();
    }
    if r.fract() == 0.0 && r * r == x && r < 1e15 {
        return format!("{r}");
    }
    let s = format!("{:.*e}", (prec.max(1) - 1) as usize, r);
    let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
    let exp: i64 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let n = digits.len() as i64;
    let e = exp - (n - 1);
    if e <= 0 && exp >= -6 {
        if exp < 0 {
            format!("0.{}{}", "0".repeat((-exp - 1) as usize), digits)
        } else {
            let point = (exp + 1) as usize;
            if point >= digits.len() {
                digits
            } else {
                format!("{}.{}", &digits[..point], &digits[point..])
            }
        }
    } else {
        let tail = if n > 1 {
            format!(".{}", &digits[1..])
        } else {
            String::new()
        };
        format!(
            "{}{}E{}{}",
            &digits[..1],
            tail,
            if exp < 0 { '-' } else { '+' },
            exp.abs()
        )
    }
}

impl MathApi {
    fn dispatch(method: &str, b: &Bound) -> Result<PyValue, PyErr> {
        let a = |i: usize| b.req(i).clone();
        match method {
            "add" => Ok(result(arith(&a(0), &a(1), '+')?)),
            "subtract" => Ok(result(arith(&a(0), &a(1), '-')?)),
            "multiply" => Ok(result(arith(&a(0), &a(1), '*')?)),
            "divide" => {
                if a(1).as_number() == Some(0.0) {
                    return Ok(error_dict("Cannot divide by zero"));
                }
                Ok(result(arith(&a(0), &a(1), '/')?))
            }
            "absolute_value" => Ok(result(match a(0) {
                PyValue::Int(i) => PyValue::Int(i.abs()),
                PyValue::Bool(x) => PyValue::Int(i64::from(x)),
                v => PyValue::Float(
                    v.as_number()
                        .ok_or_else(|| {
                            PyErr::type_error(format!(
                                "bad operand type for abs(): '{}'",
                                v.type_name()
                            ))
                        })?
                        .abs(),
                ),
            })),
            "power" => {
                let (x, y) = (a(0), a(1));
                if let (PyValue::Int(i), PyValue::Int(j)) = (&x, &y) {
                    if let Some(r) = u32::try_from(*j).ok().and_then(|j| i.checked_pow(j)) {
                        return Ok(result(PyValue::Int(r)));
                    }
                }
                let (p, q) = (num(&x, "** or pow()", &y)?, num(&y, "** or pow()", &x)?);
                Ok(result(PyValue::Float(p.powf(q))))
            }
            "percentage" => {
                if a(1).as_number() == Some(0.0) {
                    return Ok(error_dict("Whole value cannot be zero"));
                }
                let q = arith(&a(0), &a(1), '/')?;
                Ok(result(arith(&q, &PyValue::Int(100), '*')?))
            }
            "round_number" => {
                let places = b.or(1, PyValue::Int(0));
                let nd = to_int_arg(&places).unwrap_or(0);
                Ok(result(match a(0) {
                    PyValue::Int(i) if nd >= 0 => PyValue::Int(i),
                    v => PyValue::Float(round_float(v.as_number().unwrap_or(f64::NAN), nd)),
                }))
            }
            "mean" => match numbers(&a(0), "Cannot calculate mean of an empty list") {
                Err(e) => Ok(e),
                Ok(items) => {
                    let total = sum(&items).as_number().unwrap_or(f64::NAN);
                    Ok(result(PyValue::Float(total / items.len() as f64)))
                }
            },
            "standard_deviation" => {
                match numbers(
                    &a(0),
                    "Cannot calculate standard deviation of an empty list",
                ) {
                    Err(e) => Ok(e),
                    Ok(items) => {
                        let n = items.len() as f64;
                        let xs: Vec<f64> = items.iter().filter_map(PyValue::as_number).collect();
                        let mean = xs.iter().sum::<f64>() / n;
                        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
                        Ok(result(PyValue::Float(var.sqrt())))
                    }
                }
            }
            "max_value" | "min_value" => {
                let empty = if method == "max_value" {
                    "Cannot find maximum of an empty list"
                } else {
                    "Cannot find minimum of an empty list"
                };
                match numbers(&a(0), empty) {
                    Err(e) => Ok(e),
                    Ok(items) => {
                        let mut best = items[0].clone();
                        for x in &items[1..] {
                            let (p, q) = (x.as_number(), best.as_number());
                            let better = if method == "max_value" { p > q } else { p < q };
                            if better {
                                best = x.clone();
                            }
                        }
                        Ok(result(best))
                    }
                }
            }
            "sum_values" => match numbers(&a(0), "Cannot calculate sum of an empty list") {
                Err(e) => Ok(e),
                Ok(items) => Ok(result(sum(&items))),
            },
            "si_unit_conversion" | "imperial_si_conversion" => {
                let (value, unit_in, unit_out) = (a(0), a(1), a(2));
                if method == "imperial_si_conversion" && unit_in.py_eq(&unit_out) {
                    return Ok(result(value));
                }
                Ok(error_dict(format!(
                    "Conversion from '{}' to '{}' is not supported",
                    unit_in.to_py_str(),
                    unit_out.to_py_str()
                )))
            }
            "logarithm" => {
                let prec = dps_to_prec(to_int_arg(&a(2)).unwrap_or(15));
                let (Some(x), Some(base)) = (to_float_arg(&a(0)), to_float_arg(&a(1))) else {
                    return Ok(error_dict("could not convert the arguments to numbers"));
                };
                let num = round_bits(x.ln(), prec);
                let den = round_bits(base.ln(), prec);
                let repr = mpf_repr(round_bits(num / den, prec), prec);
                Ok(result(PyValue::Opaque {
                    type_name: "mpf".into(),
                    repr,
                }))
            }
            "square_root" => {
                let x = a(0).as_number().unwrap_or(f64::NAN);
                if x < 0.0 {
                    return Ok(error_dict(
                        "Cannot calculate square root of a negative number",
                    ));
                }
                let prec = to_int_arg(&a(1)).unwrap_or(28);
                if prec < 1 {
                    return Err(PyErr::value_error("valid range for prec is [1, MAX_PREC]"));
                }
                Ok(result(PyValue::Opaque {
                    type_name: "Decimal".into(),
                    repr: format!("Decimal('{}')", decimal_sqrt(x, prec)),
                }))
            }
            _ => Err(PyErr::no_attribute(&PyValue::None, method)),
        }
    }
}

fn params(method: &str) -> &'static [Param] {
    const AB: [Param; 2] = [req("a"), req("b")];
    const NUMBER: [Param; 1] = [req("number")];
    const NUMBERS: [Param; 1] = [req("numbers")];
    const CONVERT: [Param; 3] = [req("value"), req("unit_in"), req("unit_out")];
    const LOG: [Param; 3] = [req("value"), req("base"), req("precision")];
    const PERCENT: [Param; 2] = [req("part"), req("whole")];
    const POWER: [Param; 2] = [req("base"), req("exponent")];
    const ROUND: [Param; 2] = [req("number"), opt("decimal_places")];
    const SQRT: [Param; 2] = [req("number"), req("precision")];
    match method {
        "add" | "subtract" | "multiply" | "divide" => &AB,
        "absolute_value" => &NUMBER,
        "max_value" | "min_value" | "mean" | "standard_deviation" | "sum_values" => &NUMBERS,
        "si_unit_conversion" | "imperial_si_conversion" => &CONVERT,
        "logarithm" => &LOG,
        "percentage" => &PERCENT,
        "power" => &POWER,
        "round_number" => &ROUND,
        "square_root" => &SQRT,
        _ => &[],
    }
}

impl PythonClass for MathApi {
    const CLASS: &'static str = CLASS;
    const METHODS: &'static [&'static str] = METHODS;

    fn params(method: &str) -> &'static [Param] {
        params(method)
    }

    fn call_bound(&mut self, method: &str, bound: Bound) -> Result<PyValue, PyErr> {
        Self::dispatch(method, &bound)
    }

    fn vars(&self) -> Map<String, Value> {
        Map::new()
    }
}
