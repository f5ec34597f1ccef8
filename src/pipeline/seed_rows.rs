//! A seed trajectory as training rows, in the run's protocol (`[protocol] mode`): what the
//! warm-up trains on, what Rehearse fidelity replays, what `bench rollout` measures.
//!
//! * Act rows: each assistant turn of the seed (all of a user turn's Hermes tool calls, or the
//!   final answer) given the conversation before it, plus the end token;
//! * Rehearse rows: each real result given its call (few-shot facts from *other* train seeds),
//!   in `<execution_result>` form (reference) or `json.dumps` form (inline), plus the end token.
//!
//! Every row of the seed is returned, in conversation order, with its role; only completion
//! tokens are trained.

use anyhow::{anyhow, bail, Result};

use crate::actors::protocol::{
    act_messages, inline_result_target, rehearse_messages, render_rehearse_target, InlineStream,
    PromptKit, RolloutProtocol, SeedPool, ToolRendering,
};
use crate::actors::{EpisodeTask, Split, ToolCall};
use crate::kernels::ScoreRow;
use crate::storage::{Message, MessageRole, Role, SeedTrajectory, ToolExchange};

/// One training row of a seed.
#[derive(Debug, Clone, PartialEq)]
pub struct SeedRow {
    /// Act or Rehearse.
    pub role: Role,
    /// Prompt and completion token ids.
    pub row: ScoreRow,
    /// A Rehearse row's call, with the conversation it was made in; `None` for Act rows.
    pub call: Option<SeedCall>,
}

/// A real call of a seed, as the Rehearse role sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct SeedCall {
    /// The seed's messages before the Act turn that made the call.
    pub history: Vec<Message>,
    /// The raw text of that Act turn.
    pub act_text: String,
    /// The call (keyword arguments).
    pub call: ToolCall,
    /// The real exchange: call and result.
    pub exchange: ToolExchange,
}

