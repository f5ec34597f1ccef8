//! `TicketAPI`: a support-ticket queue with a login.
//!
//! Observed reference behaviour (BFCL trace README, "TicketAPI", and the traces): any
//! non-empty username/password logs in; tickets are looked up by Python equality of `id`
//! (`2 != '2'`); `create_ticket` checks the login, then `priority < 1 or priority > 5` (a
//! string priority raises the comparison `TypeError`); `get_user_tickets` reads
//! `ticket["created_by"]` of every ticket (`KeyError` for scenario tickets without it) and
//! filters by status case-insensitively when a status is given.

use serde_json::{Map, Value};

use super::{cfg, error_dict, snapshot_of, PythonClass};
use crate::bfcl::exception::PyErr;
use crate::bfcl::ops::{compare, lower, CmpOp};
use crate::bfcl::signature::{opt, req, Bound, Param};
use crate::bfcl::value::{PyDict, PyValue};

const CLASS: &str = "TicketAPI";
const METHODS: &[&str] = &[
    "close_ticket",
    "create_ticket",
    "edit_ticket",
    "get_ticket",
    "get_user_tickets",
    "logout",
    "resolve_ticket",
    "ticket_get_login_status",
    "ticket_login",
];

/// The ticket system's compared state.
#[derive(Debug, Clone)]
pub struct TicketApi {
    ticket_queue: PyValue,
    ticket_counter: PyValue,
    current_user: PyValue,
}

impl TicketApi {
    /// Loads the scenario (`ticket_queue` [], `ticket_counter` 1, `current_user` None by
    /// default).
    pub fn load(config: &PyDict) -> Self {
        Self {
            ticket_queue: cfg(config, "ticket_queue", PyValue::List(vec![])),
            ticket_counter: cfg(config, "ticket_counter", PyValue::Int(1)),
            current_user: cfg(config, "current_user", PyValue::None),
        }
    }

    fn find(&mut self, id: &PyValue) -> Option<&mut PyDict> {
        let PyValue::List(queue) = &mut self.ticket_queue else {
            return None;
        };
        queue.iter_mut().find_map(|t| match t {
            PyValue::Dict(d) if d.get_str("id").is_some_and(|v| v.py_eq(id)) => Some(d),
            _ => None,
        })
    }

    fn not_found(id: &PyValue) -> PyValue {
        error_dict(format!("Ticket with ID {} not found.", id.to_py_str()))
    }

