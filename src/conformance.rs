//! `envace conformance`: the embedded SmolLM2-135M-Instruct against HF transformers on any
//! device and dtype, with no Rust toolchain (the reference travels inside the binary).
//!
//! The reference is `tests/fixtures/smollm2-135m-instruct.json` (HF transformers, float32, the
//! same GGUF; see `tests/fixtures/README.md`): per case the chat-template prompt ids, the last
//! position's top-10 logits and logit L2 norm, teacher-forced log-probs of the prompt, and 48
//! greedy ids. Every case goes through the training forward, the KV-cache prefill, the scoring
//! path and the generation engine. Each measured deviation is compared with the tolerance of
//! the dtype ([`Tolerances::for_dtype`]); f32 uses the bounds of the CPU conformance test.

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::kernels::kv_cache::KvCache;
use crate::kernels::{
    score_no_grad, ChatMessage, Engine, EngineConfig, GenerationRequest, LoadedModel,
    SamplingParams, ScoreRow,
};

/// New tokens of the reference's greedy continuations.
const GREEDY_TOKENS: usize = 48;

const REFERENCE: &str = include_str!("../tests/fixtures/smollm2-135m-instruct.json");

/// The HF transformers reference (`tests/fixtures/smollm2-135m-instruct.json`).
#[derive(Debug, Deserialize)]
pub struct Reference {
    pub generation_cases: Vec<Case>,
}

/// One reference conversation and what HF transformers computed for it in float32.
#[derive(Debug, Deserialize)]
pub struct Case {
    pub messages: Vec<ChatMessage>,
    /// The chat template's rendering with the generation prompt, tokenised.
    pub prompt_ids: Vec<u32>,
    /// The last position's 10 largest logits.
    pub last_logits_top10: Top10,
    /// L2 norm of the last position's logits `[vocab]`.
    pub last_logits_l2: f64,
    /// Sum of `log p(token | prefix)` over the prompt after its first token, nats.
    pub teacher_forced_logprob_sum: f64,
    /// The first 16 of those log-probs, nats.
    pub teacher_forced_logprobs_first16: Vec<f32>,
    /// Greedy continuation, up to 48 ids (fewer when it ended at an end-of-turn token).
    pub greedy_ids: Vec<u32>,
}

/// Ids and values of the 10 largest logits, largest first.
#[derive(Debug, Deserialize)]
pub struct Top10 {
    pub ids: Vec<i64>,
    pub values: Vec<f32>,
}

/// The reference, parsed from the copy built into the binary.
///
/// # Errors
/// A message when the embedded JSON does not parse (a build from a damaged fixture).
pub fn reference() -> Result<Reference, String> {
    serde_json::from_str(REFERENCE).map_err(|e| format!("embedded reference: {e}"))
}

/// Bounds one dtype must meet.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Tolerances {
    /// Of the reference's top-10 ids, how many must be in ours (same top-1 always).
    pub top10_overlap: usize,
    /// Largest |Δ| of a top-10 logit (ours at the reference's ids), logits.
    pub logit_abs: f64,
    /// |Δ| / reference of the last position's logit L2 norm.
    pub logit_l2_rel: f64,
    /// |Δ| of the teacher-forced log-prob sum over the prompt, nats.
    pub logprob_sum_abs: f64,
    /// Largest |Δ| of the first 16 teacher-forced log-probs, nats.
    pub logprob_abs: f64,
    /// Greedy ids that must equal the reference's from the start (of up to 48; all of them
    /// when the reference stopped earlier at an end-of-turn token).
    pub greedy_prefix: usize,
    /// Batched and continuous-batching greedy ids must equal one-at-a-time ones (in bf16 other
    /// batch shapes round differently, so a near tie may go the other way: reported only).
    pub batching_exact: bool,
}

