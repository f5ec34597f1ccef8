//! `envace daemon` and `envace ctl` on the tiny model, as processes: a run of N steps equals
//! N/2 steps, a SIGKILL and a resume; a truncated checkpoint is detected and the one before
//! it used; SIGTERM finishes the step, checkpoints and exits 0; the Prometheus endpoint and
//! the control socket answer while it runs; a judge swap and added tasks take effect at the
//! step `ctl` names; pruning keeps the last K checkpoints.
//!
//! The daemon runs as this test binary re-executed (`daemon_child_process`), so the test can
//! register its own judge: the tiny model's random text gives no reward spread under the
//! BFCL judges, and training that never updates would make the equality trivial. The
//! `answer_length` judge scores each turn by the last digit of its final answer's length, so
//! the K samples of a task nearly always differ.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envace::actors::{Judge, JudgeTask, TurnCalls, TurnScore, Verdict};
use envace::config::{Preset, RunConfig};
use envace::daemon::{request, CtlRequest};
use envace::pipeline::control::ControlHistory;
use envace::registry::Registry;
use envace::report::RunReport;
use envace::storage::{Checkpoint, Prefix, RunId, RunState, Store, StoreOptions, Trajectory};

/// The environment variable that makes this binary the daemon: its value is the command line
/// as a JSON array.
const CHILD: &str = "ENVACE_DAEMON_TEST_ARGS";

/// Scores a turn by its final answer's length: `(chars mod 10) / 10`.
struct AnswerLengthJudge;

impl Judge for AnswerLengthJudge {
    fn judge(&self, task: &JudgeTask, transcript: &[TurnCalls]) -> Verdict {
        Verdict::from_turn_scores(
            (0..task.num_turns())
                .map(|t| {
                    let n = transcript.get(t).map_or(0, |c| c.answer.chars().count());
                    TurnScore {
                        score: (n % 10) as f32 / 10.0,
                        passed_required: true,
                        reason: format!("{n} characters"),
                    }
                })
                .collect(),
        )
    }
}

/// [`AnswerLengthJudge`] for its first 16 calls, then a panic on every call.
struct CrashLaterJudge {
    calls: std::sync::atomic::AtomicUsize,
}

impl Judge for CrashLaterJudge {
    fn judge(&self, task: &JudgeTask, transcript: &[TurnCalls]) -> Verdict {
        if self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= 16 {
            panic!("the judge broke");
        }
        AnswerLengthJudge.judge(task, transcript)
    }
}

/// Not a test: the daemon process of the tests below (does nothing without `CHILD`).
#[test]
fn daemon_child_process() {
    let Some(args) = std::env::var_os(CHILD) else {
        return;
    };
    let args: Vec<String> = serde_json::from_str(&args.to_string_lossy()).expect("args");
    let mut registry = Registry::builtin();
    registry.register_judge("answer_length", |_| Arc::new(AnswerLengthJudge));
    registry.register_judge("crash_later", |_| {
        Arc::new(CrashLaterJudge {
            calls: Default::default(),
        })
    });
    let code =
        envace::cli::run_with_args(registry, std::iter::once("envace".to_string()).chain(args));
    std::process::exit(if code == std::process::ExitCode::SUCCESS {
        0
    } else {
        1
    });
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("envace-daemon-{tag}-{}", std::process::id()));
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

/// The tiny preset judged by `answer_length`, checkpointing every 2 steps, keeping 2.
fn config_file(dir: &Path) -> PathBuf {
    write_config(dir, |_| {})
}

/// [`config_file`] changed by `change`.
fn write_config(dir: &Path, change: impl FnOnce(&mut RunConfig)) -> PathBuf {
    let mut cfg = RunConfig::preset(Preset::Tiny);
    cfg.judge = envace::config::JudgeName("answer_length".into());
    cfg.train.eval_every = None;
    cfg.daemon.checkpoint_every_steps = 2;
    cfg.daemon.checkpoint_every_minutes = None;
    cfg.daemon.keep_last = 2;
    cfg.daemon.keep_best = false;
    change(&mut cfg);
    let path = dir.join("daemon.toml");
    std::fs::write(&path, cfg.to_toml()).expect("config");
    path
}

