//! Generation engine behaviour on the `tiny` preset: budgets, stop tokens, stop strings, seeded
//! sampling, batch invariance and prefix-cache reuse.

use envace::kernels::{
    load, Engine, EngineConfig, FinishReason, GenerationRequest, LoadedModel, ModelSource,
    SamplingParams,
};
use tch::{Device, Kind};

fn tiny() -> LoadedModel {
    load(&ModelSource::Tiny, Device::Cpu, Kind::Float)
        .expect("tiny preset (needs `make setup` for its tokenizer)")
}

fn request(prompt: &[u32], params: SamplingParams) -> GenerationRequest {
    GenerationRequest {
        prompt_ids: prompt.to_vec(),
        params,
    }
}

#[test]
fn budget_stop_tokens_and_stop_strings() {
    let loaded = tiny();
    let mut engine = Engine::new(
        &loaded.model,
        Some(&loaded.tokenizer),
        EngineConfig::default(),
    );
    let prompt = loaded.tokenizer.encode("The river flows").unwrap();
    // Sampled, so the tiny model's output varies and stops are hit during decode, not prefill;
    // the same seed replays the same stream with stops added.
    let params = SamplingParams {
        temperature: 1.0,
        seed: 9,
        max_new_tokens: 24,
        ..Default::default()
    };

    // Budget: exactly max_new_tokens, finish reason length.
    let free = engine
        .generate(vec![request(&prompt, params.clone())])
        .unwrap()
        .remove(0);
    assert_eq!(free.completion_ids.len(), 24);
    assert_eq!(free.logprobs.len(), 24);
    assert_eq!(free.finish_reason, FinishReason::Length);

    // A stop token id first seen mid-completion: generation ends on it and keeps it.
    let first_seen = |i: usize| {
        free.completion_ids[..i]
            .iter()
            .all(|&t| t != free.completion_ids[i])
    };
    let at = (5..24)
        .find(|&i| first_seen(i))
        .expect("a token first seen after position 5");
    let stopped = engine
        .generate(vec![request(
            &prompt,
            SamplingParams {
                stop_token_ids: vec![free.completion_ids[at]],
                ..params.clone()
            },
        )])
        .unwrap()
        .remove(0);
    assert_eq!(stopped.completion_ids, free.completion_ids[..=at].to_vec());
    assert_eq!(stopped.finish_reason, FinishReason::Stop);

    // A stop string: ends at the token that completes it.
    let text_upto = |n: usize| {
        loaded
            .tokenizer
            .decode(&free.completion_ids[..n], false)
            .unwrap()
    };
    let needle = text_upto(12)[text_upto(10).len()..].to_string();
    assert!(!needle.is_empty());
    let expected_len = (1..=24).find(|&n| text_upto(n).contains(&needle)).unwrap();
    assert!(
        expected_len > 1,
        "the stop string must complete during decode"
    );
    let by_string = engine
        .generate(vec![request(
            &prompt,
            SamplingParams {
                stop_strings: vec![needle.clone()],
                ..params
            },
        )])
        .unwrap()
        .remove(0);
    assert_eq!(
        by_string.completion_ids.len(),
        expected_len,
        "stop string {needle:?}"
    );
    assert_eq!(by_string.finish_reason, FinishReason::Stop);
}

