//! `GorillaFileSystem`: an in-memory directory tree with a working directory and shell-like
//! commands (`ls`, `cd`, `mkdir`, `touch`, `echo`, `cat`, `find`, `wc`, `sort`, `grep`, `du`,
//! `tail`, `diff`, `mv`, `cp`, `rm`, `rmdir`, `pwd`).
//!
//! The tree is an arena of nodes addressed by index, so that one node can be reachable from
//! two directories: the reference's directory `cp` and `mv` build a new `Directory` whose
//! entries are the source's own child objects, so edits made through the copy show up in the
//! original, and the children's parent pointers keep pointing at the source (BFCL trace
//! README, "GorillaFileSystem"). Cloning the arena (`copy.deepcopy`) keeps that sharing.
//!
//! Observed reference behaviour: the single top-level key of `initial_config.root` is the root
//! and the first working directory; names holding `|/\?%*:"<>` are refused (a non-string name
//! raises `argument of type 'int' is not iterable`); `cd` takes one level at a time and answers
//! the target's own name; `mv` re-inserts the entry, so moved entries go last; `find` walks
//! depth-first in insertion order, prefixing paths with the given path and matching names by
//! substring; `echo` writes only to existing files; `tail(lines=0)` is the whole file; `diff`
//! zips the two line lists; `du` sums UTF-8 bytes. With `long_context`, files not in
//! `FILES_TAIL_USED` get `FILE_CONTENT_EXTENSION` appended and every directory without
//! subdirectories receives the empty files of `POPULATE_FILE_EXTENSION`.

use serde_json::{Map, Value};

use super::long_context::constant;
use super::{error_dict, PythonClass};
use crate::bfcl::exception::PyErr;
use crate::bfcl::ops::{compare, CmpOp};
use crate::bfcl::signature::{opt, req, Bound, Param};
use crate::bfcl::value::{PyDict, PyValue};
use crate::bfcl::BfclError;

const CLASS: &str = "GorillaFileSystem";
const METHODS: &[&str] = &[
    "cat", "cd", "cp", "diff", "du", "echo", "find", "grep", "ls", "mkdir", "mv", "pwd", "rm",
    "rmdir", "sort", "tail", "touch", "wc",
];
/// Characters the reference refuses in new names.
const INVALID_CHARS: &str = "|/\\?%*:\"<>";

/// Index of a node in the arena.
type NodeId = usize;

/// A `File` or a `Directory` object.
#[derive(Debug, Clone)]
enum Node {
    File {
        name: String,
        content: PyValue,
    },
    Dir {
        name: String,
        parent: Option<NodeId>,
        /// `contents`: name → child, in insertion order.
        contents: Vec<(String, NodeId)>,
    },
}

/// The file system's compared state (`long_context`, `root`) plus the working directory.
#[derive(Debug, Clone)]
pub struct GorillaFileSystem {
    nodes: Vec<Node>,
    root: NodeId,
    cwd: NodeId,
    long_context: bool,
}

/// Python's `str.splitlines()`.
fn splitlines(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\r' => {
                if chars.peek() == Some(&'\n') {
                    chars.next();
                }
                out.push(std::mem::take(&mut cur));
            }
            '\n' | '\x0b' | '\x0c' | '\x1c' | '\x1d' | '\x1e' | '\u{85}' | '\u{2028}'
            | '\u{2029}' => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// `name` as a `str`, or the `TypeError` of `c in name` for another type.
fn name_str(name: &PyValue) -> Result<&str, PyErr> {
    name.as_str().ok_or_else(|| {
        PyErr::type_error(format!(
            "argument of type '{}' is not iterable",
            name.type_name()
        ))
    })
}

/// `any(c in name for c in INVALID_CHARS)`.
fn invalid_name(name: &PyValue) -> Result<bool, PyErr> {
    Ok(name_str(name)?.chars().any(|c| INVALID_CHARS.contains(c)))
}

