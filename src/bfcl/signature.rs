//! Binding call arguments to a method's parameters with CPython's `TypeError` messages.
//!
//! The reference executor calls bound methods, so argument errors are CPython's own:
//! `TicketAPI.create_ticket() missing 1 required positional argument: 'title'`,
//! `… got an unexpected keyword argument 'probe_extra'`, `… takes 2 positional arguments but
//! 3 were given` (counts include `self`). CPython checks keywords first (unexpected, then
//! duplicates), then the positional count, then missing arguments.

use super::exception::PyErr;
use super::value::PyValue;

/// One parameter of a method (after `self`), in declaration order.
#[derive(Debug, Clone, Copy)]
pub struct Param {
    pub name: &'static str,
    /// False when the parameter has a default value.
    pub required: bool,
}

/// A required parameter.
pub const fn req(name: &'static str) -> Param {
    Param {
        name,
        required: true,
    }
}

/// A parameter with a default value (the method applies the default).
pub const fn opt(name: &'static str) -> Param {
    Param {
        name,
        required: false,
    }
}

/// Arguments bound to parameters: `None` where an optional parameter was not given.
#[derive(Debug)]
pub struct Bound {
    values: Vec<Option<PyValue>>,
}

impl Bound {
    /// The value for parameter `i` (declaration order), `None` when defaulted.
    pub fn get(&self, i: usize) -> Option<&PyValue> {
        self.values.get(i).and_then(Option::as_ref)
    }

    /// The value for required parameter `i`.
    pub fn req(&self, i: usize) -> &PyValue {
        const NONE: PyValue = PyValue::None;
        self.get(i).unwrap_or(&NONE)
    }

    /// One entry per declared parameter, in declaration order (`None` when defaulted).
    pub fn into_values(self) -> Vec<Option<PyValue>> {
        self.values
    }

    /// The value for parameter `i`, or `default` when not given.
    pub fn or(&self, i: usize, default: PyValue) -> PyValue {
        self.get(i).cloned().unwrap_or(default)
    }
}

/// Binds `args`/`kwargs` to `params` of `class.method`, as CPython does for a bound method.
///
/// # Errors
/// `TypeError` with CPython's message when the arguments do not fit the signature.
pub fn bind(
    class: &str,
    method: &str,
    params: &[Param],
    args: Vec<PyValue>,
    kwargs: Vec<(String, PyValue)>,
) -> Result<Bound, PyErr> {
    let qual = format!("{class}.{method}()");
    let n_args = args.len();
    let mut values: Vec<Option<PyValue>> = vec![None; params.len()];
    for (slot, v) in values.iter_mut().zip(args) {
        *slot = Some(v);
    }
    for (name, v) in kwargs {
        let Some(i) = params.iter().position(|p| p.name == name) else {
            return Err(PyErr::type_error(format!(
                "{qual} got an unexpected keyword argument '{name}'"
            )));
        };
        if values[i].is_some() {
            return Err(PyErr::type_error(format!(
                "{qual} got multiple values for argument '{name}'"
            )));
        }
        values[i] = Some(v);
    }
    if n_args > params.len() {
        let max = params.len() + 1;
        let min = params.iter().filter(|p| p.required).count() + 1;
        let takes = if min == max {
            format!(
                "{max} positional argument{}",
                if max == 1 { "" } else { "s" }
            )
        } else {
            format!("from {min} to {max} positional arguments")
        };
        let given = n_args + 1;
        return Err(PyErr::type_error(format!(
            "{qual} takes {takes} but {given} {} given",
            if given == 1 { "was" } else { "were" }
        )));
    }
    let missing: Vec<String> = params
        .iter()
        .zip(&values)
        .filter(|(p, v)| p.required && v.is_none())
        .map(|(p, _)| format!("'{}'", p.name))
        .collect();
    if !missing.is_empty() {
        let list = match missing.as_slice() {
            [one] => one.clone(),
            [a, b] => format!("{a} and {b}"),
            [init @ .., last] => format!("{}, and {last}", init.join(", ")),
            [] => String::new(),
        };
        return Err(PyErr::type_error(format!(
            "{qual} missing {} required positional argument{}: {list}",
            missing.len(),
            if missing.len() == 1 { "" } else { "s" }
        )));
    }
    Ok(Bound { values })
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: [Param; 3] = [req("value"), req("base"), opt("precision")];

    fn err(args: Vec<PyValue>, kwargs: Vec<(&str, PyValue)>) -> String {
        let kwargs = kwargs
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        bind("MathAPI", "logarithm", &P, args, kwargs)
            .map(|_| String::new())
            .unwrap_or_else(|e| e.message)
    }

    #[test]
    fn cpython_messages() {
        assert_eq!(
            err(vec![], vec![("base", PyValue::Int(10))]),
            "MathAPI.logarithm() missing 1 required positional argument: 'value'"
        );
        assert_eq!(
            err(vec![], vec![]),
            "MathAPI.logarithm() missing 2 required positional arguments: 'value' and 'base'"
        );
        assert_eq!(
            err(vec![], vec![("probe_extra", PyValue::Int(1))]),
            "MathAPI.logarithm() got an unexpected keyword argument 'probe_extra'"
        );
        assert_eq!(
            err(vec![PyValue::Int(1); 4], vec![]),
            "MathAPI.logarithm() takes from 3 to 4 positional arguments but 5 were given"
        );
        assert_eq!(
            err(vec![PyValue::Int(1)], vec![("value", PyValue::Int(2))]),
            "MathAPI.logarithm() got multiple values for argument 'value'"
        );
        let none = bind("T", "logout", &[], vec![PyValue::None], vec![])
            .map(|_| String::new())
            .unwrap_or_else(|e| e.message);
        assert_eq!(
            none,
            "T.logout() takes 1 positional argument but 2 were given"
        );
        let bound = bind(
            "MathAPI",
            "logarithm",
            &P,
            vec![PyValue::Int(1), PyValue::Int(2)],
            vec![],
        )
        .expect("binds");
        assert!(bound.get(2).is_none());
        assert_eq!(bound.req(1).repr(), "2");
    }
}
