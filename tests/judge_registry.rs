//! A judge registered by a user's crate trains a run chosen by name (`judge = "…"`), and a name
//! nobody registered is refused before the run folder is touched. One test per process: the
//! registry is process-wide.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use envace::actors::{Judge, JudgeTask, TurnCalls, Verdict};
use envace::bfcl::judge::RuleChecklistJudge;
use envace::config::{JudgeName, Preset, RunConfig};
use envace::pipeline::{Pipeline, TRAIN_RUN};
use envace::registry::{self, Registry};
use envace::storage::{RunId, SampleKey, Store, StoreOptions, Trajectory};

static CALLS: AtomicUsize = AtomicUsize::new(0);

/// The rule checklist's scores, with its own reason on every turn, counting its calls.
struct CountingJudge;

impl Judge for CountingJudge {
    fn judge(&self, task: &JudgeTask, transcript: &[TurnCalls]) -> Verdict {
        CALLS.fetch_add(1, Ordering::SeqCst);
        let mut verdict = RuleChecklistJudge.judge(task, transcript);
        for s in &mut verdict.turn_scores {
            s.reason = "counting judge".into();
        }
        verdict
    }
}

#[test]
fn a_registered_judge_trains_the_run_that_names_it() {
    let mut r = Registry::builtin();
    r.register_judge("counting", |_| Arc::new(CountingJudge));
    registry::install(r).expect("the first registry of this process");

    let dir = std::env::temp_dir().join(format!("envace-registry-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut cfg = RunConfig::preset(Preset::Tiny);
    cfg.train.steps = 1;
    cfg.train.eval_every = None;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        // An unknown name is refused before the folder is created.
        let mut unknown = cfg.clone();
        unknown.judge = JudgeName("lenient".into());
        let e = Pipeline::open(unknown.clone(), &dir, "tiny")
            .await
            .err()
            .expect("an unknown judge is refused");
        assert!(
            e.to_string().contains(
                "registered judges: bfcl_checker, counting, dense_checklist, rule_checklist"
            ),
            "{e}"
        );
        assert!(unknown.validate().is_err());
        assert!(!dir.exists());

        cfg.judge = JudgeName("counting".into());
        cfg.validate().expect("a registered judge");
        let mut p = Pipeline::open(cfg, &dir, "tiny").await.expect("open");
        p.collect().await.expect("collect");
        p.train(None).await.expect("train");
        p.close().await;
    });
    assert!(
        CALLS.load(Ordering::SeqCst) > 0,
        "the registered judge was asked"
    );
    let store = Store::open(dir.join("db"), StoreOptions::default()).expect("store");
    let trajectories: Vec<Trajectory> = store
        .scan::<Trajectory>(&SampleKey::run_prefix(&RunId::from(TRAIN_RUN)))
        .map(|r| r.expect("record").1)
        .collect();
    assert!(!trajectories.is_empty());
    for t in &trajectories {
        assert!(!t.verdicts.is_empty(), "{}", t.task);
        assert!(
            t.verdicts.iter().all(|v| v.reason == "counting judge"),
            "{}",
            t.task
        );
    }
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}