/// Starts the daemon on `out` with `extra` arguments and environment.
fn spawn(config: &Path, out: &Path, extra: &[&str], env: &[(&str, &str)]) -> Child {
    let mut args = vec![
        "daemon".to_string(),
        "--config".into(),
        config.display().to_string(),
        "--out".into(),
        out.display().to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    cmd.args([
        "daemon_child_process",
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD, serde_json::to_string(&args).expect("json"))
    .env_remove("ENVACE_CRASH_AT")
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn the daemon")
}

/// Waits for the process and returns its status and stderr.
fn finish(mut child: Child) -> (ExitStatus, String) {
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    (child.wait().expect("wait"), err)
}

/// Runs the daemon to completion.
fn run(config: &Path, out: &Path, extra: &[&str], env: &[(&str, &str)]) -> (ExitStatus, String) {
    finish(spawn(config, out, extra, env))
}

/// Every training trajectory of the run, by (step, task, sample).
fn trajectories(dir: &Path) -> Vec<Trajectory> {
    let store = Store::open(dir.join("db"), StoreOptions::default()).expect("store");
    let mut all: Vec<Trajectory> = store
        .scan::<Trajectory>(&Prefix::all())
        .map(|r| r.expect("record").1)
        .filter(|t| t.run.0 == "envace")
        .collect();
    all.sort_by(|a, b| (a.step, &a.task, a.sample).cmp(&(b.step, &b.task, b.sample)));
    all
}

/// The run state and checkpoint records.
fn state(dir: &Path) -> (RunState, Vec<Checkpoint>) {
    let store = Store::open(dir.join("db"), StoreOptions::default()).expect("store");
    let state = store
        .get::<RunState>(&RunId::from("envace"))
        .expect("read")
        .expect("run state");
    let records = store
        .scan::<Checkpoint>(&Prefix::all())
        .map(|r| r.expect("record").1)
        .filter(|c| c.run.0 == "envace")
        .collect();
    (state, records)
}

/// Largest absolute difference between two safetensors files' tensors (same names).
fn max_diff(a: &Path, b: &Path) -> f64 {
    let mut a = tch::Tensor::read_safetensors(a).expect("read a");
    let mut b = tch::Tensor::read_safetensors(b).expect("read b");
    a.sort_by(|x, y| x.0.cmp(&y.0));
    b.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(a.len(), b.len());
    let mut worst = 0.0f64;
    for ((na, ta), (nb, tb)) in a.iter().zip(&b) {
        assert_eq!(na, nb);
        let d = (ta.to_kind(tch::Kind::Double) - tb.to_kind(tch::Kind::Double))
            .abs()
            .max()
            .double_value(&[]);
        worst = worst.max(d);
    }
    worst
}

fn checkpoint_files(dir: &Path) -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(dir.join("checkpoints"))
        .expect("checkpoints")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("envace-step"))
        .collect();
    files.sort();
    files
}

/// What a trajectory sampled: (step, task, sample, reward, each row's completion ids).
type Sampled = (u64, String, u32, f32, Vec<Vec<u32>>);

/// The tokens and rewards of trajectories, for equality.
fn sampled(ts: &[Trajectory]) -> Vec<Sampled> {
    ts.iter()
        .map(|t| {
            (
                t.step,
                t.task.0.clone(),
                t.sample,
                t.reward,
                t.rows.iter().map(|r| r.completion_ids.clone()).collect(),
            )
        })
        .collect()
}

