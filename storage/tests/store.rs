//! The store's whole paths: round trips of every record type across a reopen, scan order,
//! damage isolation, schema versions, missing and locked databases, atomic multi-tree commits.
mod common;

use std::collections::BTreeMap;

use common::{small, trajectory, TempDir};
use envace_storage::{
    Checkpoint, CheckpointKey, Error, ExecutionMode, FlushPolicy, Message, MessageRole,
    PolicyVersion, Prefix, RecordKey, RehearsalMemory, RehearsalMode, Role, Row, RunId, RunState,
    SampleKey, SeedKey, SeedTrajectory, Store, StoreOptions, Task, TaskId, Termination, Timings,
    ToolExchange, Trajectory, TreeName, WriteSet, HEADER_LEN, SCHEMA_VERSION, SEGMENT_SIZE,
};

fn open(dir: &TempDir) -> Store {
    Store::open(dir.path(), StoreOptions::default()).unwrap()
}

fn key(run: &str, step: u64, task: &str, sample: u32) -> SampleKey {
    SampleKey {
        run: run.into(),
        step,
        task: task.into(),
        sample,
    }
}

#[test]
fn every_record_type_round_trips_through_a_reopen() {
    let dir = TempDir::new("roundtrip");
    let task = Task {
        id: "multi_turn_base_0".into(),
        category: "multi_turn_base".into(),
        split: "train".into(),
        payload_json: r#"{"question": [[{"role": "user", "content": "cd into tmp"}]]}"#.into(),
    };
    let seed = SeedTrajectory {
        task: task.id.clone(),
        index: 0,
        messages: vec![Message {
            role: MessageRole::Tool,
            content: r#"{"current_working_directory": "tmp"}"#.into(),
            tool_name: Some("cd".into()),
            row: None,
        }],
        tool_calls: vec![ToolExchange {
            name: "cd".into(),
            arguments_json: r#"{"folder": "tmp"}"#.into(),
            result_json: r#"{"current_working_directory": "tmp"}"#.into(),
        }],
    };
    let rich = trajectory("r", 7, "multi_turn_base_0", 2, 4, 33, 9);
    let empty = Trajectory {
        run: "r".into(),
        step: 7,
        task: "".into(),
        sample: 0,
        mode: ExecutionMode::Real,
        rows: vec![Row {
            role: Role::Act,
            prompt_ids: vec![],
            completion_ids: vec![],
            logprobs: vec![],
            policy_version: PolicyVersion(0),
        }],
        messages: vec![],
        reward: -0.1,
        verdicts: vec![],
        termination: Termination::ActParseError,
        timings: Timings::default(),
    };
    // 64k-token row: ids across the whole u32 range (varint widths 1, 3, 5 bytes) and
    // log-probs at the edges of f32.
    let big_prompt: Vec<u32> = (0..65_536u32)
        .map(|i| match i % 4 {
            0 => i % 251,
            1 => 49_151 - i % 1000,
            2 => u32::MAX - i,
            _ => i,
        })
        .collect();
    let big_logprobs: Vec<f32> = (0..65_536)
        .map(|i| match i % 3 {
            0 => f32::NEG_INFINITY,
            1 => -f32::MIN_POSITIVE,
            _ => -(i as f32) / 65_536.0,
        })
        .collect();
    let mut large = trajectory("r", 7, "big", 0, 0, 0, 0);
    large.rows = vec![Row {
        role: Role::Rehearse,
        prompt_ids: big_prompt.clone(),
        completion_ids: big_prompt.clone(),
        logprobs: big_logprobs,
        policy_version: PolicyVersion(u64::MAX),
    }];
    let memory = RehearsalMemory {
        run: "eval".into(),
        step: 470,
        task: task.id.clone(),
        sample: 0,
        mode: RehearsalMode::Sequential,
        n: 2,
        rehearsals: vec![rich.messages.clone(), vec![]],
        critiques: vec!["The cd call used the wrong folder.".into(), String::new()],
        summary: "Call cd with folder `tmp` before ls.".into(),
        policy_version: PolicyVersion(470),
    };
    let state = RunState {
        run: "r".into(),
        step: 7,
        data_cursor: 112,
        rng_state: (0..32).collect(),
        config_hash: "9f86d081884c7d65".into(),
    };
    let checkpoint = Checkpoint {
        run: "r".into(),
        step: 7,
        path: "/ckpt/r/step-7.safetensors".into(),
        metrics: BTreeMap::from([
            ("reward_mean".to_owned(), 0.4375),
            ("loss".to_owned(), -0.01),
        ]),
    };

    {
        let store = open(&dir);
        store.put(&task).unwrap();
        store.put(&seed).unwrap();
        let keys = store
            .put_many(&[rich.clone(), empty.clone(), large.clone()])
            .unwrap();
        assert_eq!(keys[2].to_string(), "r/7/big/0");
        store.put(&memory).unwrap();
        store.put(&state).unwrap();
        store.put(&checkpoint).unwrap();
    }

    let store = Store::open_existing(dir.path(), StoreOptions::default()).unwrap();
    assert_eq!(store.get::<Task>(&task.id).unwrap().unwrap(), task);
    let seed_key = SeedKey {
        task: task.id.clone(),
        index: 0,
    };
    assert_eq!(
        store.get::<SeedTrajectory>(&seed_key).unwrap().unwrap(),
        seed
    );
    assert_eq!(
        store
            .get::<Trajectory>(&key("r", 7, "multi_turn_base_0", 2))
            .unwrap()
            .unwrap(),
        rich
    );
    assert_eq!(
        store
            .get::<Trajectory>(&key("r", 7, "", 0))
            .unwrap()
            .unwrap(),
        empty
    );
    let back = store
        .get::<Trajectory>(&key("r", 7, "big", 0))
        .unwrap()
        .unwrap();
    assert_eq!(back.rows[0].prompt_ids, big_prompt);
    assert_eq!(back.rows[0].completion_ids.len(), 65_536);
    assert_eq!(back.rows[0].logprobs[0], f32::NEG_INFINITY);
    assert_eq!(
        back.rows[0].logprobs[1].to_bits(),
        (-f32::MIN_POSITIVE).to_bits()
    );
    assert_eq!(back.rows[0].policy_version, PolicyVersion(u64::MAX));
    assert_eq!(back, large);
    assert_eq!(
        store
            .get::<RehearsalMemory>(&key("eval", 470, "multi_turn_base_0", 0))
            .unwrap()
            .unwrap(),
        memory
    );
    assert_eq!(store.get::<RunState>(&"r".into()).unwrap().unwrap(), state);
    let ck = CheckpointKey {
        run: "r".into(),
        step: 7,
    };
    assert_eq!(store.get::<Checkpoint>(&ck).unwrap().unwrap(), checkpoint);
    assert_eq!(
        store.get::<Trajectory>(&key("r", 8, "big", 0)).unwrap(),
        None
    );

    let counts: Vec<usize> = TreeName::ALL
        .iter()
        .map(|&t| store.len(t).unwrap())
        .collect();
    assert_eq!(counts, [1, 1, 3, 1, 1, 1]);
    let runs: Vec<String> = store.runs().unwrap().into_iter().map(|r| r.0).collect();
    assert_eq!(runs, ["eval", "r"]);
}