#[test]
fn seeded_sampling_is_reproducible_and_batch_invariant() {
    let loaded = tiny();
    let prompt_a = loaded.tokenizer.encode("Tools and rehearsal").unwrap();
    let prompt_b = loaded
        .tokenizer
        .encode("A much longer prompt about rivers, lakes and the sea")
        .unwrap();
    let sampled = |seed| SamplingParams {
        temperature: 1.0,
        top_p: 0.9,
        top_k: 50,
        seed,
        max_new_tokens: 16,
        ..Default::default()
    };
    let mut engine = Engine::new(&loaded.model, None, EngineConfig::default());
    let alone = engine
        .generate(vec![request(&prompt_a, sampled(11))])
        .unwrap()
        .remove(0);
    let again = engine
        .generate(vec![request(&prompt_a, sampled(11))])
        .unwrap()
        .remove(0);
    assert_eq!(alone, again, "same seed, same request: same completion");
    let other_seed = engine
        .generate(vec![request(&prompt_a, sampled(12))])
        .unwrap()
        .remove(0);
    assert_ne!(alone.completion_ids, other_seed.completion_ids);

    // In a batch with a different-length prompt and a greedy neighbour.
    let batch = engine
        .generate(vec![
            request(&prompt_b, sampled(5)),
            request(&prompt_a, sampled(11)),
            request(
                &prompt_b,
                SamplingParams {
                    max_new_tokens: 3,
                    ..Default::default()
                },
            ),
        ])
        .unwrap();
    assert_eq!(batch[1].completion_ids, alone.completion_ids);
    for (x, y) in batch[1].logprobs.iter().zip(&alone.logprobs) {
        assert!((x - y).abs() < 1e-4);
    }
    assert!(alone.logprobs.iter().all(|&lp| lp <= 0.0 && lp.is_finite()));
    assert_eq!(batch[2].completion_ids.len(), 3);

    // top_k = 1 samples the argmax with probability one.
    let greedy = engine
        .generate(vec![request(
            &prompt_a,
            SamplingParams {
                max_new_tokens: 8,
                ..Default::default()
            },
        )])
        .unwrap()
        .remove(0);
    let top1 = engine
        .generate(vec![request(
            &prompt_a,
            SamplingParams {
                temperature: 1.0,
                top_k: 1,
                seed: 3,
                max_new_tokens: 8,
                ..Default::default()
            },
        )])
        .unwrap()
        .remove(0);
    assert_eq!(top1.completion_ids, greedy.completion_ids);
    assert!(top1.logprobs.iter().all(|&lp| lp == 0.0));
}

/// Length of the longest common prefix.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[test]
fn prefix_cache_reuses_kv_without_changing_greedy_ids() {
    let loaded = tiny();
    let encode = |text: &str| loaded.tokenizer.encode(text).unwrap();
    let system = encode(
        "You are a careful agent. Tools: ls(path), cd(folder), cat(file), grep(pattern, file), \
         mv(source, destination). Facts: the workspace holds a report and two drafts.",
    );
    let with_system = |text: &str| {
        let mut p = system.clone();
        p.extend(encode(text));
        p
    };
    let greedy = |n| SamplingParams {
        max_new_tokens: n,
        ..Default::default()
    };
    let first = with_system(" User: list the files.");
    let unrelated = encode("Rivers, lakes and the sea are where water rests between rains.");

    // Two slots: the append-only next turn and a branch off the shared system prompt are
    // admitted together (both hit); the unrelated prompt (a miss) joins mid-decode.
    let run = |prefix_cache_tokens| {
        let mut engine = Engine::new(
            &loaded.model,
            None,
            EngineConfig {
                max_batch: 2,
                prefix_cache_tokens,
                ..Default::default()
            },
        );
        let c1 = engine
            .generate(vec![request(&first, greedy(10))])
            .unwrap()
            .remove(0);
        let mut next = first.clone();
        next.extend(&c1.completion_ids);
        next.extend(encode(" User: now open the report."));
        let branch = with_system(" User: move the drafts.");
        let rest = engine
            .generate(vec![
                request(&next, greedy(6)),
                request(&branch, greedy(12)),
                request(&unrelated, greedy(8)),
            ])
            .unwrap();
        let prompts = vec![first.clone(), next, branch, unrelated.clone()];
        let mut out = vec![c1];
        out.extend(rest);
        (out, prompts, engine.stats())
    };
    let (expected, prompts, off) = run(0);
    let (got, _, on) = run(16_384);
    for (i, (a, b)) in expected.iter().zip(&got).enumerate() {
        assert_eq!(a.completion_ids, b.completion_ids, "request {i}");
        for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
            assert!((x - y).abs() < 1e-4, "request {i}: log-prob {x} vs {y}");
        }
    }

    // The next turn reuses turn 1's prompt and completion but its last token; the branch
    // reuses what it shares with that entry (at least the system prompt).
    let entry_len = prompts[0].len() + expected[0].completion_ids.len() - 1;
    let branch_reuse = common_prefix(&prompts[2], &prompts[0]);
    assert!(branch_reuse >= system.len(), "{branch_reuse}");
    assert_eq!(on.prefix_hits, 2);
    assert_eq!(on.prefill_tokens_reused as usize, entry_len + branch_reuse);
    let all: usize = prompts.iter().map(Vec::len).sum();
    assert_eq!(off.prefill_tokens_computed as usize, all);
    assert_eq!(off.prefill_tokens_reused, 0);
    assert_eq!(
        on.prefill_tokens_computed as usize,
        all - entry_len - branch_reuse
    );
    assert_eq!(on.decode_tokens, off.decode_tokens);
    assert!(on.prefix_cache_tokens > 0);
    eprintln!(
        "prefill tokens computed: {} without the prefix cache, {} with it ({} reused)",
        off.prefill_tokens_computed, on.prefill_tokens_computed, on.prefill_tokens_reused
    );
}

