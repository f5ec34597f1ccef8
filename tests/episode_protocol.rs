//! The turn protocol on hand-written model outputs (DESIGN.md §2), through the real actors: a
//! scripted "model thread" answers each generation request from a script keyed on the prompt,
//! so every branch of the episode driver is reached deterministically.
//!
//! Covered: several calls per turn (rehearsed one at a time against the same history, results
//! appended afterwards), multi-user-turn progression, every Act parse-error code and a Rehearse
//! format error (episode ends, turn scores 0), the generation-call cap and the context cap,
//! supervision (a judge that panics is restarted and the episode retried; a judge that always
//! panics gives a trajectory recorded as failed), zero real environment calls in rehearsal mode,
//! and the role-wise advantages every row trains with.
//!
//! The inline protocol (`[protocol] mode = "inline"`): its first Act prompt is the reference
//! one, later Act prompts extend earlier rows token for token, Rehearse rows branch off the
//! stream with facts Act rows never see, a bad inline result ends the episode, and a real
//! result joins the stream in the tool frame.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use envace::actors::env_actor::EnvFactory;
use envace::actors::episode::Agents;
use envace::actors::episode::{run_episode_supervised, transcript, EpisodeConfig, EpisodeSpec};
use envace::actors::learner_actor::grpo_batch;
use envace::actors::protocol::{
    act_messages, protocol_for, PromptKit, ProtocolConfig, RolloutProtocol, ToolRendering,
};
use envace::actors::topology::{Topology, TopologyBuilder};
use envace::actors::worker::{Generated, Job, ModelInfo, WorkerHandle};
use envace::actors::{
    ChecklistItem, EnvTask, Environment, EnvironmentError, EpisodeTask, Judge, JudgeTask,
    Observation, Split, ToolCall, TurnCalls, Verdict,
};
use envace::bfcl::dense::DenseChecklistJudge;
use envace::bfcl::judge::RuleChecklistJudge;
use envace::kernels::{load, FinishReason, GrpoConfig, ModelSource};
use envace::storage::{
    Message, MessageRole, Role, Row, RunId, Store, StoreOptions, TaskId, Termination, ToolExchange,
};
use serde_json::{json, Map, Value};

/// Answers a prompt (decoded text) with the completion text to return.
type Script = dyn Fn(&str) -> String + Send + Sync;

struct Scripted {
    kit: Arc<PromptKit>,
    worker: WorkerHandle,
    prompts: Arc<Mutex<Vec<String>>>,
}

fn kit() -> Arc<PromptKit> {
    let loaded = load(&ModelSource::Tiny, tch::Device::Cpu, tch::Kind::Float).expect("tiny model");
    Arc::new(PromptKit::new(loaded.tokenizer, loaded.chat_template).expect("kit"))
}

/// A model thread that answers from `script` (log-prob −1 per token, version 0).
fn scripted(kit: Arc<PromptKit>, context_len: usize, script: Arc<Script>) -> Scripted {
    let (tx, rx) = crossbeam_channel::unbounded::<Job>();
    let prompts = Arc::new(Mutex::new(Vec::new()));
    let seen = prompts.clone();
    let k = kit.clone();
    std::thread::spawn(move || {
        while let Ok(job) = rx.recv() {
            if let Job::Generate(req, reply) = job {
                let prompt = k
                    .tokenizer
                    .decode(&req.prompt_ids, false)
                    .expect("decode prompt");
                let text = script(&prompt);
                seen.lock().unwrap().push(prompt);
                let mut ids = k.encode(&text).expect("encode");
                ids.truncate(req.params.max_new_tokens.saturating_sub(1));
                ids.extend(k.eos_id());
                let _ = reply.send(Ok(Generated {
                    logprobs: vec![-1.0; ids.len()],
                    completion_ids: ids,
                    finish_reason: FinishReason::Stop,
                    policy_version: Default::default(),
                }));
            }
        }
    });
    let worker = WorkerHandle::from_queue(
        tx,
        ModelInfo {
            context_len,
            vocab_size: 49152,
        },
        Arc::new(AtomicU64::new(0)),
    );
    Scripted {
        kit,
        worker,
        prompts,
    }
}

fn tool(name: &str, params: &[&str]) -> Value {
    let props: Map<String, Value> = params
        .iter()
        .map(|p| {
            (
                p.to_string(),
                json!({"type": "string", "description": "a value"}),
            )
        })
        .collect();
    json!({"type": "function", "function": {
        "name": name, "description": format!("Tool {name}."),
        "parameters": {"type": "object", "properties": props, "required": params}}})
}

fn item(function: &str, args: Value) -> ChecklistItem {
    ChecklistItem {
        function: function.into(),
        arguments: args.as_object().cloned().unwrap_or_default(),
        weight: 1.0,
        required: true,
    }
}

/// Two user turns: turn 0 expects `cd(folder=docs)` and `ls()`; turn 1 expects `cat(file=a)`.
fn task(id: &str) -> EpisodeTask {
    EpisodeTask {
        id: TaskId::from(id),
        split: Split::Train,
        tools: vec![
            tool("cd", &["folder"]),
            tool("ls", &[]),
            tool("cat", &["file"]),
        ],
        user_turns: vec![
            vec!["Go to docs and list it.".into()],
            vec!["Show file a.".into()],
        ],
        judge: JudgeTask {
            id: id.into(),
            checklist: vec![
                vec![item("cd", json!({"folder": "docs"})), item("ls", json!({}))],
                vec![item("cat", json!({"file": "a"}))],
            ],
            parameter_order: BTreeMap::new(),
        },
        env: EnvTask {
            id: id.into(),
            spec: Value::Null,
        },
    }
}

fn call(name: &str, args: Value) -> String {
    format!("<tool_call>\n{{\"name\": \"{name}\", \"arguments\": {args}}}\n</tool_call>")
}

