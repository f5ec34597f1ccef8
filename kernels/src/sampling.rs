//! Sampling parameters and the per-row sampler of the generation engine.
//!
//! The distribution a token is drawn from is `softmax(logits / temperature)` restricted to the
//! `top_k` most likely tokens and then to the smallest prefix whose mass reaches `top_p`,
//! renormalised. The returned log-prob is the chosen token's log-probability under exactly
//! that distribution; for greedy decoding (`temperature = 0`) it is under `softmax(logits)`.
//!
//! For RL the learner recomputes log-probs with [`crate::scoring::score`], which applies the
//! temperature but not the truncation: sample training rollouts with `top_k = 0` and
//! `top_p = 1` (the reference setting: temperature 1.0) so that both sides agree; a truncated
//! distribution's log-probs (e.g. `top_k = 1` gives exactly 0) are not comparable.
//! Each request draws from its own ChaCha8 stream seeded by its `seed`, so a request samples
//! the same tokens whatever else shares its batch.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::error::{Error, Result};

/// How one request is decoded. Defaults: greedy, no truncation, 256 new tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingParams {
    /// Softmax temperature; `0` means greedy (argmax).
    pub temperature: f32,
    /// Nucleus mass in `(0, 1]`; `1` keeps every token.
    pub top_p: f32,
    /// Keep only the `k` most likely tokens; `0` keeps every token.
    pub top_k: usize,
    /// Seed of this request's random stream.
    pub seed: u64,
    /// Generation budget, tokens.
    pub max_new_tokens: usize,
    /// Token ids that end generation; the stop token is part of the completion.
    pub stop_token_ids: Vec<u32>,
    /// Strings that end generation once the decoded completion contains one; the completion
    /// keeps every token up to and including the one that completed the string.
    pub stop_strings: Vec<String>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            seed: 0,
            max_new_tokens: 256,
            stop_token_ids: Vec::new(),
            stop_strings: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Checks value ranges.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] naming the field and value.
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(Error::InvalidRequest(format!(
                "temperature must be ≥ 0, got {}",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::InvalidRequest(format!(
                "top_p must be in (0, 1], got {}",
                self.top_p
            )));
        }
        if self.stop_strings.iter().any(String::is_empty) {
            return Err(Error::InvalidRequest(
                "stop strings must be non-empty".into(),
            ));
        }
        if self.max_new_tokens == 0 {
            return Err(Error::InvalidRequest("max_new_tokens must be ≥ 1".into()));
        }
        Ok(())
    }

    fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    fn truncates(&self) -> bool {
        self.top_k > 0 || self.top_p < 1.0
    }
}

/// A request's sampling state: its parameters and random stream.
#[derive(Debug)]
pub(crate) struct RowSampler {
    pub params: SamplingParams,
    rng: ChaCha8Rng,
}

impl RowSampler {
    pub fn new(params: SamplingParams) -> Self {
        let rng = ChaCha8Rng::seed_from_u64(params.seed);
        Self { params, rng }
    }
}

/// Draws one token per row. `logits: [rows, vocab]` f32, one sampler per row.
/// Returns `(token id, log-prob under the sampling distribution)` per row.
pub(crate) fn sample(logits: &Tensor, samplers: &mut [&mut RowSampler]) -> Result<Vec<(u32, f32)>> {
    let rows = samplers.len();
    let mut out = vec![(0u32, 0f32); rows];
    let greedy: Vec<usize> = (0..rows)
        .filter(|&r| samplers[r].params.is_greedy())
        .collect();
    if !greedy.is_empty() {
        let idx = index_tensor(&greedy, logits.device());
        let lp = logits.index_select(0, &idx).log_softmax(-1, Kind::Float);
        let (best, ids) = lp.max_dim(-1, false);
        let best = Vec::<f32>::try_from(&best)?;
        let ids = Vec::<i64>::try_from(&ids)?;
        for (j, &r) in greedy.iter().enumerate() {
            out[r] = (ids[j] as u32, best[j]);
        }
    }
    let sampled: Vec<usize> = (0..rows)
        .filter(|&r| !samplers[r].params.is_greedy())
        .collect();
    for r in sampled {
        let sampler = &mut *samplers[r];
        let p = &sampler.params;
        // Shift by the maximum first: a tiny temperature then sends the others to −∞ (weight 0)
        // instead of overflowing everything to ∞ (NaN after softmax).
        let row = logits.get(r as i64);
        let scaled = (&row - row.max()) / f64::from(p.temperature);
        let (probs, ids) = if p.truncates() {
            let (vals, ids) = scaled.sort(-1, true);
            let probs = vals.softmax(-1, Kind::Float);
            let mut keep = probs.size()[0];
            if p.top_k > 0 {
                keep = keep.min(p.top_k as i64);
            }
            let probs = probs.narrow(0, 0, keep);
            let ids = ids.narrow(0, 0, keep);
            // Nucleus: keep tokens whose preceding mass is below top_p (the first always stays).
            let before = probs.cumsum(0, Kind::Float) - &probs;
            let n = before
                .lt(f64::from(p.top_p))
                .sum(Kind::Int64)
                .int64_value(&[])
                .max(1);
            (
                Vec::<f32>::try_from(&probs.narrow(0, 0, n))?,
                Some(Vec::<i64>::try_from(&ids.narrow(0, 0, n))?),
            )
        } else {
            (
                Vec::<f32>::try_from(&scaled.softmax(-1, Kind::Float))?,
                None,
            )
        };
        let (pos, prob) = draw(&probs, &mut sampler.rng);
        let id = ids.as_ref().map_or(pos as i64, |ids| ids[pos]);
        out[r] = (id as u32, prob.ln() as f32);
    }
    Ok(out)
}

