//! The pipeline runs a user's own task suite (`examples/support/counter_suite.rs`) chosen by
//! name (`environment = "counter"`): its tasks are stored, its reference solutions are the
//! seeds, warm-up and training run with zero real calls, and evaluation plays its test tasks
//! in its own environment. One test per process: the registry is process-wide.

#[path = "../examples/support/counter_suite.rs"]
mod counter_suite;

use std::sync::Arc;

use counter_suite::{CounterSuite, COUNTER};
use envace::config::{EnvironmentName, Preset, RunConfig};
use envace::pipeline::{Pipeline, Variant};
use envace::registry::{self, Registry};
use envace::storage::records::{SeedTrajectory, Task};
use envace::storage::{Prefix, Store, StoreOptions};
use envace::suite::TaskSuite;

#[test]
fn a_registered_suite_runs_the_whole_pipeline() {
    let mut r = Registry::builtin();
    r.register_suite(COUNTER, || {
        Ok(Arc::new(CounterSuite::new(12, 4)) as Arc<dyn TaskSuite>)
    });
    registry::install(r).expect("the first registry of this process");

    let dir = std::env::temp_dir().join(format!("envace-suite-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut cfg = RunConfig::preset(Preset::Tiny);
    cfg.train.steps = 1;
    cfg.train.eval_every = None;
    cfg.eval.tasks = Some(4);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        // A name nobody registered is refused before the folder is created.
        let mut unknown = cfg.clone();
        unknown.environment = EnvironmentName("webshop".into());
        let e = Pipeline::open(unknown.clone(), &dir, "tiny")
            .await
            .err()
            .expect("an unknown environment is refused");
        assert!(
            e.to_string()
                .contains("registered environments: bfcl_base, counter"),
            "{e}"
        );
        assert!(unknown.validate().is_err());
        assert!(!dir.exists());

        cfg.environment = EnvironmentName(COUNTER.into());
        cfg.validate().expect("a registered environment");
        let mut p = Pipeline::open(cfg, &dir, "tiny").await.expect("open");
        assert_eq!(p.suite.name(), COUNTER);
        let collect = p.collect().await.expect("collect");
        assert_eq!(collect.items, 12, "one seed per train task");
        assert_eq!(collect.real_env_calls, 12, "one add per reference solution");
        let sft = p.sft().await.expect("sft");
        assert_eq!(sft.real_env_calls, 0);
        assert!(sft.items > 0, "warm-up rows from the counter seeds");
        p.train(None).await.expect("train");
        let train = &p.report.stages["train"];
        assert_eq!(
            train.real_env_calls, 0,
            "self-rehearsal makes no real calls"
        );
        assert!(!p.report.train.steps.is_empty());
        let eval = p.eval(Variant::Envace, None).await.expect("eval");
        assert_eq!((eval.tasks, eval.split.as_str()), (4, "test"));
        let ids: Vec<&str> = eval.per_task.iter().map(|t| t.task.as_str()).collect();
        assert_eq!(
            ids,
            ["counter_12", "counter_13", "counter_14", "counter_15"]
        );
        assert!(eval.per_task.iter().all(|t| t.expected_calls == 1));
        let fidelity = eval.fidelity.as_ref().expect("fidelity");
        assert!(
            fidelity.real_env_calls >= 4,
            "the test tasks' reference replays"
        );
        p.close().await;
    });

    let store = Store::open(dir.join("db"), StoreOptions::default()).expect("store");
    let tasks: Vec<Task> = store
        .scan::<Task>(&Prefix::all())
        .map(|r| r.expect("task").1)
        .collect();
    assert_eq!(tasks.len(), 16);
    assert!(tasks.iter().all(|t| t.category == COUNTER));
    assert_eq!(tasks.iter().filter(|t| t.split == "train").count(), 12);
    let seeds: Vec<SeedTrajectory> = store
        .scan::<SeedTrajectory>(&Prefix::all())
        .map(|r| r.expect("seed").1)
        .collect();
    assert_eq!(seeds.len(), 12);
    let first = seeds
        .iter()
        .find(|s| s.task.0 == "counter_0")
        .expect("seed 0");
    assert_eq!(first.tool_calls[0].arguments_json, r#"{"n": 1}"#);
    assert_eq!(first.tool_calls[0].result_json, r#"{"count": 1}"#);
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}