#[test]
fn scans_follow_run_step_task_sample_order() {
    let dir = TempDir::new("order");
    let store = open(&dir);
    // Written shuffled; steps 9 < 10 < 256 must sort numerically, tasks textually.
    let written = [
        ("b", 0, "x", 0),
        ("a", 256, "t1", 1),
        ("a", 10, "t2", 0),
        ("a", 9, "t1", 3),
        ("a", 10, "t1", 1),
        ("a", 10, "t1", 0),
        ("ab", 1, "t", 0),
    ];
    let records: Vec<Trajectory> = written
        .iter()
        .map(|&(r, s, t, i)| small(r, s, t, i))
        .collect();
    store.put_many(&records).unwrap();

    let text = |prefix: &Prefix<SampleKey>| -> Vec<String> {
        store
            .scan::<Trajectory>(prefix)
            .map(|item| {
                let (k, t) = item.unwrap();
                assert_eq!(
                    (t.run.0.as_str(), t.step, t.sample),
                    (k.run.0.as_str(), k.step, k.sample)
                );
                k.to_string()
            })
            .collect()
    };
    assert_eq!(
        text(&Prefix::all()),
        [
            "a/9/t1/3",
            "a/10/t1/0",
            "a/10/t1/1",
            "a/10/t2/0",
            "a/256/t1/1",
            "ab/1/t/0",
            "b/0/x/0"
        ]
    );
    assert_eq!(
        text(&SampleKey::run_prefix(&"a".into())),
        [
            "a/9/t1/3",
            "a/10/t1/0",
            "a/10/t1/1",
            "a/10/t2/0",
            "a/256/t1/1"
        ]
    );
    assert_eq!(
        text(&SampleKey::step_prefix(&"a".into(), 10)),
        ["a/10/t1/0", "a/10/t1/1", "a/10/t2/0"]
    );
    assert_eq!(
        text(&SampleKey::task_prefix(&"a".into(), 10, &"t1".into())),
        ["a/10/t1/0", "a/10/t1/1"]
    );
    let last = store
        .keys::<Trajectory>(&SampleKey::run_prefix(&"a".into()))
        .next_back()
        .unwrap()
        .unwrap();
    assert_eq!(last.step, 256);
    let runs: Vec<String> = store.runs().unwrap().into_iter().map(|r| r.0).collect();
    assert_eq!(runs, ["a", "ab", "b"]);
}