/// The model thread drops the kept prefixes' KV whenever the weights change (a learner step or
/// a checkpoint load): KV computed by old weights must never serve a new policy.
#[test]
fn weight_changes_clear_the_prefix_cache() {
    use envace::actors::worker::{Job, WorkerHandle};
    use envace::kernels::TrainRow;
    let worker = WorkerHandle::from_loaded(tiny(), EngineConfig::default());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let prompt: Vec<u32> = (0..40).map(|i| 200 + i).collect();
        let greedy = SamplingParams {
            max_new_tokens: 4,
            ..SamplingParams::default()
        };
        let hits = || async { worker.engine_stats().await.expect("stats").prefix_hits };
        let generate = || async {
            worker
                .generate(request(&prompt, greedy.clone()))
                .await
                .expect("generate")
        };
        generate().await;
        generate().await;
        assert_eq!(hits().await, 1, "the same prompt reuses its kept prefix");

        worker
            .request(|tx| Job::SetLearner(Box::default(), tx))
            .await
            .expect("learner");
        let row = TrainRow {
            prompt_ids: prompt.clone(),
            completion_ids: vec![5, 6],
            old_logprobs: vec![-1.0, -1.0],
            advantage: 1.0,
        };
        worker
            .request(|tx| Job::Train(vec![row], tx))
            .await
            .expect("a learner step");
        generate().await;
        assert_eq!(hits().await, 1, "no reuse across a learner step");
        generate().await;
        assert_eq!(hits().await, 2);

        let dir = std::env::temp_dir().join(format!("envace-cache-clear-{}", std::process::id()));
        let path = dir.join("w.safetensors");
        worker
            .request(|tx| Job::Save(path.clone(), tx))
            .await
            .expect("save");
        worker
            .request(|tx| Job::Load(path.clone(), envace::storage::PolicyVersion(7), tx))
            .await
            .expect("load");
        let _ = std::fs::remove_dir_all(&dir);
        generate().await;
        assert_eq!(hits().await, 2, "no reuse across a weight load");
    });
}

/// The model thread's errors are typed: a caller tells the request's fault (a prompt over the
/// context, a learner job before `SetLearner`) from the run's (a stopped thread) by matching.
#[test]
fn model_thread_errors_are_matched_by_kind() {
    use envace::actors::worker::{Job, WorkerError, WorkerHandle};
    use envace::kernels::{Error, TrainRow};
    let loaded = tiny();
    let context = loaded.model.config().max_position_embeddings;
    let worker = WorkerHandle::from_loaded(loaded, EngineConfig::default());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let params = SamplingParams {
            max_new_tokens: 8,
            ..SamplingParams::default()
        };
        let long: Vec<u32> = (0..context as u32).map(|i| 100 + i % 500).collect();
        match worker.generate(request(&long, params)).await {
            Err(WorkerError::Kernel(Error::ContextOverflow {
                prompt_tokens,
                max_new_tokens,
                context_len,
            })) => assert_eq!(
                (prompt_tokens, max_new_tokens, context_len),
                (context, 8, context)
            ),
            other => panic!("expected a context overflow, got {other:?}"),
        }
        let row = TrainRow {
            prompt_ids: vec![1, 2],
            completion_ids: vec![3],
            old_logprobs: vec![-1.0],
            advantage: 1.0,
        };
        let out = worker.request(|tx| Job::Train(vec![row], tx)).await;
        assert!(matches!(out, Err(WorkerError::NoLearner)), "{out:?}");

        // A handle whose model thread is gone: every request is `Stopped`, never a hang.
        let (tx, rx) = crossbeam_channel::unbounded();
        drop(rx);
        let info = worker.info();
        let dead = WorkerHandle::from_queue(tx, info, Default::default());
        assert!(matches!(
            dead.engine_stats().await,
            Err(WorkerError::Stopped)
        ));
    });
}
