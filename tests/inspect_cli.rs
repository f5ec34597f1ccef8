//! `envace inspect` and `envace export` against a database written through the storage crate:
//! their output; exit code 1 with a clear message for a missing, locked or damaged database; a
//! damaged blob file reported once, never a hang; directories that are not databases refused
//! and left as they were.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use envace_storage::{
    Checkpoint, ExecutionMode, Message, MessageRole, PolicyVersion, RecordKey, Role, Row, RunState,
    SampleKey, Store, StoreOptions, Task, Termination, Timings, Trajectory, TurnVerdict,
    SEGMENT_SIZE,
};

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!("envace-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `envace ARGS[0] --db DB ARGS[1..]`; fails the test if it runs for more than a minute
/// (a scan that loops on a damaged node would otherwise hang the test run).
fn envace(args: &[&str], db: &Path) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_envace"))
        .args(&args[..1])
        .arg("--db")
        .arg(db)
        .args(&args[1..])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Drain the pipes on threads so a chatty child cannot block on a full pipe.
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut b = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut b).unwrap();
        b
    });
    let err = std::thread::spawn(move || {
        let mut b = Vec::new();
        std::io::Read::read_to_end(&mut stderr, &mut b).unwrap();
        b
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(60) {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("envace {args:?} ran for over a minute");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Two user turns: a rehearsed tool call and an answer, then a second question and answer.
fn trajectory(step: u64, task: &str, sample: u32) -> Trajectory {
    let row = |role, prompt: u32, logprob: f32| Row {
        role,
        prompt_ids: (0..prompt).collect(),
        completion_ids: vec![7, 8, 9, 10],
        logprobs: vec![logprob; 4],
        policy_version: PolicyVersion(step),
    };
    let msg = |role, content: &str, tool: Option<&str>, row: Option<u32>| Message {
        role,
        content: content.to_owned(),
        tool_name: tool.map(str::to_owned),
        row,
    };
    Trajectory {
        run: "demo".into(),
        step,
        task: task.into(),
        sample,
        mode: ExecutionMode::Rehearsal,
        rows: vec![
            row(Role::Act, 20, -0.5),
            row(Role::Rehearse, 30, -0.25),
            row(Role::Act, 40, -1.0),
            row(Role::Act, 50, -0.125),
        ],
        messages: vec![
            msg(MessageRole::User, "List the files.", None, None),
            msg(
                MessageRole::Assistant,
                "<tool_call>\n{\"name\": \"ls\", \"arguments\": {}}\n</tool_call>",
                None,
                Some(0),
            ),
            msg(
                MessageRole::Tool,
                "{\"files\": [\"a.txt\"]}",
                Some("ls"),
                Some(1),
            ),
            msg(
                MessageRole::Assistant,
                "There is a.txt.\u{1b}[2J",
                None,
                Some(2),
            ),
            msg(MessageRole::User, "And its size?", None, None),
            msg(MessageRole::Assistant, "I cannot tell.", None, Some(3)),
        ],
        reward: 0.5,
        verdicts: vec![
            TurnVerdict {
                user_turn: 0,
                score: 1.0,
                passed: true,
                reason: "named the file".into(),
            },
            TurnVerdict {
                user_turn: 1,
                score: 0.0,
                passed: false,
                reason: "no size given".into(),
            },
        ],
        termination: Termination::Completed,
        timings: Timings {
            total_s: 2.5,
            ..Timings::default()
        },
    }
}

fn fill(db: &Path) -> Vec<Trajectory> {
    let store = Store::open(db, StoreOptions::default()).unwrap();
    let all: Vec<Trajectory> = (0..3)
        .flat_map(|step| {
            ["t0", "t1"]
                .into_iter()
                .flat_map(move |task| (0..2).map(move |s| trajectory(step, task, s)))
        })
        .collect();
    store.put_many(&all).unwrap();
    store
        .put(&RunState {
            run: "demo".into(),
            step: 2,
            data_cursor: 6,
            rng_state: vec![1; 32],
            config_hash: "0123456789abcdef0123".into(),
        })
        .unwrap();
    store
        .put(&Checkpoint {
            run: "demo".into(),
            step: 1,
            path: "/ckpt/demo-1".into(),
            metrics: [("reward_mean".to_owned(), 0.5)].into(),
        })
        .unwrap();
    store
        .put(&Task {
            id: "t0".into(),
            category: "multi_turn_base".into(),
            split: "train".into(),
            payload_json: "{}".into(),
        })
        .unwrap();
    drop(store);
    wait_closed(db);
    all
}

#[test]
fn inspect_summarises_runs_and_counts() {
    let dir = TempDir::new("summary");
    fill(&dir.0);
    let out = envace(&["inspect"], &dir.0);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let line = |first: &str| -> Vec<String> {
        stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(first))
            .unwrap_or_else(|| panic!("no `{first}` line in\n{stdout}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(line("tasks"), ["tasks", "1"]);
    assert_eq!(line("rollouts"), ["rollouts", "12"]);
    assert_eq!(line("runs"), ["runs", "1"]);
    assert_eq!(line("checkpoints"), ["checkpoints", "1"]);
    // run, step, data cursor, config (12 chars), rollouts, last rollout step, memories,
    // checkpoints, last checkpoint
    assert_eq!(
        line("demo"),
        ["demo", "2", "6", "0123456789ab", "12", "2", "0", "1", "1"]
    );
}

#[test]
fn inspect_trajectory_shows_roles_reward_and_verdicts() {
    let dir = TempDir::new("trajectory");
    fill(&dir.0);
    let out = envace(&["inspect", "trajectory", "demo/1/t1/0"], &dir.0);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let expected_lines = [
        "trajectory demo/1/t1/0",
        "  mode rehearsal | reward 0.500 | termination completed | 4 rows (act 3, rehearse 1) | \
         tokens 140 prompt + 16 completion",
        "[0] user (turn 0)",
        "[1] assistant  <act row 0, policy v1, 4 tokens, mean logprob -0.500>",
        "[2] tool ls  <rehearse row 1, policy v1, 4 tokens, mean logprob -0.250>",
        "    {\"files\": [\"a.txt\"]}",
        // The terminal escape from the model's text is shown, not executed.
        "    There is a.txt.\\u{1b}[2J",
        "  => verdict turn 0: score 1.000, passed: named the file",
        "[4] user (turn 1)",
        "  => verdict turn 1: score 0.000, FAILED: no size given",
    ];
    let lines: Vec<&str> = stdout.lines().collect();
    let mut next = 0;
    for want in expected_lines {
        let at = lines[next..]
            .iter()
            .position(|l| *l == want)
            .unwrap_or_else(|| panic!("missing or out of order: `{want}` in\n{stdout}"));
        next += at + 1;
    }
    let out = envace(&["inspect", "trajectory", "demo/9/t1/0"], &dir.0);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("no trajectory demo/9/t1/0 in"));
    let out = envace(&["inspect", "trajectory", "demo/t1/0"], &dir.0);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("RUN/STEP/TASK/SAMPLE"));
}

#[test]
fn export_writes_one_json_object_per_record() {
    let dir = TempDir::new("export");
    let written = fill(&dir.0);
    let out = envace(
        &["export", "--what", "trajectories", "--format", "jsonl"],
        &dir.0,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 12);
    assert_eq!(lines[0]["id"], "demo/0/t0/0");
    assert_eq!(lines[11]["id"], "demo/2/t1/1");
    assert_eq!(lines[5]["rows"][1]["role"], "rehearse");
    assert_eq!(
        lines[5]["rows"][1]["prompt_ids"].as_array().unwrap().len(),
        30
    );
    assert_eq!(lines[5]["verdicts"][1]["passed"], false);
    assert_eq!(lines[5]["termination"], "completed");
    let back: Trajectory = {
        let mut v = lines[5].clone();
        v.as_object_mut().unwrap().remove("id");
        serde_json::from_value(v).unwrap()
    };
    assert_eq!(back, written[5]);

    let out = envace(&["export", "--what", "runs"], &dir.0);
    let runs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(runs["id"], "demo");
    assert_eq!(runs["data_cursor"], 6);
    let out = envace(&["export", "--what", "memories"], &dir.0);
    assert!(out.status.success());
    assert!(out.stdout.is_empty());
}

#[test]
fn missing_locked_and_damaged_databases_exit_1_with_a_clear_message() {
    let dir = TempDir::new("errors");
    let out = envace(&["inspect"], &dir.0);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains(&format!("no envace database at {}", dir.0.display())),
        "{}",
        text(&out.stderr)
    );

    fill(&dir.0);
    {
        let _held = Store::open(&dir.0, StoreOptions::default()).unwrap();
        let out = envace(&["export", "--what", "seeds"], &dir.0);
        assert_eq!(out.status.code(), Some(1));
        assert!(
            text(&out.stderr).contains("is locked by another process"),
            "{}",
            text(&out.stderr)
        );
    }

    // Damage one value the way a disk fault would; the rest still exports.
    let key = SampleKey {
        run: "demo".into(),
        step: 1,
        task: "t0".into(),
        sample: 1,
    };
    {
        let db = sled::Config::new()
            .path(&dir.0)
            .segment_size(SEGMENT_SIZE)
            .open()
            .unwrap();
        let tree = db.open_tree("rollouts").unwrap();
        let mut value = tree.get(key.to_bytes()).unwrap().unwrap().to_vec();
        let last = value.len() - 1;
        value[last] ^= 0xFF;
        tree.insert(key.to_bytes(), value).unwrap();
        db.flush().unwrap();
    }
    let out = envace(&["export", "--what", "trajectories"], &dir.0);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stdout).lines().count(), 11);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("corrupt record in tree `rollouts` at key demo/1/t0/1: checksum mismatch"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "1 read error(s) (warnings above: a damaged record, or a part of the \
             database that could not be read); the 11 readable records were exported"
        ),
        "{stderr}"
    );
    let out = envace(&["inspect", "trajectory", "demo/1/t0/1"], &dir.0);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("corrupt record in tree `rollouts`"));
    let out = envace(&["inspect"], &dir.0);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// Every file under `dir` with its bytes: to show a command changed nothing.