/// `needle in haystack` for a substring test (`TypeError` for a non-string needle).
fn contains(haystack: &str, needle: &PyValue) -> Result<bool, PyErr> {
    match needle {
        PyValue::Str(n) => Ok(haystack.contains(n.as_str())),
        other => Err(PyErr::type_error(format!(
            "'in <string>' requires string as left operand, not {}",
            other.type_name()
        ))),
    }
}

fn content_str(content: &PyValue) -> String {
    content.to_py_str()
}

impl GorillaFileSystem {
    /// Loads the scenario: the single key of `config["root"]` is the root directory.
    ///
    /// # Errors
    /// [`BfclError::Config`] for a root that is not one directory entry.
    pub fn load(config: &PyDict, long_context: bool) -> Result<Self, BfclError> {
        let bad = |reason: &str| BfclError::Config {
            class: CLASS.into(),
            reason: reason.into(),
        };
        let mut fs = Self {
            nodes: Vec::new(),
            root: 0,
            cwd: 0,
            long_context,
        };
        let root = match config.get_str("root") {
            Some(PyValue::Dict(d)) => d.clone(),
            None => {
                // DEFAULT_STATE: an empty `/` root.
                let mut d = PyDict::new();
                d.insert(
                    PyValue::str("/"),
                    PyValue::dict([("type", PyValue::str("directory"))]),
                );
                d
            }
            Some(_) => return Err(bad("root is not an object")),
        };
        let (name, spec) = root.iter().next().ok_or_else(|| bad("root has no entry"))?;
        let id = fs.build(&name.to_py_str(), spec, None);
        fs.root = id;
        fs.cwd = id;
        if long_context {
            fs.extend_long_context(id);
        }
        Ok(fs)
    }

    fn build(&mut self, name: &str, spec: &PyValue, parent: Option<NodeId>) -> NodeId {
        let get = |k: &str| match spec {
            PyValue::Dict(d) => d.get_str(k).cloned(),
            _ => None,
        };
        let is_file = get("type").is_some_and(|t| t.py_eq(&PyValue::str("file")));
        if is_file {
            let content = get("content").unwrap_or(PyValue::str(""));
            self.nodes.push(Node::File {
                name: name.to_string(),
                content,
            });
            return self.nodes.len() - 1;
        }
        let id = self.nodes.len();
        self.nodes.push(Node::Dir {
            name: name.to_string(),
            parent,
            contents: Vec::new(),
        });
        if let Some(PyValue::Dict(children)) = get("contents") {
            for (k, v) in children.iter() {
                let key = k.to_py_str();
                let child = self.build(&key, v, Some(id));
                self.put(id, &key, child);
            }
        }
        id
    }

    fn extend_long_context(&mut self, dir: NodeId) {
        let tail_used: Vec<String> = match constant("FILES_TAIL_USED") {
            PyValue::List(l) => l.iter().map(PyValue::to_py_str).collect(),
            _ => Vec::new(),
        };
        let extension = constant("FILE_CONTENT_EXTENSION").to_py_str();
        let populate: Vec<String> = match constant("POPULATE_FILE_EXTENSION") {
            PyValue::List(l) => l.iter().map(PyValue::to_py_str).collect(),
            _ => Vec::new(),
        };
        let mut has_subdir = false;
        for (name, child) in self.entries(dir) {
            match &mut self.nodes[child] {
                Node::File { content, .. } => {
                    if !tail_used.contains(&name) {
                        *content = PyValue::Str(content_str(content) + &extension);
                    }
                }
                Node::Dir { .. } => {
                    has_subdir = true;
                    self.extend_long_context(child);
                }
            }
        }
        if !has_subdir {
            for name in populate {
                let id = self.new_file(&name, PyValue::str(""));
                self.put(dir, &name, id);
            }
        }
    }

    fn new_file(&mut self, name: &str, content: PyValue) -> NodeId {
        self.nodes.push(Node::File {
            name: name.to_string(),
            content,
        });
        self.nodes.len() - 1
    }

    fn entries(&self, dir: NodeId) -> Vec<(String, NodeId)> {
        match &self.nodes[dir] {
            Node::Dir { contents, .. } => contents.clone(),
            Node::File { .. } => Vec::new(),
        }
    }

