//! Few-shot facts for the Rehearse role, chosen without leaking test ground truth.
//!
//! The reference (DESIGN.md §2) grounds the Rehearse prompt in real (tool, arguments, result)
//! triples from the task's own seed trajectory. Seeds exist only for train tasks (DESIGN.md §1:
//! the real environment is used once, before training, on the train split), so a test task —
//! or a train task whose seed is missing — gets triples from *other* train tasks' seeds for the
//! tools it offers. A test task's own trajectory is never used, even if one was stored by
//! mistake: it would hand the model the ground truth it is evaluated on.

use std::collections::{BTreeMap, HashSet, VecDeque};

use crate::storage::{SeedTrajectory, TaskId, ToolExchange};
use crate::{EpisodeTask, Split};

/// All seed trajectories a run knows, with the split of their task, indexed for
/// [`SeedPool::facts_for`]. Plain data: `Send + Sync`, share it behind an `Arc`.
#[derive(Debug, Clone, Default)]
pub struct SeedPool {
    /// Seeds by task id (sorted), each task's seeds by index; the split is the task's.
    by_task: BTreeMap<TaskId, Vec<(Split, SeedTrajectory)>>,
}

impl SeedPool {
    /// A pool of `(split of the seed's task, seed)` pairs. Order does not matter: seeds are kept
    /// sorted by task id and seed index, so the facts chosen are deterministic.
    pub fn new(seeds: Vec<(Split, SeedTrajectory)>) -> Self {
        let mut by_task: BTreeMap<TaskId, Vec<(Split, SeedTrajectory)>> = BTreeMap::new();
        for (split, seed) in seeds {
            by_task
                .entry(seed.task.clone())
                .or_default()
                .push((split, seed));
        }
        for seeds in by_task.values_mut() {
            seeds.sort_by_key(|(_, seed)| seed.index);
        }
        Self { by_task }
    }

    /// Number of seed trajectories in the pool.
    pub fn len(&self) -> usize {
        self.by_task.values().map(Vec::len).sum()
    }

    /// True when the pool holds no seed.
    pub fn is_empty(&self) -> bool {
        self.by_task.is_empty()
    }

    /// At most `max` few-shot facts for a Rehearse prompt of `task`, each with arguments and
    /// result cut to `max_chars` characters (the last one then `…`).
    ///
    /// * A [`Split::Train`] task with a train seed of its own: the first `max` calls of its
    ///   first seed (lowest index), in call order (the reference behaviour).
    /// * Otherwise (every test task, a train task without a seed): calls from train seeds of
    ///   *other* tasks whose tool is in `task`'s whitelist, taken round-robin over the
    ///   whitelist's tool names (in schema order), each tool's calls in (task id, seed index,
    ///   call order) order, exact duplicates skipped.
    ///
    /// Test seeds are never used, nor the task's own seed when the task is a test task.
    pub fn facts_for(&self, task: &EpisodeTask, max: usize, max_chars: usize) -> Vec<ToolExchange> {
        if max == 0 {
            return Vec::new();
        }
        if task.split == Split::Train {
            let own = self
                .by_task
                .get(&task.id)
                .and_then(|seeds| seeds.iter().find(|(split, _)| *split == Split::Train));
            if let Some((_, seed)) = own {
                return seed
                    .tool_calls
                    .iter()
                    .take(max)
                    .map(|e| truncated(e, max_chars))
                    .collect();
            }
        }

        let names = task.tool_names();
        let mut queues: Vec<VecDeque<&ToolExchange>> = vec![VecDeque::new(); names.len()];
        let mut seen: HashSet<(&str, &str, &str)> = HashSet::new();
        let others = self
            .by_task
            .iter()
            .filter(|(id, _)| **id != task.id)
            .flat_map(|(_, seeds)| seeds)
            .filter(|(split, _)| *split == Split::Train)
            .flat_map(|(_, seed)| &seed.tool_calls);
        for exchange in others {
            let Some(slot) = names.iter().position(|n| *n == exchange.name) else {
                continue;
            };
            let key = (
                exchange.name.as_str(),
                exchange.arguments_json.as_str(),
                exchange.result_json.as_str(),
            );
            if seen.insert(key) {
                queues[slot].push_back(exchange);
            }
        }

        let mut facts = Vec::with_capacity(max);
        while facts.len() < max && queues.iter().any(|q| !q.is_empty()) {
            for queue in &mut queues {
                if facts.len() == max {
                    break;
                }
                if let Some(exchange) = queue.pop_front() {
                    facts.push(truncated(exchange, max_chars));
                }
            }
        }
        facts
    }
}

/// `exchange` with arguments and result cut to `max_chars` characters.
fn truncated(exchange: &ToolExchange, max_chars: usize) -> ToolExchange {
    ToolExchange {
        name: exchange.name.clone(),
        arguments_json: cut(&exchange.arguments_json, max_chars),
        result_json: cut(&exchange.result_json, max_chars),
    }
}

