//! Parsing tool calls into one call type, without evaluating anything.
//!
//! Two input forms:
//! * BFCL's Python-call strings, e.g. `cd(folder='document')`,
//!   `sort('final_report.pdf')`, `mean(numbers=[1, -2.5e3])`: a (possibly dotted) name, then
//!   positional and keyword arguments whose values are Python literals (strings with escapes
//!   and prefixes `r`/`u`, ints in any base, floats incl. scientific, `True`/`False`/`None`,
//!   lists, tuples, dicts, sets, unary `+`/`-` on numbers).
//! * JSON tool calls `{"name": …, "arguments": {…}}` (`parameters` accepted as an alias, and
//!   `arguments` given as a JSON string is decoded, as the EnvACE reference accepts).
//!
//! Anything else is a [`ParseError`] with a character offset. The reference `eval`s the
//! string; this port only accepts literals, so a bare identifier used as a value is reported
//! as [`ParseError::Name`] (the executor turns it into the reference's `NameError` text).

use serde_json::Value;

use super::value::{PyDict, PyValue};

/// Nesting limit for containers; deeper input is rejected instead of risking the stack.
pub const MAX_DEPTH: usize = 64;

/// A parsed call: the callee name and its arguments, in source order.
#[derive(Debug, Clone)]
pub struct PyCall {
    /// The callee as written (may be dotted, e.g. `os.remove`).
    pub name: String,
    /// Positional arguments.
    pub args: Vec<PyValue>,
    /// Keyword arguments (a repeated keyword is a parse error, as in Python).
    pub kwargs: Vec<(String, PyValue)>,
}

/// Why a call string or JSON call could not be parsed. Offsets count characters from 0.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("empty call")]
    Empty,
    #[error("expected {expected} at offset {offset}, found {found}")]
    Expected {
        expected: &'static str,
        offset: usize,
        found: String,
    },
    #[error("unterminated string literal starting at offset {offset}")]
    UnterminatedString { offset: usize },
    #[error("invalid escape sequence in string at offset {offset}")]
    InvalidEscape { offset: usize },
    #[error("invalid number literal {text:?} at offset {offset}")]
    InvalidNumber { offset: usize, text: String },
    #[error("name {name:?} at offset {offset} is not a literal")]
    Name { name: String, offset: usize },
    #[error("unsupported expression at offset {offset}: {what}")]
    Unsupported { offset: usize, what: String },
    #[error("positional argument follows keyword argument at offset {offset}")]
    PositionalAfterKeyword { offset: usize },
    #[error("keyword argument repeated: {name}")]
    DuplicateKeyword { name: String },
    #[error("nesting deeper than {MAX_DEPTH} at offset {offset}")]
    TooDeep { offset: usize },
    #[error("unexpected input after the call at offset {offset}")]
    TrailingInput { offset: usize },
    #[error("invalid JSON tool call: {0}")]
    Json(String),
}

/// Parses one BFCL Python-call string.
///
/// # Errors
/// [`ParseError`] for anything that is not `name(literal args…)`.
pub fn parse_python_call(src: &str) -> Result<PyCall, ParseError> {
    let mut p = Parser {
        chars: src.chars().collect(),
        pos: 0,
    };
    p.skip_ws();
    if p.at_end() {
        return Err(ParseError::Empty);
    }
    let name = p.dotted_name()?;
    p.skip_ws();
    p.expect('(', "'('")?;
    let (args, kwargs) = p.arguments()?;
    p.skip_ws();
    if !p.at_end() {
        return Err(ParseError::TrailingInput { offset: p.pos });
    }
    Ok(PyCall { name, args, kwargs })
}

/// Parses a JSON tool call `{"name": …, "arguments": {…}}`.
///
/// # Errors
/// [`ParseError::Json`] for bad JSON, a missing or non-string name, or arguments that are not
/// an object.
pub fn parse_json_call(src: &str) -> Result<PyCall, ParseError> {
    let v: Value = serde_json::from_str(src).map_err(|e| ParseError::Json(e.to_string()))?;
    json_value_to_call(&v)
}