    /// `dir.contents[name] = child` (an existing key keeps its position).
    fn put(&mut self, dir: NodeId, name: &str, child: NodeId) {
        if let Node::Dir { contents, .. } = &mut self.nodes[dir] {
            match contents.iter_mut().find(|(k, _)| k == name) {
                Some(slot) => slot.1 = child,
                None => contents.push((name.to_string(), child)),
            }
        }
    }

    /// `dir.contents.pop(name)`.
    fn pop(&mut self, dir: NodeId, name: &str) -> Option<NodeId> {
        if let Node::Dir { contents, .. } = &mut self.nodes[dir] {
            let i = contents.iter().position(|(k, _)| k == name)?;
            return Some(contents.remove(i).1);
        }
        None
    }

    /// `dir.contents.get(name)` (a non-string name is simply absent).
    fn child(&self, dir: NodeId, name: &PyValue) -> Option<NodeId> {
        let name = name.as_str()?;
        match &self.nodes[dir] {
            Node::Dir { contents, .. } => {
                contents.iter().find(|(k, _)| k == name).map(|(_, id)| *id)
            }
            Node::File { .. } => None,
        }
    }

    fn is_dir(&self, id: NodeId) -> bool {
        matches!(self.nodes[id], Node::Dir { .. })
    }

    fn file_child(&self, name: &PyValue) -> Option<String> {
        let id = self.child(self.cwd, name)?;
        match &self.nodes[id] {
            Node::File { content, .. } => Some(content_str(content)),
            Node::Dir { .. } => None,
        }
    }

    fn node_name(&self, id: NodeId) -> &str {
        match &self.nodes[id] {
            Node::File { name, .. } | Node::Dir { name, .. } => name,
        }
    }

    fn parent(&self, id: NodeId) -> Option<NodeId> {
        match &self.nodes[id] {
            Node::Dir { parent, .. } => *parent,
            Node::File { .. } => None,
        }
    }

    fn pwd(&self) -> String {
        let mut parts = Vec::new();
        let mut at = Some(self.cwd);
        while let Some(id) = at {
            parts.push(self.node_name(id).to_string());
            at = self.parent(id);
        }
        parts.reverse();
        format!("/{}", parts.join("/")).replace("//", "/")
    }

    /// The directory at a `/`-separated path (relative to the working directory, or absolute).
    fn navigate(&self, path: &str) -> Option<NodeId> {
        if path == "." {
            return Some(self.cwd);
        }
        if path == "/" {
            return Some(self.root);
        }
        let mut at = if path.starts_with('/') {
            self.root
        } else {
            self.cwd
        };
        for part in path.trim_matches('/').split('/') {
            at = match part {
                "." | "" => at,
                ".." => self.parent(at)?,
                name => self
                    .child(at, &PyValue::str(name))
                    .filter(|id| self.is_dir(*id))?,
            };
        }
        Some(at)
    }

    fn encode(&self, id: NodeId) -> Value {
        let mut m = Map::new();
        match &self.nodes[id] {
            Node::File { name, content } => {
                m.insert("__pyobj__".into(), Value::from("File"));
                m.insert("name".into(), Value::from(name.as_str()));
                m.insert("content".into(), content.to_encoded());
            }
            Node::Dir { name, contents, .. } => {
                m.insert("__pyobj__".into(), Value::from("Directory"));
                m.insert("name".into(), Value::from(name.as_str()));
                let children: Map<String, Value> = contents
                    .iter()
                    .map(|(k, c)| (k.clone(), self.encode(*c)))
                    .collect();
                m.insert("contents".into(), Value::Object(children));
            }
        }
        Value::Object(m)
    }