/// The last user message and how many tool results (each opened by `tool_marker`) follow it
/// in an Act prompt.
fn act_state_with(prompt: &str, tool_marker: &str) -> (String, usize) {
    let last_user = prompt.rfind("<|im_start|>user\n").expect("a user turn");
    let rest = &prompt[last_user + "<|im_start|>user\n".len()..];
    let user = rest.split("<|im_end|>").next().unwrap_or("").to_string();
    (user, rest.matches(tool_marker).count())
}

/// [`act_state_with`] for reference prompts (results wrapped in `<tool_response>`).
fn act_state(prompt: &str) -> (String, usize) {
    act_state_with(prompt, "<tool_response>")
}

fn is_rehearse(prompt: &str) -> bool {
    prompt.contains("# Call to simulate")
}

/// The good policy: the expected calls (two in one turn), then a final answer.
fn good_policy() -> Arc<Script> {
    Arc::new(|prompt: &str| {
        if is_rehearse(prompt) {
            return "\n<execution_result>\n{\"ok\": true}\n</execution_result>".into();
        }
        good_act(act_state(prompt))
    })
}

/// The good policy's Act turn for (last user message, tool results since it): the expected
/// calls (two in one turn for the first user turn), then a final answer.
fn good_act(state: (String, usize)) -> String {
    match state {
        (u, 0) if u.starts_with("Go to docs") => format!(
            "{}\n{}",
            call("cd", json!({"folder": "docs"})),
            call("ls", json!({}))
        ),
        (u, 0) if u.starts_with("Show file") => call("cat", json!({"file": "a"})),
        _ => "All done.".into(),
    }
}

struct World {
    topology: Topology,
    scripted: Scripted,
    _dir: tempdir::Dir,
}

/// The tests' protocol settings: compact tool rendering, in `mode`.
fn protocol_config(mode: RolloutProtocol) -> ProtocolConfig {
    ProtocolConfig {
        mode,
        tool_rendering: ToolRendering::Compact,
        ..ProtocolConfig::default()
    }
}

impl World {
    /// Self-rehearsal agents in the inline protocol (the topology's own play the reference
    /// one).
    fn inline_agents(&self) -> Agents {
        Agents {
            protocol: protocol_for(
                &protocol_config(RolloutProtocol::Inline),
                self.scripted.kit.clone(),
            )
            .expect("inline protocol"),
            ..self.topology.rehearsal_agents()
        }
    }
}

