//! The pipeline end to end on the tiny model (random weights, SmolLM2's tokenizer) and the real
//! BFCL tasks: seed collection on the train split only, few-shot facts without leakage, rows
//! with their roles, exact ids and policy versions, zero real environment calls during
//! training, resume from sled at the right step, and `envace demo --preset tiny` writing its
//! report and plot.

use std::path::{Path, PathBuf};
use std::process::Command;

use envace::actors::protocol::act_messages;
use envace::actors::Split;
use envace::config::{Preset, RunConfig};
use envace::pipeline::{Pipeline, Variant, TRAIN_RUN};
use envace::storage::{
    MessageRole, Prefix, RunId, RunState, SampleKey, SeedTrajectory, Store, StoreOptions,
    Trajectory,
};

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("envace-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("temp dir");
        Self(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn config(steps: u64) -> RunConfig {
    let mut cfg = RunConfig::preset(Preset::Tiny);
    cfg.train.steps = steps;
    cfg.train.eval_every = None;
    cfg.eval.tasks = Some(1);
    cfg
}

async fn close(p: Pipeline) {
    p.close().await;
}

fn trajectories(dir: &Path, run: &str) -> Vec<Trajectory> {
    let store = Store::open(dir.join("db"), StoreOptions::default()).expect("store");
    store
        .scan::<Trajectory>(&SampleKey::run_prefix(&RunId::from(run)))
        .map(|r| r.expect("record").1)
        .collect()
}

#[test]
fn collect_train_resume_and_eval_on_the_tiny_model() {
    let dir = TempDir::new("pipeline");
    rt().block_on(async {
        // Stage 1: seeds for the train split only.
        let mut p = Pipeline::open(config(1), &dir.0, "tiny")
            .await
            .expect("open");
        let collected = p.collect().await.expect("collect");
        assert_eq!(collected.items, 150);
        assert!(collected.real_env_calls > 0);
        let pool = p.seed_pool().await.expect("pool");
        assert_eq!(pool.len(), 150);

        // No leakage: a test task's facts are real exchanges of train seeds, never of its own
        // ground truth when that exchange exists nowhere in the train seeds.
        let seeds: Vec<SeedTrajectory> = {
            let store = p.store.clone();
            store
                .scan::<SeedTrajectory>(&Prefix::all())
                .map(|r| r.expect("seed").1)
                .collect()
        };
        assert!(seeds
            .iter()
            .all(|s| p.suite.tasks(Split::Train).iter().any(|t| t.id == s.task)));
        // The split is stratified: every class of a test task is trained on, so every test
        // task gets facts from train seeds of its tools.
        let mut env = (p.suite.environment())();
        let mut with_facts = 0;
        for task in p.suite.tasks(Split::Test) {
            assert_eq!(task.split, Split::Test);
            let facts = pool.facts_for(task, 6, 100_000);
            assert!(!facts.is_empty(), "{}", task.id);
            with_facts += usize::from(!facts.is_empty());
            let own = p.suite.collect_seed(task, env.as_mut()).expect("gt");
            for f in &facts {
                let from_train = seeds.iter().any(|s| s.tool_calls.contains(f));
                assert!(
                    from_train,
                    "{}: fact {f:?} is not from a train seed",
                    task.id
                );
                let only_own = own.seed.tool_calls.contains(f)
                    && !seeds.iter().any(|s| s.tool_calls.contains(f));
                assert!(!only_own, "{}: fact leaked from its ground truth", task.id);
            }
        }
        assert_eq!(with_facts, 50);

        // Stage 2: one self-rehearsal GRPO step; zero real calls. The random tiny model answers
        // every turn in plain text, so each group's rewards are equal: dynamic sampling draws
        // up to its bound (3 tasks), finds no signal, and the step is skipped — no update.
        let calls_before = p.topology.real_env_calls();
        let train = p.train(None).await.expect("train");
        assert_eq!(train.real_env_calls, 0);
        assert_eq!(p.topology.real_env_calls(), calls_before);
        assert_eq!(p.report.train.steps.len(), 1);
        let s0 = &p.report.train.steps[0];
        assert_eq!(s0.real_env_calls, 0);
        assert!(s0.skipped, "{s0:?}");
        assert_eq!(
            (s0.groups, s0.zero_variance_groups, s0.draw_rounds),
            (3, 3, 2)
        );
        assert_eq!(s0.zero_variance_fraction, 1.0);
        // No update: no loss, KL or gradient to report (null in report.json), not zeros.
        assert!(
            s0.loss.is_nan() && s0.kl.is_nan() && s0.grad_norm.is_nan(),
            "{s0:?}"
        );
        assert_eq!(s0.informative_rows_act + s0.informative_rows_rehearse, 0);
        assert_eq!(p.topology.worker.policy_version().0, 0, "a skipped step");
        let kit = p.topology.kit.clone();
        let tools = p.cfg.protocol.tool_rendering;
        let task0 = p.suite.tasks(Split::Train)[0].clone();
        let train_ids: Vec<String> = p
            .suite
            .tasks(Split::Train)
            .iter()
            .map(|t| t.id.0.clone())
            .collect();
        // A one-task evaluation takes the middle of the test split (tasks spread evenly).
        let test = p.suite.tasks(Split::Test);
        let middle_test = test[test.len() / 2].id.0.clone();
        close(p).await;

        // Every trajectory drawn is stored, trained or not.
        let step0 = trajectories(&dir.0, TRAIN_RUN);
        let (k, tasks) = (2usize, 3usize);
        assert_eq!(step0.len(), k * tasks);
        for t in &step0 {
            assert_eq!(t.step, 0);
            assert!(!t.rows.is_empty());
            for (i, row) in t.rows.iter().enumerate() {
                assert_eq!(row.policy_version.0, 0, "sampled before the first update");
                assert_eq!(row.logprobs.len(), row.completion_ids.len());
                assert!(row.logprobs.iter().all(|l| l.is_finite() && *l <= 0.0));
                // The row's message holds it; its role matches the message role.
                let m = t
                    .messages
                    .iter()
                    .find(|m| m.row == Some(i as u32))
                    .expect("message");
                let expected = match row.role {
                    envace::storage::Role::Act => MessageRole::Assistant,
                    envace::storage::Role::Rehearse => MessageRole::Tool,
                };
                assert_eq!(m.role, expected);
            }
        }
        // Exact ids: the first Act row's prompt is the rendered Act prompt of its history.
        let first = step0
            .iter()
            .find(|t| t.task == task0.id)
            .expect("task 0 trajectory");
        let history: Vec<_> = first
            .messages
            .iter()
            .take_while(|m| m.role == MessageRole::User)
            .cloned()
            .collect();
        let prompt = kit
            .encode_chat(&act_messages(&task0.tools, tools, &history, None), true)
            .expect("render");
        assert_eq!(first.rows[0].prompt_ids, prompt);
        let text = kit.decode(&first.rows[0].completion_ids).expect("decode");
        assert_eq!(first.messages[history.len()].content, text);

        // Stage 3: a "stopped" run resumes at step 1 with the saved weights and version.
        let mut p = Pipeline::open(config(2), &dir.0, "tiny")
            .await
            .expect("reopen");
        p.train(None).await.expect("resume");
        assert_eq!(
            p.report
                .train
                .steps
                .iter()
                .map(|s| s.step)
                .collect::<Vec<_>>(),
            vec![0, 1]
        );
        assert_eq!(p.topology.worker.policy_version().0, 0);
        let state = p
            .store
            .get::<RunState>(&RunId::from(TRAIN_RUN))
            .expect("read")
            .expect("run state");
        assert_eq!(state.step, 2);
        assert_eq!(state.data_cursor, 6, "3 tasks drawn per step");
        // A skipped step keeps the previous checkpoint: the weights of step 1 and the learner
        // state (AdamW moments, step count) saved with them.
        let mut files: Vec<_> = std::fs::read_dir(dir.0.join("checkpoints"))
            .expect("checkpoints")
            .map(|e| e.expect("entry").file_name())
            .collect();
        files.sort();
        assert_eq!(
            files,
            [
                std::ffi::OsString::from("envace-step1.learner.safetensors"),
                std::ffi::OsString::from("envace-step1.safetensors"),
            ]
        );

        // Stage 4: evaluation in the real environment with the BFCL checker, every metric
        // with an interval, and Rehearse fidelity on the task's real calls.
        let eval = p.eval(Variant::Base, None).await.expect("eval");
        assert_eq!(eval.tasks, 1);
        assert_eq!(eval.split, "test");
        assert_eq!(eval.per_task.len(), 1);
        assert_eq!(eval.per_task[0].task, middle_test);
        let t = &eval.per_task[0];
        assert!(t.act_turns >= 1 && t.expected_calls >= 1, "{t:?}");
        // Plain text where calls are expected: no well-formed call, no checklist credit.
        assert_eq!((t.well_formed_turns, t.name_matches), (0, 0));
        assert_eq!(t.checklist_score, 0.0, "{t:?}");
        let fidelity = eval.fidelity.as_ref().expect("fidelity");
        assert_eq!(fidelity.calls, 1, "eval.fidelity_calls_per_task = 1");
        assert!(fidelity.real_env_calls >= 1, "the ground-truth replay");
        assert_eq!(eval.metrics.checklist_score.estimate, t.checklist_score);
        p.save_report().expect("report");
        close(p).await;

        let all = trajectories(&dir.0, TRAIN_RUN);
        assert_eq!(
            all.iter().filter(|t| t.step == 0).count(),
            k * tasks,
            "step 0 not redone"
        );
        let step1: Vec<_> = all.iter().filter(|t| t.step == 1).collect();
        assert_eq!(step1.len(), k * tasks);
        assert!(step1
            .iter()
            .flat_map(|t| &t.rows)
            .all(|r| r.policy_version.0 == 0));
        // Step 1 took the next tasks of the train split.
        assert!(step1.iter().all(|t| train_ids[3..6].contains(&t.task.0)));
    });
}

#[test]
fn the_learner_updates_on_a_reward_spread_and_skips_equal_rewards() {
    use envace::actors::learner_actor::{LearnerActor, LearnerArgs, LearnerMsg};
    use envace::actors::worker::WorkerHandle;
    use envace::kernels::{load, EngineConfig, LearnerConfig, ModelSource};
    use envace::storage::{ExecutionMode, PolicyVersion, Role, Row, TaskId, Termination, Timings};
    let loaded = load(&ModelSource::Tiny, tch::Device::Cpu, tch::Kind::Float).expect("tiny");
    let worker = WorkerHandle::spawn(loaded.model, loaded.tokenizer, EngineConfig::default());
    let trajectory = |sample: u32, reward: f32| Trajectory {
        run: RunId::from("t"),
        step: 0,
        task: TaskId::from("task"),
        sample,
        mode: ExecutionMode::Rehearsal,
        rows: vec![Row {
            role: Role::Act,
            prompt_ids: vec![11, 12, 13],
            completion_ids: vec![14, 15],
            logprobs: vec![-3.0, -3.0],
            policy_version: PolicyVersion(0),
        }],
        messages: Vec::new(),
        reward,
        verdicts: Vec::new(),
        termination: Termination::Completed,
        timings: Timings::default(),
    };
    rt().block_on(async {
        let (learner, _) = ractor::Actor::spawn(
            None,
            LearnerActor,
            LearnerArgs::new(worker.clone(), vec![2]),
        )
        .await
        .expect("learner");
        let cfg = Box::new(LearnerConfig {
            lr: 1e-3,
            ..LearnerConfig::default()
        });
        ractor::call!(learner, LearnerMsg::Configure, cfg)
            .expect("call")
            .expect("configure");
        let equal = vec![trajectory(0, 0.3), trajectory(1, 0.3)];
        let out = ractor::call!(learner, LearnerMsg::GrpoStep, equal)
            .expect("call")
            .expect("step");
        assert!(out.skipped);
        assert_eq!((out.stats.grad_norm, out.policy_version.0), (0.0, 0));
        assert_eq!(worker.policy_version().0, 0, "no optimizer step");
        let spread = vec![trajectory(0, 0.0), trajectory(1, 0.5)];
        let out = ractor::call!(learner, LearnerMsg::GrpoStep, spread)
            .expect("call")
            .expect("step");
        assert!(!out.skipped);
        assert!(out.stats.grad_norm > 0.0, "{:?}", out.stats);
        assert_eq!(out.policy_version.0, 1);
        assert_eq!(out.advantages, vec![vec![Some(-0.25)], vec![Some(0.25)]]);
        learner.stop(None);
    });
}

#[test]
fn demo_tiny_writes_the_report_and_plot() {
    let dir = TempDir::new("demo");
    let out = Command::new(env!("CARGO_BIN_EXE_envace"))
        .args(["demo", "--preset", "tiny", "--out"])
        .arg(&dir.0)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run envace");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("after EnvACE training"), "{table}");
    assert!(
        table.contains("real env calls during training: 0"),
        "{table}"
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.0.join("report.json")).expect("report"))
            .expect("json");
    for stage in [
        "collect",
        "sft",
        "train",
        "eval_base",
        "eval_sft",
        "eval_envace",
    ] {
        let s = &report["stages"][stage];
        assert!(
            s["wall_s"].as_f64().is_some_and(|w| w > 0.0),
            "{stage}: {s}"
        );
        assert!(s["tokens"].as_u64().is_some(), "{stage}: {s}");
    }
    assert!(report["stages"]["train"]["tokens"].as_u64().unwrap() > 0);
    assert_eq!(report["train"]["real_env_calls"], 0);
    assert_eq!(report["train"]["steps"].as_array().map(Vec::len), Some(2));
    for step in report["train"]["steps"].as_array().expect("steps") {
        for key in [
            "skipped",
            "groups",
            "zero_variance_fraction",
            "informative_rows_act",
        ] {
            assert!(!step[key].is_null(), "{key}: {step}");
        }
        if step["skipped"] == true {
            assert!(
                step["loss"].is_null() && step["grad_norm"].is_null(),
                "{step}"
            );
        }
    }
    // The warm-up trains every row of the seeds it uses: one Act row per assistant turn and
    // one Rehearse row per real call of each seed, with tokens and loss per role.
    let store = Store::open(dir.0.join("db"), StoreOptions::default()).expect("store");
    let seeds: Vec<SeedTrajectory> = store
        .scan::<SeedTrajectory>(&Prefix::all())
        .map(|r| r.expect("seed").1)
        .collect();
    drop(store);
    let used: Vec<&str> = report["sft"]["seeds"]
        .as_array()
        .expect("seeds used")
        .iter()
        .filter_map(|s| s.as_str())
        .collect();
    assert_eq!(used.len(), 2, "the tiny preset's sft.seeds");
    let (mut acts, mut calls) = (0, 0);
    for id in &used {
        let seed = seeds
            .iter()
            .find(|s| s.task.0 == *id)
            .expect("a stored seed");
        acts += seed
            .messages
            .iter()
            .filter(|m| m.role == MessageRole::Assistant)
            .count() as u64;
        calls += seed.tool_calls.len() as u64;
    }
    let per_role = &report["sft"]["per_role"];
    assert_eq!(per_role["act"]["rows"], acts);
    assert_eq!(per_role["rehearse"]["rows"], calls);
    for role in ["act", "rehearse"] {
        let r = &per_role[role];
        assert!(
            r["completion_tokens"].as_u64().is_some_and(|n| n > 0),
            "{role}: {r}"
        );
        assert!(r["loss_last_epoch"].as_f64().is_some(), "{role}: {r}");
    }
    // Periodic evaluation (train.eval_every = 1): before training and after each step.
    let evals = report["train"]["evals"].as_array().expect("evals");
    let at: Vec<u64> = evals.iter().filter_map(|e| e["step"].as_u64()).collect();
    assert_eq!(at, [0, 1, 2]);
    for variant in ["base", "sft", "envace"] {
        let v = &report["variants"][variant];
        assert!(v["task_success"].as_f64().is_some(), "{variant}: {v}");
        for metric in [
            "task_success",
            "turn_success",
            "checklist_score",
            "well_formed_call_share",
            "malformed_share",
            "tool_name_accuracy",
            "argument_accuracy",
        ] {
            let ci = &v["metrics"][metric];
            assert!(ci["low"].as_f64().is_some(), "{variant} {metric}: {ci}");
            assert!(ci["high"].as_f64().is_some(), "{variant} {metric}: {ci}");
        }
        assert!(
            v["fidelity"]["equal_values"]["estimate"].as_f64().is_some(),
            "{v}"
        );
        assert_eq!(v["split"], "test");
    }
    for pair in ["sft - base", "envace - sft"] {
        let c = &report["comparisons"][pair];
        assert_eq!(c["tasks"], 2, "{pair}: {c}");
        assert!(c["differences"]["checklist_score"]["low"]
            .as_f64()
            .is_some());
    }
    let png = std::fs::read(dir.0.join("training.png")).expect("plot");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert!(dir.0.join("db").is_dir());

    // Checkpoint records name their files relative to the run folder.
    let store = Store::open(dir.0.join("db"), StoreOptions::default()).expect("store");
    let recorded: Vec<PathBuf> = store
        .scan::<envace::storage::Checkpoint>(&Prefix::all())
        .map(|r| r.expect("checkpoint").1.path)
        .collect();
    drop(store);
    assert!(!recorded.is_empty());
    assert!(
        recorded
            .iter()
            .all(|p| p.starts_with("checkpoints") && p.is_relative()),
        "{recorded:?}"
    );
    // A copied folder evaluates its own weights, from another working directory, with the
    // folder's own config (no --preset: the tiny model, not the default smollm2).
    let copy = TempDir::new("demo-copy");
    let cp = Command::new("cp")
        .arg("-a")
        .arg(dir.0.join("."))
        .arg(&copy.0)
        .status()
        .expect("cp");
    assert!(cp.success());
    std::fs::remove_dir_all(dir.0.join("checkpoints")).expect("remove the original's weights");
    let eval = Command::new(env!("CARGO_BIN_EXE_envace"))
        .args(["eval", "--variant", "envace", "--limit", "1", "--out"])
        .arg(&copy.0)
        .current_dir(std::env::temp_dir())
        .env("RUST_LOG", "warn")
        .output()
        .expect("run envace eval");
    let stderr = String::from_utf8_lossy(&eval.stderr);
    assert!(eval.status.success(), "{stderr}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(copy.0.join("report.json")).expect("report"))
            .expect("json");
    assert_eq!(
        report["variants"]["envace"]["tasks"], 1,
        "{}",
        report["variants"]["envace"]
    );

    // The demo again on that folder: the stages already done are not run again.
    let again = Command::new(env!("CARGO_BIN_EXE_envace"))
        .args(["demo", "--out"])
        .arg(&copy.0)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run envace demo");
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{stderr}");
    for stage in ["collect", "eval base", "sft", "eval sft"] {
        assert!(
            stderr.contains(&format!("demo: {stage} is already done")),
            "{stage}: {stderr}"
        );
    }
    // The envace evaluation above covered 1 task, not the config's 2: it runs again.
    assert!(
        !stderr.contains("demo: eval envace is already done"),
        "{stderr}"
    );
}

#[test]
fn the_model_thread_trains_with_a_k3_kl_to_a_frozen_reference() {
    use envace::actors::worker::{Job, WorkerHandle};
    use envace::kernels::{load, EngineConfig, LearnerConfig, ModelSource, TrainRow};
    let loaded = load(&ModelSource::Tiny, tch::Device::Cpu, tch::Kind::Float).expect("tiny");
    let worker = WorkerHandle::spawn(loaded.model, loaded.tokenizer, EngineConfig::default());
    rt().block_on(async {
        let mut cfg = LearnerConfig {
            lr: 1e-2,
            ..LearnerConfig::default()
        };
        cfg.grpo.kl_coef = Some(0.1);
        worker
            .request(|tx| Job::SetLearner(Box::new(cfg), tx))
            .await
            .expect("a learner with a frozen reference");
        let scored = worker
            .request(|tx| {
                Job::Score(
                    vec![envace::kernels::ScoreRow {
                        prompt_ids: vec![1, 2, 3],
                        completion_ids: vec![4, 5],
                    }],
                    tx,
                )
            })
            .await
            .expect("score");
        let row = TrainRow {
            prompt_ids: vec![1, 2, 3],
            completion_ids: vec![4, 5],
            old_logprobs: scored[0].clone(),
            advantage: 1.0,
        };
        let first = worker
            .request(|tx| Job::Train(vec![row.clone()], tx))
            .await
            .expect("step 1");
        assert!(
            first.ref_kl.abs() < 1e-6,
            "identical weights: {}",
            first.ref_kl
        );
        let mut last = first;
        for _ in 0..3 {
            last = worker
                .request(|tx| Job::Train(vec![row.clone()], tx))
                .await
                .expect("step");
        }
        assert!(last.ref_kl > 1e-6, "the policy moved away: {}", last.ref_kl);
        assert_eq!(worker.policy_version().0, 4);
    });
}

#[test]
fn the_inline_protocol_runs_every_stage_on_the_tiny_model() {
    use envace::actors::protocol::RolloutProtocol;
    let dir = TempDir::new("inline");
    rt().block_on(async {
        let cfg = config(1).with_protocol(RolloutProtocol::Inline);
        assert!(cfg.train.learner.pack_prefixes);
        let mut p = Pipeline::open(cfg, &dir.0, "tiny").await.expect("open");
        p.collect().await.expect("collect");
        let sft = p.sft().await.expect("inline warm-up");
        assert!(sft.tokens > 0);
        let train = p.train(None).await.expect("inline training");
        assert_eq!(train.real_env_calls, 0);
        let eval = p.eval(Variant::Envace, None).await.expect("inline eval");
        assert_eq!(eval.tasks, 1);
        let kit = p.topology.kit.clone();
        let first_task = p.suite.tasks(Split::Train)[0].clone();
        close(p).await;

        let trajs = trajectories(&dir.0, TRAIN_RUN);
        assert!(!trajs.is_empty());
        let reference_prompt = kit
            .encode_chat(
                &act_messages(
                    &first_task.tools,
                    RunConfig::preset(Preset::Tiny).protocol.tool_rendering,
                    &first_task.user_turns[0]
                        .iter()
                        .map(|m| envace::storage::Message {
                            role: MessageRole::User,
                            content: m.clone(),
                            tool_name: None,
                            row: None,
                        })
                        .collect::<Vec<_>>(),
                    None,
                ),
                true,
            )
            .expect("reference prompt");
        for t in trajs.iter().filter(|t| t.task == first_task.id) {
            // The first Act row's context is the reference protocol's first Act prompt.
            assert_eq!(t.rows[0].prompt_ids, reference_prompt, "{}", t.task);
            // Every later row (Act or Rehearse) branches off the same stream.
            for row in &t.rows {
                assert!(row.prompt_ids.starts_with(&reference_prompt), "{}", t.task);
            }
        }
    });
}