/// Converts an already-decoded JSON tool call (see [`parse_json_call`]).
///
/// # Errors
/// As [`parse_json_call`].
pub fn json_value_to_call(v: &Value) -> Result<PyCall, ParseError> {
    let obj = v
        .as_object()
        .ok_or_else(|| ParseError::Json("a tool call must be a JSON object".into()))?;
    let name = obj
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| ParseError::Json("missing string field \"name\"".into()))?;
    let raw_args = obj.get("arguments").or_else(|| obj.get("parameters"));
    let decoded;
    let args = match raw_args {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => {
            decoded = serde_json::from_str::<Value>(s)
                .map_err(|e| ParseError::Json(format!("arguments string: {e}")))?;
            Some(&decoded)
        }
        Some(other) => Some(other),
    };
    let kwargs = match args {
        None => Vec::new(),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| (k.clone(), PyValue::from_json(v)))
            .collect(),
        Some(_) => return Err(ParseError::Json("\"arguments\" must be an object".into())),
    };
    Ok(PyCall {
        name: name.to_string(),
        args: Vec::new(),
        kwargs,
    })
}

struct Parser {
    chars: Vec<char>,
    pos: usize,
}

impl Parser {
    fn at_end(&self) -> bool {
        self.pos >= self.chars.len()
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn peek_at(&self, k: usize) -> Option<char> {
        self.chars.get(self.pos + k).copied()
    }

    fn skip_ws(&mut self) {
        while let Some(c) = self.peek() {
            if c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\u{c}' {
                self.pos += 1;
            } else if c == '\\' && matches!(self.peek_at(1), Some('\n')) {
                self.pos += 2;
            } else {
                break;
            }
        }
    }

    fn found(&self) -> String {
        match self.peek() {
            Some(c) => format!("{c:?}"),
            None => "end of input".into(),
        }
    }

    fn expect(&mut self, c: char, expected: &'static str) -> Result<(), ParseError> {
        if self.peek() == Some(c) {
            self.pos += 1;
            Ok(())
        } else {
            Err(ParseError::Expected {
                expected,
                offset: self.pos,
                found: self.found(),
            })
        }
    }

    fn identifier(&mut self) -> Option<String> {
        let start = self.pos;
        match self.peek() {
            Some(c) if c == '_' || c.is_alphabetic() => self.pos += 1,
            _ => return None,
        }
        while let Some(c) = self.peek() {
            if c == '_' || c.is_alphanumeric() {
                self.pos += 1;
            } else {
                break;
            }
        }
        Some(self.chars[start..self.pos].iter().collect())
    }

    fn dotted_name(&mut self) -> Result<String, ParseError> {
        let mut name = self.identifier().ok_or_else(|| ParseError::Expected {
            expected: "a function name",
            offset: self.pos,
            found: self.found(),
        })?;
        loop {
            self.skip_ws();
            if self.peek() != Some('.') {
                return Ok(name);
            }
            self.pos += 1;
            self.skip_ws();
            let part = self.identifier().ok_or_else(|| ParseError::Expected {
                expected: "a name after '.'",
                offset: self.pos,
                found: self.found(),
            })?;
            name.push('.');
            name.push_str(&part);
        }
    }

    /// After `(`: arguments up to and including `)`.
    #[allow(clippy::type_complexity)]
    fn arguments(&mut self) -> Result<(Vec<PyValue>, Vec<(String, PyValue)>), ParseError> {
        let mut args = Vec::new();
        let mut kwargs: Vec<(String, PyValue)> = Vec::new();
        loop {
            self.skip_ws();
            if self.peek() == Some(')') {
                self.pos += 1;
                return Ok((args, kwargs));
            }
            let start = self.pos;
            // A keyword argument is `identifier =` (but not `==`).
            let keyword = match self.identifier() {
                Some(id) => {
                    self.skip_ws();
                    if self.peek() == Some('=') && self.peek_at(1) != Some('=') {
                        self.pos += 1;
                        Some(id)
                    } else {
                        self.pos = start;
                        None
                    }
                }
                None => None,
            };
            let value = self.expr(1)?;
            match keyword {
                Some(k) => {
                    if kwargs.iter().any(|(name, _)| *name == k) {
                        return Err(ParseError::DuplicateKeyword { name: k });
                    }
                    kwargs.push((k, value));
                }
                None if !kwargs.is_empty() => {
                    return Err(ParseError::PositionalAfterKeyword { offset: start })
                }
                None => args.push(value),
            }
            self.skip_ws();
            match self.peek() {
                Some(',') => self.pos += 1,
                Some(')') => {}
                _ => {
                    return Err(ParseError::Expected {
                        expected: "',' or ')'",
                        offset: self.pos,
                        found: self.found(),
                    })
                }
            }
        }
    }

