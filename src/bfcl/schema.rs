//! Tool schemas: BFCL's multi-turn function docs as OpenAI function schemas, per task and turn.
//!
//! The docs are JSON lines under `bfcl_eval/data/multi_turn_func_doc/` (installed by the
//! set-up; one file per class, see [`DOC_FILES`]). Each line is
//! `{"name", "description", "parameters": {"type": "dict", "properties", "required"},
//! "response"}` with BFCL's Python-flavoured type names. [`to_json_schema`] rewrites them
//! to JSON-Schema types, recursively through `properties` and `items`:
//!
//! | BFCL | JSON Schema |
//! |---|---|
//! | `dict`, `object` | `object` |
//! | `float`, `number` | `number` |
//! | `int`, `integer` | `integer` |
//! | `bool`, `boolean` | `boolean` |
//! | `str`, `string` | `string` |
//! | `list`, `array`, `tuple` | `array` |
//! | `any` | no `type` (any value) |
//!
//! BFCL's own handlers map `any` to `string` and append " This is a float type value." to
//! float descriptions; we keep descriptions verbatim and leave `any` untyped, which is the
//! standard JSON-Schema meaning. `response` is not part of an OpenAI schema and is dropped
//! from the tool (it stays on [`FuncDoc`]).
//!
//! Per task ([`FuncDocs::task_tools`]), as `populate_test_cases_with_predefined_functions`
//! and the handlers' inference loop do: the involved classes' docs in `involved_classes`
//! order, minus the task's excluded functions, minus its missed functions, whose docs are
//! appended (in turn order) from the turn the task names on.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use super::error::BfclError;

/// Class name → func-doc file name (BFCL's `MULTI_TURN_FUNC_DOC_FILE_MAPPING`).
pub const DOC_FILES: &[(&str, &str)] = &[
    ("GorillaFileSystem", "gorilla_file_system.json"),
    ("MathAPI", "math_api.json"),
    ("MessageAPI", "message_api.json"),
    ("TwitterAPI", "posting_api.json"),
    ("TicketAPI", "ticket_api.json"),
    ("TradingBot", "trading_bot.json"),
    ("TravelAPI", "travel_booking.json"),
    ("VehicleControlAPI", "vehicle_control.json"),
];

/// One function doc of a class.
#[derive(Debug, Clone, PartialEq)]
pub struct FuncDoc {
    /// The class the function belongs to (`GorillaFileSystem`).
    pub class: String,
    /// The function (method) name.
    pub name: String,
    /// BFCL's description.
    pub description: String,
    /// BFCL's parameter schema, as in the file.
    pub parameters: Value,
    /// BFCL's response schema, as in the file (not part of the tool).
    pub response: Option<Value>,
    /// The OpenAI tool: `{"type": "function", "function": {"name", "description",
    /// "parameters"}}` with JSON-Schema types.
    pub tool: Value,
}

/// The function docs of the eight multi-turn classes.
#[derive(Debug, Clone, Default)]
pub struct FuncDocs {
    by_class: BTreeMap<String, Vec<FuncDoc>>,
}

/// The installed func-doc folder: `assets_dir()/bfcl_eval/data/multi_turn_func_doc`.
pub fn installed_dir() -> PathBuf {
    super::tasks::data_dir().join("multi_turn_func_doc")
}

impl FuncDocs {
    /// Loads every class of [`DOC_FILES`] from `dir`.
    ///
    /// # Errors
    /// [`BfclError::Io`] for a missing file, [`BfclError::Data`] (file and line) for a line
    /// that is not a function doc or uses a type this module does not know.
    pub fn load(dir: &Path) -> Result<Self, BfclError> {
        let mut by_class = BTreeMap::new();
        for (class, file) in DOC_FILES {
            let path = dir.join(file);
            let text = std::fs::read_to_string(&path).map_err(|source| BfclError::Io {
                path: path.clone(),
                source,
            })?;
            let mut docs = Vec::new();
            for (i, line) in text.lines().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                let data_error = |reason: String| BfclError::Data {
                    path: path.clone(),
                    line: i + 1,
                    reason,
                };
                let raw: Value =
                    serde_json::from_str(line).map_err(|e| data_error(e.to_string()))?;
                docs.push(FuncDoc::from_raw(class, &raw).map_err(data_error)?);
            }
            by_class.insert((*class).to_string(), docs);
        }
        Ok(Self { by_class })
    }

    /// Loads the installed docs ([`installed_dir`]).
    ///
    /// # Errors
    /// As [`FuncDocs::load`].
    pub fn load_installed() -> Result<Self, BfclError> {
        Self::load(&installed_dir())
    }

    /// The docs of `class`, in file order.
    pub fn class(&self, class: &str) -> Option<&[FuncDoc]> {
        self.by_class.get(class).map(Vec::as_slice)
    }

    /// The doc of function `name` among `classes`.
    pub fn find(&self, classes: &[String], name: &str) -> Option<&FuncDoc> {
        classes
            .iter()
            .filter_map(|c| self.class(c))
            .flatten()
            .find(|d| d.name == name)
    }

    /// The docs offered at user turn `turn` (0-based) of a task: see the module doc.
    ///
    /// # Errors
    /// [`BfclError::NoFuncDoc`] when a class has no docs.
    pub fn task_docs(
        &self,
        classes: &[String],
        excluded: &[String],
        missed: &BTreeMap<usize, Vec<String>>,
        turn: usize,
    ) -> Result<Vec<&FuncDoc>, BfclError> {
        let mut all = Vec::new();
        for c in classes {
            let docs = self
                .class(c)
                .ok_or_else(|| BfclError::NoFuncDoc(c.clone()))?;
            all.extend(docs.iter().filter(|d| !excluded.contains(&d.name)));
        }
        let withheld = |d: &&FuncDoc| missed.values().any(|names| names.contains(&d.name));
        let mut offered: Vec<&FuncDoc> = all.iter().copied().filter(|d| !withheld(d)).collect();
        for (_, names) in missed.range(..=turn) {
            for name in names {
                offered.extend(all.iter().copied().filter(|d| &d.name == name));
            }
        }
        Ok(offered)
    }

    /// The OpenAI tools offered at `turn` (see [`FuncDocs::task_docs`]).
    ///
    /// # Errors
    /// As [`FuncDocs::task_docs`].
    pub fn task_tools(
        &self,
        classes: &[String],
        excluded: &[String],
        missed: &BTreeMap<usize, Vec<String>>,
        turn: usize,
    ) -> Result<Vec<Value>, BfclError> {
        Ok(self
            .task_docs(classes, excluded, missed, turn)?
            .into_iter()
            .map(|d| d.tool.clone())
            .collect())
    }
}