    fn cd(&mut self, folder: &PyValue) -> Result<PyValue, PyErr> {
        let Some(folder) = folder.as_str() else {
            return Err(PyErr::no_attribute(folder, "rstrip"));
        };
        if folder == "/" {
            self.cwd = self.root;
            return Ok(PyValue::dict([(
                "current_working_directory",
                PyValue::str("/"),
            )]));
        }
        let folder = folder.trim_end_matches('/');
        if folder == ".." {
            return Ok(match self.parent(self.cwd) {
                Some(p) => {
                    self.cwd = p;
                    PyValue::Dict(PyDict::new())
                }
                None => error_dict("Current directory is already the root. Cannot go back."),
            });
        }
        if folder.contains('/') {
            return Ok(error_dict(format!(
                "cd: {folder}: Unsupported path. Only one folder level at a time is supported."
            )));
        }
        match self
            .child(self.cwd, &PyValue::str(folder))
            .filter(|id| self.is_dir(*id))
        {
            Some(id) => {
                self.cwd = id;
                Ok(PyValue::dict([(
                    "current_working_directory",
                    PyValue::str(folder),
                )]))
            }
            None => Ok(error_dict(format!(
                "cd: '{folder}': No such file or directory"
            ))),
        }
    }

    fn find(&self, path: &PyValue, name: &PyValue) -> Result<PyValue, PyErr> {
        let Some(p) = path.as_str() else {
            return Err(PyErr::no_attribute(path, "strip"));
        };
        let Some(start) = self.navigate(p) else {
            return Ok(error_dict(format!(
                "find: '{p}': No such file or directory"
            )));
        };
        let mut matches = Vec::new();
        self.walk(start, p.trim_end_matches('/'), name, &mut matches)?;
        Ok(PyValue::dict([("matches", PyValue::List(matches))]))
    }

    fn walk(
        &self,
        dir: NodeId,
        base: &str,
        name: &PyValue,
        out: &mut Vec<PyValue>,
    ) -> Result<(), PyErr> {
        for (item, id) in self.entries(dir) {
            let path = format!("{base}/{item}");
            if matches!(name, PyValue::None) || contains(&item, name)? {
                out.push(PyValue::Str(path.clone()));
            }
            if self.is_dir(id) {
                self.walk(id, &path, name, out)?;
            }
        }
        Ok(())
    }

    fn du_bytes(&self, id: NodeId) -> usize {
        match &self.nodes[id] {
            Node::File { content, .. } => content_str(content).len(),
            Node::Dir { contents, .. } => contents.iter().map(|(_, c)| self.du_bytes(*c)).sum(),
        }
    }

    /// `cp`/`mv` of a directory: a new `Directory` holding the source's own children.
    fn alias_dir(&mut self, source: NodeId, name: &str, parent: NodeId) -> NodeId {
        let contents = self.entries(source);
        self.nodes.push(Node::Dir {
            name: name.to_string(),
            parent: Some(parent),
            contents,
        });
        self.nodes.len() - 1
    }

    fn copy_node(&mut self, source: NodeId, name: &str, parent: NodeId) -> NodeId {
        match self.nodes[source].clone() {
            Node::File { content, .. } => self.new_file(name, content),
            Node::Dir { .. } => self.alias_dir(source, name, parent),
        }
    }

    fn cp(&mut self, source: &PyValue, destination: &PyValue) -> Result<PyValue, PyErr> {
        let Some(src) = self.child(self.cwd, source) else {
            return Ok(error_dict(format!(
                "cp: cannot copy '{}': No such file or directory",
                source.to_py_str()
            )));
        };
        let src_name = source.to_py_str();
        if invalid_name(destination)? {
            return Ok(error_dict(format!(
                "cp: cannot copy '{src_name}' to '{}': Invalid character",
                destination.to_py_str()
            )));
        }
        let dest = destination.to_py_str();
        match self.child(self.cwd, destination) {
            Some(d) if self.is_dir(d) => {
                if self.child(d, source).is_some() {
                    return Err(PyErr::value_error(format!(
                        "File '{src_name}' already exists in directory '{dest}'."
                    )));
                }
                let copy = self.copy_node(src, &src_name, d);
                self.put(d, &src_name, copy);
                Ok(PyValue::dict([(
                    "result",
                    PyValue::Str(format!("'{src_name}' copied to '{dest}/{src_name}'")),
                )]))
            }
            Some(_) => Err(PyErr::value_error(format!(
                "File '{dest}' already exists in directory '{}'.",
                self.node_name(self.cwd)
            ))),
            None => {
                let copy = self.copy_node(src, &dest, self.cwd);
                self.put(self.cwd, &dest, copy);
                Ok(PyValue::dict([(
                    "result",
                    PyValue::Str(format!("'{src_name}' copied to '{dest}'")),
                )]))
            }
        }
    }