impl Tolerances {
    /// f32: the CPU conformance test's bounds (`tests/conformance_smollm2.rs`). bf16 (and
    /// f16, which gets the same bounds): 8 mantissa bits in weights and activations, so logits
    /// move by a few tenths and a greedy continuation may take another token once two
    /// candidates are close; the bounds are about twice the deviations measured on the CPU,
    /// where a bf16 model keeps its KV cache in f32 ([`crate::kernels::Model::kv_dtype`];
    /// CUDA keeps it in bf16), with room below the measured greedy agreement (README, "GPU").
    pub fn for_dtype(dtype: Kind) -> Self {
        match dtype {
            Kind::Float => Self {
                top10_overlap: 10,
                logit_abs: 1e-3,
                logit_l2_rel: 1e-4,
                logprob_sum_abs: 1e-2,
                logprob_abs: 1e-3,
                greedy_prefix: 48,
                batching_exact: true,
            },
            _ => Self {
                top10_overlap: 7,
                logit_abs: 1.0,
                logit_l2_rel: 7e-2,
                logprob_sum_abs: 2.0,
                logprob_abs: 1.0,
                greedy_prefix: 4,
                batching_exact: false,
            },
        }
    }
}

/// What one case measured, worst over the training forward and the prefill.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CaseReport {
    /// The chat template rendered and tokenised to the reference's prompt ids.
    pub prompt_ids_equal: bool,
    /// The last position's argmax is the reference's, in both paths.
    pub top1_equal: bool,
    /// Of the reference's top-10 ids, how many are in ours (the worse path).
    pub top10_overlap: usize,
    /// Largest |Δ| of a logit at the reference's top-10 ids, logits (NaN if one is NaN).
    pub logit_abs: f64,
    /// |Δ| / reference of the logit L2 norm.
    pub logit_l2_rel: f64,
    /// |Δ| of the teacher-forced log-prob sum over the prompt, nats.
    pub logprob_sum_abs: f64,
    /// Largest |Δ| of the first 16 teacher-forced log-probs, nats.
    pub logprob_abs: f64,
    /// Greedy ids equal to the reference's from the start, one request alone.
    pub greedy_prefix: usize,
    /// The reference's greedy ids (48, or fewer when it stopped at an end-of-turn token).
    pub greedy_reference_len: usize,
    /// Ours equal the reference's, length included.
    pub greedy_equal: bool,
    /// The same requests batched (and with two slots, joining mid-decode) gave the same ids as
    /// one at a time.
    pub batching_consistent: bool,
}

/// The whole run: the device, dtype, bounds, every case and the verdict.
#[derive(Debug, Clone, Serialize)]
pub struct ConformanceReport {
    /// `cpu` or `cuda:N`.
    pub device: String,
    /// The model's compute dtype (`Float`, `BFloat16`).
    pub dtype: String,
    pub tolerances: Tolerances,
    pub cases: Vec<CaseReport>,
    /// Every bound held in every case.
    pub passed: bool,
    /// One line per failed bound.
    pub failures: Vec<String>,
}

