//! A seed trajectory as training rows, in the run's protocol (`[protocol] mode`): what the
//! warm-up trains on, what Rehearse fidelity replays, what `bench rollout` measures.
//!
//! The seed is replayed through the same [`Transcript`] a rollout uses, with the seed's own
//! turns in place of sampled ones:
//!
//! * Act rows: each assistant turn of the seed (all of a user turn's Hermes tool calls, or the
//!   final answer) given the conversation before it, plus the end token;
//! * Rehearse rows: each real result given its call (few-shot facts from *other* train seeds),
//!   in the protocol's target form ([`Protocol::rehearse_target`]: `<execution_result>` in the
//!   reference protocol, `json.dumps` in the inline one), plus the end token. Every call of a
//!   turn is prompted against the same conversation; the results join it after the last call,
//!   as in a rollout.
//!
//! Every row of the seed is returned, in conversation order, with its role; only completion
//! tokens are trained.

use anyhow::{anyhow, bail, Result};

use crate::actors::protocol::{EpisodeContext, PromptKit, Protocol, SeedPool, ToolResult};
use crate::actors::{EpisodeTask, Split, ToolCall};
use crate::kernels::ScoreRow;
use crate::storage::{MessageRole, Role, SeedTrajectory, ToolExchange};

/// One training row of a seed.
#[derive(Debug, Clone, PartialEq)]
pub struct SeedRow {
    /// Act or Rehearse.
    pub role: Role,
    /// Prompt and completion token ids.
    pub row: ScoreRow,
    /// A Rehearse row's real call; `None` for Act rows.
    pub call: Option<SeedCall>,
}

/// A real call of a seed, as the Rehearse role sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct SeedCall {
    /// The call (keyword arguments).
    pub call: ToolCall,
    /// The real exchange: call and result.
    pub exchange: ToolExchange,
    /// The protocol's stop strings for this row's prompt (what a rollout generates with).
    pub stop_strings: Vec<String>,
}

/// Warm-up rows of one seed, in conversation order, in `protocol` (the run's; see the module
/// doc).
///
/// Rehearse rows take their few-shot facts from *other* train tasks ([`warmup_facts`]), so the
/// target result is never in its own prompt.
///
/// # Errors
/// Rendering or tokenising fails, or a tool message has no recorded call.
pub fn seed_rows(
    kit: &PromptKit,
    protocol: &dyn Protocol,
    task: &EpisodeTask,
    seed: &SeedTrajectory,
    pool: &SeedPool,
    cfg: &crate::config::RunConfig,
) -> Result<Vec<SeedRow>> {
    let facts = warmup_facts(pool, task, cfg);
    replay_seed(kit, protocol, task, seed, facts)
}

/// [`seed_rows`] with the few-shot facts given.
///
/// # Errors
/// As [`seed_rows`].
pub fn replay_seed(
    kit: &PromptKit,
    protocol: &dyn Protocol,
    task: &EpisodeTask,
    seed: &SeedTrajectory,
    facts: Vec<ToolExchange>,
) -> Result<Vec<SeedRow>> {
    let eos: Vec<u32> = kit.eos_id().into_iter().collect();
    let encode = |text: &str| -> Result<Vec<u32>> {
        let mut ids = kit.encode(text)?;
        ids.extend(&eos);
        Ok(ids)
    };
    let mut transcript = protocol.open(EpisodeContext {
        task: std::sync::Arc::new(task.clone()),
        facts: std::sync::Arc::new(facts),
        memory: None,
    });
    let mut rows = Vec::new();
    let mut exchange = seed.tool_calls.iter();
    let mut users: Vec<String> = Vec::new();
    // Results of the current Act turn's calls, joined after its last call.
    let mut pending: Vec<ToolResult> = Vec::new();
    let mut after_act = false;
    for m in &seed.messages {
        if m.role != MessageRole::Tool && !pending.is_empty() {
            transcript.push_results(std::mem::take(&mut pending))?;
        }
        if m.role != MessageRole::User && !users.is_empty() {
            transcript.push_user(&std::mem::take(&mut users))?;
        }
        match m.role {
            MessageRole::User => users.push(m.content.clone()),
            MessageRole::Assistant => {
                let prompt = transcript.act_prompt()?;
                let completion = encode(&m.content)?;
                // A seed's turn is the ground truth: its parse is not needed here.
                let _ = transcript.push_act(rows.len() as u32, &completion, &m.content);
                rows.push(SeedRow {
                    role: Role::Act,
                    row: ScoreRow {
                        prompt_ids: prompt.ids,
                        completion_ids: completion,
                    },
                    call: None,
                });
                after_act = true;
            }
            MessageRole::Tool => {
                let (Some(x), true) = (exchange.next(), after_act) else {
                    bail!("seed of {}: a tool message without a call", seed.task);
                };
                let call = exchange_call(seed, x)?;
                let prompt = transcript.rehearse_prompt(&call)?;
                let completion = encode(&protocol.rehearse_target(&x.result_json))?;
                pending.push(ToolResult {
                    name: x.name.clone(),
                    text: m.content.clone(),
                    rehearsed: Some((rows.len() as u32, completion.clone())),
                });
                rows.push(SeedRow {
                    role: Role::Rehearse,
                    row: ScoreRow {
                        prompt_ids: prompt.ids,
                        completion_ids: completion,
                    },
                    call: Some(SeedCall {
                        call,
                        exchange: x.clone(),
                        stop_strings: prompt.stop_strings,
                    }),
                });
            }
            MessageRole::System => {}
        }
    }
    Ok(rows)
}