    fn expr(&mut self, depth: usize) -> Result<PyValue, ParseError> {
        if depth > MAX_DEPTH {
            return Err(ParseError::TooDeep { offset: self.pos });
        }
        self.skip_ws();
        let start = self.pos;
        let Some(c) = self.peek() else {
            return Err(ParseError::Expected {
                expected: "a value",
                offset: self.pos,
                found: self.found(),
            });
        };
        match c {
            '[' => {
                self.pos += 1;
                Ok(PyValue::List(self.sequence(']', depth)?.0))
            }
            '(' => {
                self.pos += 1;
                let (items, trailing_comma) = self.sequence(')', depth)?;
                if items.len() == 1 && !trailing_comma {
                    Ok(items.into_iter().next().unwrap_or(PyValue::None))
                } else {
                    Ok(PyValue::Tuple(items))
                }
            }
            '{' => {
                self.pos += 1;
                self.dict_or_set(depth)
            }
            '-' | '+' => {
                self.pos += 1;
                let operand = self.expr(depth + 1)?;
                let negate = c == '-';
                match operand {
                    PyValue::Int(i) if negate => {
                        i.checked_neg()
                            .map(PyValue::Int)
                            .ok_or_else(|| ParseError::InvalidNumber {
                                offset: start,
                                text: "integer overflow".into(),
                            })
                    }
                    PyValue::Float(f) if negate => Ok(PyValue::Float(-f)),
                    PyValue::Bool(b) if negate => Ok(PyValue::Int(-i64::from(b))),
                    PyValue::Bool(b) => Ok(PyValue::Int(i64::from(b))),
                    v @ (PyValue::Int(_) | PyValue::Float(_)) => Ok(v),
                    _ => Err(ParseError::Unsupported {
                        offset: start,
                        what: "unary sign on a non-number".into(),
                    }),
                }
            }
            '\'' | '"' => self.strings(),
            '0'..='9' | '.' => self.number(),
            c if c == '_' || c.is_alphabetic() => {
                // String prefixes (r'..', u"..") before a quote.
                if let Some(value) = self.prefixed_string()? {
                    return Ok(value);
                }
                let name = self.identifier().unwrap_or_default();
                match name.as_str() {
                    "True" => Ok(PyValue::Bool(true)),
                    "False" => Ok(PyValue::Bool(false)),
                    "None" => Ok(PyValue::None),
                    _ => Err(ParseError::Name {
                        name,
                        offset: start,
                    }),
                }
            }
            _ => Err(ParseError::Expected {
                expected: "a value",
                offset: self.pos,
                found: self.found(),
            }),
        }
    }

    /// Items up to `close` (consumed); returns whether the last item had a trailing comma.
    fn sequence(&mut self, close: char, depth: usize) -> Result<(Vec<PyValue>, bool), ParseError> {
        let mut items = Vec::new();
        let mut trailing_comma = false;
        loop {
            self.skip_ws();
            if self.peek() == Some(close) {
                self.pos += 1;
                return Ok((items, trailing_comma));
            }
            items.push(self.expr(depth + 1)?);
            self.skip_ws();
            match self.peek() {
                Some(',') => {
                    self.pos += 1;
                    trailing_comma = true;
                }
                Some(c) if c == close => trailing_comma = false,
                _ => {
                    return Err(ParseError::Expected {
                        expected: "',' or a closing bracket",
                        offset: self.pos,
                        found: self.found(),
                    })
                }
            }
        }
    }

