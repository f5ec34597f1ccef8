//! A model of the Python values BFCL's API classes take and return, with CPython's exact
//! `repr`, `str` and `json.dumps` (default options) text.
//!
//! BFCL's executor turns every result into text (`str(v)`, or `json.dumps(v)` for dicts), so a
//! faithful port has to print values byte for byte as CPython 3.11 does: `repr(1e-07)` is
//! `1e-07`, `repr(10000.0)` is `10000.0`, strings pick `'` or `"` as quotes, dict keys keep
//! insertion order, `json.dumps` escapes non-ASCII as `\uXXXX`. Source: the BFCL trace README
//! (`../shared/data/bfcl/README.md`, "Executor semantics" and "Value encoding").

use std::fmt::Write as _;

use envace_kernels::pyjson::{float_repr, json_float, write_string};
use serde_json::{Map, Number, Value};

use super::error::BfclError;

/// A Python value. Containers own their elements (no shared references between values).
#[derive(Debug, Clone)]
pub enum PyValue {
    None,
    Bool(bool),
    /// A Python `int` that fits in 64 bits (all values BFCL data and probes produce do).
    Int(i64),
    Float(f64),
    Str(String),
    List(Vec<PyValue>),
    Tuple(Vec<PyValue>),
    Dict(PyDict),
    /// A `set`, in iteration order (CPython's order depends on the hash seed for strings).
    Set(Vec<PyValue>),
    /// An object the port only needs to print (`mpf`, `Decimal`, `complex`, `Ellipsis`):
    /// `json.dumps` rejects it, `repr`/`str` give `repr`.
    Opaque {
        type_name: String,
        repr: String,
    },
}

/// A Python `dict`: insertion-ordered pairs, keys compared with Python equality
/// (`1 == 1.0 == True`).
#[derive(Debug, Clone, Default)]
pub struct PyDict {
    entries: Vec<(PyValue, PyValue)>,
}

impl PyDict {
    /// An empty dict.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when the dict has no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = (&PyValue, &PyValue)> {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    /// The keys in insertion order.
    pub fn keys(&self) -> impl Iterator<Item = &PyValue> {
        self.entries.iter().map(|(k, _)| k)
    }

    /// The values in insertion order.
    pub fn values(&self) -> impl Iterator<Item = &PyValue> {
        self.entries.iter().map(|(_, v)| v)
    }

    fn position(&self, key: &PyValue) -> Option<usize> {
        self.entries.iter().position(|(k, _)| k.py_eq(key))
    }

    /// `d.get(key)`.
    pub fn get(&self, key: &PyValue) -> Option<&PyValue> {
        self.position(key).map(|i| &self.entries[i].1)
    }

    /// `d.get(key)` for a string key.
    pub fn get_str(&self, key: &str) -> Option<&PyValue> {
        self.entries
            .iter()
            .find(|(k, _)| matches!(k, PyValue::Str(s) if s == key))
            .map(|(_, v)| v)
    }

    /// Mutable `d[key]` lookup.
    pub fn get_mut(&mut self, key: &PyValue) -> Option<&mut PyValue> {
        self.position(key).map(move |i| &mut self.entries[i].1)
    }

    /// `d[key] = value`: replaces in place (keeping the position) or appends.
    pub fn insert(&mut self, key: PyValue, value: PyValue) {
        match self.position(&key) {
            Some(i) => self.entries[i].1 = value,
            None => self.entries.push((key, value)),
        }
    }

    /// `d.pop(key)`.
    pub fn remove(&mut self, key: &PyValue) -> Option<PyValue> {
        self.position(key).map(|i| self.entries.remove(i).1)
    }

    /// `key in d`.
    pub fn contains_key(&self, key: &PyValue) -> bool {
        self.position(key).is_some()
    }
}

impl FromIterator<(PyValue, PyValue)> for PyDict {
    fn from_iter<I: IntoIterator<Item = (PyValue, PyValue)>>(iter: I) -> Self {
        let mut d = PyDict::new();
        for (k, v) in iter {
            d.insert(k, v);
        }
        d
    }
}

/// `json.dumps` raised (`TypeError`: a value or key type JSON cannot hold); the executor then
/// falls back to `str(v)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotJsonSerializable {
    /// The Python type name that failed (`mpf`, `set`, …).
    pub type_name: String,
}

