//! BFCL multi-turn tasks: the four categories' question files joined with their ground truth,
//! and the fixed train/test split.
//!
//! Data comes from the copy the set-up installs (`make setup` puts the `bfcl-eval==2026.3.23`
//! wheel's `bfcl_eval/` under `assets/`), never from the conformance folder in `../shared`:
//! [`data_dir`] is `envace_kernels::loader::assets_dir()/bfcl_eval/data`, and a category reads
//! `BFCL_v4_multi_turn_<category>.json` (question lines: `id`, `question`, `initial_config`,
//! `path`, `involved_classes`, optional `excluded_function`, `missed_function`) and
//! `possible_answer/BFCL_v4_multi_turn_<category>.json` (`id`, `ground_truth`: one list of call
//! strings per user turn). Both are JSON lines; a malformed line is an error naming the file
//! and the 1-based line.
//!
//! # Split
//!
//! The train/test split is stratified by the classes a scenario involves and follows the
//! scenario index across the four categories: see [`super::split`].

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use envace_actors::environment::EnvTask;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::BfclError;

/// The user message BFCL's function-calling handlers send at a miss-func turn, whose question
/// is empty (`DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC`).
pub const ADDITIONAL_FUNCTION_PROMPT: &str =
    "I have updated some more functions you can choose from. What about now?";

/// One of the four BFCL v4 multi-turn categories.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// All information and functions available.
    Base,
    /// A user turn lacks a required parameter; the model should ask instead of calling
    /// (that turn's ground truth is empty), the next turn supplies it.
    MissParam,
    /// A function is withheld until a named turn; before that the model should not call
    /// (empty ground truth), at that turn its doc appears.
    MissFunc,
    /// Base scenarios with large distracting state (`long_context=True` in `_load_scenario`).
    LongContext,
}

impl Category {
    /// All four, in BFCL's order.
    pub const ALL: [Category; 4] = [
        Category::Base,
        Category::MissParam,
        Category::MissFunc,
        Category::LongContext,
    ];

    /// The short name (`base`, `miss_param`, `miss_func`, `long_context`).
    pub fn name(self) -> &'static str {
        match self {
            Category::Base => "base",
            Category::MissParam => "miss_param",
            Category::MissFunc => "miss_func",
            Category::LongContext => "long_context",
        }
    }

    /// The data file name shared by the question and the possible-answer file.
    pub fn file_name(self) -> String {
        format!("BFCL_v4_multi_turn_{}.json", self.name())
    }

    /// The flag BFCL passes to `_load_scenario`: `"long_context" in id.rsplit("_", 1)[0]`,
    /// true only for this category.
    pub fn long_context(self) -> bool {
        self == Category::LongContext
    }

    /// The category of a task id (`multi_turn_miss_func_3` → `MissFunc`).
    pub fn of_id(id: &str) -> Option<Category> {
        let (prefix, _) = id.rsplit_once('_')?;
        prefix.strip_prefix("multi_turn_")?.parse().ok()
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Category {
    type Err = BfclError;

    /// Accepts the short name or the `multi_turn_` form.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let short = s.strip_prefix("multi_turn_").unwrap_or(s);
        Category::ALL
            .into_iter()
            .find(|c| c.name() == short)
            .ok_or_else(|| BfclError::UnknownCategory(s.to_string()))
    }
}

/// One message of a user turn, as in the question file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskMessage {
    /// `user` for every turn shipped (BFCL may add `system` at run time).
    pub role: String,
    pub content: String,
}

/// One line of a question file (the environment's task specification, see
/// [`BfclTask::to_env_task`]). Field names are BFCL's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskSpec {
    pub id: String,
    /// Messages per user turn; a miss-func turn that only reveals a function is empty.
    pub question: Vec<Vec<TaskMessage>>,
    /// `{class: scenario}`; classes absent here load their defaults.
    #[serde(default = "empty_object")]
    pub initial_config: Value,
    /// The `Class.method` path the ground truth follows (informational).
    #[serde(default)]
    pub path: Vec<String>,
    /// Instantiation order = state key order.
    pub involved_classes: Vec<String>,
    /// Functions never offered to the model in this task.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub excluded_function: Vec<String>,
    /// Turn index (a string, as in the file) → functions withheld until that turn.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub missed_function: BTreeMap<String, Vec<String>>,
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