/// Overwrites the raw value under `key` in `tree`, the way a disk fault or a foreign writer
/// would, bypassing the store.
fn tamper(dir: &TempDir, tree: TreeName, key: &SampleKey, edit: impl FnOnce(&mut Vec<u8>)) {
    let db = sled::Config::new()
        .path(dir.path())
        .segment_size(SEGMENT_SIZE)
        .open()
        .unwrap();
    let t = db.open_tree(tree.as_str()).unwrap();
    let mut value = t.get(key.to_bytes()).unwrap().unwrap().to_vec();
    edit(&mut value);
    t.insert(key.to_bytes(), value).unwrap();
    db.flush().unwrap();
}

#[test]
fn damaged_records_fail_alone_and_scanning_continues() {
    let dir = TempDir::new("corrupt");
    let records: Vec<Trajectory> = (0..6).map(|i| small("r", 1, "t", i)).collect();
    {
        let store = open(&dir);
        store.put_many(&records).unwrap();
        store.put(&small("other", 0, "t", 0)).unwrap();
    }
    // 1: one flipped payload bit; 3: cut to 4 bytes; 4: written by schema version 2.
    tamper(&dir, TreeName::Rollouts, &key("r", 1, "t", 1), |v| {
        let mid = HEADER_LEN + (v.len() - HEADER_LEN) / 2;
        v[mid] ^= 0x01;
    });
    tamper(&dir, TreeName::Rollouts, &key("r", 1, "t", 3), |v| {
        v.truncate(4)
    });
    tamper(&dir, TreeName::Rollouts, &key("r", 1, "t", 4), |v| {
        v[4..6].copy_from_slice(&(SCHEMA_VERSION + 1).to_be_bytes());
    });

    let store = open(&dir);
    let results: Vec<Result<(SampleKey, Trajectory), Error>> = store
        .scan::<Trajectory>(&SampleKey::run_prefix(&"r".into()))
        .collect();
    assert_eq!(results.len(), 6);
    for i in [0, 2, 5] {
        let (k, t) = results[i].as_ref().unwrap();
        assert_eq!(k.sample, i as u32);
        assert_eq!(t, &records[i]);
    }
    let messages: Vec<String> = [1, 3, 4]
        .iter()
        .map(|&i| results[i].as_ref().unwrap_err().to_string())
        .collect();
    assert!(matches!(
        results[1],
        Err(Error::Corrupt {
            tree: TreeName::Rollouts,
            ..
        })
    ));
    assert!(
        messages[0]
            .starts_with("corrupt record in tree `rollouts` at key r/1/t/1: checksum mismatch"),
        "{}",
        messages[0]
    );
    assert_eq!(
        messages[1],
        "corrupt record in tree `rollouts` at key r/1/t/3: value is 4 bytes, shorter than the \
         10-byte header"
    );
    assert!(matches!(
        results[4],
        Err(Error::NewerSchema {
            found: 2,
            supported: 1,
            ..
        })
    ));
    assert_eq!(
        messages[2],
        "record in tree `rollouts` at key r/1/t/4 has schema version 2, newer than the version \
         1 this build reads; upgrade envace to read it"
    );
    // Point reads agree with the scan; the rest of the database is untouched.
    let err = store.get::<Trajectory>(&key("r", 1, "t", 1)).unwrap_err();
    assert_eq!(err.to_string(), messages[0]);
    assert_eq!(
        store
            .get::<Trajectory>(&key("r", 1, "t", 5))
            .unwrap()
            .unwrap(),
        records[5]
    );
    assert_eq!(
        store
            .get::<Trajectory>(&key("other", 0, "t", 0))
            .unwrap()
            .unwrap(),
        small("other", 0, "t", 0)
    );
    // Keys stay listable even where values are damaged.
    assert_eq!(store.keys::<Trajectory>(&Prefix::all()).count(), 7);
}

