//! `MessageAPI`: a workspace messaging system (users, login, an inbox of one-entry dicts).
//!
//! Observed reference behaviour (BFCL trace README, "MessageAPI", and the traces): message
//! ids are `randint(10000, 99999)` from `random.Random(200191)`, redrawn while already used;
//! `view_messages_sent` groups every inbox entry (its first pair) by receiver whatever the
//! sender;
//! `delete_message` removes the newest entry for the receiver and never decrements
//! `message_count`; `get_message_stats` counts inbox entries and distinct first keys;
//! `search_messages` lower-cases every stored message (`AttributeError` for list-valued
//! scenario entries).

use serde_json::{Map, Value};

use super::{cfg, error_dict, snapshot_of, PythonClass};
use crate::bfcl::exception::PyErr;
use crate::bfcl::ops::lower;
use crate::bfcl::pyrandom::PyRandom;
use crate::bfcl::signature::{req, Bound, Param};
use crate::bfcl::value::{PyDict, PyValue};
use crate::bfcl::BfclError;

const CLASS: &str = "MessageAPI";
const METHODS: &[&str] = &[
    "add_contact",
    "delete_message",
    "get_message_stats",
    "get_user_id",
    "list_users",
    "message_get_login_status",
    "message_login",
    "search_messages",
    "send_message",
    "view_messages_sent",
];
const DEFAULT_SEED: i64 = 200_191;

/// The messaging system's compared state plus its private generator.
#[derive(Debug, Clone)]
pub struct MessageApi {
    generated_ids: Vec<PyValue>,
    user_count: PyValue,
    user_map: PyDict,
    inbox: Vec<PyValue>,
    message_count: PyValue,
    current_user: PyValue,
    random: PyRandom,
}

fn default_user_map() -> PyDict {
    [
        ("Alice", "USR001"),
        ("Bob", "USR002"),
        ("Catherine", "USR003"),
        ("Daniel", "USR004"),
    ]
    .into_iter()
    .map(|(k, v)| (PyValue::str(k), PyValue::str(v)))
    .collect()
}

fn default_inbox() -> Vec<PyValue> {
    [
        ("USR002", "My name is Alice. I want to connect."),
        ("USR003", "Could you upload the file?"),
        ("USR004", "Could you upload the file?"),
    ]
    .into_iter()
    .map(|(k, v)| PyValue::dict([(k, PyValue::str(v))]))
    .collect()
}

impl MessageApi {
    /// Loads the scenario; missing keys take `DEFAULT_STATE` (4 users, 3 inbox messages).
    ///
    /// # Errors
    /// [`BfclError::Config`] when `user_map` is not a dict or `inbox` not a list.
    pub fn load(config: &PyDict) -> Result<Self, BfclError> {
        let bad = |reason: &str| BfclError::Config {
            class: CLASS.into(),
            reason: reason.into(),
        };
        let user_map = match cfg(config, "user_map", PyValue::Dict(default_user_map())) {
            PyValue::Dict(d) => d,
            _ => return Err(bad("user_map must be an object")),
        };
        let inbox = match cfg(config, "inbox", PyValue::List(default_inbox())) {
            PyValue::List(l) => l,
            _ => return Err(bad("inbox must be a list")),
        };
        let seed = match config.get_str("random_seed") {
            Some(PyValue::Int(s)) => *s,
            _ => DEFAULT_SEED,
        };
        Ok(Self {
            generated_ids: match cfg(config, "generated_ids", PyValue::Set(vec![])) {
                PyValue::Set(v) | PyValue::List(v) => v,
                _ => Vec::new(),
            },
            user_count: cfg(config, "user_count", PyValue::Int(4)),
            user_map,
            inbox,
            message_count: cfg(config, "message_count", PyValue::Int(3)),
            current_user: cfg(config, "current_user", PyValue::None),
            random: PyRandom::new(seed),
        })
    }

    fn is_user_id(&self, id: &PyValue) -> bool {
        self.user_map.values().any(|v| v.py_eq(id))
    }