/// The few-shot facts of `task`'s seed rows: from *other* train seeds of its tools (the pool
/// is asked as if the task were a test task), so a row's target is never in its own prompt.
pub fn warmup_facts(
    pool: &SeedPool,
    task: &EpisodeTask,
    cfg: &crate::config::RunConfig,
) -> Vec<ToolExchange> {
    let mut as_test = task.clone();
    as_test.split = Split::Test;
    pool.facts_for(
        &as_test,
        cfg.protocol.max_facts,
        cfg.protocol.max_fact_chars,
    )
}

/// `seed` cut before its `(turns + 1)`-th user turn (a run of user messages); all of it when
/// `turns` is `None`. Unused tool exchanges at the end are harmless: rows consume them in order.
pub fn first_user_turns(seed: &SeedTrajectory, turns: Option<usize>) -> SeedTrajectory {
    let mut out = seed.clone();
    let Some(turns) = turns else {
        return out;
    };
    let mut seen = 0;
    let mut previous_user = false;
    let end = seed
        .messages
        .iter()
        .position(|m| {
            let user = m.role == MessageRole::User;
            let starts_turn = user && !previous_user;
            previous_user = user;
            if starts_turn {
                seen += 1;
            }
            starts_turn && seen > turns
        })
        .unwrap_or(seed.messages.len());
    out.messages.truncate(end);
    out
}

