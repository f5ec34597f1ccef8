//! Conformance of the embedded SmolLM2-135M-Instruct (f32, CPU) with HF transformers.
//!
//! Reference: `tests/fixtures/smollm2-135m-instruct.json` (see `tests/fixtures/README.md`),
//! produced by HF transformers in float32 from the same GGUF.

use envace::conformance::{Case as GenerationCase, Reference};
use envace::kernels::kv_cache::KvCache;
use envace::kernels::loader::embedded_gguf_path;
use envace::kernels::{
    load, score_no_grad, Engine, EngineConfig, GenerationRequest, LoadedModel, ModelSource,
    SamplingParams, ScoreRow,
};
use tch::{Device, Kind, Tensor};

fn reference() -> Reference {
    envace::conformance::reference().expect("fixture parses")
}

fn smollm2() -> LoadedModel {
    load(&ModelSource::Embedded, Device::Cpu, Kind::Float)
        .expect("embedded model installed by `make setup`")
}

fn greedy(max_new_tokens: usize, loaded: &LoadedModel) -> SamplingParams {
    SamplingParams {
        max_new_tokens,
        stop_token_ids: loaded.tokenizer.eos_token_ids.clone(),
        ..Default::default()
    }
}

fn check_top10(logits: &Tensor, case: &GenerationCase, path: &str) {
    let (values, ids) = logits.topk(10, -1, true, true);
    let ids = Vec::<i64>::try_from(&ids).unwrap();
    let values = Vec::<f32>::try_from(&values).unwrap();
    assert_eq!(ids, case.last_logits_top10.ids, "{path}: top-10 ids");
    for (ours, theirs) in values.iter().zip(&case.last_logits_top10.values) {
        assert!(
            (ours - theirs).abs() < 1e-3,
            "{path}: logit {ours} vs reference {theirs}"
        );
    }
    let l2 = logits.norm().double_value(&[]);
    assert!(
        (l2 - case.last_logits_l2).abs() / case.last_logits_l2 < 1e-4,
        "{path}: l2 {l2} vs {}",
        case.last_logits_l2
    );
}