impl TaskSpec {
    /// `missed_function` with numeric turn keys.
    ///
    /// # Errors
    /// A message naming the key when a key is not a turn number.
    pub fn missed_by_turn(&self) -> Result<BTreeMap<usize, Vec<String>>, String> {
        self.missed_function
            .iter()
            .map(|(k, v)| {
                k.parse::<usize>()
                    .map(|t| (t, v.clone()))
                    .map_err(|_| format!("missed_function key {k:?} is not a turn index"))
            })
            .collect()
    }

    /// The `long_context` flag BFCL derives from the id.
    pub fn long_context(&self) -> bool {
        Category::of_id(&self.id).is_some_and(Category::long_context)
    }
}

/// A BFCL multi-turn task with its ground truth.
#[derive(Debug, Clone, PartialEq)]
pub struct BfclTask {
    /// `multi_turn_<category>_<n>`.
    pub id: String,
    pub category: Category,
    /// The user messages of each turn (`question`).
    pub turns: Vec<Vec<TaskMessage>>,
    /// `{class: scenario}` as in the file.
    pub initial_config: Value,
    /// Instantiation order = state key order.
    pub involved_classes: Vec<String>,
    /// Functions never offered in this task.
    pub excluded_functions: Vec<String>,
    /// Turn → functions whose docs appear only from that turn on (miss_func).
    pub missed_functions: BTreeMap<usize, Vec<String>>,
    /// The ground-truth call strings per turn (Python-call syntax, e.g. `cd(folder='doc')`);
    /// an empty turn means the model should make no call.
    pub ground_truth: Vec<Vec<String>>,
    /// The ground-truth `Class.method` path (informational).
    pub path: Vec<String>,
}

impl BfclTask {
    /// Joins a question line with its ground truth.
    fn from_parts(
        spec: TaskSpec,
        ground_truth: Vec<Vec<String>>,
        category: Category,
    ) -> Result<Self, String> {
        let missed_functions = spec.missed_by_turn()?;
        if ground_truth.len() != spec.question.len() {
            return Err(format!(
                "{}: {} question turns but {} ground-truth turns",
                spec.id,
                spec.question.len(),
                ground_truth.len()
            ));
        }
        if let Some((&turn, _)) = missed_functions
            .iter()
            .find(|(&t, _)| t >= spec.question.len())
        {
            return Err(format!(
                "{}: missed_function names turn {turn} of {}",
                spec.id,
                spec.question.len()
            ));
        }
        Ok(Self {
            id: spec.id,
            category,
            turns: spec.question,
            initial_config: spec.initial_config,
            involved_classes: spec.involved_classes,
            excluded_functions: spec.excluded_function,
            missed_functions,
            ground_truth,
            path: spec.path,
        })
    }

    /// The numeric suffix of the id (`multi_turn_base_17` → 17).
    pub fn index(&self) -> Option<usize> {
        id_index(&self.id)
    }

    /// The `long_context` flag of `_load_scenario`.
    pub fn long_context(&self) -> bool {
        self.category.long_context()
    }

    /// The user messages the model sees at `turn`: the question's, or, at a miss-func turn
    /// (empty question), [`ADDITIONAL_FUNCTION_PROMPT`] as BFCL's handlers send it.
    pub fn user_messages(&self, turn: usize) -> Vec<TaskMessage> {
        match self.turns.get(turn) {
            Some(m) if m.is_empty() && self.missed_functions.contains_key(&turn) => {
                vec![TaskMessage {
                    role: "user".into(),
                    content: ADDITIONAL_FUNCTION_PROMPT.into(),
                }]
            }
            Some(m) => m.clone(),
            None => Vec::new(),
        }
    }

    /// Number of user turns.
    pub fn num_turns(&self) -> usize {
        self.turns.len()
    }

    /// The question-file form of this task.
    pub fn spec(&self) -> TaskSpec {
        TaskSpec {
            id: self.id.clone(),
            question: self.turns.clone(),
            initial_config: self.initial_config.clone(),
            path: self.path.clone(),
            involved_classes: self.involved_classes.clone(),
            excluded_function: self.excluded_functions.clone(),
            missed_function: self
                .missed_functions
                .iter()
                .map(|(t, f)| (t.to_string(), f.clone()))
                .collect(),
        }
    }

    /// The task as the [`Environment`](envace_actors::environment::Environment) receives it:
    /// the spec is the task's question-file line (no ground truth).
    pub fn to_env_task(&self) -> EnvTask {
        EnvTask {
            id: self.id.clone(),
            spec: serde_json::to_value(self.spec()).unwrap_or(Value::Null),
        }
    }
}

