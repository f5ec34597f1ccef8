//! Generation engine behaviour on the `tiny` preset: budgets, stop tokens, stop strings, seeded
//! sampling and batch invariance.

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
