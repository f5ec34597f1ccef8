//! `sft`: the supervised warm-up. Act rows: the seed's assistant turns (Hermes tool calls, or
//! the final answer) given the conversation before them; Rehearse rows: each real observation
//! given its call. Only the completion tokens are trained. Rows are built in the run's
//! protocol (`[protocol] mode`): reference prompts, or the inline protocol's stream and
//! branches, so the warm-up teaches the format rollouts use. Reference rows are shuffled one
//! by one; inline rows keep each seed's rows together (seeds shuffled) so a step packs them
//! into one stream, and cover the user turns training plays (`rollout.max_user_turns`).

use std::time::Instant;

use anyhow::{anyhow, bail, Result};
use rand::seq::SliceRandom;
use rand::SeedableRng;

use super::{progress, secs, Pipeline, SFT_RUN};
use crate::actors::learner::LearnerMsg;
use crate::actors::memory::MemoryMsg;
use crate::actors::protocol::{
    act_messages, inline_result_target, rehearse_messages, render_rehearse_target, InlineStream,
    PromptKit, RolloutProtocol, SeedPool, ToolRendering,
};
use crate::actors::{EpisodeTask, Split, ToolCall};
use crate::kernels::ScoreRow;
use crate::report::StageReport;
use crate::storage::{Checkpoint, MessageRole, RunId, RunState, SeedTrajectory};

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
) -> Result<Vec<(crate::storage::Role, ScoreRow)>> {
    let rendering = cfg.protocol.tool_rendering;
    let mut as_test = task.clone();
    as_test.split = Split::Test;
    let facts = pool.facts_for(
        &as_test,
        cfg.protocol.max_facts,
        cfg.protocol.max_fact_chars,
    );
    if cfg.protocol.mode == RolloutProtocol::Inline {
        // An inline row carries the whole stream before it, so late user turns make rows
        // longer than `sft.max_row_tokens`: warm up on the turns training plays.
        let seed = first_user_turns(seed, cfg.rollout.max_user_turns);
        return inline_seed_rows(kit, task, &seed, &facts, rendering);
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
                rows.push((
                    crate::storage::Role::Act,
                    ScoreRow {
                        prompt_ids: prompt,
                        completion_ids: completion,
                    },
                ));
                last_act = Some((i, m.content.clone()));
            }
            MessageRole::Tool => {
                let (Some(x), Some((act_at, act_text))) = (exchange.next(), &last_act) else {
                    bail!("seed of {}: a tool message without a call", seed.task);
                };
                let arguments = serde_json::from_str(&x.arguments_json)
                    .map_err(|e| anyhow!("seed of {}: arguments of {}: {e}", seed.task, x.name))?;
                let call = ToolCall::new(x.name.clone(), arguments);
                let history = &seed.messages[..*act_at];
                let prompt = kit.encode_chat(
                    &rehearse_messages(&task.tools, rendering, &facts, history, act_text, &call),
                    true,
                )?;
                let mut completion = kit.encode(&render_rehearse_target(&x.result_json))?;
                completion.extend(&eos);
                rows.push((
                    crate::storage::Role::Rehearse,
                    ScoreRow {
                        prompt_ids: prompt,
                        completion_ids: completion,
                    },
                ));
            }
            _ => {}
        }
    }
    Ok(rows)
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
    facts: &[crate::storage::ToolExchange],
    rendering: ToolRendering,
) -> Result<Vec<(crate::storage::Role, ScoreRow)>> {
    let eos: Vec<u32> = kit.eos_id().into_iter().collect();
    let mut rows = Vec::new();
    let mut exchange = seed.tool_calls.iter();
    let mut users: Vec<String> = Vec::new();
    let mut stream: Option<InlineStream> = None;
    // Results of the current Act turn's calls, joined to the stream after its last call.
    let mut pending: Vec<Vec<u32>> = Vec::new();
    for m in &seed.messages {
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
                rows.push((
                    crate::storage::Role::Act,
                    ScoreRow {
                        prompt_ids: s.act_prompt(),
                        completion_ids: completion.clone(),
                    },
                ));
                s.push_act(&completion);
            }
            MessageRole::Tool => {
                let (Some(x), Some(s)) = (exchange.next(), &stream) else {
                    bail!("seed of {}: a tool message without a call", seed.task);
                };
                let arguments = serde_json::from_str(&x.arguments_json)
                    .map_err(|e| anyhow!("seed of {}: arguments of {}: {e}", seed.task, x.name))?;
                let call = ToolCall::new(x.name.clone(), arguments);
                let mut completion = kit.encode(&inline_result_target(&x.result_json))?;
                completion.extend(&eos);
                rows.push((
                    crate::storage::Role::Rehearse,
                    ScoreRow {
                        prompt_ids: s.rehearse_prompt(kit, &task.tools, rendering, facts, &call)?,
                        completion_ids: completion.clone(),
                    },
                ));
                pending.push(completion);
            }
            MessageRole::System => {}
        }
    }
    Ok(rows)
}