/// The numeric suffix of a task id.
pub fn id_index(id: &str) -> Option<usize> {
    id.rsplit_once('_')?.1.parse().ok()
}

/// `assets_dir()/bfcl_eval/data`, where the set-up installs BFCL's data.
pub fn data_dir() -> PathBuf {
    envace_kernels::loader::assets_dir()
        .join("bfcl_eval")
        .join("data")
}

/// Loads one category from `data_dir` (see [`data_dir`]), in question-file order.
///
/// # Errors
/// [`BfclError::Io`] for a missing file; [`BfclError::Data`] (file and line) for a line that is
/// not JSON, lacks a field, repeats an id, has no ground truth or a ground truth whose turn
/// count differs from the question's.
pub fn load_category(data_dir: &Path, category: Category) -> Result<Vec<BfclTask>, BfclError> {
    let question_path = data_dir.join(category.file_name());
    let answer_path = data_dir.join("possible_answer").join(category.file_name());

    #[derive(Deserialize)]
    struct Answer {
        id: String,
        ground_truth: Vec<Vec<String>>,
    }
    let mut answers: HashMap<String, (usize, Vec<Vec<String>>)> = HashMap::new();
    for (line, answer) in read_json_lines::<Answer>(&answer_path)? {
        if answers
            .insert(answer.id.clone(), (line, answer.ground_truth))
            .is_some()
        {
            return Err(data_error(
                &answer_path,
                line,
                format!("duplicate id {}", answer.id),
            ));
        }
    }

    let mut tasks = Vec::new();
    for (line, spec) in read_json_lines::<TaskSpec>(&question_path)? {
        if Category::of_id(&spec.id) != Some(category) {
            return Err(data_error(
                &question_path,
                line,
                format!("id {:?} is not a {category} task id", spec.id),
            ));
        }
        let Some((_, ground_truth)) = answers.remove(&spec.id) else {
            return Err(data_error(
                &question_path,
                line,
                format!(
                    "task {} has no ground truth in {}",
                    spec.id,
                    answer_path.display()
                ),
            ));
        };
        let task = BfclTask::from_parts(spec, ground_truth, category)
            .map_err(|reason| data_error(&question_path, line, reason))?;
        tasks.push(task);
    }
    if let Some((id, (line, _))) = answers.into_iter().min_by_key(|(_, (line, _))| *line) {
        return Err(data_error(
            &answer_path,
            line,
            format!(
                "ground truth for {id}, which {} does not hold",
                question_path.display()
            ),
        ));
    }
    Ok(tasks)
}

/// Loads one category from the installed data ([`data_dir`]).
///
/// # Errors
/// As [`load_category`].
pub fn load_installed(category: Category) -> Result<Vec<BfclTask>, BfclError> {
    load_category(&data_dir(), category)
}

fn data_error(path: &Path, line: usize, reason: impl Into<String>) -> BfclError {
    BfclError::Data {
        path: path.to_path_buf(),
        line,
        reason: reason.into(),
    }
}

/// Reads a JSON-lines file into `(1-based line, value)` pairs, skipping blank lines.
fn read_json_lines<T: serde::de::DeserializeOwned>(
    path: &Path,
) -> Result<Vec<(usize, T)>, BfclError> {
    let text = std::fs::read_to_string(path).map_err(|source| BfclError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map(|v| (i + 1, v))
                .map_err(|e| data_error(path, i + 1, e.to_string()))
        })
        .collect()
}

