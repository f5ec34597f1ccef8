//! Test-time scaling on the tiny model and the real BFCL test tasks: a rehearsal memory is
//! created, stored and reloaded; the committed execution's prompt contains it; rehearsal makes
//! zero real calls; sequential rehearsal n's prompt contains rehearsals < n; the memory stays
//! within its bound.

use std::path::PathBuf;

use envace::config::{Preset, RunConfig};
use envace::pipeline::{Pipeline, TtsSpec, Variant};
use envace::storage::{Prefix, RehearsalMemory, RehearsalMode, RunId, SampleKey, Trajectory};

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn trajectories(p: &Pipeline, run: &str) -> Vec<Trajectory> {
    p.store
        .scan::<Trajectory>(&SampleKey::run_prefix(&RunId::from(run)))
        .map(|r| r.expect("record").1)
        .collect()
}

#[test]
fn rehearse_condense_commit_store_and_reuse() {
    let dir = TempDir(std::env::temp_dir().join(format!("envace-tts-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut cfg = RunConfig::preset(Preset::Tiny);
        cfg.tts.max_memory_chars = 600;
        cfg.tts.critique_max_new_tokens = 16;
        let mut p = Pipeline::open(cfg, &dir.0, "tiny").await.expect("open");
        p.collect().await.expect("collect");
        let kit = p.topology.kit.clone();
        // The one test task a limit of 1 evaluates (the middle of the test split).
        let (_, picked) = p.eval_tasks(Some(1)).expect("eval tasks");
        let task_id = picked[0].id.0.clone();

        // Parallel N = 2 on one test task.
        let spec: TtsSpec = "parallel:2".parse().expect("spec");
        let r = p
            .eval_tts(Variant::Base, Some(spec), Some(1), false)
            .await
            .expect("tts");
        assert_eq!((r.tasks, r.n, r.mode.as_str()), (1, 2, "parallel"));
        assert_eq!(r.real_env_calls_rehearsal, 0);
        assert!(r.extra_tokens > 0, "rehearsals and critiques cost tokens");
        let memories: Vec<RehearsalMemory> = p
            .store
            .scan::<RehearsalMemory>(&Prefix::all())
            .map(|m| m.expect("memory").1)
            .collect();
        assert_eq!(memories.len(), 1);
        let m = &memories[0];
        assert_eq!(
            (m.mode, m.n, m.task.0.as_str()),
            (RehearsalMode::Parallel, 2, task_id.as_str())
        );
        assert_eq!((m.rehearsals.len(), m.critiques.len()), (2, 2));
        assert!(
            m.summary.contains("Rehearsal 1") && m.summary.contains("Rehearsal 2"),
            "{}",
            m.summary
        );
        assert!(m.summary.chars().count() <= 600);
        // The committed execution's Act prompt carries the memory.
        let committed = trajectories(&p, "tts-base-parallel-2");
        assert_eq!(committed.len(), 1);
        let prompt = kit
            .decode(&committed[0].rows[0].prompt_ids)
            .expect("decode");
        let first_line = m.summary.lines().nth(1).expect("an entry line");
        assert!(
            prompt.contains(first_line),
            "the committed prompt lacks the memory"
        );
        // The rehearsals were stored, and no tool call reached the real environment.
        let rehearsals = trajectories(&p, "tts-base-parallel-2-rehearsal");
        assert_eq!(rehearsals.len(), 2);
        assert!(rehearsals
            .iter()
            .all(|t| t.mode == envace::storage::ExecutionMode::Rehearsal));

        // Reuse: the stored memory is taken, no rehearsal is run again.
        let again = p
            .eval_tts(Variant::Base, Some(spec), Some(1), true)
            .await
            .expect("reuse");
        assert_eq!((again.reused_memories, again.extra_tokens), (1, 0));

        // Sequential N = 3: rehearsal n's prompt holds the memory of rehearsals < n.
        let spec: TtsSpec = "sequential:3".parse().expect("spec");
        let s = p
            .eval_tts(Variant::Base, Some(spec), Some(1), false)
            .await
            .expect("sequential");
        assert_eq!(s.real_env_calls_rehearsal, 0);
        let mut seq = trajectories(&p, "tts-base-sequential-3-rehearsal");
        seq.sort_by_key(|t| t.sample);
        assert_eq!(seq.len(), 3);
        for (n, t) in seq.iter().enumerate() {
            let prompt = kit.decode(&t.rows[0].prompt_ids).expect("decode");
            for earlier in 1..=n {
                assert!(
                    prompt.contains(&format!("Rehearsal {earlier} (ended:")),
                    "rehearsal {n} misses {earlier}"
                );
            }
            assert!(!prompt.contains(&format!("Rehearsal {} (ended:", n + 1)));
        }
        let stored = p
            .store
            .get::<RehearsalMemory>(&SampleKey {
                run: RunId::from("tts-base-sequential-3"),
                step: 0,
                task: task_id.as_str().into(),
                sample: 0,
            })
            .expect("read")
            .expect("sequential memory");
        assert!(
            stored.summary.chars().count() <= 600,
            "the bound holds at N = 3"
        );
        assert_eq!(p.report.tts.len(), 3);

        // The baseline (no TTS) spends no extra tokens.
        let none = p
            .eval_tts(Variant::Base, None, Some(1), false)
            .await
            .expect("none");
        assert_eq!((none.n, none.extra_tokens), (0, 0));
        p.shutdown();
    });
    assert!("parallel:0".parse::<TtsSpec>().is_err());
    assert!("both:2".parse::<TtsSpec>().is_err());
}