    fn dict_or_set(&mut self, depth: usize) -> Result<PyValue, ParseError> {
        self.skip_ws();
        if self.peek() == Some('}') {
            self.pos += 1;
            return Ok(PyValue::Dict(PyDict::new()));
        }
        let first = self.expr(depth + 1)?;
        self.skip_ws();
        if self.peek() != Some(':') {
            let mut items = vec![first];
            loop {
                self.skip_ws();
                match self.peek() {
                    Some(',') => {
                        self.pos += 1;
                        self.skip_ws();
                        if self.peek() == Some('}') {
                            continue;
                        }
                        let item = self.expr(depth + 1)?;
                        if !items.iter().any(|x| x.py_eq(&item)) {
                            items.push(item);
                        }
                    }
                    Some('}') => {
                        self.pos += 1;
                        return Ok(PyValue::Set(items));
                    }
                    _ => {
                        return Err(ParseError::Expected {
                            expected: "',' or '}'",
                            offset: self.pos,
                            found: self.found(),
                        })
                    }
                }
            }
        }
        let mut dict = PyDict::new();
        let mut key = first;
        loop {
            self.expect(':', "':'")?;
            let value = self.expr(depth + 1)?;
            if matches!(key, PyValue::List(_) | PyValue::Dict(_) | PyValue::Set(_)) {
                return Err(ParseError::Unsupported {
                    offset: self.pos,
                    what: format!("unhashable dict key of type {}", key.type_name()),
                });
            }
            dict.insert(key, value);
            self.skip_ws();
            match self.peek() {
                Some(',') => {
                    self.pos += 1;
                    self.skip_ws();
                    if self.peek() == Some('}') {
                        self.pos += 1;
                        return Ok(PyValue::Dict(dict));
                    }
                    key = self.expr(depth + 1)?;
                    self.skip_ws();
                }
                Some('}') => {
                    self.pos += 1;
                    return Ok(PyValue::Dict(dict));
                }
                _ => {
                    return Err(ParseError::Expected {
                        expected: "',' or '}'",
                        offset: self.pos,
                        found: self.found(),
                    })
                }
            }
        }
    }

    /// `r'…'`, `u'…'`, `R"…"`; other prefixes (bytes, f-strings) are unsupported.
    fn prefixed_string(&mut self) -> Result<Option<PyValue>, ParseError> {
        let start = self.pos;
        let mut prefix = String::new();
        while let Some(c) = self.peek() {
            if prefix.len() < 2 && "rRuUbBfF".contains(c) {
                prefix.push(c);
                self.pos += 1;
            } else {
                break;
            }
        }
        if prefix.is_empty() || !matches!(self.peek(), Some('\'' | '"')) {
            self.pos = start;
            return Ok(None);
        }
        let lower = prefix.to_lowercase();
        if lower.contains('b') || lower.contains('f') {
            return Err(ParseError::Unsupported {
                offset: start,
                what: format!("{prefix}-prefixed string"),
            });
        }
        let raw = lower.contains('r');
        let first = self.string_literal(raw)?;
        let rest = self.adjacent_strings()?;
        Ok(Some(PyValue::Str(first + &rest)))
    }

    /// One or more adjacent string literals (`'a' "b"` is `'ab'`).
    fn strings(&mut self) -> Result<PyValue, ParseError> {
        let first = self.string_literal(false)?;
        let rest = self.adjacent_strings()?;
        Ok(PyValue::Str(first + &rest))
    }

    fn adjacent_strings(&mut self) -> Result<String, ParseError> {
        let mut out = String::new();
        loop {
            let save = self.pos;
            self.skip_ws();
            match self.peek() {
                Some('\'' | '"') => out.push_str(&self.string_literal(false)?),
                Some(c) if "rRuU".contains(c) && matches!(self.peek_at(1), Some('\'' | '"')) => {
                    self.pos += 1;
                    out.push_str(&self.string_literal(c == 'r' || c == 'R')?);
                }
                _ => {
                    self.pos = save;
                    return Ok(out);
                }
            }
        }
    }