#[test]
fn n_steps_equal_half_a_sigkill_a_resume_and_half_and_a_truncated_checkpoint_falls_back() {
    let tmp = TempDir::new("resume");
    let config = config_file(&tmp.0);
    let (a, b) = (tmp.0.join("a"), tmp.0.join("b"));

    // Uninterrupted: 6 steps, checkpoints after 2, 4, 6; the last 2 kept.
    let (status, err) = run(&config, &a, &["--steps", "6"], &[]);
    assert!(status.success(), "{err}");
    let ta = trajectories(&a);
    let (sa, records) = state(&a);
    assert_eq!(sa.step, 6);
    assert_eq!(
        records.iter().map(|c| c.step).collect::<Vec<_>>(),
        [2, 4, 6]
    );
    assert_eq!(
        checkpoint_files(&a),
        [
            "envace-step4.learner.safetensors",
            "envace-step4.safetensors",
            "envace-step6.learner.safetensors",
            "envace-step6.safetensors"
        ],
        "pruning keeps the last 2"
    );
    let report = RunReport::load_or_new(&a, "x", "tiny").expect("report");
    let updates = report.train.steps.iter().filter(|s| !s.skipped).count();
    assert!(
        updates >= 4,
        "the answer_length judge gives reward spreads: {updates} updates"
    );
    assert_eq!(report.train.steps.len(), 6);

    // Interrupted: SIGKILL after step 3 is played (step 2 is the last commit), then the same
    // command.
    let (status, err) = run(
        &config,
        &b,
        &["--steps", "6"],
        &[
            ("ENVACE_CRASH_AT", "train-step-played@3"),
            ("ENVACE_CRASH_SIGNAL", "kill"),
        ],
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9), "killed by SIGKILL: {err}");
    assert_eq!(state(&b).0.step, 2, "steps 0-1 committed, step 2 lost");
    let (status, err) = run(&config, &b, &["--steps", "6"], &[]);
    assert!(status.success(), "{err}");
    assert!(err.contains("resuming run envace after step 2"), "{err}");
    let tb = trajectories(&b);
    assert_eq!(tb.len(), ta.len(), "nothing lost, nothing stored twice");
    assert_eq!(sampled(&ta), sampled(&tb), "the same sampled trajectories");
    let (sb, _) = state(&b);
    assert_eq!((sb.step, sb.data_cursor), (sa.step, sa.data_cursor));
    let wa = a.join("checkpoints/envace-step6.safetensors");
    let wb = b.join("checkpoints/envace-step6.safetensors");
    let d = max_diff(&wa, &wb);
    assert!(d <= 1e-6, "weights differ by {d}");
    let d = max_diff(
        &a.join("checkpoints/envace-step6.learner.safetensors"),
        &b.join("checkpoints/envace-step6.learner.safetensors"),
    );
    assert!(d <= 1e-6, "optimizer states differ by {d}");

    // A truncated last checkpoint: detected, the one of step 4 used, steps 4-5 played again
    // to the same weights.
    let original = tmp.0.join("step6.safetensors");
    std::fs::copy(&wa, &original).expect("copy");
    let len = std::fs::metadata(&wa).expect("meta").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&wa)
        .and_then(|f| f.set_len(len / 2))
        .expect("truncate");
    let (status, err) = run(&config, &a, &["--steps", "6"], &[]);
    assert!(status.success(), "{err}");
    assert!(err.contains("checkpoint skipped: step 6"), "{err}");
    assert!(
        err.contains("resuming from the checkpoint of step 4 instead"),
        "{err}"
    );
    let d = max_diff(&original, &wa);
    assert!(d <= 1e-6, "replayed weights differ by {d}");
    assert_eq!(sampled(&trajectories(&a)), sampled(&ta));
    let report = RunReport::load_or_new(&a, "x", "tiny").expect("report");
    assert_eq!(
        report
            .train
            .steps
            .iter()
            .map(|s| s.step)
            .collect::<Vec<_>>(),
        [0, 1, 2, 3, 4, 5]
    );
}

/// A GET of `path` on `addr`, the body.
fn http_get(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    out
}

