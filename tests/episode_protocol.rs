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

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use envace::actors::episode::{run_episode_supervised, EpisodeConfig, EpisodeSpec};
use envace::actors::learner::grpo_batch;
use envace::actors::protocol::{PromptKit, ToolRendering};
use envace::actors::topology::{Topology, TopologySpec};
use envace::actors::worker::{Generated, Job, ModelInfo, WorkerHandle};
use envace::actors::{
    ChecklistItem, EnvTask, EpisodeTask, Judge, JudgeTask, Split, TurnCalls, Verdict,
};
use envace::bfcl::judge::RuleChecklistJudge;
use envace::kernels::{load, FinishReason, GrpoConfig, ModelSource};
use envace::storage::{MessageRole, Role, RunId, Store, StoreOptions, TaskId, Termination};
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

/// The last user message and how many tool responses follow it in an Act prompt.
fn act_state(prompt: &str) -> (String, usize) {
    let last_user = prompt.rfind("<|im_start|>user\n").expect("a user turn");
    let rest = &prompt[last_user + "<|im_start|>user\n".len()..];
    let user = rest.split("<|im_end|>").next().unwrap_or("").to_string();
    (user, rest.matches("<tool_response>").count())
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
        match act_state(prompt) {
            (u, 0) if u.starts_with("Go to docs") => format!(
                "{}\n{}",
                call("cd", json!({"folder": "docs"})),
                call("ls", json!({}))
            ),
            (u, 0) if u.starts_with("Show file") => call("cat", json!({"file": "a"})),
            _ => "All done.".into(),
        }
    })
}

struct World {
    topology: Topology,
    scripted: Scripted,
    _dir: tempdir::Dir,
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
    let dir = tempdir::Dir::new("protocol");
    let scripted = scripted(kit(), context_len, script);
    let store = Arc::new(Store::open(dir.0.join("db"), StoreOptions::default()).expect("store"));
    let topology = Topology::start(
        TopologySpec {
            acting_workers: 2,
            rehearsal_workers: 2,
            max_restarts: 5,
        },
        scripted.worker.clone(),
        scripted.kit.clone(),
        judge,
        None,
        store,
    )
    .await
    .expect("topology");
    World {
        topology,
        scripted,
        _dir: dir,
    }
}

fn config() -> EpisodeConfig {
    EpisodeConfig {
        tool_rendering: ToolRendering::Compact,
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
        assert_eq!(batch.per_role["act"].rows, 6);
        assert_eq!(batch.per_role["rehearse"].rows, 4);
        // Exact ids travel unchanged into the training rows.
        assert_eq!(batch.rows[0].completion_ids, good.rows[0].completion_ids);
        assert_eq!(batch.rows[0].prompt_ids, good.rows[0].prompt_ids);
        w.topology.stop();
    });
}