#[test]
fn smollm2_matches_hf_transformers() {
    let reference = reference();
    let loaded = smollm2();
    let model = &loaded.model;
    let template = loaded
        .chat_template
        .as_ref()
        .expect("SmolLM2 ships a chat template");

    for (i, case) in reference.generation_cases.iter().enumerate() {
        let prompt = template.render(&case.messages, None, true).unwrap();
        let ids = loaded.tokenizer.encode(&prompt).unwrap();
        assert_eq!(ids, case.prompt_ids, "case {i}: chat-template prompt ids");
        let n = ids.len() as i64;
        let input =
            Tensor::from_slice(&ids.iter().map(|&t| i64::from(t)).collect::<Vec<_>>()).view([1, n]);

        // Training path: full causal forward, last position.
        let logits = tch::no_grad(|| model.logits(&model.forward_hidden(&input).get(0).get(n - 1)));
        check_top10(&logits, case, &format!("case {i} forward"));

        // Inference path: prefill into a KV cache.
        let mut cache = KvCache::new(model.config(), 1, ids.len() + 1, Device::Cpu, Kind::Float);
        let logits = tch::no_grad(|| {
            model.prefill(
                &input,
                &Tensor::from_slice(&[0i64]),
                &Tensor::from_slice(&[n - 1]),
                &mut cache,
            )
        });
        check_top10(&logits.get(0), case, &format!("case {i} prefill"));

        // Teacher-forced log-probs of the prompt through the scoring path.
        let row = ScoreRow {
            prompt_ids: ids[..1].to_vec(),
            completion_ids: ids[1..].to_vec(),
        };
        let lp = &score_no_grad(model, &[row], 1.0, 4096).unwrap()[0];
        let sum: f64 = lp.iter().map(|&x| f64::from(x)).sum();
        assert!(
            (sum - case.teacher_forced_logprob_sum).abs() < 1e-2,
            "case {i}: teacher-forced sum {sum} vs {}",
            case.teacher_forced_logprob_sum
        );
        for (j, (ours, theirs)) in lp
            .iter()
            .zip(&case.teacher_forced_logprobs_first16)
            .enumerate()
        {
            assert!(
                (ours - theirs).abs() < 1e-3,
                "case {i} token {j}: {ours} vs {theirs}"
            );
        }
    }

    // Greedy continuations, one request at a time, then all three in one batch.
    let requests: Vec<GenerationRequest> = reference
        .generation_cases
        .iter()
        .map(|c| GenerationRequest {
            prompt_ids: c.prompt_ids.clone(),
            params: greedy(48, &loaded),
        })
        .collect();
    let mut one_at_a_time = Vec::new();
    for (i, request) in requests.iter().enumerate() {
        let mut engine = Engine::new(model, Some(&loaded.tokenizer), EngineConfig::default());
        let out = engine.generate(vec![request.clone()]).unwrap().remove(0);
        assert_eq!(
            out.completion_ids, reference.generation_cases[i].greedy_ids,
            "case {i}: greedy ids"
        );
        assert_eq!(out.logprobs.len(), out.completion_ids.len());
        assert!(out.logprobs.iter().all(|&lp| lp <= 0.0 && lp.is_finite()));
        one_at_a_time.push(out);
    }
    let mut engine = Engine::new(model, Some(&loaded.tokenizer), EngineConfig::default());
    let batched = engine.generate(requests.clone()).unwrap();
    for (i, (a, b)) in one_at_a_time.iter().zip(&batched).enumerate() {
        assert_eq!(
            a.completion_ids, b.completion_ids,
            "case {i}: batched ids differ"
        );
        assert_eq!(a.finish_reason, b.finish_reason, "case {i}: finish reason");
        for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
            assert!((x - y).abs() < 1e-3, "case {i}: log-prob {x} vs {y}");
        }
    }

    // Continuous batching: two slots for three requests, so the third joins mid-decode.
    let mut engine = Engine::new(
        model,
        Some(&loaded.tokenizer),
        EngineConfig {
            max_batch: 2,
            ..Default::default()
        },
    );
    let joined = engine.generate(requests).unwrap();
    for (i, (a, b)) in one_at_a_time.iter().zip(&joined).enumerate() {
        assert_eq!(
            a.completion_ids, b.completion_ids,
            "case {i}: ids differ under continuous batching"
        );
    }
}

#[test]
fn bad_inputs_are_clear_errors() {
    // Missing model file: the error names the path and the set-up command.
    let missing = std::env::temp_dir().join("envace-no-such-model.gguf");
    let err = load(
        &ModelSource::Gguf(missing.clone()),
        Device::Cpu,
        Kind::Float,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains(&missing.display().to_string()), "{err}");

    // Truncated GGUF: an error, not a panic.
    let bytes =
        std::fs::read(embedded_gguf_path()).expect("embedded model installed by `make setup`");
    let truncated =
        std::env::temp_dir().join(format!("envace-truncated-{}.gguf", std::process::id()));
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let err = load(
        &ModelSource::Gguf(truncated.clone()),
        Device::Cpu,
        Kind::Float,
    )
    .unwrap_err()
    .to_string();
    std::fs::remove_file(&truncated).ok();
    assert!(err.contains("GGUF") && err.contains("offset"), "{err}");

    // A prompt longer than the context: an error naming the lengths.
    let loaded = load(&ModelSource::Tiny, Device::Cpu, Kind::Float).unwrap();
    let context = loaded.model.config().max_position_embeddings;
    let mut engine = Engine::new(&loaded.model, None, EngineConfig::default());
    let err = engine
        .generate(vec![GenerationRequest {
            prompt_ids: vec![100; context + 1],
            params: SamplingParams::default(),
        }])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("context length of {context}")),
        "{err}"
    );
    let err = engine
        .generate(vec![GenerationRequest {
            prompt_ids: vec![],
            params: SamplingParams::default(),
        }])
        .unwrap_err()
        .to_string();
    assert!(err.contains("empty prompt"), "{err}");
    let err = engine
        .generate(vec![GenerationRequest {
            prompt_ids: vec![60_000],
            params: SamplingParams::default(),
        }])
        .unwrap_err()
        .to_string();
    assert!(err.contains("outside the vocabulary"), "{err}");
    assert!(
        !engine.has_unfinished(),
        "rejected requests must not stay queued"
    );
}