/// The call of a seed's exchange, its arguments parsed from their JSON text.
fn exchange_call(seed: &SeedTrajectory, x: &ToolExchange) -> Result<ToolCall> {
    let arguments = serde_json::from_str(&x.arguments_json)
        .map_err(|e| anyhow!("seed of {}: arguments of {}: {e}", seed.task, x.name))?;
    Ok(ToolCall::new(x.name.clone(), arguments))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;
    use crate::actors::protocol::{protocol_for, ToolRendering};
    use crate::actors::{EnvTask, JudgeTask};
    use crate::config::RunConfig;
    use crate::kernels::gguf::GgufFile;
    use crate::kernels::loader::embedded_gguf_path;
    use crate::kernels::{ChatTemplate, Tokenizer};
    use crate::storage::{Message, Role, TaskId, ToolExchange};

    fn kit() -> PromptKit {
        let gguf = GgufFile::open(&embedded_gguf_path()).expect("SmolLM2 GGUF: run `make setup`");
        let tokenizer = Tokenizer::from_gguf_metadata(gguf.metadata()).expect("tokenizer");
        let template = ChatTemplate::from_tokenizer(&tokenizer).expect("template");
        PromptKit::new(tokenizer, Some(template)).expect("kit")
    }

    fn task(id: &str) -> EpisodeTask {
        let tool = |name: &str| {
            json!({"type": "function", "function": {"name": name, "description": "A tool.",
                "parameters": {"type": "object", "properties": {}, "required": []}}})
        };
        EpisodeTask {
            id: TaskId::from(id),
            split: Split::Train,
            tools: vec![tool("cd"), tool("ls"), tool("cat")],
            user_turns: Vec::new(),
            judge: JudgeTask {
                id: id.into(),
                checklist: Vec::new(),
                parameter_order: BTreeMap::new(),
            },
            env: EnvTask {
                id: id.into(),
                spec: serde_json::Value::Null,
            },
        }
    }

    fn m(role: MessageRole, content: &str) -> Message {
        Message {
            role,
            content: content.into(),
            tool_name: None,
            row: None,
        }
    }

    fn exchange(name: &str, result: &str) -> ToolExchange {
        ToolExchange {
            name: name.into(),
            arguments_json: "{}".into(),
            result_json: result.into(),
        }
    }

    /// Two user turns; the first Act turn makes two calls.
    fn seed(id: &str, results: [&str; 3]) -> SeedTrajectory {
        use MessageRole::{Assistant, Tool, User};
        SeedTrajectory {
            task: TaskId::from(id),
            index: 0,
            messages: vec![
                m(User, "Go to docs and list it."),
                m(
                    Assistant,
                    "<tool_call>\n{\"name\": \"cd\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"ls\", \"arguments\": {}}\n</tool_call>",
                ),
                m(Tool, results[0]),
                m(Tool, results[1]),
                m(Assistant, "Done."),
                m(User, "Show file a."),
                m(
                    Assistant,
                    "<tool_call>\n{\"name\": \"cat\", \"arguments\": {}}\n</tool_call>",
                ),
                m(Tool, results[2]),
                m(Assistant, "Here it is."),
            ],
            tool_calls: vec![
                exchange("cd", results[0]),
                exchange("ls", results[1]),
                exchange("cat", results[2]),
            ],
        }
    }

    #[test]
    fn inline_warm_up_rows_follow_one_stream_and_target_the_real_results() {
        let kit = kit();
        let mut cfg = RunConfig::from_toml("[protocol]\nmode = \"inline\"\n").expect("config");
        cfg.protocol.tool_rendering = ToolRendering::Compact;
        let own = seed("own", ["{\"cwd\": \"docs\"}", "[\"a\", \"b\"]", "None"]);
        let other = seed("other", ["{\"cwd\": \"x\"}", "{\"other_fact\": 1}", "{}"]);
        let pool = SeedPool::new(vec![(Split::Train, own.clone()), (Split::Train, other)]);
        let kit = std::sync::Arc::new(kit);
        let inline = protocol_for(&cfg.protocol, kit.clone()).expect("inline protocol");
        let inline_rows =
            seed_rows(&kit, inline.as_ref(), &task("own"), &own, &pool, &cfg).expect("rows");
        let roles: Vec<Role> = inline_rows.iter().map(|r| r.role).collect();
        let rows: Vec<(Role, ScoreRow)> = inline_rows
            .iter()
            .map(|r| (r.role, r.row.clone()))
            .collect();
        use Role::{Act, Rehearse};
        assert_eq!(
            roles,
            vec![Act, Rehearse, Rehearse, Act, Act, Rehearse, Act]
        );
        let eos = kit.eos_id().expect("eos");
        // Every row extends the stream of every earlier Act row (prompt + completion), and
        // every later row's prompt starts with it.
        for (i, (role, row)) in rows.iter().enumerate() {
            assert_eq!(row.completion_ids.last(), Some(&eos));
            if *role != Act {
                continue;
            }
            let mut full = row.prompt_ids.clone();
            full.extend(&row.completion_ids);
            for (_, later) in &rows[i + 1..] {
                assert!(later.prompt_ids.starts_with(&full), "row {i}");
            }
        }
        // Both Rehearse rows of the two-call turn branch off the same stream.
        let (a, b) = (&rows[1].1.prompt_ids, &rows[2].1.prompt_ids);
        let mut turn = rows[0].1.prompt_ids.clone();
        turn.extend(&rows[0].1.completion_ids);
        assert!(a.starts_with(&turn) && b.starts_with(&turn));
        // Targets are the real results in `json.dumps` form, as real results appear in the
        // stream at evaluation (a non-JSON result wrapped).
        let target = |i: usize| kit.decode(&rows[i].1.completion_ids).expect("decode");
        assert_eq!(target(1), "{\"cwd\": \"docs\"}");
        assert_eq!(target(2), "[\"a\", \"b\"]");
        assert_eq!(target(5), "{\"result\": \"None\"}");
        // Facts come from other tasks only, and stay out of the Act rows.
        let rehearse = kit.tokenizer.decode(a, false).expect("decode");
        assert!(rehearse.contains("other_fact") && !rehearse.contains("\"docs\""));
        for (role, row) in &rows {
            let text = kit
                .tokenizer
                .decode(&row.prompt_ids, false)
                .expect("decode");
            if *role == Act {
                assert!(!text.contains("other_fact") && !text.contains("# Known facts"));
            }
        }
        // The results joined the stream after the turn's last call, as the targets' ids.
        let act = kit
            .tokenizer
            .decode(&rows[3].1.prompt_ids, false)
            .expect("decode");
        assert!(act.ends_with(
            "</tool_call><|im_end|>\n<|im_start|>tool\n{\"cwd\": \"docs\"}<|im_end|>\n<|im_start|>tool\n[\"a\", \"b\"]<|im_end|>\n<|im_start|>assistant\n"
        ), "{act}");

        // The reference protocol: fresh prompts, `<execution_result>` targets.
        let reference_cfg = crate::config::RunConfig::default();
        let reference =
            protocol_for(&reference_cfg.protocol, kit.clone()).expect("reference protocol");
        let reference = seed_rows(
            &kit,
            reference.as_ref(),
            &task("own"),
            &own,
            &pool,
            &reference_cfg,
        )
        .expect("reference rows");
        assert_eq!(reference.len(), rows.len());
        // Rehearse rows know their call; the prompt holds the conversation before the Act
        // turn that made it and that turn's text.
        let call = reference[1].call.as_ref().expect("a Rehearse row's call");
        assert_eq!(call.call.name, "cd");
        let inline_call = inline_rows[1].call.as_ref().expect("a Rehearse row's call");
        assert_eq!(
            (&call.call, &call.exchange),
            (&inline_call.call, &inline_call.exchange)
        );
        assert_eq!(call.stop_strings, ["</execution_result>"]);
        assert!(inline_call.stop_strings.is_empty());
        let prompt = kit
            .tokenizer
            .decode(&reference[2].row.prompt_ids, false)
            .expect("decode");
        assert!(prompt
            .contains("User: Go to docs and list it.\n\n# Latest assistant turn\n<tool_call>"));
        assert!(prompt.contains("# Call to simulate\nTool: ls"), "{prompt}");
        // The final answer's Act prompt holds both results, after the calls' turn.
        let act = kit
            .tokenizer
            .decode(&reference[3].row.prompt_ids, false)
            .expect("decode");
        assert!(
            act.contains("<tool_response>\n{\"cwd\": \"docs\"}\n</tool_response>"),
            "{act}"
        );
        assert!(reference[0].call.is_none());
        assert!(kit
            .decode(&reference[1].row.completion_ids)
            .expect("decode")
            .contains("<execution_result>"));
    }
}

#[cfg(test)]
mod turn_tests {
    use super::*;
    use crate::storage::{Message, TaskId};

    fn msg(role: MessageRole, content: &str) -> Message {
        Message {
            role,
            content: content.into(),
            tool_name: None,
            row: None,
        }
    }

    #[test]
    fn first_user_turns_cuts_before_the_next_turn() {
        use MessageRole::{Assistant, Tool, User};
        let seed = SeedTrajectory {
            task: TaskId::from("t"),
            index: 0,
            messages: vec![
                msg(User, "u1"),
                msg(User, "u1b"),
                msg(Assistant, "a1"),
                msg(Tool, "r1"),
                msg(Assistant, "done"),
                msg(User, "u2"),
                msg(Assistant, "a2"),
            ],
            tool_calls: Vec::new(),
        };
        let one = first_user_turns(&seed, Some(1));
        let contents: Vec<&str> = one.messages.iter().map(|m| m.content.as_str()).collect();
        assert_eq!(contents, ["u1", "u1b", "a1", "r1", "done"]);
        assert_eq!(first_user_turns(&seed, Some(2)).messages.len(), 7);
        assert_eq!(first_user_turns(&seed, None).messages.len(), 7);
    }
}