    fn new_id(&mut self) -> i64 {
        loop {
            let id = self.random.randint(10_000, 99_999);
            let v = PyValue::Int(id);
            if !self.generated_ids.iter().any(|x| x.py_eq(&v)) {
                self.generated_ids.push(v);
                return id;
            }
        }
    }

    fn not_logged_in() -> PyValue {
        error_dict("No user is currently logged in.")
    }

    fn dispatch(&mut self, method: &str, a: &[PyValue]) -> Result<PyValue, PyErr> {
        match method {
            "list_users" => Ok(PyValue::dict([(
                "user_list",
                PyValue::List(self.user_map.keys().cloned().collect()),
            )])),
            "get_user_id" => Ok(match self.user_map.get(&a[0]) {
                Some(id) => PyValue::dict([("user_id", id.clone())]),
                None => error_dict(format!(
                    "User '{}' not found in the workspace.",
                    a[0].to_py_str()
                )),
            }),
            "message_login" => {
                if !self.is_user_id(&a[0]) {
                    return Ok(PyValue::dict([
                        ("login_status", PyValue::Bool(false)),
                        (
                            "message",
                            PyValue::Str(format!("User ID '{}' not found.", a[0].to_py_str())),
                        ),
                    ]));
                }
                self.current_user = a[0].clone();
                Ok(PyValue::dict([
                    ("login_status", PyValue::Bool(true)),
                    (
                        "message",
                        PyValue::Str(format!(
                            "User '{}' logged in successfully.",
                            a[0].to_py_str()
                        )),
                    ),
                ]))
            }
            "message_get_login_status" => Ok(PyValue::dict([(
                "login_status",
                PyValue::Bool(self.current_user.truthy()),
            )])),
            "send_message" => {
                if !self.current_user.truthy() {
                    return Ok(Self::not_logged_in());
                }
                if !self.is_user_id(&a[0]) {
                    return Ok(error_dict(format!(
                        "Receiver ID '{}' not found.",
                        a[0].to_py_str()
                    )));
                }
                let id = self.new_id();
                self.inbox.push(PyValue::Dict(
                    [(a[0].clone(), a[1].clone())].into_iter().collect(),
                ));
                self.message_count = increment(&self.message_count);
                Ok(PyValue::dict([
                    ("sent_status", PyValue::Bool(true)),
                    ("message_id", PyValue::dict([("new_id", PyValue::Int(id))])),
                    (
                        "message",
                        PyValue::Str(format!(
                            "Message sent to '{}' successfully.",
                            a[0].to_py_str()
                        )),
                    ),
                ]))
            }
            "delete_message" => {
                let pos = self
                    .inbox
                    .iter()
                    .rposition(|m| matches!(m, PyValue::Dict(d) if d.contains_key(&a[0])));
                match pos {
                    Some(i) => {
                        self.inbox.remove(i);
                        Ok(PyValue::dict([
                            ("deleted_status", PyValue::Bool(true)),
                            ("receiver_id", a[0].clone()),
                            (
                                "message",
                                PyValue::Str(format!(
                                    "Receiver {}'s latest message deleted successfully.",
                                    a[0].to_py_str()
                                )),
                            ),
                        ]))
                    }
                    None => Ok(error_dict(format!(
                        "Receiver ID {} not found.",
                        a[0].to_py_str()
                    ))),
                }
            }
            "view_messages_sent" => {
                if !self.current_user.truthy() {
                    return Ok(Self::not_logged_in());
                }
                let mut grouped = PyDict::new();
                for m in &self.inbox {
                    // Only an entry's first pair counts (scenario entries may hold several).
                    let PyValue::Dict(d) = m else { continue };
                    if let Some((rid, msg)) = d.iter().next() {
                        match grouped.get_mut(rid) {
                            Some(PyValue::List(l)) => l.push(msg.clone()),
                            _ => grouped.insert(rid.clone(), PyValue::List(vec![msg.clone()])),
                        }
                    }
                }
                Ok(PyValue::dict([("messages", PyValue::Dict(grouped))]))
            }
            "add_contact" => {
                if self.user_map.contains_key(&a[0]) {
                    return Ok(error_dict(format!(
                        "User name '{}' already exists.",
                        a[0].to_py_str()
                    )));
                }
                self.user_count = increment(&self.user_count);
                let n = match &self.user_count {
                    PyValue::Int(i) => *i,
                    _ => 0,
                };
                let id = format!("USR{n:03}");
                self.user_map.insert(a[0].clone(), PyValue::str(id.clone()));
                Ok(PyValue::dict([
                    ("added_status", PyValue::Bool(true)),
                    ("user_id", PyValue::Str(id)),
                    (
                        "message",
                        PyValue::Str(format!(
                            "Contact '{}' added successfully.",
                            a[0].to_py_str()
                        )),
                    ),
                ]))
            }
            "search_messages" => {
                if !self.current_user.truthy() {
                    return Ok(Self::not_logged_in());
                }
                let keyword = lower(&a[0])?;
                let mut results = Vec::new();
                for m in &self.inbox {
                    let PyValue::Dict(d) = m else { continue };
                    for (rid, msg) in d.iter() {
                        if lower(msg)?.contains(&keyword) {
                            results.push(PyValue::dict([
                                ("receiver_id", rid.clone()),
                                ("message", msg.clone()),
                            ]));
                        }
                    }
                }
                Ok(PyValue::dict([("results", PyValue::List(results))]))
            }
            "get_message_stats" => {
                if !self.current_user.truthy() {
                    return Ok(Self::not_logged_in());
                }
                let mut contacts: Vec<PyValue> = Vec::new();
                for m in &self.inbox {
                    let PyValue::Dict(d) = m else { continue };
                    if let Some(first) = d.keys().next() {
                        if !contacts.iter().any(|c| c.py_eq(first)) {
                            contacts.push(first.clone());
                        }
                    }
                }
                Ok(PyValue::dict([(
                    "stats",
                    PyValue::dict([
                        ("received_count", PyValue::Int(self.inbox.len() as i64)),
                        ("total_contacts", PyValue::Int(contacts.len() as i64)),
                    ]),
                )]))
            }
            _ => Err(PyErr::no_attribute(&PyValue::None, method)),
        }
    }
}