    fn mv(&mut self, source: &PyValue, destination: &PyValue) -> Result<PyValue, PyErr> {
        let Some(src) = self.child(self.cwd, source) else {
            return Ok(error_dict(format!(
                "mv: cannot move '{}': No such file or directory",
                source.to_py_str()
            )));
        };
        let src_name = source.to_py_str();
        if invalid_name(destination)? {
            return Ok(error_dict(format!(
                "mv: cannot move '{src_name}' to '{}': Invalid character",
                destination.to_py_str()
            )));
        }
        let dest = destination.to_py_str();
        match self.child(self.cwd, destination) {
            Some(d) if self.is_dir(d) => {
                if self.child(d, source).is_some() {
                    return Ok(error_dict(format!(
                        "mv: cannot move '{src_name}' to '{dest}/{src_name}': File exists"
                    )));
                }
                self.pop(self.cwd, &src_name);
                if let Node::Dir { parent, .. } = &mut self.nodes[src] {
                    *parent = Some(d);
                }
                self.put(d, &src_name, src);
                Ok(PyValue::dict([(
                    "result",
                    PyValue::Str(format!("'{src_name}' moved to '{dest}/{src_name}'")),
                )]))
            }
            Some(_) => Ok(error_dict(format!(
                "mv: cannot move '{src_name}' to '{dest}': File exists"
            ))),
            None => {
                self.pop(self.cwd, &src_name);
                let moved = match &mut self.nodes[src] {
                    Node::File { name, .. } => {
                        *name = dest.clone();
                        src
                    }
                    Node::Dir { .. } => self.alias_dir(src, &dest, self.cwd),
                };
                self.put(self.cwd, &dest, moved);
                Ok(PyValue::dict([(
                    "result",
                    PyValue::Str(format!("'{src_name}' moved to '{dest}'")),
                )]))
            }
        }
    }

    fn tail(&self, file_name: &PyValue, lines: &PyValue) -> Result<PyValue, PyErr> {
        let Some(content) = self.file_child(file_name) else {
            return Ok(error_dict(format!(
                "tail: {}: No such file or directory",
                file_name.to_py_str()
            )));
        };
        let all = splitlines(&content);
        let len = all.len() as i64;
        let n = if compare(CmpOp::Gt, lines, &PyValue::Int(len))? {
            len
        } else {
            match lines {
                PyValue::Int(i) => *i,
                PyValue::Bool(b) => i64::from(*b),
                _ => {
                    return Err(PyErr::type_error(
                        "slice indices must be integers or None or have an __index__ method",
                    ))
                }
            }
        };
        // `all[-n:]` with Python's slice clamping.
        let start = if n > 0 {
            (len - n).max(0)
        } else {
            (-n).min(len)
        };
        let start = if n == 0 { 0 } else { start };
        let start = usize::try_from(start).unwrap_or(0);
        Ok(PyValue::dict([(
            "last_lines",
            PyValue::Str(all[start..].join("\n")),
        )]))
    }