/// The value of the series `name` (exact name with labels) in a Prometheus text body.
fn series(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Polls the daemon until `done(status)` (at most 120 s).
fn wait_for(dir: &Path, what: &str, done: impl Fn(&envace::pipeline::control::RunStatus) -> bool) {
    let start = Instant::now();
    loop {
        if let Ok(reply) = request(dir, &CtlRequest::Status) {
            if reply.status.as_ref().is_some_and(&done) {
                return;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sigterm_checkpoints_and_exits_0_while_metrics_judge_swaps_and_added_tasks_apply_at_their_step() {
    let tmp = TempDir::new("sigterm");
    let config = config_file(&tmp.0);
    let out = tmp.0.join("run");
    // A free loopback port for the endpoint.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let child = spawn(&config, &out, &["--metrics-addr", &addr], &[]);
    wait_for(&out, "a first checkpoint", |s| s.committed_steps >= 2);

    // The socket is private to the user.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(out.join("ctl.sock"))
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    let first = http_get(&addr, "/metrics");
    for name in [
        "train_steps",
        "train_policy_version",
        "train_zero_variance_fraction",
        "checkpoint_bytes",
        "checkpoint_age_seconds",
        "run_disk_bytes",
        "train_real_env_calls",
    ] {
        let v = series(&first, name);
        assert!(v.is_some_and(f64::is_finite), "{name}: {v:?} in\n{first}");
    }
    assert!(series(&first, "checkpoint_bytes").expect("bytes") > 1e6);
    assert!(first.contains("train_adv_std{role=\"act\"}"), "{first}");
    assert!(
        first.contains("actor_tokens_per_second{actor=\"policy\"}"),
        "{first}"
    );
    assert_eq!(series(&first, "train_real_env_calls"), Some(0.0));
    let steps_then = series(&first, "train_steps").expect("train_steps");

    // An unknown judge is refused and changes nothing.
    let refused = request(
        &out,
        &CtlRequest::Judge {
            name: "nope".into(),
        },
    )
    .expect("reply");
    assert!(
        !refused.ok && refused.message.contains("registered judges"),
        "{refused:?}"
    );
    // The swap: answer_length (rewards > 0 on text) → rule_checklist (0 without the
    // expected calls), from the step ctl names.
    let swap = request(
        &out,
        &CtlRequest::Judge {
            name: "rule_checklist".into(),
        },
    )
    .expect("reply");
    assert!(swap.ok, "{swap:?}");
    let history = ControlHistory::load(&out).expect("history");
    let from = history.judges[0].step;
    assert_eq!(history.judges[0].judge, "rule_checklist");
    assert!(
        swap.message.contains(&format!("from step {from}")),
        "{swap:?}"
    );

    // Two train tasks under new ids, one with a seed.
    use envace::suite::TaskSuite;
    let suite = envace::bfcl::episode::BfclSuite::load_base().expect("suite");
    let mut env = (suite.environment())();
    let added: Vec<String> = suite
        .train
        .iter()
        .take(2)
        .enumerate()
        .map(|(i, t)| {
            let mut task = t.clone();
            task.id = envace::storage::TaskId(format!("added_{i}"));
            if i == 0 {
                // With its seed: the ground truth replayed in the real environment.
                let mut seed = suite.collect_seed(t, env.as_mut()).expect("seed").seed;
                seed.task = task.id.clone();
                serde_json::json!({"task": task, "seed": seed}).to_string()
            } else {
                serde_json::json!({"task": task}).to_string()
            }
        })
        .collect();
    let file = tmp.0.join("new.jsonl");
    std::fs::write(&file, added.join("\n")).expect("tasks");
    let reply = request(&out, &CtlRequest::AddTasks { file: file.clone() }).expect("reply");
    assert!(reply.ok, "{reply:?}");
    assert!(
        reply.message.contains("2 task(s) (1 with a seed)"),
        "{reply:?}"
    );
    let again = request(&out, &CtlRequest::AddTasks { file }).expect("reply");
    assert!(!again.ok && again.message.contains("is taken"), "{again:?}");
    let tasks_from = ControlHistory::load(&out).expect("history").task_batches[0].step;

    wait_for(&out, "the changes to apply", |s| {
        s.steps_done > from.max(tasks_from) + 1
    });
    let later = http_get(&addr, "/metrics");
    assert!(
        series(&later, "train_steps").expect("train_steps") > steps_then,
        "the step counter moves"
    );
    assert_eq!(series(&later, "judge_swaps"), Some(1.0));

    // SIGTERM: the step in flight finishes, a checkpoint, exit 0.
    let pid = child.id() as i32;
    // SAFETY: kill(2) on our child's pid.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    let (status, err) = finish(child);
    assert!(status.success(), "{status:?}\n{err}");
    assert!(
        err.contains("SIGTERM: finishing the step in flight"),
        "{err}"
    );
    assert!(!out.join("ctl.sock").exists(), "the socket is removed");
    let (state, records) = state(&out);
    let last = records.iter().map(|c| c.step).max().expect("a checkpoint");
    assert_eq!(last, state.step, "a checkpoint of the last step done");
    let report = RunReport::load_or_new(&out, "x", "tiny").expect("report");
    assert_eq!(report.train.steps.len() as u64, state.step);
    assert_eq!(report.train.judges.len(), 1);
    assert_eq!(
        (
            report.train.judges[0].step,
            report.train.judges[0].judge.as_str()
        ),
        (from, "rule_checklist")
    );

    // The swap took effect at exactly its step, the new tasks were drawn at theirs.
    let ts = trajectories(&out);
    let reward_before: f32 = ts.iter().filter(|t| t.step < from).map(|t| t.reward).sum();
    assert!(reward_before > 0.0, "answer_length rewards text");
    assert!(
        ts.iter()
            .filter(|t| t.step >= from)
            .all(|t| t.reward == 0.0),
        "rule_checklist from step {from}"
    );
    let store = Store::open(out.join("db"), StoreOptions::default()).expect("store");
    let seeds: Vec<envace::storage::SeedTrajectory> = store
        .scan::<envace::storage::SeedTrajectory>(&Prefix::all())
        .map(|r| r.expect("seed").1)
        .collect();
    assert_eq!(seeds.iter().filter(|s| s.task.0 == "added_0").count(), 1);
    drop(store);
    let drawn_at = |id: &str| ts.iter().filter(|t| t.task.0 == id).map(|t| t.step).min();
    assert_eq!(drawn_at("added_0"), Some(tasks_from));
    assert!(ts
        .iter()
        .filter(|t| t.step < tasks_from)
        .all(|t| !t.task.0.starts_with("added_")));
}

#[test]
fn an_actor_past_its_restart_limit_stops_the_daemon_with_the_steps_checkpointed() {
    let tmp = TempDir::new("gave-up");
    let config = write_config(&tmp.0, |c| {
        c.judge = envace::config::JudgeName("crash_later".into());
        c.topology.max_restarts = 2;
        c.topology.restart_backoff_ms = 10;
        // No checkpoint of its own before the failure: the failure path writes it.
        c.daemon.checkpoint_every_steps = 100;
    });
    let out = tmp.0.join("run");
    let (status, err) = run(&config, &out, &[], &[]);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("actor judge failed 3 times (restart limit topology.max_restarts reached"),
        "{err}"
    );
    assert!(err.contains("the judge broke"), "{err}");
    let (state, records) = state(&out);
    assert!(
        state.step >= 1,
        "the judge answered 16 calls: a step was played"
    );
    assert_eq!(records.iter().map(|c| c.step).max(), Some(state.step));
    let report = RunReport::load_or_new(&out, "x", "tiny").expect("report");
    assert_eq!(report.train.steps.len() as u64, state.step);
    assert_eq!(
        trajectories(&out).iter().map(|t| t.step).max(),
        Some(state.step - 1),
        "the steps played are committed, the failed one is not"
    );
}