/// Waits until sled's background threads let go of the database: dropping the last `Store`
/// does not close it at once (they finish its last snapshot a moment later), and damaging
/// files meanwhile races with that write.
fn wait_closed(dir: &Path) {
    let db = std::fs::File::open(dir.join("db")).unwrap();
    let start = Instant::now();
    while db.try_lock().is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "sled never let go of {}",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    db.unlock().unwrap();
}

fn contents(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.insert(path.clone(), Vec::new());
            out.extend(contents(&path));
        } else {
            out.insert(path.clone(), std::fs::read(&path).unwrap());
        }
    }
    out
}

#[test]
fn a_damaged_blob_file_is_reported_once_and_the_rest_exported() {
    let dir = TempDir::new("blob");
    // Small segments (256 KiB: messages over 64 KiB go to blob files) keep this fast; the store
    // keeps the segment size the database's `conf` records.
    drop(
        sled::Config::new()
            .path(&dir.0)
            .segment_size(1 << 18)
            .open()
            .unwrap(),
    );
    let mut big = trajectory(0, "big", 0);
    big.rows[0].prompt_ids = (0..30_000).collect(); // ~90 KB: a blob file
    let small: Vec<Trajectory> = (0..2000)
        .map(|i| {
            let mut t = trajectory(1 + i / 100, "t", (i % 100) as u32);
            t.messages.clear();
            t
        })
        .collect();
    {
        let store = Store::open(&dir.0, StoreOptions::default()).unwrap();
        store.put(&big).unwrap();
        for chunk in small.chunks(100) {
            store.put_many(chunk).unwrap();
        }
    }
    // Reopen once so that sled's snapshot lies past the blob's log segment (recovery does not
    // read it again), then damage every blob file as the reviewer did: 16 bytes overwritten.
    wait_closed(&dir.0);
    drop(Store::open(&dir.0, StoreOptions::default()).unwrap());
    wait_closed(&dir.0);
    let blobs: Vec<PathBuf> = std::fs::read_dir(dir.0.join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(!blobs.is_empty());
    for file in &blobs {
        let mut bytes = std::fs::read(file).unwrap();
        for b in &mut bytes[100..116] {
            *b ^= 0xFF;
        }
        std::fs::write(file, bytes).unwrap();
    }

    let before = contents(&dir.0);
    let out = envace(&["export", "--what", "trajectories"], &dir.0);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(contents(&dir.0) == before, "export changed the database");
    let exported = text(&out.stdout).lines().count();
    let stderr = text(&out.stderr);
    // Which blob files sled's recovery reads depends on when its background threads rewrote
    // the big record's leaf (a later rewrite is a later blob file, in the replayed segments).
    // Such a database is refused before sled opens it, or sled's own recovery check stops
    // the open; either way nothing is exported, the error says why, and nothing changed.
    if exported == 0 {
        assert!(
            stderr.contains("fails its checksum, and sled's recovery reads it")
                || stderr.contains("cannot open database"),
            "{stderr}"
        );
        return;
    }
    // The damaged leaf node (the big record and its neighbours) is skipped; the rest exported.
    assert!(
        (2001 - 20..2001).contains(&exported),
        "{exported} of 2001 exported: {stderr}"
    );
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("warning: "))
        .collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(
        warnings[0].starts_with("warning: cannot read tree `rollouts` "),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "1 read error(s) (warnings above: a damaged record, or a part of the database that \
             could not be read); the {exported} readable records were exported"
        )),
        "{stderr}"
    );

    let out = envace(&["inspect"], &dir.0);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let rollouts = stdout
        .lines()
        .find(|l| l.starts_with("rollouts "))
        .map(|l| l.split_whitespace().collect::<Vec<_>>());
    assert_eq!(
        rollouts,
        Some(vec!["rollouts", &format!("{exported}*")]),
        "{stdout}"
    );
    assert!(stdout.contains("* readable records only"), "{stdout}");
    // One warning of ours (sled may log its own lines about the checksum too).
    let stderr = text(&out.stderr);
    assert_eq!(
        stderr
            .lines()
            .filter(|l| l.starts_with("warning: "))
            .count(),
        1,
        "{stderr}"
    );

    let out = envace(&["inspect", "trajectories", "--limit", "0"], &dir.0);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).lines().count(), exported + 1);
}