impl FuncDoc {
    /// Reads one doc line of `class` and builds its tool.
    ///
    /// # Errors
    /// A message naming what is missing or which type is unknown.
    pub fn from_raw(class: &str, raw: &Value) -> Result<Self, String> {
        let name = raw
            .get("name")
            .and_then(Value::as_str)
            .ok_or("missing string field \"name\"")?;
        let description = raw
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let parameters = raw
            .get("parameters")
            .ok_or_else(|| format!("{name}: missing \"parameters\""))?;
        let mut schema = to_json_schema(parameters).map_err(|e| format!("{name}: {e}"))?;
        // OpenAI requires an object schema at the top, whatever BFCL wrote.
        if let Value::Object(m) = &mut schema {
            m.insert("type".into(), Value::from("object"));
        }
        Ok(Self {
            class: class.to_string(),
            name: name.to_string(),
            description: description.to_string(),
            parameters: parameters.clone(),
            response: raw.get("response").cloned(),
            tool: json!({
                "type": "function",
                "function": {"name": name, "description": description, "parameters": schema},
            }),
        })
    }
}

/// The JSON-Schema type of a BFCL type name; `Ok(None)` for `any`.
///
/// # Errors
/// The name, when it is not one of the types the module doc lists.
pub fn json_type(bfcl: &str) -> Result<Option<&'static str>, String> {
    Ok(Some(match bfcl {
        "dict" | "object" => "object",
        "float" | "number" => "number",
        "int" | "integer" => "integer",
        "bool" | "boolean" => "boolean",
        "str" | "string" => "string",
        "list" | "array" | "tuple" => "array",
        "any" => return Ok(None),
        other => return Err(format!("unknown BFCL type {other:?}")),
    }))
}