/// Warm-up rows of one seed, in conversation order, in the protocol of `cfg.protocol.mode`
/// (see [`inline_seed_rows`] for the inline one).
///
/// Rehearse rows take their few-shot facts from *other* train tasks (the pool is asked as if
/// the task were a test task), so the target result is never in its own prompt.
///
/// # Errors
/// Rendering or tokenising fails.
pub fn seed_rows(
    kit: &PromptKit,
    task: &EpisodeTask,
    seed: &SeedTrajectory,
    pool: &SeedPool,
    cfg: &crate::config::RunConfig,
) -> Result<Vec<SeedRow>> {
    let rendering = cfg.protocol.tool_rendering;
    let facts = warmup_facts(pool, task, cfg);
    if cfg.protocol.mode == RolloutProtocol::Inline {
        return inline_seed_rows(kit, task, seed, &facts, rendering);
    }
    let eos: Vec<u32> = kit.eos_id().into_iter().collect();
    let mut rows = Vec::new();
    let mut exchange = seed.tool_calls.iter();
    let mut last_act: Option<(usize, String)> = None;
    for (i, m) in seed.messages.iter().enumerate() {
        let before = &seed.messages[..i];
        match m.role {
            MessageRole::Assistant => {
                let prompt =
                    kit.encode_chat(&act_messages(&task.tools, rendering, before, None), true)?;
                let mut completion = kit.encode(&m.content)?;
                completion.extend(&eos);
                rows.push(SeedRow {
                    role: Role::Act,
                    row: ScoreRow {
                        prompt_ids: prompt,
                        completion_ids: completion,
                    },
                    call: None,
                });
                last_act = Some((i, m.content.clone()));
            }
            MessageRole::Tool => {
                let (Some(x), Some((act_at, act_text))) = (exchange.next(), &last_act) else {
                    bail!("seed of {}: a tool message without a call", seed.task);
                };
                let call = SeedCall {
                    history: seed.messages[..*act_at].to_vec(),
                    act_text: act_text.clone(),
                    call: exchange_call(seed, x)?,
                    exchange: x.clone(),
                };
                let prompt = kit.encode_chat(
                    &rehearse_messages(
                        &task.tools,
                        rendering,
                        &facts,
                        &call.history,
                        &call.act_text,
                        &call.call,
                    ),
                    true,
                )?;
                let mut completion = kit.encode(&render_rehearse_target(&x.result_json))?;
                completion.extend(&eos);
                rows.push(SeedRow {
                    role: Role::Rehearse,
                    row: ScoreRow {
                        prompt_ids: prompt,
                        completion_ids: completion,
                    },
                    call: Some(call),
                });
            }
            _ => {}
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

/// Inline warm-up rows of one seed: the seed conversation as one [`InlineStream`].
///
/// * Act rows: the stream so far plus the assistant header → the seed's assistant text
///   encoded, plus the end token (the stream then grows by exactly those ids), so every Act
///   row's prompt extends the previous rows';
/// * Rehearse rows: the stream after the Act turn plus the private block (`facts`, the call)
///   and the tool header → the real result in `json.dumps` form ([`inline_result_target`]) plus the end
///   token; every call of a turn branches off the same stream, and the results join it (as
///   those target ids) after the turn's last call, as in a rollout.
///
/// # Errors
/// Rendering or tokenising fails, or a tool message has no recorded call.
pub fn inline_seed_rows(
    kit: &PromptKit,
    task: &EpisodeTask,
    seed: &SeedTrajectory,
    facts: &[ToolExchange],
    rendering: ToolRendering,
) -> Result<Vec<SeedRow>> {
    let eos: Vec<u32> = kit.eos_id().into_iter().collect();
    let mut rows = Vec::new();
    let mut exchange = seed.tool_calls.iter();
    let mut users: Vec<String> = Vec::new();
    let mut stream: Option<InlineStream> = None;
    // Results of the current Act turn's calls, joined to the stream after its last call.
    let mut pending: Vec<Vec<u32>> = Vec::new();
    let mut last_act: Option<(usize, String)> = None;
    for (i, m) in seed.messages.iter().enumerate() {
        if m.role != MessageRole::Tool {
            if let Some(s) = &mut stream {
                for result in pending.drain(..) {
                    s.push_tool_result_ids(&result);
                }
            }
        }
        match m.role {
            MessageRole::User => users.push(m.content.clone()),
            MessageRole::Assistant => {
                let s = match &mut stream {
                    Some(s) => {
                        s.push_user(kit, &users)?;
                        s
                    }
                    None => stream.insert(InlineStream::new(
                        kit,
                        &task.tools,
                        rendering,
                        None,
                        &users,
                    )?),
                };
                users.clear();
                let mut completion = kit.encode(&m.content)?;
                completion.extend(&eos);
                rows.push(SeedRow {
                    role: Role::Act,
                    row: ScoreRow {
                        prompt_ids: s.act_prompt(),
                        completion_ids: completion.clone(),
                    },
                    call: None,
                });
                s.push_act(&completion);
                last_act = Some((i, m.content.clone()));
            }
            MessageRole::Tool => {
                let (Some(x), Some(s), Some((act_at, act_text))) =
                    (exchange.next(), &stream, &last_act)
                else {
                    bail!("seed of {}: a tool message without a call", seed.task);
                };
                let call = SeedCall {
                    history: seed.messages[..*act_at].to_vec(),
                    act_text: act_text.clone(),
                    call: exchange_call(seed, x)?,
                    exchange: x.clone(),
                };
                let mut completion = kit.encode(&inline_result_target(&x.result_json))?;
                completion.extend(&eos);
                rows.push(SeedRow {
                    role: Role::Rehearse,
                    row: ScoreRow {
                        prompt_ids: s.rehearse_prompt(
                            kit,
                            &task.tools,
                            rendering,
                            facts,
                            &call.call,
                        )?,
                        completion_ids: completion.clone(),
                    },
                    call: Some(call),
                });
                pending.push(completion);
            }
            MessageRole::System => {}
        }
    }
    Ok(rows)
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
        let inline_rows = seed_rows(&kit, &task("own"), &own, &pool, &cfg).expect("rows");
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

        // The reference protocol is unchanged: fresh prompts, `<execution_result>` targets.
        let reference = seed_rows(
            &kit,
            &task("own"),
            &own,
            &pool,
            &crate::config::RunConfig::default(),
        )
        .expect("reference rows");
        assert_eq!(reference.len(), rows.len());
        // Rehearse rows know their call and the conversation before it.
        let call = reference[1].call.as_ref().expect("a Rehearse row's call");
        assert_eq!(call.call.name, "cd");
        assert_eq!(
            call.history.len(),
            1,
            "the user message before the Act turn"
        );
        assert!(call.act_text.contains("\"ls\""));
        assert_eq!(reference[1].call, inline_rows[1].call);
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