impl PyValue {
    /// A `str` value.
    pub fn str(s: impl Into<String>) -> Self {
        PyValue::Str(s.into())
    }

    /// A dict with string keys, in the given order.
    pub fn dict<K: Into<String>>(pairs: impl IntoIterator<Item = (K, PyValue)>) -> Self {
        PyValue::Dict(
            pairs
                .into_iter()
                .map(|(k, v)| (PyValue::Str(k.into()), v))
                .collect(),
        )
    }

    /// Python's `type(v).__name__`.
    pub fn type_name(&self) -> &str {
        match self {
            PyValue::None => "NoneType",
            PyValue::Bool(_) => "bool",
            PyValue::Int(_) => "int",
            PyValue::Float(_) => "float",
            PyValue::Str(_) => "str",
            PyValue::List(_) => "list",
            PyValue::Tuple(_) => "tuple",
            PyValue::Dict(_) => "dict",
            PyValue::Set(_) => "set",
            PyValue::Opaque { type_name, .. } => type_name,
        }
    }

    /// The value as an `f64` if it is a Python number (`bool`, `int`, `float`).
    pub fn as_number(&self) -> Option<f64> {
        match self {
            PyValue::Bool(b) => Some(f64::from(u8::from(*b))),
            PyValue::Int(i) => Some(*i as f64),
            PyValue::Float(f) => Some(*f),
            _ => None,
        }
    }

    /// The string content if this is a `str`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            PyValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// Python truthiness (`bool(v)`).
    pub fn truthy(&self) -> bool {
        match self {
            PyValue::None => false,
            PyValue::Bool(b) => *b,
            PyValue::Int(i) => *i != 0,
            PyValue::Float(f) => *f != 0.0,
            PyValue::Str(s) => !s.is_empty(),
            PyValue::List(v) | PyValue::Tuple(v) | PyValue::Set(v) => !v.is_empty(),
            PyValue::Dict(d) => !d.is_empty(),
            PyValue::Opaque { .. } => true,
        }
    }

    /// Python `==` (numbers compare across `bool`/`int`/`float`; a list never equals a tuple).
    pub fn py_eq(&self, other: &PyValue) -> bool {
        use PyValue::*;
        match (self, other) {
            (None, None) => true,
            (Str(a), Str(b)) => a == b,
            (List(a), List(b)) | (Tuple(a), Tuple(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.py_eq(y))
            }
            (Dict(a), Dict(b)) => {
                a.len() == b.len() && a.iter().all(|(k, v)| b.get(k).is_some_and(|w| v.py_eq(w)))
            }
            (Set(a), Set(b)) => {
                a.len() == b.len() && a.iter().all(|x| b.iter().any(|y| x.py_eq(y)))
            }
            (Opaque { repr: a, .. }, Opaque { repr: b, .. }) => a == b,
            (Int(a), Int(b)) => a == b,
            _ => match (self.as_number(), other.as_number()) {
                (Some(a), Some(b)) => a == b,
                _ => false,
            },
        }
    }

    /// Python's `repr(v)`.
    pub fn repr(&self) -> String {
        let mut out = String::new();
        self.write_repr(&mut out);
        out
    }

    /// Python's `str(v)`: the string itself for `str`, else `repr(v)`.
    pub fn to_py_str(&self) -> String {
        match self {
            PyValue::Str(s) => s.clone(),
            other => other.repr(),
        }
    }