    fn dispatch(&mut self, method: &str, a: &[Option<PyValue>]) -> Result<PyValue, PyErr> {
        let arg = |i: usize| a.get(i).cloned().flatten().unwrap_or(PyValue::None);
        match method {
            "ticket_login" => {
                let ok = arg(0).truthy() && arg(1).truthy();
                if ok {
                    self.current_user = arg(0);
                }
                Ok(PyValue::dict([("success", PyValue::Bool(ok))]))
            }
            "ticket_get_login_status" => Ok(PyValue::dict([(
                "login_status",
                PyValue::Bool(self.current_user.truthy()),
            )])),
            "logout" => {
                let was = self.current_user.truthy();
                if was {
                    self.current_user = PyValue::None;
                }
                Ok(PyValue::dict([("success", PyValue::Bool(was))]))
            }
            "create_ticket" => {
                if !self.current_user.truthy() {
                    return Ok(error_dict(
                        "User not authenticated. Please log in to create a ticket.",
                    ));
                }
                let priority = a[2].clone().unwrap_or(PyValue::Int(1));
                if compare(CmpOp::Lt, &priority, &PyValue::Int(1))?
                    || compare(CmpOp::Gt, &priority, &PyValue::Int(5))?
                {
                    return Ok(error_dict(
                        "Invalid priority. Priority must be between 1 and 5.",
                    ));
                }
                let ticket = PyValue::dict([
                    ("id", self.ticket_counter.clone()),
                    ("title", arg(0)),
                    ("description", a[1].clone().unwrap_or(PyValue::str(""))),
                    ("status", PyValue::str("Open")),
                    ("priority", priority),
                    ("created_by", self.current_user.clone()),
                ]);
                if let PyValue::List(q) = &mut self.ticket_queue {
                    q.push(ticket.clone());
                }
                self.ticket_counter = match &self.ticket_counter {
                    PyValue::Int(i) => PyValue::Int(i + 1),
                    PyValue::Float(f) => PyValue::Float(f + 1.0),
                    other => other.clone(),
                };
                Ok(ticket)
            }
            "get_ticket" => {
                let id = arg(0);
                Ok(match self.find(&id) {
                    Some(t) => PyValue::Dict(t.clone()),
                    None => Self::not_found(&id),
                })
            }
            "close_ticket" => {
                let id = arg(0);
                let Some(t) = self.find(&id) else {
                    return Ok(Self::not_found(&id));
                };
                if t.get_str("status")
                    .is_some_and(|s| s.py_eq(&PyValue::str("Closed")))
                {
                    return Ok(error_dict(format!(
                        "Ticket with ID {} is already closed.",
                        id.to_py_str()
                    )));
                }
                t.insert(PyValue::str("status"), PyValue::str("Closed"));
                Ok(PyValue::dict([(
                    "status",
                    PyValue::Str(format!(
                        "Ticket {} has been closed successfully.",
                        id.to_py_str()
                    )),
                )]))
            }
            "resolve_ticket" => {
                let id = arg(0);
                let Some(t) = self.find(&id) else {
                    return Ok(Self::not_found(&id));
                };
                t.insert(PyValue::str("status"), PyValue::str("Resolved"));
                t.insert(PyValue::str("resolution"), arg(1));
                Ok(PyValue::dict([(
                    "status",
                    PyValue::Str(format!(
                        "Ticket {} has been resolved successfully.",
                        id.to_py_str()
                    )),
                )]))
            }
            "edit_ticket" => {
                let id = arg(0);
                let updates = arg(1);
                let Some(t) = self.find(&id) else {
                    return Ok(Self::not_found(&id));
                };
                let PyValue::Dict(updates) = updates else {
                    return Err(PyErr::no_attribute(&updates, "keys"));
                };
                const VALID: [&str; 4] = ["title", "description", "status", "priority"];
                let invalid: Vec<String> = updates
                    .keys()
                    .filter(|k| !k.as_str().is_some_and(|k| VALID.contains(&k)))
                    .map(PyValue::repr)
                    .collect();
                if !invalid.is_empty() {
                    // CPython prints a set here; its order depends on the hash seed.
                    return Ok(error_dict(format!(
                        "Invalid fields for update: {{{}}}",
                        invalid.join(", ")
                    )));
                }
                for (k, v) in updates.iter() {
                    t.insert(k.clone(), v.clone());
                }
                Ok(PyValue::dict([(
                    "status",
                    PyValue::Str(format!(
                        "Ticket {} has been updated successfully.",
                        id.to_py_str()
                    )),
                )]))
            }
            "get_user_tickets" => {
                if !self.current_user.truthy() {
                    return Ok(PyValue::List(vec![error_dict(
                        "User not authenticated. Please log in to view tickets.",
                    )]));
                }
                let status = arg(0);
                let wanted = if status.truthy() {
                    Some(lower(&status)?)
                } else {
                    None
                };
                let PyValue::List(queue) = &self.ticket_queue else {
                    return Ok(PyValue::List(vec![]));
                };
                let mut out = Vec::new();
                for t in queue {
                    let PyValue::Dict(d) = t else { continue };
                    let by = d
                        .get_str("created_by")
                        .ok_or_else(|| PyErr::key_error(&PyValue::str("created_by")))?;
                    if !by.py_eq(&self.current_user) {
                        continue;
                    }
                    if let Some(w) = &wanted {
                        let s = d
                            .get_str("status")
                            .ok_or_else(|| PyErr::key_error(&PyValue::str("status")))?;
                        if lower(s)? != *w {
                            continue;
                        }
                    }
                    out.push(t.clone());
                }
                Ok(PyValue::List(out))
            }
            _ => Err(PyErr::no_attribute(&PyValue::None, method)),
        }
    }
}

fn params(method: &str) -> &'static [Param] {
    const TITLE: [Param; 3] = [req("title"), opt("description"), opt("priority")];
    const ID: [Param; 1] = [req("ticket_id")];
    const EDIT: [Param; 2] = [req("ticket_id"), req("updates")];
    const RESOLVE: [Param; 2] = [req("ticket_id"), req("resolution")];
    const STATUS: [Param; 1] = [opt("status")];
    const LOGIN: [Param; 2] = [req("username"), req("password")];
    match method {
        "create_ticket" => &TITLE,
        "get_ticket" | "close_ticket" => &ID,
        "edit_ticket" => &EDIT,
        "resolve_ticket" => &RESOLVE,
        "get_user_tickets" => &STATUS,
        "ticket_login" => &LOGIN,
        _ => &[],
    }
}

impl PythonClass for TicketApi {
    const CLASS: &'static str = CLASS;
    const METHODS: &'static [&'static str] = METHODS;

    fn params(method: &str) -> &'static [Param] {
        params(method)
    }

    fn call_bound(&mut self, method: &str, bound: Bound) -> Result<PyValue, PyErr> {
        self.dispatch(method, &bound.into_values())
    }

    fn vars(&self) -> Map<String, Value> {
        snapshot_of(&[
            ("ticket_queue", &self.ticket_queue),
            ("ticket_counter", &self.ticket_counter),
            ("current_user", &self.current_user),
        ])
    }
}