    fn string_literal(&mut self, raw: bool) -> Result<String, ParseError> {
        let start = self.pos;
        let quote = self.peek().unwrap_or('\'');
        let triple = self.peek_at(1) == Some(quote) && self.peek_at(2) == Some(quote);
        self.pos += if triple { 3 } else { 1 };
        let mut out = String::new();
        loop {
            let Some(c) = self.peek() else {
                return Err(ParseError::UnterminatedString { offset: start });
            };
            if c == quote {
                if !triple {
                    self.pos += 1;
                    return Ok(out);
                }
                if self.peek_at(1) == Some(quote) && self.peek_at(2) == Some(quote) {
                    self.pos += 3;
                    return Ok(out);
                }
                out.push(c);
                self.pos += 1;
                continue;
            }
            if c == '\n' && !triple {
                return Err(ParseError::UnterminatedString { offset: start });
            }
            if c != '\\' {
                out.push(c);
                self.pos += 1;
                continue;
            }
            let Some(next) = self.peek_at(1) else {
                return Err(ParseError::UnterminatedString { offset: start });
            };
            if raw {
                // In raw strings a backslash only keeps the next character from ending it.
                out.push('\\');
                out.push(next);
                self.pos += 2;
                continue;
            }
            self.pos += 2;
            match next {
                '\n' => {}
                '\\' => out.push('\\'),
                '\'' => out.push('\''),
                '"' => out.push('"'),
                'a' => out.push('\u{7}'),
                'b' => out.push('\u{8}'),
                'f' => out.push('\u{c}'),
                'n' => out.push('\n'),
                'r' => out.push('\r'),
                't' => out.push('\t'),
                'v' => out.push('\u{b}'),
                '0'..='7' => {
                    let mut code = next.to_digit(8).unwrap_or(0);
                    for _ in 0..2 {
                        match self.peek().and_then(|d| d.to_digit(8)) {
                            Some(d) => {
                                code = code * 8 + d;
                                self.pos += 1;
                            }
                            None => break,
                        }
                    }
                    out.push(
                        char::from_u32(code)
                            .ok_or(ParseError::InvalidEscape { offset: self.pos })?,
                    );
                }
                'x' => out.push(self.hex_escape(2)?),
                'u' => out.push(self.hex_escape(4)?),
                'U' => out.push(self.hex_escape(8)?),
                'N' => {
                    return Err(ParseError::Unsupported {
                        offset: self.pos - 2,
                        what: "\\N{…} escape".into(),
                    })
                }
                other => {
                    // Python keeps unknown escapes verbatim.
                    out.push('\\');
                    out.push(other);
                }
            }
        }
    }

    fn hex_escape(&mut self, len: usize) -> Result<char, ParseError> {
        let offset = self.pos;
        let mut code: u32 = 0;
        for _ in 0..len {
            let d = self
                .peek()
                .and_then(|c| c.to_digit(16))
                .ok_or(ParseError::InvalidEscape { offset })?;
            code = code * 16 + d;
            self.pos += 1;
        }
        char::from_u32(code).ok_or(ParseError::InvalidEscape { offset })
    }