/// Runs every case on `loaded` (the embedded SmolLM2-135M-Instruct, any device and dtype).
///
/// # Errors
/// A message when the model has no chat template or a kernel fails.
pub fn run(loaded: &LoadedModel) -> Result<ConformanceReport, String> {
    let reference = reference()?;
    let model = &loaded.model;
    let (device, dtype) = (model.device(), model.dtype());
    let tol = Tolerances::for_dtype(dtype);
    let template = loaded
        .chat_template
        .as_ref()
        .ok_or("the model has no chat template")?;
    let err = |e: crate::kernels::Error| e.to_string();
    let mut cases = Vec::new();
    for case in &reference.generation_cases {
        let mut r = CaseReport {
            top1_equal: true,
            top10_overlap: 10,
            ..CaseReport::default()
        };
        let prompt = template.render(&case.messages, None, true).map_err(err)?;
        let ids = loaded.tokenizer.encode(&prompt).map_err(err)?;
        r.prompt_ids_equal = ids == case.prompt_ids;
        let n = ids.len() as i64;
        let input = Tensor::from_slice(&ids.iter().map(|&t| i64::from(t)).collect::<Vec<_>>())
            .view([1, n])
            .to_device(device);
        let forward =
            tch::no_grad(|| model.logits(&model.forward_hidden(&input).get(0).get(n - 1)));
        let mut cache = KvCache::new(model.config(), 1, ids.len() + 1, device, model.kv_dtype());
        let prefill = tch::no_grad(|| {
            model.prefill(
                &input,
                &Tensor::from_slice(&[0i64]).to_device(device),
                &Tensor::from_slice(&[n - 1]).to_device(device),
                &mut cache,
            )
        });
        for logits in [forward, prefill.get(0)] {
            compare_logits(&logits.to_device(Device::Cpu), case, &mut r).map_err(err)?;
        }
        let row = ScoreRow {
            prompt_ids: ids[..1].to_vec(),
            completion_ids: ids[1..].to_vec(),
        };
        let lp = &score_no_grad(model, &[row], 1.0, 4096).map_err(err)?[0];
        let sum: f64 = lp.iter().map(|&x| f64::from(x)).sum();
        r.logprob_sum_abs = (sum - case.teacher_forced_logprob_sum).abs();
        r.logprob_abs = lp
            .iter()
            .zip(&case.teacher_forced_logprobs_first16)
            .map(|(a, b)| f64::from((a - b).abs()))
            .fold(0.0, worst);
        cases.push(r);
    }

    // Greedy continuations: alone, batched, and two slots for three requests.
    let requests: Vec<GenerationRequest> = reference
        .generation_cases
        .iter()
        .map(|c| GenerationRequest {
            prompt_ids: c.prompt_ids.clone(),
            params: SamplingParams {
                max_new_tokens: GREEDY_TOKENS,
                stop_token_ids: loaded.tokenizer.eos_token_ids.clone(),
                ..Default::default()
            },
        })
        .collect();
    let generate = |requests: Vec<GenerationRequest>, max_batch: usize| {
        let config = EngineConfig {
            max_batch,
            ..Default::default()
        };
        Engine::new(model, Some(&loaded.tokenizer), config)
            .generate(requests)
            .map_err(err)
    };
    let mut alone = Vec::new();
    for request in &requests {
        alone.push(generate(vec![request.clone()], 1)?.remove(0).completion_ids);
    }
    let batched = generate(requests.clone(), requests.len())?;
    let joined = generate(requests, 2)?;
    for (i, (r, case)) in cases
        .iter_mut()
        .zip(&reference.generation_cases)
        .enumerate()
    {
        r.greedy_prefix = alone[i]
            .iter()
            .zip(&case.greedy_ids)
            .take_while(|(a, b)| a == b)
            .count();
        r.greedy_reference_len = case.greedy_ids.len();
        r.greedy_equal = alone[i] == case.greedy_ids;
        r.batching_consistent =
            batched[i].completion_ids == alone[i] && joined[i].completion_ids == alone[i];
    }

    let failures = failures(&cases, &tol);
    Ok(ConformanceReport {
        device: crate::runtime::device_name(device),
        dtype: format!("{dtype:?}"),
        tolerances: tol,
        passed: failures.is_empty(),
        cases,
        failures,
    })
}

/// Folds one path's last-position logits `[vocab]` (CPU) into the case's worst deviations.
fn compare_logits(
    logits: &Tensor,
    case: &Case,
    r: &mut CaseReport,
) -> Result<(), crate::kernels::Error> {
    let logits = logits.to_kind(Kind::Float);
    let (_, ids) = logits.f_topk(10, -1, true, true)?;
    let ids = Vec::<i64>::try_from(&ids)?;
    let want = &case.last_logits_top10;
    r.top1_equal &= ids.first() == want.ids.first();
    r.top10_overlap = r
        .top10_overlap
        .min(want.ids.iter().filter(|id| ids.contains(id)).count());
    let at_reference =
        Vec::<f32>::try_from(&logits.f_index_select(0, &Tensor::from_slice(&want.ids))?)?;
    for (ours, theirs) in at_reference.iter().zip(&want.values) {
        r.logit_abs = worst(r.logit_abs, f64::from((ours - theirs).abs()));
    }
    let l2 = logits.f_norm()?.double_value(&[]);
    r.logit_l2_rel = worst(
        r.logit_l2_rel,
        (l2 - case.last_logits_l2).abs() / case.last_logits_l2,
    );
    Ok(())
}

/// The larger of two deviations, NaN winning (`f64::max` would drop it and report 0).
fn worst(acc: f64, v: f64) -> f64 {
    if v.is_nan() || v > acc {
        v
    } else {
        acc
    }
}