mod tempdir {
    /// A temporary directory removed on drop.
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new(tag: &str) -> Self {
            let p = std::env::temp_dir().join(format!(
                "envace-{tag}-{}-{}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0)
            ));
            std::fs::create_dir_all(&p).expect("temp dir");
            Self(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

async fn world(script: Arc<Script>, judge: Arc<dyn Judge>, context_len: usize) -> World {
    world_with_env(script, judge, context_len, None).await
}

async fn world_with_env(
    script: Arc<Script>,
    judge: Arc<dyn Judge>,
    context_len: usize,
    environment: Option<EnvFactory>,
) -> World {
    let dir = tempdir::Dir::new("protocol");
    let scripted = scripted(kit(), context_len, script);
    let store = Arc::new(Store::open(dir.0.join("db"), StoreOptions::default()).expect("store"));
    let mut builder = TopologyBuilder::new(scripted.worker.clone(), scripted.kit.clone(), store)
        .policy_workers(4)
        .max_restarts(5)
        .judge(judge)
        .protocol_config(&protocol_config(RolloutProtocol::Reference));
    if let Some(factory) = environment {
        builder = builder.environment(factory);
    }
    let topology = builder.start().await.expect("topology");
    World {
        topology,
        scripted,
        _dir: dir,
    }
}

fn config() -> EpisodeConfig {
    EpisodeConfig {
        act_max_new_tokens: 128,
        rehearse_max_new_tokens: 64,
        ..EpisodeConfig::default()
    }
}

fn spec(task: EpisodeTask, sample: u32) -> EpisodeSpec {
    EpisodeSpec {
        task: Arc::new(task),
        facts: Arc::new(Vec::new()),
        memory: None,
        run: RunId::from("t"),
        step: 0,
        sample,
        seed: u64::from(sample),
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn a_good_episode_plays_both_user_turns_with_rehearsed_results() {
    rt().block_on(async {
        let w = world(good_policy(), Arc::new(RuleChecklistJudge), 2048).await;
        let t = run_episode_supervised(
            &w.topology.rehearsal_agents(),
            &config(),
            &spec(task("a"), 0),
        )
        .await;
        assert_eq!(t.termination, Termination::Completed, "{:#?}", t.messages);
        assert_eq!(t.reward, 1.0);
        assert_eq!(t.verdicts.len(), 2);
        // Rows: act(cd+ls), rehearse(cd), rehearse(ls), act(final), act(cat), rehearse(cat), act(final).
        let roles: Vec<Role> = t.rows.iter().map(|r| r.role).collect();
        use Role::{Act, Rehearse};
        assert_eq!(
            roles,
            vec![Act, Rehearse, Rehearse, Act, Act, Rehearse, Act]
        );
        // Both rehearsals of the two-call turn saw the same history (no result of the first).
        let prompts = w.scripted.prompts.lock().unwrap().clone();
        let rehearse: Vec<&String> = prompts.iter().filter(|p| is_rehearse(p)).collect();
        assert_eq!(rehearse.len(), 3);
        assert!(
            !rehearse[1].contains("\"ok\""),
            "the second call's prompt saw the first result"
        );
        // Tool results appended after both calls, in call order, with their rehearse row.
        let tools: Vec<_> = t
            .messages
            .iter()
            .filter(|m| m.role == MessageRole::Tool)
            .collect();
        assert_eq!(tools.len(), 3);
        assert_eq!(tools[0].tool_name.as_deref(), Some("cd"));
        assert_eq!(tools[1].tool_name.as_deref(), Some("ls"));
        assert_eq!(tools[0].row, Some(1));
        assert_eq!(tools[1].row, Some(2));
        // Exact ids: each row's completion is the script's text plus the end token.
        for row in &t.rows {
            assert_eq!(row.logprobs.len(), row.completion_ids.len());
            assert_eq!(row.completion_ids.last().copied(), w.scripted.kit.eos_id());
        }
        // The second user turn's Act prompt holds the first turn's rehearsed observations.
        let last_act = prompts.iter().rev().find(|p| !is_rehearse(p)).unwrap();
        assert!(last_act.contains("Show file a.") && last_act.contains("<tool_response>"));
        assert_eq!(w.topology.real_env_calls(), 0);
        w.topology.stop();
    });
}

fn bad_act(text: &'static str) -> Arc<Script> {
    Arc::new(move |prompt: &str| {
        if is_rehearse(prompt) {
            "\n<execution_result>\n{}\n</execution_result>".into()
        } else {
            text.into()
        }
    })
}

#[test]
fn every_act_parse_error_ends_the_episode_with_its_code() {
    let cases = [
        (
            "<tool_call>\n{\"name\": \"cd\", \"arguments\": {}}",
            "MALFORMED_TOOL_CALL",
        ),
        ("<tool_call>\n{\"name\": cd}\n</tool_call>", "INVALID_JSON"),
        (
            "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
            "MISSING_NAME",
        ),
        (
            "<tool_call>\n{\"name\": \"cd\"}\n</tool_call>",
            "MISSING_ARGUMENTS",
        ),
        (
            "<tool_call>\n{\"name\": \"cd\", \"arguments\": [1]}\n</tool_call>",
            "INVALID_ARGUMENTS",
        ),
        (
            "<tool_call>\n{\"name\": \"rm\", \"arguments\": {}}\n</tool_call>",
            "UNKNOWN_TOOL",
        ),
    ];
    rt().block_on(async {
        for (text, code) in cases {
            let w = world(bad_act(text), Arc::new(RuleChecklistJudge), 2048).await;
            let t = run_episode_supervised(
                &w.topology.rehearsal_agents(),
                &config(),
                &spec(task("p"), 0),
            )
            .await;
            assert_eq!(t.termination, Termination::ActParseError, "{code}");
            assert_eq!(t.reward, 0.0);
            assert_eq!(t.rows.len(), 1, "{code}: only the Act row");
            let last = t.messages.last().unwrap();
            assert_eq!(last.role, MessageRole::Tool);
            let v: Value = serde_json::from_str(&last.content).expect("error tool message is JSON");
            assert_eq!(v["error_tool_call"]["code"], code, "{text}");
            w.topology.stop();
        }
    });
}

#[test]
fn complete_blocks_before_a_malformed_one_earn_dense_credit_but_are_not_executed() {
    // `cd(folder=docs)` closed, then an `ls` block cut by the token budget.
    let text: &'static str = "<tool_call>\n{\"name\": \"cd\", \"arguments\": {\"folder\": \"docs\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"ls\", \"argu";
    rt().block_on(async {
        let w = world(bad_act(text), Arc::new(DenseChecklistJudge), 2048).await;
        let t = run_episode_supervised(
            &w.topology.rehearsal_agents(),
            &config(),
            &spec(task("p"), 0),
        )
        .await;
        assert_eq!(t.termination, Termination::ActParseError);
        // Nothing was rehearsed: the only row is the Act row.
        assert_eq!(t.rows.len(), 1);
        assert!(t.rows.iter().all(|r| r.role == Role::Act));
        // The transcript the judge saw, read back from the stored messages.
        let turns = transcript(&t.messages, &task("p").tool_names());
        assert_eq!(turns.len(), 1);
        assert!(turns[0].calls.is_empty() && turns[0].malformed && !turns[0].final_answer);
        assert_eq!(turns[0].unexecuted_calls.len(), 1);
        // Turn 0: f = 1/2 (a call, but a malformed, unfinished turn), credit 1/2 (cd of cd +
        // ls): 0.2 * 0.5 + 0.8 * 0.5 = 0.5; R = 0.5 / 2 turns.
        assert!((t.reward - 0.25).abs() < 1e-6, "{}", t.reward);
        w.topology.stop();
    });
}

#[test]
fn a_rehearse_format_error_ends_the_episode_and_zeroes_the_turn() {
    let script: Arc<Script> = Arc::new(|prompt: &str| {
        if is_rehearse(prompt) {
            "the file was listed".into()
        } else {
            call("cd", json!({"folder": "docs"}))
        }
    });
    rt().block_on(async {
        let w = world(script, Arc::new(RuleChecklistJudge), 2048).await;
        let t = run_episode_supervised(
            &w.topology.rehearsal_agents(),
            &config(),
            &spec(task("r"), 0),
        )
        .await;
        assert_eq!(t.termination, Termination::RehearseFormatError);
        assert_eq!(t.reward, 0.0);
        assert_eq!(
            t.rows.iter().map(|r| r.role).collect::<Vec<_>>(),
            vec![Role::Act, Role::Rehearse]
        );
        assert!(t.messages.last().unwrap().content.contains("MISSING_BLOCK"));
        w.topology.stop();
    });
}

#[test]
fn the_generation_cap_and_the_context_cap_end_episodes() {
    // A policy that never stops calling: capped at max_generation_calls (Act + Rehearse).
    let looping: Arc<Script> = Arc::new(|prompt: &str| {
        if is_rehearse(prompt) {
            "\n<execution_result>\n{}\n</execution_result>".into()
        } else {
            call("ls", json!({}))
        }
    });
    rt().block_on(async {
        let w = world(looping, Arc::new(RuleChecklistJudge), 4096).await;
        let cfg = EpisodeConfig {
            max_generation_calls: 7,
            ..config()
        };
        let t =
            run_episode_supervised(&w.topology.rehearsal_agents(), &cfg, &spec(task("c"), 0)).await;
        assert_eq!(t.termination, Termination::MaxGenerationCalls);
        assert_eq!(t.rows.len(), 7);
        assert_eq!(t.reward, 0.0);
        // The per-user-turn cap: three Act turns (each with its Rehearse call), then the end.
        let cfg = EpisodeConfig {
            max_act_turns_per_user_turn: Some(3),
            ..config()
        };
        let t =
            run_episode_supervised(&w.topology.rehearsal_agents(), &cfg, &spec(task("c"), 1)).await;
        assert_eq!(t.termination, Termination::MaxGenerationCalls);
        let roles: Vec<Role> = t.rows.iter().map(|r| r.role).collect();
        assert_eq!(roles, [Role::Act, Role::Rehearse].repeat(3));
        w.topology.stop();

        // A context too small for the first prompt plus the budget: length-exceeded, no row.
        let w = world(good_policy(), Arc::new(RuleChecklistJudge), 200).await;
        let t = run_episode_supervised(
            &w.topology.rehearsal_agents(),
            &config(),
            &spec(task("l"), 0),
        )
        .await;
        assert_eq!(t.termination, Termination::LengthExceeded);
        assert!(t.rows.is_empty());
        assert_eq!(t.reward, 0.0);
        w.topology.stop();
    });
}

#[test]
fn a_failed_required_item_stops_before_the_next_user_turn() {
    // Turn 0 calls only `cd`: the `ls` item fails, turn 1 is never played.
    let script: Arc<Script> = Arc::new(|prompt: &str| {
        if is_rehearse(prompt) {
            return "\n<execution_result>\n{}\n</execution_result>".into();
        }
        match act_state(prompt) {
            (_, 0) => call("cd", json!({"folder": "docs"})),
            _ => "Done.".into(),
        }
    });
    rt().block_on(async {
        let w = world(script, Arc::new(RuleChecklistJudge), 2048).await;
        let t = run_episode_supervised(
            &w.topology.rehearsal_agents(),
            &config(),
            &spec(task("f"), 0),
        )
        .await;
        assert_eq!(t.termination, Termination::RequiredCheckFailed);
        assert_eq!(t.verdicts.len(), 2);
        assert_eq!(t.verdicts[0].score, 0.5);
        assert_eq!(t.verdicts[1].score, 0.0);
        assert_eq!(t.reward, 0.25);
        assert!(!w
            .scripted
            .prompts
            .lock()
            .unwrap()
            .iter()
            .any(|p| p.contains("Show file a.")));
        w.topology.stop();
    });
}

/// Panics on its first `fail_first` calls, then judges like the rule judge.
struct FlakyJudge {
    calls: AtomicUsize,
    fail_first: usize,
}

impl Judge for FlakyJudge {
    fn judge(&self, task: &JudgeTask, transcript: &[TurnCalls]) -> Verdict {
        if self.calls.fetch_add(1, Ordering::SeqCst) < self.fail_first {
            panic!("flaky judge");
        }
        RuleChecklistJudge.judge(task, transcript)
    }
}

#[test]
fn a_crashed_judge_is_restarted_and_the_episode_retried_or_recorded_failed() {
    rt().block_on(async {
        let judge = Arc::new(FlakyJudge {
            calls: AtomicUsize::new(0),
            fail_first: 1,
        });
        let w = world(good_policy(), judge, 2048).await;
        let t = run_episode_supervised(
            &w.topology.rehearsal_agents(),
            &config(),
            &spec(task("s"), 0),
        )
        .await;
        assert_eq!(t.termination, Termination::Completed);
        assert_eq!(t.reward, 1.0);
        assert_eq!(w.topology.restarts().await, 1);
        w.topology.stop();

        let judge = Arc::new(FlakyJudge {
            calls: AtomicUsize::new(0),
            fail_first: usize::MAX,
        });
        let w = world(good_policy(), judge, 2048).await;
        let cfg = EpisodeConfig {
            max_retries: 2,
            ..config()
        };
        let t =
            run_episode_supervised(&w.topology.rehearsal_agents(), &cfg, &spec(task("x"), 3)).await;
        assert_eq!(t.termination, Termination::ActorFailed);
        assert_eq!(t.sample, 3, "the failed trajectory keeps its identity");
        assert!(
            t.messages[0].content.contains("judge"),
            "{}",
            t.messages[0].content
        );
        // The last restart may land just after the episode gave up: wait for it.
        let mut restarts = 0;
        for _ in 0..100 {
            restarts = w.topology.restarts().await;
            if restarts == 3 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(restarts, 3, "one restart per attempt");
        w.topology.stop();
    });
}

#[test]
fn every_row_trains_with_its_trajectory_reward_and_role_wise_advantage() {
    // K = 2 samples of one task: a perfect episode (R = 1, 4 act + 3 rehearse rows) and one
    // that fails turn 0 (R = 0.25, 2 act + 1 rehearse rows).
    let script: Arc<Script> = Arc::new(|prompt: &str| {
        if is_rehearse(prompt) {
            return "\n<execution_result>\n{\"ok\": true}\n</execution_result>".into();
        }
        let seed_one = prompt.contains("BAD");
        match act_state(prompt) {
            (_, 0) if seed_one => call("cd", json!({"folder": "docs"})),
            (u, 0) if u.starts_with("Go to docs") => format!(
                "{}\n{}",
                call("cd", json!({"folder": "docs"})),
                call("ls", json!({}))
            ),
            (u, 0) if u.starts_with("Show file") => call("cat", json!({"file": "a"})),
            _ => "All done.".into(),
        }
    });
    rt().block_on(async {
        let w = world(script, Arc::new(RuleChecklistJudge), 2048).await;
        let good = run_episode_supervised(
            &w.topology.rehearsal_agents(),
            &config(),
            &spec(task("g"), 0),
        )
        .await;
        let mut bad_spec = spec(task("g"), 1);
        bad_spec.memory = Some("BAD".into()); // the script keys the weak policy on this text
        let bad =
            run_episode_supervised(&w.topology.rehearsal_agents(), &config(), &bad_spec).await;
        assert_eq!((good.reward, bad.reward), (1.0, 0.25));
        let batch = grpo_batch(&[good.clone(), bad.clone()], &GrpoConfig::default(), &[]);
        // μ_act = (4·1 + 2·0.25) / 6 = 0.75; μ_rehearse = (3·1 + 1·0.25) / 4 = 0.8125.
        let (mu_act, mu_reh) = (0.75f32, 0.8125f32);
        for (t, traj) in [&good, &bad].iter().enumerate() {
            for (r, row) in traj.rows.iter().enumerate() {
                let mu = if row.role == Role::Act {
                    mu_act
                } else {
                    mu_reh
                };
                let a = batch.advantages[t][r].expect("trainable");
                assert!(
                    (a - (traj.reward - mu)).abs() < 1e-6,
                    "traj {t} row {r}: {a}"
                );
            }
        }
        assert_eq!(batch.rows.len(), 10);
        assert_eq!(batch.per_role[&Role::Act].rows, 6);
        assert_eq!(batch.per_role[&Role::Rehearse].rows, 4);
        // Exact ids travel unchanged into the training rows.
        assert_eq!(batch.rows[0].completion_ids, good.rows[0].completion_ids);
        assert_eq!(batch.rows[0].prompt_ids, good.rows[0].prompt_ids);
        w.topology.stop();
    });
}

// ---- The inline protocol -------------------------------------------------------------------

/// The last user message and how many tool turns follow it in an inline Act prompt.
fn inline_act_state(prompt: &str) -> (String, usize) {
    act_state_with(prompt, "<|im_start|>tool\n")
}

/// The good policy in the inline format: bare JSON results.
fn inline_policy() -> Arc<Script> {
    Arc::new(|prompt: &str| {
        if is_rehearse(prompt) {
            return "{\"ok\": true}".into();
        }
        good_act(inline_act_state(prompt))
    })
}

fn full(row: &Row) -> Vec<u32> {
    let mut ids = row.prompt_ids.clone();
    ids.extend(&row.completion_ids);
    ids
}

#[test]
fn inline_act_prompts_start_as_the_reference_prompt_and_extend_each_other() {
    rt().block_on(async {
        let w = world(inline_policy(), Arc::new(RuleChecklistJudge), 4096).await;
        let task = task("i");
        let t = run_episode_supervised(&w.inline_agents(), &config(), &spec(task.clone(), 0)).await;
        assert_eq!(t.termination, Termination::Completed, "{:#?}", t.messages);
        assert_eq!(t.reward, 1.0);
        use Role::{Act, Rehearse};
        let roles: Vec<Role> = t.rows.iter().map(|r| r.role).collect();
        assert_eq!(
            roles,
            vec![Act, Rehearse, Rehearse, Act, Act, Rehearse, Act]
        );
        let kit = &w.scripted.kit;
        // The first Act span has the reference protocol's exact context.
        let history = [Message {
            role: MessageRole::User,
            content: task.user_turns[0][0].clone(),
            tool_name: None,
            row: None,
        }];
        let reference = kit
            .encode_chat(
                &act_messages(&task.tools, ToolRendering::Compact, &history, None),
                true,
            )
            .expect("reference prompt");
        assert_eq!(t.rows[0].prompt_ids, reference);
        // Every row's prompt extends every earlier Act row (prompt + completion).
        for (i, row) in t.rows.iter().enumerate() {
            assert_eq!(row.completion_ids.last().copied(), kit.eos_id());
            if row.role == Act {
                for later in &t.rows[i + 1..] {
                    assert!(later.prompt_ids.starts_with(&full(row)), "row {i}");
                }
            }
        }
        // Both calls of the first turn were rehearsed against the same stream; their exact
        // ids joined it afterwards, in call order, in the template's tool frame.
        let turn = full(&t.rows[0]);
        assert!(t.rows[1].prompt_ids.starts_with(&turn) && t.rows[2].prompt_ids.starts_with(&turn));
        let tool = kit.encode("<|im_start|>tool\n").expect("encode");
        let newline = kit.encode("\n").expect("encode");
        let mut expected = turn.clone();
        expected.extend(&newline);
        for r in [&t.rows[1], &t.rows[2]] {
            expected.extend(&tool);
            expected.extend(&r.completion_ids);
            expected.extend(&newline);
        }
        assert!(t.rows[3].prompt_ids.starts_with(&expected));
        // Messages, tool rows and the judge's inputs are as in the reference protocol.
        let tools: Vec<_> = t
            .messages
            .iter()
            .filter(|m| m.role == MessageRole::Tool)
            .collect();
        assert_eq!(tools.len(), 3);
        assert_eq!(
            (tools[0].row, tools[1].row, tools[2].row),
            (Some(1), Some(2), Some(5))
        );
        assert_eq!(tools[0].content, "{\"ok\": true}");
        assert_eq!(w.topology.real_env_calls(), 0);
        w.topology.stop();
    });
}

fn facts(result: &str) -> Arc<Vec<ToolExchange>> {
    Arc::new(vec![ToolExchange {
        name: "ls".into(),
        arguments_json: "{}".into(),
        result_json: result.into(),
    }])
}

#[test]
fn inline_act_rows_never_see_the_rehearse_facts() {
    rt().block_on(async {
        let w = world(inline_policy(), Arc::new(RuleChecklistJudge), 4096).await;
        let mut one = spec(task("v"), 0);
        one.facts = facts("{\"secret_one\": 1}");
        let mut two = spec(task("v"), 0);
        two.facts = facts("{\"secret_two\": 2}");
        let agents = w.inline_agents();
        let a = run_episode_supervised(&agents, &config(), &one).await;
        let b = run_episode_supervised(&agents, &config(), &two).await;
        assert_eq!(a.termination, Termination::Completed);
        assert_eq!(a.rows.len(), b.rows.len());
        let kit = &w.scripted.kit;
        let mut stream: Vec<u32> = Vec::new();
        for (x, y) in a.rows.iter().zip(&b.rows) {
            assert_eq!(x.role, y.role);
            match x.role {
                Role::Act => {
                    assert_eq!(
                        x.prompt_ids, y.prompt_ids,
                        "Act context depends on the facts"
                    );
                    let text = kit.tokenizer.decode(&x.prompt_ids, false).expect("decode");
                    assert!(!text.contains("secret_") && !text.contains("# Known facts"));
                    stream = full(x);
                }
                Role::Rehearse => {
                    assert_ne!(x.prompt_ids, y.prompt_ids);
                    assert!(x.prompt_ids.starts_with(&stream));
                    let text = kit.tokenizer.decode(&x.prompt_ids, false).expect("decode");
                    assert!(text.contains("secret_one") && text.contains("# Call to simulate"));
                    assert!(text.ends_with("<|im_start|>tool\n"));
                }
            }
        }
        w.topology.stop();
    });
}

#[test]
fn an_inline_result_that_is_not_json_ends_the_episode() {
    // The reference format is not the inline format either.
    for (result, code) in [
        ("the file was listed", "INVALID_JSON"),
        (
            "\n<execution_result>\n{}\n</execution_result>",
            "INVALID_JSON",
        ),
        ("42", "NOT_OBJECT_OR_ARRAY"),
    ] {
        let script: Arc<Script> = Arc::new(move |prompt: &str| {
            if is_rehearse(prompt) {
                result.into()
            } else {
                call("cd", json!({"folder": "docs"}))
            }
        });
        rt().block_on(async {
            let w = world(script, Arc::new(RuleChecklistJudge), 4096).await;
            let t =
                run_episode_supervised(&w.inline_agents(), &config(), &spec(task("e"), 0)).await;
            assert_eq!(t.termination, Termination::RehearseFormatError, "{result}");
            assert_eq!(t.reward, 0.0);
            assert_eq!(
                t.rows.iter().map(|r| r.role).collect::<Vec<_>>(),
                vec![Role::Act, Role::Rehearse]
            );
            let last = t.messages.last().unwrap();
            assert!(last.content.contains(code), "{}", last.content);
            assert_eq!(last.row, Some(1));
            w.topology.stop();
        });
    }
}

/// A real environment whose every call returns `{"real": "<name>"}`.
struct Echo;

impl Environment for Echo {
    fn tools(&self) -> Vec<Value> {
        Vec::new()
    }
    fn reset(&mut self, _task: &EnvTask) -> Result<(), EnvironmentError> {
        Ok(())
    }
    fn execute(&mut self, call: &ToolCall) -> Observation {
        let value = json!({"real": call.name});
        Observation {
            text: value.to_string(),
            value,
            is_error: false,
        }
    }
    fn snapshot(&self) -> Value {
        Value::Null
    }
}

#[test]
fn a_real_inline_episode_appends_the_real_results_to_the_stream() {
    rt().block_on(async {
        let factory: EnvFactory = Arc::new(|| Box::new(Echo) as Box<dyn Environment>);
        let w = world_with_env(
            inline_policy(),
            Arc::new(RuleChecklistJudge),
            4096,
            Some(factory),
        )
        .await;
        let agents = Agents {
            protocol: w.inline_agents().protocol,
            ..w.topology
                .real_agents(w.topology.judge.clone())
                .expect("real agents")
        };
        let t = run_episode_supervised(&agents, &config(), &spec(task("real"), 0)).await;
        assert_eq!(t.termination, Termination::Completed, "{:#?}", t.messages);
        assert!(t.rows.iter().all(|r| r.role == Role::Act));
        assert_eq!(t.rows.len(), 4);
        assert_eq!(w.topology.real_env_calls(), 3);
        for (i, row) in t.rows.iter().enumerate() {
            for later in &t.rows[i + 1..] {
                assert!(later.prompt_ids.starts_with(&full(row)), "row {i}");
            }
        }
        let kit = &w.scripted.kit;
        let second = kit
            .tokenizer
            .decode(&t.rows[1].prompt_ids, false)
            .expect("decode");
        assert!(second.ends_with(
            "</tool_call><|im_end|>\n<|im_start|>tool\n{\"real\":\"cd\"}<|im_end|>\n<|im_start|>tool\n{\"real\":\"ls\"}<|im_end|>\n<|im_start|>assistant\n"
        ), "{second}");
        w.topology.stop();
    });
}

#[test]
fn rehearse_fidelity_compares_predictions_with_real_results() {
    use envace::actors::protocol::EpisodeContext;
    use envace::pipeline::fidelity::{predict_results, summarize, FidelityRequest};
    // The world model's answers, by the call in the Rehearse prompt: `cd` exactly right, `ls`
    // the right keys with a wrong value, `cat` not a result at all.
    let script: Arc<Script> = Arc::new(|prompt: &str| {
        let call = prompt
            .split("# Call to simulate\nTool: ")
            .nth(1)
            .and_then(|s| s.lines().next())
            .unwrap_or("");
        match call {
            "cd" => "\n<execution_result>\n{\"current_working_directory\": \"docs\"}\n</execution_result>",
            "ls" => "\n<execution_result>\n{\"current_directory_content\": [\"x\"]}\n</execution_result>",
            _ => "I cannot run that.",
        }
        .into()
    });
    let real = |name: &str, result: &str| ToolExchange {
        name: name.into(),
        arguments_json: "{}".into(),
        result_json: result.into(),
    };
    // The prompt a rollout sends for `name` (the Act turn called it), in the reference
    // protocol.
    let request = |kit: &Arc<PromptKit>, t: &EpisodeTask, name: &str| {
        let protocol = protocol_for(&protocol_config(RolloutProtocol::Reference), kit.clone())
            .expect("protocol");
        let mut transcript = protocol.open(EpisodeContext {
            task: Arc::new(t.clone()),
            facts: Arc::new(Vec::new()),
            memory: None,
        });
        transcript
            .push_act(0, &[], &call(name, json!({})))
            .expect("a whitelisted call");
        transcript
            .rehearse_prompt(&ToolCall::new(name, Map::new()))
            .expect("prompt")
    };
    rt().block_on(async {
        let w = world(script, Arc::new(RuleChecklistJudge), 4096).await;
        let kit = &w.scripted.kit;
        let (a, b) = (task("a"), task("b"));
        let requests = vec![
            FidelityRequest {
                task: "a".into(),
                class: "GorillaFileSystem".into(),
                exchange: real("cd", r#"{"current_working_directory": "docs"}"#),
                prompt: request(kit, &a, "cd"),
            },
            FidelityRequest {
                task: "a".into(),
                class: "GorillaFileSystem".into(),
                exchange: real("ls", r#"{"current_directory_content": ["a", "b"]}"#),
                prompt: request(kit, &a, "ls"),
            },
            FidelityRequest {
                task: "b".into(),
                class: "Other".into(),
                exchange: real("cat", r#"{"file_content": "hi"}"#),
                prompt: request(kit, &b, "cat"),
            },
        ];
        let params = envace::kernels::SamplingParams {
            max_new_tokens: 64,
            ..Default::default()
        };
        let (calls, tokens) = predict_results(
            &w.topology.policy,
            w.topology.protocol.as_ref(),
            &params,
            requests,
        )
        .await
        .expect("fidelity");
        assert!(tokens > 0);
        let flags: Vec<(&str, bool, bool, bool)> = calls
            .iter()
            .map(|c| (c.tool.as_str(), c.valid_json, c.same_keys, c.equal_values))
            .collect();
        assert_eq!(
            flags,
            [
                ("cd", true, true, true),
                ("ls", true, true, false),
                ("cat", false, false, false)
            ]
        );
        assert_eq!(calls[2].predicted, "I cannot run that.");
        let report = summarize(calls);
        assert_eq!((report.calls, report.tasks), (3, 2));
        // Over tasks: a has 1 of 2 exact, b 0 of 1: 1/3 in all.
        assert!((report.equal_values.estimate - 1.0 / 3.0).abs() < 1e-12);
        assert!((report.valid_json.estimate - 2.0 / 3.0).abs() < 1e-12);
        let fs = report.per_class["GorillaFileSystem"];
        assert_eq!(
            (fs.calls, fs.valid_json, fs.same_keys, fs.equal_values),
            (2, 2, 2, 1)
        );
        assert_eq!(report.per_class["Other"].valid_json, 0);
        w.topology.stop();
    });
}

/// The warm-up's rows are made by the code rollouts use: a policy that plays a seed's turns
/// word for word gives, in both protocols, the rows [`replay_seed`] builds from that seed —
/// the same roles, prompt ids and completion ids, row by row.
#[test]
fn a_rollout_that_plays_a_seed_has_the_seed_rows_in_both_protocols() {
    use envace::pipeline::seed_rows::replay_seed;
    use envace::storage::SeedTrajectory;
    const RESULT: &str = r#"{"ok": true}"#;
    for mode in [RolloutProtocol::Reference, RolloutProtocol::Inline] {
        let kit = kit();
        let protocol = protocol_for(&protocol_config(mode), kit.clone()).expect("protocol");
        let target = protocol.rehearse_target(RESULT);
        let marker = match mode {
            RolloutProtocol::Reference => "<tool_response>",
            RolloutProtocol::Inline => "<|im_start|>tool\n",
        };
        let script: Arc<Script> = Arc::new(move |prompt: &str| {
            if is_rehearse(prompt) {
                return target.clone();
            }
            good_act(act_state_with(prompt, marker))
        });
        rt().block_on(async {
            let w = world(script, Arc::new(RuleChecklistJudge), 4096).await;
            let agents = Agents {
                protocol: protocol.clone(),
                ..w.topology.rehearsal_agents()
            };
            let t = run_episode_supervised(&agents, &config(), &spec(task("s"), 0)).await;
            assert_eq!(t.termination, Termination::Completed, "{mode:?}");
            assert_eq!(t.rows.len(), 7, "{mode:?}");
            // The trajectory as a seed: its messages, and each tool message's call and result.
            let arguments = |name: &str| match name {
                "cd" => r#"{"folder": "docs"}"#,
                "cat" => r#"{"file": "a"}"#,
                _ => "{}",
            };
            let seed = SeedTrajectory {
                task: TaskId::from("s"),
                index: 0,
                messages: t.messages.clone(),
                tool_calls: t
                    .messages
                    .iter()
                    .filter(|m| m.role == MessageRole::Tool)
                    .map(|m| {
                        let name = m.tool_name.clone().expect("a tool message names its tool");
                        ToolExchange {
                            arguments_json: arguments(&name).into(),
                            name,
                            result_json: RESULT.into(),
                        }
                    })
                    .collect(),
            };
            let rows = replay_seed(&kit, protocol.as_ref(), &task("s"), &seed, Vec::new())
                .expect("seed rows");
            assert_eq!(rows.len(), t.rows.len(), "{mode:?}");
            for (i, (seed_row, row)) in rows.iter().zip(&t.rows).enumerate() {
                assert_eq!(seed_row.role, row.role, "{mode:?} row {i}");
                assert_eq!(seed_row.row.prompt_ids, row.prompt_ids, "{mode:?} row {i}");
                assert_eq!(
                    seed_row.row.completion_ids, row.completion_ids,
                    "{mode:?} row {i}"
                );
            }
            w.topology.stop();
        });
    }
}

/// A user's own actor for [`a_users_actor_runs_and_restarts_under_the_topologys_supervisor`]:
/// adds to a counter that starts at its argument; `None` panics.
#[derive(Clone)]
struct Tally;

impl ractor::Actor for Tally {
    type Msg = (Option<u64>, ractor::RpcReplyPort<u64>);
    type State = u64;
    type Arguments = u64;

    async fn pre_start(
        &self,
        _myself: ractor::ActorRef<Self::Msg>,
        start: u64,
    ) -> Result<u64, ractor::ActorProcessingErr> {
        Ok(start)
    }

    async fn handle(
        &self,
        _myself: ractor::ActorRef<Self::Msg>,
        (add, reply): Self::Msg,
        total: &mut u64,
    ) -> Result<(), ractor::ActorProcessingErr> {
        let Some(add) = add else {
            panic!("tally asked to fail");
        };
        *total += add;
        let _ = reply.send(*total);
        Ok(())
    }
}

#[test]
fn a_users_actor_runs_and_restarts_under_the_topologys_supervisor() {
    rt().block_on(async {
        let w = world(good_policy(), Arc::new(RuleChecklistJudge), 4096).await;
        let starts = Arc::new(AtomicU64::new(0));
        let counted = starts.clone();
        let tally = w
            .topology
            .start_actor("tally", Tally, move || {
                counted.fetch_add(1, Ordering::SeqCst);
                10
            })
            .await
            .expect("a user's actor starts");
        assert_eq!(tally.ask("tally", |r| (Some(5), r)).await.expect("add"), 15);
        assert_eq!(tally.ask("tally", |r| (Some(1), r)).await.expect("add"), 16);
        assert_eq!(w.topology.restarts().await, 0);
        // The panic drops the reply port: the caller gets an error, not a hang.
        assert!(tally.ask("tally", |r| (None, r)).await.is_err());
        // The supervisor handles the failure in its own mailbox; wait for the restart it
        // records there (bounded, so a missing restart fails the test).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while w.topology.restarts().await == 0 {
            assert!(std::time::Instant::now() < deadline, "no restart");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(starts.load(Ordering::SeqCst), 2, "started, then restarted");
        // The same slot serves the replacement, with fresh state from its arguments.
        assert_eq!(tally.ask("tally", |r| (Some(2), r)).await.expect("add"), 12);
        w.topology.stop();
    });
}

#[test]
fn an_actor_past_its_restart_limit_is_reported_by_name_after_doubling_backoffs() {
    rt().block_on(async {
        // max_restarts 5, restart_backoff 100 ms: restarts after 100, 200, 400, 800, 1600 ms.
        let w = world(good_policy(), Arc::new(RuleChecklistJudge), 4096).await;
        let tally = w
            .topology
            .start_actor("tally", Tally, || 0)
            .await
            .expect("a user's actor starts");
        assert!(w.topology.gave_up().await.expect("supervisor").is_empty());
        for restarts in 1..=5u64 {
            let failed = std::time::Instant::now();
            assert!(tally.ask("tally", |r| (None, r)).await.is_err());
            // The failed request returns once its actor has stopped, so the next one waits
            // through the backoff for the replacement and reaches it.
            assert_eq!(tally.ask("tally", |r| (Some(1), r)).await.expect("add"), 1);
            assert_eq!(w.topology.restarts().await, restarts);
            let backoff = std::time::Duration::from_millis(100 << (restarts - 1));
            assert!(
                failed.elapsed() >= backoff,
                "restart {restarts} after {:?}, before its backoff of {backoff:?}",
                failed.elapsed()
            );
        }
        // The sixth failure is past the limit: the actor stays down and is named.
        assert!(tally.ask("tally", |r| (None, r)).await.is_err());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let gave_up = loop {
            let g = w.topology.gave_up().await.expect("supervisor");
            if !g.is_empty() {
                break g;
            }
            assert!(std::time::Instant::now() < deadline, "not reported");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        };
        assert_eq!(gave_up.len(), 1);
        assert_eq!(
            (gave_up[0].actor.as_str(), gave_up[0].failures),
            ("tally", 6)
        );
        assert!(
            gave_up[0].reason.contains("tally asked to fail"),
            "{gave_up:?}"
        );
        assert!(
            tally.ask("tally", |r| (Some(1), r)).await.is_err(),
            "stays down"
        );
        w.topology.stop();
    });
}

/// Keeps every reply port and never answers.
#[derive(Clone)]
struct Silent;

impl ractor::Actor for Silent {
    type Msg = ractor::RpcReplyPort<u64>;
    type State = Vec<ractor::RpcReplyPort<u64>>;
    type Arguments = ();

    async fn pre_start(
        &self,
        _myself: ractor::ActorRef<Self::Msg>,
        _: (),
    ) -> Result<Self::State, ractor::ActorProcessingErr> {
        Ok(Vec::new())
    }

    async fn handle(
        &self,
        _myself: ractor::ActorRef<Self::Msg>,
        reply: Self::Msg,
        held: &mut Self::State,
    ) -> Result<(), ractor::ActorProcessingErr> {
        held.push(reply);
        Ok(())
    }
}

#[test]
fn a_request_past_the_slots_timeout_is_an_error_not_a_hang() {
    rt().block_on(async {
        let w = world(good_policy(), Arc::new(RuleChecklistJudge), 4096).await;
        let silent = w
            .topology
            .start_actor("silent", Silent, || ())
            .await
            .expect("starts")
            .with_timeout(Some(std::time::Duration::from_millis(200)));
        let asked = std::time::Instant::now();
        let e = silent.ask("silent", |r| r).await.unwrap_err();
        assert_eq!(
            e,
            envace::actors::slot::ActorCallError::Timeout {
                what: "silent".into()
            }
        );
        assert!(asked.elapsed() >= std::time::Duration::from_millis(200));
        w.topology.stop();
    });
}