/// Rewrites a BFCL schema to JSON Schema: `type` through [`json_type`], recursively in
/// `properties` and `items`; every other key is kept as is.
///
/// # Errors
/// An unknown type name, or a `type` / `properties` of the wrong JSON kind.
pub fn to_json_schema(schema: &Value) -> Result<Value, String> {
    let Value::Object(m) = schema else {
        return Err(format!("a schema must be an object, got {schema}"));
    };
    let mut out = Map::new();
    for (k, v) in m {
        match k.as_str() {
            "type" => {
                let t = v
                    .as_str()
                    .ok_or_else(|| format!("\"type\" {v} is not a string"))?;
                if let Some(t) = json_type(t)? {
                    out.insert(k.clone(), Value::from(t));
                }
            }
            "properties" => {
                let props = v
                    .as_object()
                    .ok_or_else(|| format!("\"properties\" {v} is not an object"))?;
                let converted = props
                    .iter()
                    .map(|(p, s)| {
                        to_json_schema(s)
                            .map(|s| (p.clone(), s))
                            .map_err(|e| format!("{p}: {e}"))
                    })
                    .collect::<Result<Map<_, _>, _>>()?;
                out.insert(k.clone(), Value::Object(converted));
            }
            "items" => {
                out.insert(
                    k.clone(),
                    to_json_schema(v).map_err(|e| format!("items: {e}"))?,
                );
            }
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bfcl::tasks::{load_installed, Category};

    fn docs() -> FuncDocs {
        FuncDocs::load_installed().expect("installed by `make setup`")
    }

    fn names(tools: &[Value]) -> Vec<&str> {
        tools
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap())
            .collect()
    }

    #[test]
    fn types_convert_recursively() {
        let raw = json!({"type": "dict", "properties": {
            "a": {"type": "float", "description": "x"},
            "t": {"type": "tuple", "items": {"type": "int"}},
            "l": {"type": "list", "items": {"type": "dict", "properties": {"b": {"type": "bool"}}}},
            "s": {"type": "str", "enum": ["p", "q"], "default": "p"},
            "z": {"type": "any", "description": "anything"}},
            "required": ["a"]});
        assert_eq!(
            to_json_schema(&raw).unwrap(),
            json!({"type": "object", "properties": {
                "a": {"type": "number", "description": "x"},
                "t": {"type": "array", "items": {"type": "integer"}},
                "l": {"type": "array", "items": {"type": "object", "properties": {"b": {"type": "boolean"}}}},
                "s": {"type": "string", "enum": ["p", "q"], "default": "p"},
                "z": {"description": "anything"}},
                "required": ["a"]})
        );
        let err = to_json_schema(&json!({"type": "HashMap"})).unwrap_err();
        assert!(err.contains("HashMap"), "{err}");
    }

    #[test]
    fn installed_docs_become_openai_tools() {
        let d = docs();
        assert_eq!(d.class("MathAPI").unwrap().len(), 17);
        let math = d.find(&["MathAPI".into()], "mean").unwrap();
        assert_eq!(
            math.tool,
            json!({"type": "function", "function": {
                "name": "mean",
                "description": "This tool belongs to the Math API, which provides various mathematical operations. Tool description: Calculate the mean of a list of numbers.",
                "parameters": {"type": "object", "properties": {
                    "numbers": {"type": "array", "items": {"type": "number"},
                                "description": "List of numbers to calculate the mean of. "}},
                    "required": ["numbers"]}}})
        );
        let ticket = d.find(&["TicketAPI".into()], "edit_ticket").unwrap();
        let params = &ticket.tool["function"]["parameters"];
        assert_eq!(params["properties"]["ticket_id"]["type"], "integer");
        assert_eq!(params["properties"]["updates"]["type"], "object");
        assert_eq!(
            params["properties"]["updates"]["properties"]["priority"],
            json!({"type": "integer", "description": "[Optional] New priority for the ticket."})
        );
        let ls = d.find(&["GorillaFileSystem".into()], "ls").unwrap();
        assert_eq!(
            ls.tool["function"]["parameters"],
            json!({"type": "object", "properties": {"a": {"type": "boolean",
                "description": "Show hidden files and directories. Defaults to False. ",
                "default": false}}, "required": []})
        );
        assert!(ls.tool["function"].get("response").is_none());
        assert!(ls.response.is_some());
    }

    #[test]
    fn every_task_gets_its_tools_with_exclusions_and_missed_functions() {
        let d = docs();
        for c in Category::ALL {
            for t in load_installed(c).unwrap() {
                let first = d
                    .task_tools(
                        &t.involved_classes,
                        &t.excluded_functions,
                        &t.missed_functions,
                        0,
                    )
                    .unwrap();
                let first = names(&first);
                for ex in &t.excluded_functions {
                    assert!(!first.contains(&ex.as_str()), "{} offers {ex}", t.id);
                }
                for (turn, missed) in &t.missed_functions {
                    let before = d
                        .task_tools(
                            &t.involved_classes,
                            &t.excluded_functions,
                            &t.missed_functions,
                            turn - 1,
                        )
                        .unwrap();
                    let at = d
                        .task_tools(
                            &t.involved_classes,
                            &t.excluded_functions,
                            &t.missed_functions,
                            *turn,
                        )
                        .unwrap();
                    for m in missed {
                        assert!(!names(&before).contains(&m.as_str()), "{}", t.id);
                        assert!(names(&at).contains(&m.as_str()), "{} lacks {m}", t.id);
                    }
                    assert_eq!(at.len(), before.len() + missed.len(), "{}", t.id);
                }
            }
        }
    }

    #[test]
    fn miss_func_zero_adds_sort_at_turn_three_at_the_end() {
        let d = docs();
        let t = &load_installed(Category::MissFunc).unwrap()[0];
        let tools = |turn| {
            d.task_tools(
                &t.involved_classes,
                &t.excluded_functions,
                &t.missed_functions,
                turn,
            )
        };
        let twitter = d.class("TwitterAPI").unwrap().len();
        let fs = d.class("GorillaFileSystem").unwrap().len();
        let t2 = tools(2).unwrap();
        // minus `cp` (excluded) and `sort` (missed)
        assert_eq!(t2.len(), twitter + fs - 2);
        assert!(!names(&t2).contains(&"sort") && !names(&t2).contains(&"cp"));
        let t3 = tools(3).unwrap();
        assert_eq!(names(&t3).last(), Some(&"sort"));
        assert_eq!(names(&t3)[0], d.class("TwitterAPI").unwrap()[0].name);
    }
}