#[test]
fn a_second_open_reports_the_lock() {
    let dir = TempDir::new("locked");
    let _held = open(&dir);
    let err = Store::open(dir.path(), StoreOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Locked { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "database at {} is locked by another process (sled admits one process at a time: \
             stop the process that holds it, e.g. a running trainer, and retry)",
            dir.path().display()
        )
    );
}

#[test]
fn missing_database_is_a_clear_error_and_is_not_created() {
    let dir = TempDir::new("missing");
    let err = Store::open_existing(dir.path(), StoreOptions::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "no envace database at {}: no such directory",
            dir.path().display()
        )
    );
    assert!(!dir.path().exists());
    std::fs::create_dir_all(dir.path()).unwrap();
    let err = Store::open_existing(dir.path(), StoreOptions::default()).unwrap_err();
    assert!(
        err.to_string()
            .ends_with("the directory holds no sled database (no `db` file)"),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn a_write_set_commits_across_trees_and_removes() {
    let dir = TempDir::new("commit");
    let store = open(&dir);
    let mut writes = WriteSet::new();
    for i in 0..4 {
        writes.put(&small("run", 5, "t", i)).unwrap();
    }
    writes
        .put(&RunState {
            run: "run".into(),
            step: 5,
            data_cursor: 4,
            rng_state: vec![1, 2, 3],
            config_hash: "abc".into(),
        })
        .unwrap();
    writes.remove::<Trajectory>(&key("run", 5, "t", 9));
    assert_eq!(writes.len(), 6);
    store.commit(writes).unwrap();
    assert_eq!(store.len(TreeName::Rollouts).unwrap(), 4);
    assert_eq!(
        store
            .get::<RunState>(&"run".into())
            .unwrap()
            .unwrap()
            .data_cursor,
        4
    );

    let mut writes = WriteSet::new();
    writes.remove::<Trajectory>(&key("run", 5, "t", 0));
    store.commit(writes).unwrap();
    assert!(!store
        .contains::<Trajectory>(&key("run", 5, "t", 0))
        .unwrap());
    assert!(store
        .contains::<Trajectory>(&key("run", 5, "t", 1))
        .unwrap());
    // put replaces.
    let mut t = small("run", 5, "t", 1);
    t.reward = 0.75;
    store.put(&t).unwrap();
    assert_eq!(
        store
            .get::<Trajectory>(&key("run", 5, "t", 1))
            .unwrap()
            .unwrap()
            .reward,
        0.75
    );
    assert_eq!(store.len(TreeName::Rollouts).unwrap(), 3);
}

#[test]
fn interval_policy_reads_back_after_flush_and_reopen() {
    let dir = TempDir::new("interval");
    let options = StoreOptions {
        flush: FlushPolicy::IntervalMs(50),
        ..StoreOptions::default()
    };
    {
        let store = Store::open(dir.path(), options.clone()).unwrap();
        let records: Vec<Trajectory> = (0..10).map(|i| small("r", 0, "t", i)).collect();
        store.put_many(&records).unwrap();
        store.flush().unwrap();
    }
    let store = Store::open(dir.path(), options).unwrap();
    assert_eq!(
        store
            .scan::<Trajectory>(&Prefix::all())
            .filter(Result::is_ok)
            .count(),
        10
    );
    assert!(store.size_on_disk().unwrap() > 0);
}

#[test]
fn checkpoints_and_seeds_scan_by_their_prefixes() {
    let dir = TempDir::new("prefixes");
    let store = open(&dir);
    for (run, step) in [("a", 100), ("a", 20), ("b", 5)] {
        store
            .put(&Checkpoint {
                run: RunId(run.into()),
                step,
                path: format!("/c/{run}/{step}").into(),
                metrics: BTreeMap::new(),
            })
            .unwrap();
    }
    let steps: Vec<u64> = store
        .scan::<Checkpoint>(&CheckpointKey::run_prefix(&"a".into()))
        .map(|c| c.unwrap().1.step)
        .collect();
    assert_eq!(steps, [20, 100]);
    for index in [1, 0] {
        store
            .put(&SeedTrajectory {
                task: TaskId("t".into()),
                index,
                messages: vec![],
                tool_calls: vec![],
            })
            .unwrap();
    }
    let seeds: Vec<String> = store
        .keys::<SeedTrajectory>(&SeedKey::task_prefix(&"t".into()))
        .map(|k| k.unwrap().to_string())
        .collect();
    assert_eq!(seeds, ["t/0", "t/1"]);
}