#[test]
fn directories_that_are_not_databases_are_refused_untouched() {
    let random: Vec<u8> = (0..100_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    for (name, db, reason) in [
        (
            "random",
            random.as_slice(),
            "holds no valid sled log segment header",
        ),
        ("empty", &[][..], "`db` is empty (0 bytes)"),
    ] {
        let dir = TempDir::new(name);
        fill(&dir.0);
        std::fs::write(dir.0.join("db"), db).unwrap();
        for f in std::fs::read_dir(&dir.0).unwrap() {
            let path = f.unwrap().path();
            if path
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("snap.")
            {
                std::fs::remove_file(path).unwrap();
            }
        }
        let before = contents(&dir.0);
        for args in [&["inspect"][..], &["export", "--what", "trajectories"]] {
            let out = envace(args, &dir.0);
            assert_eq!(out.status.code(), Some(1), "{name} {args:?}");
            let stderr = text(&out.stderr);
            assert!(
                stderr.contains(&format!(
                    "{} does not hold a valid envace database: ",
                    dir.0.display()
                )) && stderr.contains(reason)
                    && stderr.contains("nothing was changed there"),
                "{name} {args:?}: {stderr}"
            );
            assert!(out.stdout.is_empty());
            assert!(
                contents(&dir.0) == before,
                "{name} {args:?} changed the directory"
            );
        }
    }
}

/// The `rollouts N` count of an `inspect` summary.
fn rollouts_shown(stdout: &str) -> Option<usize> {
    stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some("rollouts"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
}

#[test]
fn a_flipped_byte_in_the_log_never_changes_the_database_and_is_reported() {
    // Flips at several offsets of the used log, in a cleanly closed database and in one
    // without sled's snapshot (as a SIGKILLed run leaves it).
    let cases = [
        (0.15, false),
        (0.45, false),
        (0.8, false),
        (0.3, true),
        (0.7, true),
    ];
    for (i, (fraction, drop_snapshots)) in cases.into_iter().enumerate() {
        let dir = TempDir::new(&format!("flip{i}"));
        let written = fill(&dir.0).len();
        if drop_snapshots {
            for f in std::fs::read_dir(&dir.0).unwrap() {
                let path = f.unwrap().path();
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                if name.starts_with("snap.") {
                    std::fs::remove_file(path).unwrap();
                }
            }
        }
        let db = dir.0.join("db");
        let mut bytes = std::fs::read(&db).unwrap();
        let used = bytes.iter().rposition(|&b| b != 0).expect("a written log");
        let at = (used as f64 * fraction) as usize;
        bytes[at] ^= 0x5A;
        std::fs::write(&db, &bytes).unwrap();
        let before = contents(&dir.0);
        let out = envace(&["inspect"], &dir.0);
        assert!(
            contents(&dir.0) == before,
            "inspect changed the database (flip at byte {at})"
        );
        let stderr = text(&out.stderr);
        if out.status.success() {
            assert!(stderr.contains("reading a private copy of"), "{stderr}");
            let shown = rollouts_shown(&text(&out.stdout)).expect("a rollouts line");
            assert!(
                shown == written || stderr.contains("damaged") || stderr.contains("corrupt"),
                "flip at byte {at}: {shown} of {written} rollouts shown without a word: {stderr}"
            );
        }
        // `repair` rebuilds every record from the journal and keeps the damaged files.
        let out = envace(&["repair"], &dir.0);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "repair: {}", text(&out.stderr));
        assert!(
            stdout.contains("lost: nothing"),
            "flip at byte {at}: {stdout}"
        );
        let mut kept = dir.0.clone().into_os_string();
        kept.push(".damaged");
        let kept = PathBuf::from(kept);
        let relative =
            |root: &Path, files: &BTreeMap<PathBuf, Vec<u8>>| -> BTreeMap<PathBuf, Vec<u8>> {
                files
                    .iter()
                    .map(|(p, b)| (p.strip_prefix(root).unwrap().to_path_buf(), b.clone()))
                    .collect()
            };
        assert!(
            relative(&kept, &contents(&kept)) == relative(&dir.0, &before),
            "flip at byte {at}: the damaged files are kept as they were"
        );
        std::fs::remove_dir_all(&kept).unwrap();
        let out = envace(&["inspect"], &dir.0);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(
            !text(&out.stderr).contains("damaged"),
            "{}",
            text(&out.stderr)
        );
        assert_eq!(
            rollouts_shown(&text(&out.stdout)),
            Some(written),
            "flip at byte {at}"
        );
    }
}