    fn dispatch(&mut self, method: &str, a: &[Option<PyValue>]) -> Result<PyValue, PyErr> {
        let arg = |i: usize| a.get(i).cloned().flatten().unwrap_or(PyValue::None);
        let one = |k: &str, v: PyValue| Ok(PyValue::dict([(k, v)]));
        let missing = |cmd: &str, f: &PyValue| {
            Ok(error_dict(format!(
                "{cmd}: {}: No such file or directory",
                f.to_py_str()
            )))
        };
        match method {
            "pwd" => one("current_working_directory", PyValue::Str(self.pwd())),
            "ls" => {
                let all = a[0].as_ref().is_some_and(PyValue::truthy);
                let names = self
                    .entries(self.cwd)
                    .into_iter()
                    .filter(|(n, _)| all || !n.starts_with('.'))
                    .map(|(n, _)| PyValue::Str(n))
                    .collect();
                one("current_directory_content", PyValue::List(names))
            }
            "cd" => self.cd(&arg(0)),
            "mkdir" => {
                let name = arg(0);
                if invalid_name(&name)? {
                    return Ok(error_dict(format!(
                        "mkdir: cannot create directory '{}': Invalid character",
                        name.to_py_str()
                    )));
                }
                let n = name.to_py_str();
                if self.child(self.cwd, &name).is_some() {
                    return Ok(error_dict(format!(
                        "mkdir: cannot create directory '{n}': File exists"
                    )));
                }
                self.nodes.push(Node::Dir {
                    name: n.clone(),
                    parent: Some(self.cwd),
                    contents: Vec::new(),
                });
                let id = self.nodes.len() - 1;
                self.put(self.cwd, &n, id);
                Ok(PyValue::None)
            }
            "touch" => {
                let name = arg(0);
                if invalid_name(&name)? {
                    return Ok(error_dict(format!(
                        "touch: cannot touch '{}': Invalid character",
                        name.to_py_str()
                    )));
                }
                if self.child(self.cwd, &name).is_none() {
                    let n = name.to_py_str();
                    let id = self.new_file(&n, PyValue::str(""));
                    self.put(self.cwd, &n, id);
                }
                Ok(PyValue::None)
            }
            "echo" => {
                let (content, file_name) = (arg(0), arg(1));
                if matches!(file_name, PyValue::None) {
                    return one("terminal_output", content);
                }
                if invalid_name(&file_name)? {
                    return Ok(error_dict(format!(
                        "echo: cannot write to '{}': Invalid character",
                        file_name.to_py_str()
                    )));
                }
                match self.child(self.cwd, &file_name) {
                    Some(id) if !self.is_dir(id) => {
                        if let Node::File { content: c, .. } = &mut self.nodes[id] {
                            *c = content;
                        }
                        Ok(PyValue::None)
                    }
                    _ => Ok(error_dict(format!(
                        "echo: cannot write to '{}': No such file",
                        file_name.to_py_str()
                    ))),
                }
            }
            "cat" => {
                let name = arg(0);
                if invalid_name(&name)? {
                    return Ok(error_dict(format!(
                        "cat: '{}': Invalid character",
                        name.to_py_str()
                    )));
                }
                match self.child(self.cwd, &name) {
                    Some(id) => match &self.nodes[id] {
                        Node::File { content, .. } => one("file_content", content.clone()),
                        Node::Dir { .. } => Ok(error_dict(format!(
                            "cat: '{}': Is a directory",
                            name.to_py_str()
                        ))),
                    },
                    None => Ok(error_dict(format!(
                        "cat: '{}': No such file or directory",
                        name.to_py_str()
                    ))),
                }
            }
            "find" => {
                let path = a[0].clone().unwrap_or(PyValue::str("."));
                self.find(&path, &arg(1))
            }
            "wc" => {
                let (file_name, mode) = (arg(0), a[1].clone().unwrap_or(PyValue::str("l")));
                let kind = match mode.as_str() {
                    Some("l") => "lines",
                    Some("w") => "words",
                    Some("c") => "characters",
                    _ => {
                        return Ok(error_dict(format!(
                            "wc: invalid mode '{}'",
                            mode.to_py_str()
                        )))
                    }
                };
                let Some(content) = self.file_child(&file_name) else {
                    return missing("wc", &file_name);
                };
                let count = match kind {
                    "lines" => splitlines(&content).len(),
                    "words" => content.split_whitespace().count(),
                    _ => content.chars().count(),
                };
                Ok(PyValue::dict([
                    ("count", PyValue::Int(count as i64)),
                    ("type", PyValue::str(kind)),
                ]))
            }
            "sort" => {
                let file_name = arg(0);
                let Some(content) = self.file_child(&file_name) else {
                    return missing("sort", &file_name);
                };
                let mut lines = splitlines(&content);
                lines.sort();
                one("sorted_content", PyValue::Str(lines.join("\n")))
            }
            "grep" => {
                let (file_name, pattern) = (arg(0), arg(1));
                let Some(content) = self.file_child(&file_name) else {
                    return missing("grep", &file_name);
                };
                let mut hits = Vec::new();
                for line in splitlines(&content) {
                    if contains(&line, &pattern)? {
                        hits.push(PyValue::Str(line));
                    }
                }
                one("matching_lines", PyValue::List(hits))
            }
            "du" => {
                let human = a[0].as_ref().is_some_and(PyValue::truthy);
                let bytes = self.du_bytes(self.cwd);
                let text = if human {
                    let mut size = bytes as f64;
                    let mut unit = "B";
                    for u in ["KB", "MB", "GB", "TB"] {
                        if size < 1024.0 {
                            break;
                        }
                        size /= 1024.0;
                        unit = u;
                    }
                    format!("{size:.2} {unit}")
                } else {
                    format!("{bytes} bytes")
                };
                one("disk_usage", PyValue::Str(text))
            }
            "tail" => {
                let lines = a[1].clone().unwrap_or(PyValue::Int(10));
                self.tail(&arg(0), &lines)
            }
            "diff" => {
                let (f1, f2) = (arg(0), arg(1));
                let (Some(c1), Some(c2)) = (self.file_child(&f1), self.file_child(&f2)) else {
                    return Ok(error_dict(format!(
                        "diff: {} or {}: No such file or directory",
                        f1.to_py_str(),
                        f2.to_py_str()
                    )));
                };
                let diff: Vec<String> = splitlines(&c1)
                    .into_iter()
                    .zip(splitlines(&c2))
                    .filter(|(x, y)| x != y)
                    .map(|(x, y)| format!("- {x}\n+ {y}"))
                    .collect();
                one("diff_lines", PyValue::Str(diff.join("\n")))
            }
            "mv" => self.mv(&arg(0), &arg(1)),
            "cp" => self.cp(&arg(0), &arg(1)),
            "rm" => {
                let name = arg(0);
                if self.child(self.cwd, &name).is_none() {
                    return Ok(error_dict(format!(
                        "rm: cannot remove '{}': No such file or directory",
                        name.to_py_str()
                    )));
                }
                self.pop(self.cwd, &name.to_py_str());
                one(
                    "result",
                    PyValue::Str(format!("'{}' removed", name.to_py_str())),
                )
            }
            "rmdir" => {
                let name = arg(0);
                let n = name.to_py_str();
                match self.child(self.cwd, &name).filter(|id| self.is_dir(*id)) {
                    Some(id) if !self.entries(id).is_empty() => Ok(error_dict(format!(
                        "rmdir: failed to remove '{n}': Directory not empty"
                    ))),
                    Some(_) => {
                        self.pop(self.cwd, &n);
                        one("result", PyValue::Str(format!("'{n}' removed")))
                    }
                    None => Ok(error_dict(format!(
                        "rmdir: cannot remove '{n}': No such file or directory"
                    ))),
                }
            }
            _ => Err(PyErr::no_attribute(&PyValue::None, method)),
        }
    }
}