fn failures(cases: &[CaseReport], tol: &Tolerances) -> Vec<String> {
    let mut out = Vec::new();
    for (i, r) in cases.iter().enumerate() {
        let mut fail = |what: String| out.push(format!("case {i}: {what}"));
        if !r.prompt_ids_equal {
            fail("chat-template prompt ids differ".into());
        }
        if !r.top1_equal {
            fail("top-1 id differs".into());
        }
        if r.top10_overlap < tol.top10_overlap {
            fail(format!(
                "top-10 overlap {} < {}",
                r.top10_overlap, tol.top10_overlap
            ));
        }
        let bounds = [
            ("top-10 logit |Δ|", r.logit_abs, tol.logit_abs),
            ("logit L2 relative |Δ|", r.logit_l2_rel, tol.logit_l2_rel),
            (
                "teacher-forced sum |Δ|",
                r.logprob_sum_abs,
                tol.logprob_sum_abs,
            ),
            (
                "teacher-forced log-prob |Δ|",
                r.logprob_abs,
                tol.logprob_abs,
            ),
        ];
        for (what, got, bound) in bounds {
            // NaN fails too.
            if got.is_nan() || got > bound {
                fail(format!("{what} {got:.3e} > {bound:.1e}"));
            }
        }
        let need = tol.greedy_prefix.min(r.greedy_reference_len);
        if r.greedy_prefix < need || (need == r.greedy_reference_len && !r.greedy_equal) {
            fail(format!(
                "greedy ids equal for {} tokens, {need} required (reference: {})",
                r.greedy_prefix, r.greedy_reference_len
            ));
        }
        if tol.batching_exact && !r.batching_consistent {
            fail("batched or continuous-batching greedy ids differ from one at a time".into());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> CaseReport {
        CaseReport {
            prompt_ids_equal: true,
            top1_equal: true,
            top10_overlap: 10,
            greedy_prefix: 48,
            greedy_reference_len: 48,
            greedy_equal: true,
            batching_consistent: true,
            ..CaseReport::default()
        }
    }

    #[test]
    fn every_bound_is_checked_against_its_dtype() {
        let (f32, bf16) = (
            Tolerances::for_dtype(Kind::Float),
            Tolerances::for_dtype(Kind::BFloat16),
        );
        assert!(failures(&[good()], &f32).is_empty());
        // A bf16-sized deviation fails f32 and passes bf16.
        let drift = CaseReport {
            logit_abs: 0.3,
            top10_overlap: 9,
            greedy_prefix: 20,
            greedy_equal: false,
            batching_consistent: false,
            ..good()
        };
        assert_eq!(
            failures(std::slice::from_ref(&drift), &f32).len(),
            4,
            "{:?}",
            failures(std::slice::from_ref(&drift), &f32)
        );
        assert!(failures(&[drift], &bf16).is_empty());
        // A NaN never passes; a reference that stopped early must be matched whole.
        let nan = CaseReport {
            logprob_abs: f64::NAN,
            ..good()
        };
        assert_eq!(
            failures(&[nan], &bf16),
            ["case 0: teacher-forced log-prob |Δ| NaN > 1.0e0"]
        );
        // A reference shorter than the bound (it stopped at an end-of-turn token after 3
        // ids) must be matched whole, its stop included.
        let short = CaseReport {
            greedy_prefix: 3,
            greedy_reference_len: 3,
            greedy_equal: false,
            ..good()
        };
        assert_eq!(failures(&[short], &bf16).len(), 1);
        let matched = CaseReport {
            greedy_prefix: 3,
            greedy_reference_len: 3,
            ..good()
        };
        assert!(failures(&[matched], &bf16).is_empty());
    }

    #[test]
    fn a_nan_logit_is_a_nan_deviation() {
        let reference = reference().unwrap();
        let case = &reference.generation_cases[0];
        let mut logits = vec![0f32; 49_152];
        for (&id, &v) in case
            .last_logits_top10
            .ids
            .iter()
            .zip(&case.last_logits_top10.values)
        {
            logits[id as usize] = v;
        }
        logits[case.last_logits_top10.ids[3] as usize] = f32::NAN;
        let mut r = good();
        compare_logits(&Tensor::from_slice(&logits), case, &mut r).unwrap();
        assert!(r.logit_abs.is_nan(), "{r:?}");
        assert!(!failures(&[r], &Tolerances::for_dtype(Kind::BFloat16)).is_empty());
    }
}