    fn number(&mut self) -> Result<PyValue, ParseError> {
        let start = self.pos;
        while let Some(c) = self.peek() {
            let prev = if self.pos > start {
                self.chars[self.pos - 1]
            } else {
                ' '
            };
            let exp_sign = (c == '+' || c == '-') && (prev == 'e' || prev == 'E');
            if c.is_ascii_alphanumeric() || c == '.' || c == '_' || exp_sign {
                self.pos += 1;
            } else {
                break;
            }
        }
        let text: String = self.chars[start..self.pos].iter().collect();
        let invalid = || ParseError::InvalidNumber {
            offset: start,
            text: text.clone(),
        };
        if text.starts_with('_') || text.ends_with('_') || text.contains("__") {
            return Err(invalid());
        }
        let clean: String = text.chars().filter(|c| *c != '_').collect();
        let lower = clean.to_ascii_lowercase();
        for (prefix, radix) in [("0x", 16), ("0o", 8), ("0b", 2)] {
            if let Some(digits) = lower.strip_prefix(prefix) {
                return i64::from_str_radix(digits, radix)
                    .ok()
                    .filter(|_| !digits.is_empty() && !digits.starts_with(['+', '-']))
                    .map(PyValue::Int)
                    .ok_or_else(invalid);
            }
        }
        if lower.ends_with('j') {
            return Err(ParseError::Unsupported {
                offset: start,
                what: "complex literal".into(),
            });
        }
        let is_float = lower.contains(['.', 'e']);
        if !lower
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | '+' | '-'))
            || lower == "."
        {
            return Err(invalid());
        }
        if is_float {
            // Python requires digits in the exponent and at most one '.' before it.
            let (mantissa, exponent) = match lower.split_once('e') {
                Some((m, e)) => (m, Some(e)),
                None => (lower.as_str(), None),
            };
            let exp_ok = exponent.is_none_or(|e| {
                let digits = e.strip_prefix(['+', '-']).unwrap_or(e);
                !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit())
            });
            let mantissa_ok = mantissa.chars().filter(|c| *c == '.').count() <= 1
                && mantissa.chars().any(|c| c.is_ascii_digit())
                && !mantissa.contains(['+', '-']);
            if !exp_ok || !mantissa_ok {
                return Err(invalid());
            }
            return lower
                .parse::<f64>()
                .map(PyValue::Float)
                .map_err(|_| invalid());
        }
        if lower.len() > 1 && lower.starts_with('0') && lower.chars().any(|c| c != '0') {
            return Err(invalid());
        }
        lower
            .parse::<i64>()
            .map(PyValue::Int)
            .map_err(|_| invalid())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> PyCall {
        parse_python_call(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn keyword_and_positional_arguments() {
        let c = parse("cd(folder='document')");
        assert_eq!(c.name, "cd");
        assert_eq!(c.kwargs[0].0, "folder");
        assert_eq!(c.kwargs[0].1.repr(), "'document'");
        let c = parse("sort('final_report.pdf')");
        assert_eq!(c.args.len(), 1);
        assert!(c.kwargs.is_empty());
        let c = parse("mean([227.16,2.552,227.11, 227.09])");
        assert_eq!(c.args[0].repr(), "[227.16, 2.552, 227.11, 227.09]");
    }

    #[test]
    fn literals_of_every_kind() {
        let c = parse(
            r#"f(a=-4.0, b=1e-07, c=-2.5E+3, d=True, e=None, f={'k': [1, (2,)], "q": {}}, g="it's \"x\"\n", h=0x1F, i=())"#,
        );
        let repr: Vec<String> = c.kwargs.iter().map(|(_, v)| v.repr()).collect();
        assert_eq!(
            repr,
            [
                "-4.0",
                "1e-07",
                "-2500.0",
                "True",
                "None",
                "{'k': [1, (2,)], 'q': {}}",
                "'it\\'s \"x\"\\n'",
                "31",
                "()",
            ]
        );
    }

    #[test]
    fn escaped_quotes_and_raw_strings() {
        let c = parse(r"echo(content='don\'t', file_name=r'a\b.txt')");
        assert_eq!(c.kwargs[0].1.as_str(), Some("don't"));
        assert_eq!(c.kwargs[1].1.as_str(), Some("a\\b.txt"));
    }

    #[test]
    fn malformed_input_is_a_structured_error() {
        assert_eq!(parse_python_call("").err(), Some(ParseError::Empty));
        assert!(matches!(
            parse_python_call("cd(folder='x'"),
            Err(ParseError::Expected { .. })
        ));
        assert!(matches!(
            parse_python_call("cd(folder='x)"),
            Err(ParseError::UnterminatedString { .. })
        ));
        assert_eq!(
            parse_python_call("cd(folder=document)").map(|c| c.name),
            Err(ParseError::Name {
                name: "document".into(),
                offset: 10
            })
        );
        assert!(matches!(
            parse_python_call("f(a=1, 2)"),
            Err(ParseError::PositionalAfterKeyword { .. })
        ));
        assert!(matches!(
            parse_python_call("f(a=1, a=2)"),
            Err(ParseError::DuplicateKeyword { .. })
        ));
        assert!(matches!(
            parse_python_call("f(x=007)"),
            Err(ParseError::InvalidNumber { .. })
        ));
        assert!(matches!(
            parse_python_call("f() g()"),
            Err(ParseError::TrailingInput { .. })
        ));
        let deep = format!("f({}{})", "[".repeat(200), "]".repeat(200));
        assert!(matches!(
            parse_python_call(&deep),
            Err(ParseError::TooDeep { .. })
        ));
    }

    #[test]
    fn json_tool_calls() {
        let c = parse_json_call(r#"{"name": "cd", "arguments": {"folder": "document", "n": 2.0}}"#)
            .expect("json call");
        assert_eq!(c.name, "cd");
        assert_eq!(c.kwargs[1].1.repr(), "2.0");
        let c = parse_json_call(r#"{"name": "ls", "parameters": "{\"a\": true}"}"#)
            .expect("string arguments");
        assert_eq!(c.kwargs[0].1.repr(), "True");
        assert!(parse_json_call(r#"{"arguments": {}}"#).is_err());
        assert!(parse_json_call(r#"{"name": "x", "arguments": [1]}"#).is_err());
    }
}