fn params(method: &str) -> &'static [Param] {
    const SRC_DST: [Param; 2] = [req("source"), req("destination")];
    const DIFF: [Param; 2] = [req("file_name1"), req("file_name2")];
    const ECHO: [Param; 2] = [req("content"), opt("file_name")];
    const FIND: [Param; 2] = [opt("path"), opt("name")];
    const GREP: [Param; 2] = [req("file_name"), req("pattern")];
    const TAIL: [Param; 2] = [req("file_name"), opt("lines")];
    const WC: [Param; 2] = [req("file_name"), opt("mode")];
    const FILE: [Param; 1] = [req("file_name")];
    const DIR: [Param; 1] = [req("dir_name")];
    match method {
        "cat" | "rm" | "sort" | "touch" => &FILE,
        "cd" => {
            const P: &[Param] = &[req("folder")];
            P
        }
        "cp" | "mv" => &SRC_DST,
        "diff" => &DIFF,
        "du" => {
            const P: &[Param] = &[opt("human_readable")];
            P
        }
        "echo" => &ECHO,
        "find" => &FIND,
        "grep" => &GREP,
        "ls" => {
            const P: &[Param] = &[opt("a")];
            P
        }
        "mkdir" | "rmdir" => &DIR,
        "tail" => &TAIL,
        "wc" => &WC,
        _ => &[],
    }
}

