//! Llama, Qwen2 (q/k/v bias) and Qwen3 (q/k norm) checkpoints: logits of our decoder, through
//! both the training forward and the KV-cache path, against HF transformers in float32.
//!
//! Fixtures `tests/fixtures/tiny-{llama,qwen2,qwen3}/` come from
//! `scripts/make_tiny_hf_fixtures.py` (seeded random weights, transformers 5.24.0).

use std::path::PathBuf;

use envace::kernels::hf::load_checkpoint;
use envace::kernels::kv_cache::KvCache;
use envace::kernels::{Architecture, Model};
use serde::Deserialize;
use tch::{Device, Kind, Tensor};

#[derive(Deserialize)]
struct Expected {
    input_ids: Vec<Vec<i64>>,
    /// `[batch][seq][vocab]`
    logits: Vec<Vec<Vec<f32>>>,
}

fn fixture(name: &str) -> (Model, Expected) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let (config, weights) = load_checkpoint(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
    let model = Model::from_weights(&config, weights, Device::Cpu, Kind::Float).unwrap();
    let expected: Expected =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    (model, expected)
}

fn max_abs_diff(ours: &Tensor, theirs: &[Vec<f32>]) -> f64 {
    let flat: Vec<f32> = theirs.iter().flatten().copied().collect();
    let theirs = Tensor::from_slice(&flat).view(ours.size().as_slice());
    (ours - theirs).abs().max().double_value(&[])
}

fn check_family(name: &str, arch: Architecture) {
    let (model, expected) = fixture(name);
    assert_eq!(model.config().architecture, arch);
    // transformers 5 nests θ under `rope_parameters`; the fixtures use a non-default 50000.
    assert_eq!(model.config().rope_theta, 50_000.0);
    let _guard = tch::no_grad_guard();
    let (b, t) = (
        expected.input_ids.len() as i64,
        expected.input_ids[0].len() as i64,
    );
    let ids: Vec<i64> = expected.input_ids.iter().flatten().copied().collect();
    let input = Tensor::from_slice(&ids).view([b, t]);

    // Training forward over the whole batch.
    let logits = model.logits(&model.forward_hidden(&input));
    for (i, seq) in expected.logits.iter().enumerate() {
        let diff = max_abs_diff(&logits.get(i as i64), seq);
        assert!(
            diff < 1e-4,
            "{name} row {i}: forward logits differ by {diff}"
        );
    }

    // KV-cache path: prefill 4 tokens, then decode the rest one token at a time.
    let prefix = 4;
    let mut cache = KvCache::new(
        model.config(),
        b as usize,
        t as usize,
        Device::Cpu,
        Kind::Float,
    );
    let slots = Tensor::from_slice(&[0i64, 1]);
    let first = model.prefill(
        &input.narrow(1, 0, prefix),
        &slots,
        &Tensor::from_slice(&[prefix - 1, prefix - 1]),
        &mut cache,
    );
    for (i, seq) in expected.logits.iter().enumerate() {
        let diff = max_abs_diff(
            &first.get(i as i64),
            &seq[prefix as usize - 1..prefix as usize],
        );
        assert!(
            diff < 1e-4,
            "{name} row {i}: prefill logits differ by {diff}"
        );
    }
    for pos in prefix..t {
        let step = model.decode(
            &input.select(1, pos),
            &Tensor::from_slice(&[pos, pos]),
            &mut cache,
        );
        for (i, seq) in expected.logits.iter().enumerate() {
            let diff = max_abs_diff(&step.get(i as i64), &seq[pos as usize..pos as usize + 1]);
            assert!(
                diff < 1e-4,
                "{name} row {i} position {pos}: decode logits differ by {diff}"
            );
        }
    }
}

#[test]
fn llama_matches_hf() {
    check_family("tiny-llama", Architecture::Llama);
}

#[test]
fn qwen2_matches_hf() {
    check_family("tiny-qwen2", Architecture::Qwen2);
}

#[test]
fn qwen3_matches_hf() {
    check_family("tiny-qwen3", Architecture::Qwen3);
}