fn increment(v: &PyValue) -> PyValue {
    match v {
        PyValue::Int(i) => PyValue::Int(i + 1),
        PyValue::Float(f) => PyValue::Float(f + 1.0),
        other => other.clone(),
    }
}

fn params(method: &str) -> &'static [Param] {
    const USER_NAME: [Param; 1] = [req("user_name")];
    const RECEIVER: [Param; 1] = [req("receiver_id")];
    const USER: [Param; 1] = [req("user")];
    const USER_ID: [Param; 1] = [req("user_id")];
    const KEYWORD: [Param; 1] = [req("keyword")];
    const SEND: [Param; 2] = [req("receiver_id"), req("message")];
    match method {
        "add_contact" => &USER_NAME,
        "delete_message" => &RECEIVER,
        "get_user_id" => &USER,
        "message_login" => &USER_ID,
        "search_messages" => &KEYWORD,
        "send_message" => &SEND,
        _ => &[],
    }
}

impl PythonClass for MessageApi {
    const CLASS: &'static str = CLASS;
    const METHODS: &'static [&'static str] = METHODS;

    fn params(method: &str) -> &'static [Param] {
        params(method)
    }

    fn call_bound(&mut self, method: &str, bound: Bound) -> Result<PyValue, PyErr> {
        let values: Vec<PyValue> = (0..params(method).len())
            .map(|i| bound.req(i).clone())
            .collect();
        self.dispatch(method, &values)
    }

    fn vars(&self) -> Map<String, Value> {
        let ids = PyValue::Set(self.generated_ids.clone());
        let user_map = PyValue::Dict(self.user_map.clone());
        let inbox = PyValue::List(self.inbox.clone());
        snapshot_of(&[
            ("generated_ids", &ids),
            ("user_count", &self.user_count),
            ("user_map", &user_map),
            ("inbox", &inbox),
            ("message_count", &self.message_count),
            ("current_user", &self.current_user),
        ])
    }
}