/// A small task over ported classes only (TicketAPI, MathAPI) for unit tests: turn 0 logs in
/// and creates a ticket, turn 1 has an empty ground truth, turn 2 adds and closes the ticket.
#[cfg(test)]
pub(crate) fn synthetic_task() -> BfclTask {
    let turn = |text: &str| {
        vec![TaskMessage {
            role: "user".into(),
            content: text.into(),
        }]
    };
    let calls = |c: &[&str]| c.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    BfclTask {
        id: "multi_turn_base_900".into(),
        category: Category::Base,
        turns: vec![
            turn("Log in as ann (pw) and file a priority-3 ticket 'Printer jam' (Floor 2)."),
            turn("Also close my other ticket."),
            turn("Add 2 and 3, then close ticket 1."),
        ],
        initial_config: serde_json::json!({"TicketAPI": {}}),
        involved_classes: vec!["TicketAPI".into(), "MathAPI".into()],
        excluded_functions: vec!["logout".into()],
        missed_functions: BTreeMap::new(),
        ground_truth: vec![
            calls(&[
                "ticket_login(username='ann', password='pw')",
                "create_ticket(title='Printer jam', description='Floor 2', priority=3)",
            ]),
            vec![],
            calls(&["add(a=2, b=3)", "close_ticket(ticket_id=1)"]),
        ],
        path: vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        let p = dir.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("envace-bfcl-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn category_names_round_trip() {
        for c in Category::ALL {
            assert_eq!(c.name().parse::<Category>().unwrap(), c);
            assert_eq!(format!("multi_turn_{c}").parse::<Category>().unwrap(), c);
        }
        assert!("multi_turn".parse::<Category>().is_err());
        assert_eq!(
            Category::of_id("multi_turn_miss_func_12"),
            Some(Category::MissFunc)
        );
        assert_eq!(Category::of_id("simple_python_3"), None);
    }

    #[test]
    fn installed_categories_load_with_their_ground_truth() {
        for c in Category::ALL {
            let tasks = load_installed(c).expect("installed by `make setup`");
            assert_eq!(tasks.len(), 200, "{c}");
            for t in &tasks {
                assert_eq!(t.turns.len(), t.ground_truth.len());
                assert!(!t.involved_classes.is_empty());
            }
        }
        let mf = load_installed(Category::MissFunc).unwrap();
        let t0 = &mf[0];
        assert_eq!(t0.id, "multi_turn_miss_func_0");
        assert_eq!(t0.involved_classes, ["TwitterAPI", "GorillaFileSystem"]);
        assert_eq!(t0.excluded_functions, ["cp"]);
        assert_eq!(t0.missed_functions[&3], ["sort"]);
        assert!(t0.turns[3].is_empty());
        assert_eq!(t0.ground_truth[2], Vec::<String>::new());
        assert_eq!(t0.ground_truth[3], ["sort('final_report.pdf')"]);
        assert_eq!(t0.user_messages(3)[0].content, ADDITIONAL_FUNCTION_PROMPT);
        assert_eq!(t0.user_messages(0), t0.turns[0]);
        // The spec round-trips through the environment task.
        let spec: TaskSpec = serde_json::from_value(t0.to_env_task().spec).unwrap();
        assert_eq!(spec, t0.spec());
    }

    #[test]
    fn malformed_lines_name_file_and_line() {
        let d = tmp("bad");
        let q = r#"{"id": "multi_turn_base_0", "question": [[{"role": "user", "content": "hi"}]], "initial_config": {}, "involved_classes": ["MathAPI"]}"#;
        write(
            &d,
            "BFCL_v4_multi_turn_base.json",
            &format!("{q}\n{{oops\n"),
        );
        write(
            &d,
            "possible_answer/BFCL_v4_multi_turn_base.json",
            "{\"id\": \"multi_turn_base_0\", \"ground_truth\": [[\"add(a=1, b=2)\"]]}\n",
        );
        let err = load_category(&d, Category::Base).unwrap_err().to_string();
        assert!(
            err.contains("BFCL_v4_multi_turn_base.json line 2:"),
            "{err}"
        );

        write(&d, "BFCL_v4_multi_turn_base.json", &format!("{q}\n"));
        write(
            &d,
            "possible_answer/BFCL_v4_multi_turn_base.json",
            "{\"id\": \"multi_turn_base_0\", \"ground_truth\": [[], []]}\n",
        );
        let err = load_category(&d, Category::Base).unwrap_err().to_string();
        assert!(
            err.contains("line 1:") && err.contains("1 question turns but 2 ground-truth turns"),
            "{err}"
        );

        write(
            &d,
            "possible_answer/BFCL_v4_multi_turn_base.json",
            "{\"id\": \"multi_turn_base_0\", \"ground_truth\": [[]]}\n{\"id\": \"multi_turn_base_9\", \"ground_truth\": [[]]}\n",
        );
        let err = load_category(&d, Category::Base).unwrap_err().to_string();
        assert!(
            err.contains("possible_answer") && err.contains("line 2:"),
            "{err}"
        );
        let tasks = {
            write(
                &d,
                "possible_answer/BFCL_v4_multi_turn_base.json",
                "{\"id\": \"multi_turn_base_0\", \"ground_truth\": [[\"add(a=1, b=2)\"]]}\n",
            );
            load_category(&d, Category::Base).unwrap()
        };
        assert_eq!(
            tasks[0].ground_truth,
            vec![vec!["add(a=1, b=2)".to_string()]]
        );
        let _ = std::fs::remove_dir_all(&d);
    }
}