    fn write_repr(&self, out: &mut String) {
        match self {
            PyValue::None => out.push_str("None"),
            PyValue::Bool(true) => out.push_str("True"),
            PyValue::Bool(false) => out.push_str("False"),
            PyValue::Int(i) => {
                let _ = write!(out, "{i}");
            }
            PyValue::Float(f) => out.push_str(&float_repr(*f)),
            PyValue::Str(s) => out.push_str(&str_repr(s)),
            PyValue::List(items) => {
                out.push('[');
                write_items(out, items);
                out.push(']');
            }
            PyValue::Tuple(items) => {
                out.push('(');
                write_items(out, items);
                if items.len() == 1 {
                    out.push(',');
                }
                out.push(')');
            }
            PyValue::Set(items) if items.is_empty() => out.push_str("set()"),
            PyValue::Set(items) => {
                out.push('{');
                write_items(out, items);
                out.push('}');
            }
            PyValue::Dict(d) => {
                out.push('{');
                for (i, (k, v)) in d.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    k.write_repr(out);
                    out.push_str(": ");
                    v.write_repr(out);
                }
                out.push('}');
            }
            PyValue::Opaque { repr, .. } => out.push_str(repr),
        }
    }

    /// `json.dumps(v)` with default options (`ensure_ascii=True`, separators `", "` and
    /// `": "`, `allow_nan=True`, non-`str` keys of type int/float/bool/None converted).
    ///
    /// # Errors
    /// [`NotJsonSerializable`] where CPython raises `TypeError` (sets, opaque objects, keys of
    /// other types).
    pub fn json_dumps(&self) -> Result<String, NotJsonSerializable> {
        let mut out = String::new();
        self.write_json(&mut out)?;
        Ok(out)
    }

    fn write_json(&self, out: &mut String) -> Result<(), NotJsonSerializable> {
        match self {
            PyValue::None => out.push_str("null"),
            PyValue::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            PyValue::Int(i) => {
                let _ = write!(out, "{i}");
            }
            PyValue::Float(f) => out.push_str(&json_float(*f)),
            PyValue::Str(s) => write_string(out, s, true),
            PyValue::List(items) | PyValue::Tuple(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    item.write_json(out)?;
                }
                out.push(']');
            }
            PyValue::Dict(d) => {
                out.push('{');
                for (i, (k, v)) in d.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    let key = match k {
                        PyValue::Str(s) => s.clone(),
                        PyValue::Int(i) => i.to_string(),
                        PyValue::Float(f) => json_float(*f),
                        PyValue::Bool(b) => (if *b { "true" } else { "false" }).to_string(),
                        PyValue::None => "null".to_string(),
                        other => {
                            return Err(NotJsonSerializable {
                                type_name: other.type_name().to_string(),
                            })
                        }
                    };
                    write_string(out, &key, true);
                    out.push_str(": ");
                    v.write_json(out)?;
                }
                out.push('}');
            }
            PyValue::Set(_) | PyValue::Opaque { .. } => {
                return Err(NotJsonSerializable {
                    type_name: self.type_name().to_string(),
                })
            }
        }
        Ok(())
    }

    /// Converts plain JSON (a JSON tool call's arguments, a task's `initial_config`) into a
    /// Python value as `json.loads` would: objects become dicts with `str` keys, integral
    /// numbers `int`, others `float`.
    pub fn from_json(v: &Value) -> PyValue {
        match v {
            Value::Null => PyValue::None,
            Value::Bool(b) => PyValue::Bool(*b),
            Value::Number(n) => number_to_py(n),
            Value::String(s) => PyValue::Str(s.clone()),
            Value::Array(a) => PyValue::List(a.iter().map(PyValue::from_json).collect()),
            Value::Object(m) => PyValue::Dict(
                m.iter()
                    .map(|(k, v)| (PyValue::Str(k.clone()), PyValue::from_json(v)))
                    .collect(),
            ),
        }
    }

    /// Decodes the trace value encoding (`__pydict__`, `__pyset__`, `__pyfloat__`,
    /// `__pyobj__` tags; see the BFCL trace README, "Value encoding").
    ///
    /// # Errors
    /// [`BfclError::Encoding`] for a malformed tag.
    pub fn from_encoded(v: &Value) -> Result<PyValue, BfclError> {
        Ok(match v {
            Value::Array(a) => PyValue::List(
                a.iter()
                    .map(PyValue::from_encoded)
                    .collect::<Result<_, _>>()?,
            ),
            Value::Object(m) => {
                if let Some(pairs) = m.get("__pydict__") {
                    let pairs = pairs
                        .as_array()
                        .ok_or_else(|| bad_tag("__pydict__", pairs))?;
                    let mut d = PyDict::new();
                    for pair in pairs {
                        match pair.as_array().map(Vec::as_slice) {
                            Some([k, v]) => {
                                d.insert(PyValue::from_encoded(k)?, PyValue::from_encoded(v)?)
                            }
                            _ => return Err(bad_tag("__pydict__", pair)),
                        }
                    }
                    PyValue::Dict(d)
                } else if let Some(items) = m.get("__pyset__") {
                    let items = items
                        .as_array()
                        .ok_or_else(|| bad_tag("__pyset__", items))?;
                    PyValue::Set(
                        items
                            .iter()
                            .map(PyValue::from_encoded)
                            .collect::<Result<_, _>>()?,
                    )
                } else if let Some(f) = m.get("__pyfloat__") {
                    match f.as_str() {
                        Some("nan") => PyValue::Float(f64::NAN),
                        Some("inf") => PyValue::Float(f64::INFINITY),
                        Some("-inf") => PyValue::Float(f64::NEG_INFINITY),
                        _ => return Err(bad_tag("__pyfloat__", f)),
                    }
                } else if let Some(t) = m.get("__pyobj__") {
                    let type_name = t.as_str().ok_or_else(|| bad_tag("__pyobj__", t))?;
                    let repr = m
                        .get("repr")
                        .and_then(Value::as_str)
                        .ok_or_else(|| bad_tag("__pyobj__", v))?;
                    PyValue::Opaque {
                        type_name: type_name.to_string(),
                        repr: repr.to_string(),
                    }
                } else {
                    let mut d = PyDict::new();
                    for (k, v) in m {
                        d.insert(PyValue::Str(k.clone()), PyValue::from_encoded(v)?);
                    }
                    PyValue::Dict(d)
                }
            }
            other => PyValue::from_json(other),
        })
    }

    /// Encodes the value in the trace encoding (inverse of [`PyValue::from_encoded`]; tuples
    /// become arrays, sets are sorted).
    pub fn to_encoded(&self) -> Value {
        match self {
            PyValue::None => Value::Null,
            PyValue::Bool(b) => Value::Bool(*b),
            PyValue::Int(i) => Value::from(*i),
            PyValue::Float(f) if f.is_nan() => tagged("__pyfloat__", Value::from("nan")),
            PyValue::Float(f) if f.is_infinite() => tagged(
                "__pyfloat__",
                Value::from(if *f > 0.0 { "inf" } else { "-inf" }),
            ),
            PyValue::Float(f) => Number::from_f64(*f).map_or(Value::Null, Value::Number),
            PyValue::Str(s) => Value::String(s.clone()),
            PyValue::List(items) | PyValue::Tuple(items) => {
                Value::Array(items.iter().map(PyValue::to_encoded).collect())
            }
            PyValue::Dict(d) => {
                if d.keys().all(|k| matches!(k, PyValue::Str(_))) {
                    let mut m = Map::new();
                    for (k, v) in d.iter() {
                        if let PyValue::Str(k) = k {
                            m.insert(k.clone(), v.to_encoded());
                        }
                    }
                    Value::Object(m)
                } else {
                    let pairs = d
                        .iter()
                        .map(|(k, v)| Value::Array(vec![k.to_encoded(), v.to_encoded()]))
                        .collect();
                    tagged("__pydict__", Value::Array(pairs))
                }
            }
            PyValue::Set(items) => {
                let mut sorted = items.clone();
                sorted.sort_by(|a, b| {
                    match (a.as_number(), b.as_number()) {
                        (Some(x), Some(y)) => x.partial_cmp(&y),
                        _ => a.as_str().partial_cmp(&b.as_str()),
                    }
                    .unwrap_or(std::cmp::Ordering::Equal)
                });
                tagged(
                    "__pyset__",
                    Value::Array(sorted.iter().map(PyValue::to_encoded).collect()),
                )
            }
            PyValue::Opaque { type_name, repr } => {
                let mut m = Map::new();
                m.insert("__pyobj__".into(), Value::from(type_name.as_str()));
                m.insert("repr".into(), Value::from(repr.as_str()));
                Value::Object(m)
            }
        }
    }
}