/// Inverse-CDF draw from unnormalised `weights`; returns the index and its normalised probability.
fn draw(weights: &[f32], rng: &mut ChaCha8Rng) -> (usize, f64) {
    let total: f64 = weights.iter().map(|&w| f64::from(w)).sum();
    let target = rng.random::<f64>() * total;
    let mut acc = 0.0;
    let mut last_positive = 0;
    for (i, &w) in weights.iter().enumerate() {
        if w <= 0.0 {
            continue;
        }
        last_positive = i;
        acc += f64::from(w);
        if acc > target {
            return (i, f64::from(w) / total);
        }
    }
    // Rounding left `target` past the last bucket: take the last token with mass.
    (last_positive, f64::from(weights[last_positive]) / total)
}

fn index_tensor(rows: &[usize], device: tch::Device) -> Tensor {
    let v: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
    Tensor::from_slice(&v).to_device(device)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(params: SamplingParams) -> RowSampler {
        RowSampler::new(params)
    }

    #[test]
    fn greedy_picks_argmax_with_its_log_softmax() {
        let logits = Tensor::from_slice(&[1.0f32, 3.0, 2.0]).view([1, 3]);
        let mut s = sampler(SamplingParams::default());
        let out = sample(&logits, &mut [&mut s]).unwrap();
        let expected = 3.0 - (1f32.exp() + 3f32.exp() + 2f32.exp()).ln();
        assert_eq!(out[0].0, 1);
        assert!(
            (out[0].1 - expected).abs() < 1e-6,
            "{} vs {expected}",
            out[0].1
        );
    }

    #[test]
    fn top_k_one_is_greedy_with_log_prob_zero() {
        let logits = Tensor::from_slice(&[0.5f32, 0.1, 4.0, 0.2]).view([1, 4]);
        let mut s = sampler(SamplingParams {
            temperature: 1.0,
            top_k: 1,
            seed: 7,
            ..Default::default()
        });
        for _ in 0..5 {
            let out = sample(&logits, &mut [&mut s]).unwrap();
            assert_eq!(out[0], (2, 0.0));
        }
    }

    #[test]
    fn top_p_keeps_the_nucleus_and_renormalises() {
        // probs ∝ [0.5, 0.3, 0.2]: top_p 0.6 keeps {0, 1}, renormalised to [0.625, 0.375].
        let logits = Tensor::from_slice(&[0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()]).view([1, 3]);
        let mut s = sampler(SamplingParams {
            temperature: 1.0,
            top_p: 0.6,
            seed: 1,
            ..Default::default()
        });
        let mut seen = [0usize; 3];
        for _ in 0..400 {
            let (id, lp) = sample(&logits, &mut [&mut s]).unwrap()[0];
            seen[id as usize] += 1;
            let expected = if id == 0 { 0.625f32 } else { 0.375 };
            assert!((lp - expected.ln()).abs() < 1e-5, "id {id} lp {lp}");
        }
        assert_eq!(seen[2], 0, "token outside the nucleus was sampled");
        assert!(seen[0] > 200 && seen[1] > 100, "{seen:?}");
    }

    #[test]
    fn same_seed_same_stream_regardless_of_batch() {
        let logits = crate::model::with_torch_rng(None, || {
            Tensor::randn([3, 50], (Kind::Float, tch::Device::Cpu))
        });
        let params = SamplingParams {
            temperature: 1.0,
            seed: 42,
            ..Default::default()
        };
        let mut alone = sampler(params.clone());
        let solo: Vec<u32> = (0..10)
            .map(|_| sample(&logits.narrow(0, 1, 1), &mut [&mut alone]).unwrap()[0].0)
            .collect();
        let mut a = sampler(SamplingParams {
            seed: 1,
            ..params.clone()
        });
        let mut b = sampler(params.clone());
        let mut c = sampler(SamplingParams { seed: 3, ..params });
        let batched: Vec<u32> = (0..10)
            .map(|_| sample(&logits, &mut [&mut a, &mut b, &mut c]).unwrap()[1].0)
            .collect();
        assert_eq!(solo, batched);
    }

    #[test]
    fn tiny_temperature_is_finite_and_near_greedy() {
        let logits = Tensor::from_slice(&[1.0f32, 3.0, 2.0, 2.9]).view([1, 4]);
        let mut s = sampler(SamplingParams {
            temperature: 1e-30,
            seed: 5,
            ..Default::default()
        });
        let (id, lp) = sample(&logits, &mut [&mut s]).unwrap()[0];
        assert_eq!((id, lp), (1, 0.0));
    }

    #[test]
    fn invalid_values_are_rejected() {
        let bad = SamplingParams {
            stop_strings: vec![String::new()],
            ..Default::default()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("stop strings"));
        let bad = SamplingParams {
            top_p: 0.0,
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("top_p"));
        let bad = SamplingParams {
            temperature: -1.0,
            ..Default::default()
        };
        assert!(bad.validate().is_err());
    }
}