/// `seed` cut before its `(turns + 1)`-th user turn (a run of user messages); all of it when
/// `turns` is `None`. Unused tool exchanges at the end are harmless: rows consume them in order.
pub(super) fn first_user_turns(seed: &SeedTrajectory, turns: Option<usize>) -> SeedTrajectory {
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

impl Pipeline {
    /// Runs `sft.steps` supervised steps on warm-up rows from the train seeds and saves the
    /// weights as the `sft` checkpoint.
    ///
    /// # Errors
    /// No seeds (run `collect` first), or a learner step fails.
    pub async fn sft(&mut self) -> Result<StageReport> {
        let start = Instant::now();
        let seeds = self
            .memory()
            .ask("memory", MemoryMsg::Seeds)
            .await?
            .map_err(|e| anyhow!(e))?;
        if seeds.is_empty() {
            bail!(
                "sft: no seed trajectories in {}; run `envace collect` first",
                self.dir.display()
            );
        }
        let pool = self.seed_pool().await?;
        let mut rows = Vec::new();
        for seed in &seeds {
            let Some(task) = self.suite.train.iter().find(|t| t.id == seed.task) else {
                continue; // seeds of test tasks are never used for training
            };
            rows.push(seed_rows(&self.topology.kit, task, seed, &pool, &self.cfg)?);
        }
        let total = rows.iter().map(Vec::len).sum::<usize>();
        let mut lengths: Vec<usize> = rows.iter().flatten().map(|(_, r)| r.len()).collect();
        lengths.sort_unstable();
        if let (Some(&max), Some(&median)) = (lengths.last(), lengths.get(lengths.len() / 2)) {
            eprintln!("sft: row length median {median} tokens, max {max} tokens");
        }
        // Inline rows carry the stream before them, and a seed's rows are trained packed (one
        // forward per seed's stream): keep each seed's rows together, in order, and bound them
        // by the context instead of `max_row_tokens`. Reference rows are shuffled one by one.
        let inline = self.cfg.protocol.mode == RolloutProtocol::Inline;
        let limit = if inline {
            self.topology.worker.info().context_len
        } else {
            self.cfg.sft.max_row_tokens
        };
        for seed_rows in &mut rows {
            seed_rows.retain(|(_, r)| r.len() <= limit);
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(self.cfg.sft.seed);
        let rows: Vec<(crate::storage::Role, ScoreRow)> = if inline {
            rows.shuffle(&mut rng);
            rows.into_iter().flatten().collect()
        } else {
            let mut rows: Vec<_> = rows.into_iter().flatten().collect();
            rows.shuffle(&mut rng);
            rows
        };
        eprintln!(
            "sft: {} warm-up rows ({} act, {} rehearse; {} over {} tokens left out)",
            rows.len(),
            rows.iter()
                .filter(|(r, _)| *r == crate::storage::Role::Act)
                .count(),
            rows.iter()
                .filter(|(r, _)| *r == crate::storage::Role::Rehearse)
                .count(),
            total - rows.len(),
            limit
        );
        if rows.is_empty() {
            bail!(
                "sft: every warm-up row is longer than {limit} tokens (sft.max_row_tokens, or \
                 the context in inline mode)"
            );
        }
        let learner = self.topology.learner.clone();
        self.configure_learner(self.cfg.sft.learner.clone()).await?;
        let bar = progress(self.cfg.sft.steps, "sft");
        let (mut tokens, mut trained) = (0u64, 0u64);
        let per = self.cfg.sft.rows_per_step;
        for step in 0..self.cfg.sft.steps {
            let batch: Vec<ScoreRow> = (0..per)
                .map(|i| rows[(step as usize * per + i) % rows.len()].1.clone())
                .collect();
            tokens += batch
                .iter()
                .map(|r| (r.prompt_ids.len() + r.completion_ids.len()) as u64)
                .sum::<u64>();
            trained += batch
                .iter()
                .map(|r| r.completion_ids.len() as u64)
                .sum::<u64>();
            let stats = learner
                .ask("learner", |r| LearnerMsg::SftStep(batch, r))
                .await?
                .map_err(|e| anyhow!("sft step {step}: {e}"))?;
            metrics::gauge!("sft_loss").set(stats.loss);
            bar.set_message(format!("sft {:.3}", stats.loss));
            tracing::info!(
                step,
                loss = stats.loss,
                grad_norm = stats.grad_norm,
                "sft step"
            );
            bar.inc(1);
        }
        bar.finish_and_clear();
        let path = self.checkpoint_path(SFT_RUN);
        let worker = self.topology.worker.clone();
        let p = path.clone();
        worker
            .request(|tx| crate::actors::worker::Job::Save(p, tx))
            .await
            .map_err(|e| anyhow!("saving the warm-up checkpoint: {e}"))?;
        let run = RunId::from(SFT_RUN);
        let checkpoint = Checkpoint {
            run: run.clone(),
            step: self.cfg.sft.steps,
            path,
            metrics: Default::default(),
        };
        let state = RunState {
            run,
            step: self.cfg.sft.steps,
            data_cursor: 0,
            rng_state: Vec::new(),
            config_hash: String::new(),
        };
        self.memory()
            .ask("memory", |r| MemoryMsg::CommitStep {
                trajectories: Vec::new(),
                checkpoint: Some(checkpoint),
                state,
                reply: r,
            })
            .await?
            .map_err(|e| anyhow!(e))?;
        let stage = StageReport {
            wall_s: secs(start),
            tokens,
            generated_tokens: trained,
            real_env_calls: 0,
            items: self.cfg.sft.steps,
        };
        self.record_stage("sft", stage.clone());
        Ok(stage)
    }
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
        let rows = seed_rows(&kit, &task("own"), &own, &pool, &cfg).expect("rows");
        let roles: Vec<Role> = rows.iter().map(|(r, _)| *r).collect();
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
        assert!(kit
            .decode(&reference[1].1.completion_ids)
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