/// `text` if it has at most `max_chars` characters, else its first `max_chars − 1` characters
/// and `…` (so the result has `max_chars` characters; `"…"` alone when `max_chars` is 0 or 1).
fn cut(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max_chars.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::environment::EnvTask;
    use crate::judge::JudgeTask;

    fn exchange(name: &str, args: &str, result: &str) -> ToolExchange {
        ToolExchange {
            name: name.into(),
            arguments_json: args.into(),
            result_json: result.into(),
        }
    }

    fn seed(task: &str, calls: Vec<ToolExchange>) -> SeedTrajectory {
        SeedTrajectory {
            task: TaskId::from(task),
            index: 0,
            messages: Vec::new(),
            tool_calls: calls,
        }
    }

    fn tool(name: &str) -> Value {
        json!({"type": "function", "function": {"name": name, "description": "", "parameters": {"type": "object", "properties": {}}}})
    }

    fn task(id: &str, split: Split, tools: &[&str]) -> EpisodeTask {
        EpisodeTask {
            id: TaskId::from(id),
            split,
            tools: tools.iter().map(|n| tool(n)).collect(),
            user_turns: vec![vec!["hi".into()]],
            judge: JudgeTask::default(),
            env: EnvTask {
                id: id.into(),
                spec: Value::Null,
            },
        }
    }

    fn pool() -> SeedPool {
        SeedPool::new(vec![
            (
                Split::Test,
                seed(
                    "test_1",
                    vec![exchange(
                        "cd",
                        "{\"folder\":\"secret\"}",
                        "{\"ok\":\"SECRET\"}",
                    )],
                ),
            ),
            (
                Split::Train,
                seed(
                    "train_b",
                    vec![
                        exchange("cd", "{\"folder\":\"b\"}", "{\"cwd\":\"b\"}"),
                        exchange("rm", "{\"file\":\"x\"}", "{}"),
                        exchange("ls", "{}", "{\"content\":[\"b1\"]}"),
                        exchange("cd", "{\"folder\":\"b2\"}", "{\"cwd\":\"b2\"}"),
                    ],
                ),
            ),
            (
                Split::Train,
                seed(
                    "train_a",
                    vec![
                        exchange("cd", "{\"folder\":\"a\"}", "{\"cwd\":\"a\"}"),
                        exchange("cd", "{\"folder\":\"a\"}", "{\"cwd\":\"a\"}"),
                        exchange("ls", "{}", "{\"content\":[\"a1\"]}"),
                    ],
                ),
            ),
        ])
    }

    #[test]
    fn test_task_never_sees_its_own_or_any_test_seed() {
        let pool = pool();
        assert_eq!(pool.len(), 3);
        let facts = pool.facts_for(&task("test_1", Split::Test, &["cd", "ls"]), 10, 400);
        assert!(!facts.is_empty());
        assert!(facts
            .iter()
            .all(|f| !f.result_json.contains("SECRET") && !f.arguments_json.contains("secret")));
        // Another test task with the same tools does not see test_1's seed either.
        let facts = pool.facts_for(&task("test_2", Split::Test, &["cd"]), 10, 400);
        assert!(facts.iter().all(|f| !f.result_json.contains("SECRET")));
    }

    #[test]
    fn train_task_gets_its_own_seed_calls() {
        let pool = pool();
        let facts = pool.facts_for(&task("train_b", Split::Train, &["cd", "ls", "rm"]), 3, 400);
        assert_eq!(
            facts,
            vec![
                exchange("cd", "{\"folder\":\"b\"}", "{\"cwd\":\"b\"}"),
                exchange("rm", "{\"file\":\"x\"}", "{}"),
                exchange("ls", "{}", "{\"content\":[\"b1\"]}"),
            ]
        );
        assert!(pool
            .facts_for(&task("train_b", Split::Train, &["cd"]), 0, 400)
            .is_empty());
    }

    #[test]
    fn borrowed_facts_are_whitelisted_round_robin_and_deterministic() {
        let pool = pool();
        // A train task without a seed borrows from train_a then train_b (sorted), round-robin
        // over its whitelist order, duplicates skipped, no `rm` (not whitelisted).
        let t = task("train_c", Split::Train, &["ls", "cd"]);
        let facts = pool.facts_for(&t, 10, 400);
        assert_eq!(
            facts,
            vec![
                exchange("ls", "{}", "{\"content\":[\"a1\"]}"),
                exchange("cd", "{\"folder\":\"a\"}", "{\"cwd\":\"a\"}"),
                exchange("ls", "{}", "{\"content\":[\"b1\"]}"),
                exchange("cd", "{\"folder\":\"b\"}", "{\"cwd\":\"b\"}"),
                exchange("cd", "{\"folder\":\"b2\"}", "{\"cwd\":\"b2\"}"),
            ]
        );
        assert_eq!(pool.facts_for(&t, 2, 400), facts[..2]);
        let whitelist = ["ls"];
        let only_ls = pool.facts_for(&task("test_9", Split::Test, &whitelist), 10, 400);
        assert_eq!(only_ls.len(), 2);
        assert!(only_ls.iter().all(|f| f.name == "ls"));
        assert!(pool
            .facts_for(&task("test_9", Split::Test, &["mv"]), 10, 400)
            .is_empty());
        // Same facts whatever the order the pool was built in.
        let mut seeds: Vec<(Split, SeedTrajectory)> =
            pool.by_task.values().flatten().cloned().collect();
        seeds.reverse();
        assert_eq!(SeedPool::new(seeds).facts_for(&t, 10, 400), facts);
    }

    #[test]
    fn long_arguments_and_results_are_cut() {
        let long = "é".repeat(50);
        let pool = SeedPool::new(vec![(
            Split::Train,
            seed(
                "train_a",
                vec![exchange("cd", &long, &format!("{{\"r\":\"{long}\"}}"))],
            ),
        )]);
        let facts = pool.facts_for(&task("train_a", Split::Train, &["cd"]), 6, 10);
        assert_eq!(facts[0].arguments_json, format!("{}…", "é".repeat(9)));
        assert_eq!(facts[0].result_json.chars().count(), 10);
        assert!(
            facts[0].result_json.starts_with("{\"r\":\"éé") && facts[0].result_json.ends_with('…')
        );
        let facts = pool.facts_for(&task("test_1", Split::Test, &["cd"]), 6, 100);
        assert_eq!(facts[0].arguments_json, long);
        assert_eq!(cut("abc", 3), "abc");
        assert_eq!(cut("abcd", 0), "…");
    }
}