fn tagged(tag: &str, v: Value) -> Value {
    let mut m = Map::new();
    m.insert(tag.to_string(), v);
    Value::Object(m)
}

fn bad_tag(tag: &str, v: &Value) -> BfclError {
    BfclError::Encoding(format!("malformed {tag} value: {v}"))
}

fn number_to_py(n: &Number) -> PyValue {
    if let Some(i) = n.as_i64() {
        PyValue::Int(i)
    } else {
        PyValue::Float(n.as_f64().unwrap_or(f64::NAN))
    }
}

fn write_items(out: &mut String, items: &[PyValue]) {
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        item.write_repr(out);
    }
}

/// CPython's `repr(str)`: single quotes unless the text holds `'` and no `"`; escapes
/// backslash, the quote, `\t\n\r`, other non-printable characters as `\xNN`/`\uNNNN`/
/// `\UNNNNNNNN`. "Printable" follows `str.isprintable` for the characters that occur in
/// practice (controls, separators, format characters, private use); unassigned code points
/// are treated as printable, which CPython does not.
pub fn str_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !is_printable(c) => {
                let code = c as u32;
                if code <= 0xff {
                    let _ = write!(out, "\\x{code:02x}");
                } else if code <= 0xffff {
                    let _ = write!(out, "\\u{code:04x}");
                } else {
                    let _ = write!(out, "\\U{code:08x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

fn is_printable(c: char) -> bool {
    let code = c as u32;
    !matches!(code,
        0..=0x1f | 0x7f..=0xa0 | 0xad
        | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x180e | 0x1680
        | 0x2000..=0x200f | 0x2028..=0x202f | 0x205f..=0x2064 | 0x2066..=0x206f
        | 0x3000 | 0xe000..=0xf8ff | 0xfeff | 0xfff9..=0xfffb
        | 0xf0000..=0x10ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_cpython() {
        let cases = [
            (10000.0, "10000.0"),
            (1e-07, "1e-07"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (-0.0, "-0.0"),
            (2.5000001, "2.5000001"),
            (1.6069380442589903e60, "1.6069380442589903e+60"),
            (3.162277660168379e-18, "3.162277660168379e-18"),
            (111.92365689097284, "111.92365689097284"),
            (0.1 + 0.2, "0.30000000000000004"),
            (123456789012345678.0, "1.2345678901234568e+17"),
        ];
        for (f, want) in cases {
            assert_eq!(float_repr(f), want, "{f:e}");
        }
    }

    #[test]
    fn str_repr_picks_quotes_and_escapes() {
        assert_eq!(str_repr("abc"), "'abc'");
        assert_eq!(str_repr("I'll"), "\"I'll\"");
        assert_eq!(str_repr("a'b\"c"), "'a\\'b\"c'");
        assert_eq!(str_repr("tab\there\n"), "'tab\\there\\n'");
        assert_eq!(str_repr("café\u{7f}"), "'café\\x7f'");
    }

    #[test]
    fn json_dumps_default_options() {
        let v = PyValue::dict([
            ("name", PyValue::str("Zoë \"Z\"")),
            ("n", PyValue::Int(3)),
            ("x", PyValue::Float(1e-07)),
            (
                "l",
                PyValue::List(vec![
                    PyValue::None,
                    PyValue::Bool(true),
                    PyValue::Float(2.0),
                ]),
            ),
        ]);
        assert_eq!(
            v.json_dumps().expect("serializable"),
            r#"{"name": "Zo\u00eb \"Z\"", "n": 3, "x": 1e-07, "l": [null, true, 2.0]}"#
        );
        let mut d = PyDict::new();
        d.insert(PyValue::Int(12345), PyValue::str("a"));
        assert_eq!(
            PyValue::Dict(d).json_dumps().expect("int keys"),
            r#"{"12345": "a"}"#
        );
        let opaque = PyValue::dict([(
            "result",
            PyValue::Opaque {
                type_name: "mpf".into(),
                repr: "mpf('2.0')".into(),
            },
        )]);
        assert!(opaque.json_dumps().is_err());
        assert_eq!(opaque.repr(), "{'result': mpf('2.0')}");
    }

    #[test]
    fn repr_of_containers() {
        let v = PyValue::List(vec![
            PyValue::dict([("error", PyValue::str("x"))]),
            PyValue::Tuple(vec![PyValue::Int(1)]),
            PyValue::Set(vec![]),
            PyValue::None,
        ]);
        assert_eq!(v.repr(), "[{'error': 'x'}, (1,), set(), None]");
    }

    #[test]
    fn encoding_round_trips_tags() {
        let enc: Value = serde_json::from_str(
            r#"{"__pydict__": [[1, {"a": [1.5, "x"]}], ["order_type", "Buy"]]}"#,
        )
        .expect("json");
        let v = PyValue::from_encoded(&enc).expect("decode");
        assert_eq!(v.to_encoded(), enc);
        let set: Value = serde_json::from_str(r#"{"__pyset__": [3, 10]}"#).expect("json");
        let decoded = PyValue::from_encoded(&set).expect("decode");
        assert_eq!(decoded.to_encoded(), set);
        assert!(PyValue::Int(1).py_eq(&PyValue::Float(1.0)));
        assert!(!PyValue::List(vec![]).py_eq(&PyValue::Tuple(vec![])));
    }
}