impl PythonClass for GorillaFileSystem {
    const CLASS: &'static str = CLASS;
    const METHODS: &'static [&'static str] = METHODS;

    fn params(method: &str) -> &'static [Param] {
        params(method)
    }

    fn call_bound(&mut self, method: &str, bound: Bound) -> Result<PyValue, PyErr> {
        self.dispatch(method, &bound.into_values())
    }

    fn vars(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("long_context".into(), Value::Bool(self.long_context));
        m.insert("root".into(), self.encode(self.root));
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bfcl::classes::ApiClass;

    fn fs() -> GorillaFileSystem {
        let config: Value = serde_json::json!({"root": {"ws": {"type": "directory", "contents": {
            "d": {"type": "directory", "contents": {
                "f.txt": {"type": "file", "content": "a\nb"}}},
            "g.txt": {"type": "file", "content": "x"}}}}});
        let PyValue::Dict(d) = PyValue::from_json(&config) else {
            panic!("object")
        };
        GorillaFileSystem::load(&d, false).expect("loads")
    }

    fn call(fs: &mut GorillaFileSystem, m: &str, kw: &[(&str, &str)]) -> String {
        let kwargs = kw
            .iter()
            .map(|(k, v)| ((*k).to_string(), PyValue::str(*v)))
            .collect();
        match fs.call(m, vec![], kwargs) {
            Ok(v) => v.json_dumps().unwrap_or_else(|_| v.repr()),
            Err(e) => e.to_result_text(),
        }
    }

    #[test]
    fn directory_copy_shares_children() {
        let mut f = fs();
        call(&mut f, "cp", &[("source", "d"), ("destination", "e")]);
        call(&mut f, "cd", &[("folder", "e")]);
        call(
            &mut f,
            "echo",
            &[("content", "new"), ("file_name", "f.txt")],
        );
        call(&mut f, "cd", &[("folder", "..")]);
        call(&mut f, "cd", &[("folder", "d")]);
        assert_eq!(
            call(&mut f, "cat", &[("file_name", "f.txt")]),
            r#"{"file_content": "new"}"#
        );
        // A deep copy keeps the aliasing.
        let mut g = f.clone();
        call(
            &mut g,
            "echo",
            &[("content", "again"), ("file_name", "f.txt")],
        );
        assert_eq!(
            g.snapshot()["root"]["contents"]["e"]["contents"]["f.txt"]["content"],
            "again"
        );
        assert_eq!(
            f.snapshot()["root"]["contents"]["e"]["contents"]["f.txt"]["content"],
            "new"
        );
    }

    #[test]
    fn shell_messages() {
        let mut f = fs();
        assert_eq!(
            call(&mut f, "cd", &[("folder", "a/b")]),
            r#"{"error": "cd: a/b: Unsupported path. Only one folder level at a time is supported."}"#
        );
        assert_eq!(
            call(&mut f, "cd", &[("folder", "..")]),
            r#"{"error": "Current directory is already the root. Cannot go back."}"#
        );
        assert_eq!(
            call(&mut f, "find", &[("path", "."), ("name", "t")]),
            r#"{"matches": ["./d/f.txt", "./g.txt"]}"#
        );
        assert_eq!(splitlines("a\r\nb\n"), vec!["a", "b"]);
    }
}
