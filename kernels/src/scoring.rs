//! Log-probs of given completions, the learner's forward pass.
//!
//! A row is `(prompt ids, completion ids)`; only completion positions are scored — the prompt
//! (system text, user turns, rehearsed or real observations) conditions them and is never a
//! target. Rows are right-padded into one `[rows, longest]` batch and run causally, then only
//! the hidden states that predict completion tokens go through the vocabulary projection:
//! the `[tokens, vocab]` logits are the largest activation, so prompt positions never pay it.

use std::ops::Range;

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::checkpoint::{HeadStage, LayerTape, Plan};
use crate::error::{Error, Result};
use crate::model::Model;

/// Upper bound on one chunk of `[rows, vocab]` f32 logits, bytes (below glibc's 32 MiB
/// maximum mmap threshold).
const LOGITS_CHUNK_BYTES: usize = 24 << 20;

/// One sequence to score: the completion's tokens given the prompt's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScoreRow {
    /// Conditioning tokens, at least one.
    pub prompt_ids: Vec<u32>,
    /// Tokens whose log-probs are returned, at least one.
    pub completion_ids: Vec<u32>,
}

impl ScoreRow {
    /// Prompt plus completion length, tokens.
    pub fn len(&self) -> usize {
        self.prompt_ids.len() + self.completion_ids.len()
    }

    /// True when the row has no tokens at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The scored completions of one micro-batch.
#[derive(Debug)]
pub struct ScoredBatch {
    /// `[rows, longest completion]` f32: `log softmax(logits / temperature)` of each completion
    /// token; carries autograd history unless scored under `tch::no_grad`. Padding is 0.
    pub logprobs: Tensor,
    /// `[rows, longest completion]` f32: 1 on real completion tokens, 0 on padding.
    pub mask: Tensor,
}

/// Splits `rows` into consecutive micro-batches whose padded size (`rows × longest row`) stays
/// within `max_tokens` (a row longer than that gets a micro-batch of its own).
pub fn micro_batches(rows: &[ScoreRow], max_tokens: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut longest) = (0, 0);
    for (i, row) in rows.iter().enumerate() {
        let l = longest.max(row.len());
        if i > start && (i - start + 1) * l > max_tokens {
            out.push(start..i);
            start = i;
            longest = row.len();
        } else {
            longest = l;
        }
    }
    if start < rows.len() {
        out.push(start..rows.len());
    }
    out
}

/// Scores one micro-batch with `model` (autograd recorded unless under `tch::no_grad`).
/// `temperature` divides the logits as during sampling (use 1.0 for greedy rollouts).
///
/// # Errors
/// [`Error::InvalidRequest`] for an empty prompt or completion, an id outside the vocabulary,
/// a row longer than the context, or a non-positive temperature.
pub fn score(model: &Model, rows: &[ScoreRow], temperature: f64) -> Result<ScoredBatch> {
    score_with(model, rows, temperature, false).map(|(batch, _)| batch)
}

/// [`score`], with `checkpoint` through a checkpointed forward whose tape completes the
/// backward pass ([`LayerTape::backward`]).
pub(crate) fn score_with<'m>(
    model: &'m Model,
    rows: &[ScoreRow],
    temperature: f64,
    checkpoint: bool,
) -> Result<(ScoredBatch, Option<LayerTape<'m>>)> {
    validate(model, rows, temperature)?;
    let b = rows.len();
    let longest = rows.iter().map(ScoreRow::len).max().unwrap_or(1);
    let completion = rows
        .iter()
        .map(|r| r.completion_ids.len())
        .max()
        .unwrap_or(1);
    let mut ids = vec![0i64; b * longest];
    let mut gather = vec![0i64; b * completion];
    let mut targets = vec![0i64; b * completion];
    let mut mask = vec![0f32; b * completion];
    for (i, r) in rows.iter().enumerate() {
        for (t, &tok) in r.prompt_ids.iter().chain(&r.completion_ids).enumerate() {
            ids[i * longest + t] = i64::from(tok);
        }
        let p = r.prompt_ids.len();
        for (j, &tok) in r.completion_ids.iter().enumerate() {
            // Hidden state at position p + j − 1 predicts completion token j.
            gather[i * completion + j] = (p + j - 1) as i64;
            targets[i * completion + j] = i64::from(tok);
            mask[i * completion + j] = 1.0;
        }
    }
    let device = model.device();
    let (b, longest, completion) = (b as i64, longest as i64, completion as i64);
    let input = Tensor::from_slice(&ids)
        .view([b, longest])
        .to_device(device);
    let (hidden, mut tape) = if checkpoint {
        let positions = Tensor::arange(longest, (Kind::Int64, device))
            .unsqueeze(0)
            .expand([b, longest], false);
        let (hidden, tape) = model.forward_checkpointed(&input, &positions, Plan::Causal);
        (hidden, Some(tape))
    } else {
        (model.forward_hidden(&input), None)
    };
    let h = hidden.size()[2];
    let index = Tensor::from_slice(&gather)
        .view([b, completion, 1])
        .to_device(device)
        .expand([b, completion, h], false);
    let selected = hidden.gather(1, &index, false).reshape([b * completion, h]);
    let targets = Tensor::from_slice(&targets).to_device(device);
    let picked = target_logprobs(model, &selected, &targets, temperature, tape.as_mut());
    let mask = Tensor::from_slice(&mask)
        .view([b, completion])
        .to_device(device);
    let logprobs = picked.view([b, completion]) * &mask;
    Ok((ScoredBatch { logprobs, mask }, tape))
}

/// The checks of [`score`], shared with [`crate::packing::score_packed`] so both reject the same
/// rows with the same errors.
///
/// # Errors
/// As [`score`].
pub(crate) fn validate(model: &Model, rows: &[ScoreRow], temperature: f64) -> Result<()> {
    let cfg = model.config();
    if temperature.is_nan() || temperature <= 0.0 {
        return Err(Error::InvalidRequest(format!(
            "scoring temperature must be > 0, got {temperature}"
        )));
    }
    if rows.is_empty() {
        return Err(Error::InvalidRequest("no rows to score".into()));
    }
    for (i, r) in rows.iter().enumerate() {
        if r.prompt_ids.is_empty() || r.completion_ids.is_empty() {
            return Err(Error::InvalidRequest(format!(
                "score row {i}: prompt and completion must be non-empty"
            )));
        }
        if r.len() > cfg.max_position_embeddings {
            return Err(Error::ContextOverflow {
                prompt_tokens: r.prompt_ids.len(),
                max_new_tokens: r.completion_ids.len(),
                context_len: cfg.max_position_embeddings,
            });
        }
        if let Some(bad) = r
            .prompt_ids
            .iter()
            .chain(&r.completion_ids)
            .find(|&&t| t as usize >= cfg.vocab_size)
        {
            return Err(Error::InvalidRequest(format!(
                "score row {i}: token id {bad} is outside the vocabulary"
            )));
        }
    }
    Ok(())
}

/// `log softmax(logits / temperature)` of each target: `selected: [n, hidden]` (model dtype)
/// hidden states that predict `targets: [n]` i64 → `[n, 1]` f32. Shared by [`score`] and
/// [`crate::packing::score_packed`].
///
/// With a `tape` (activation checkpointing) the projection runs without autograd and the
/// result is a leaf; the tape records the head and recomputes it chunk by chunk in its
/// backward ([`LayerTape::backward`]), so no `[n, vocab]` log-softmax is kept for backward
/// (196 KB per completion token for SmolLM2's 49 152-token vocabulary).
pub(crate) fn target_logprobs(
    model: &Model,
    selected: &Tensor,
    targets: &Tensor,
    temperature: f64,
    tape: Option<&mut LayerTape<'_>>,
) -> Tensor {
    match tape {
        None => chunked_logprobs(model, selected, targets, temperature),
        Some(tape) => {
            let picked = tch::no_grad(|| chunked_logprobs(model, selected, targets, temperature))
                .set_requires_grad(true);
            tape.record_head(HeadStage {
                selected: selected.shallow_clone(),
                targets: targets.shallow_clone(),
                temperature,
                picked: picked.shallow_clone(),
            });
            picked
        }
    }
}

/// Rows of the vocabulary projection computed at once: each chunk's `[rows, vocab]` f32
/// logits take at most 24 MiB, so the projection never holds `[n, vocab]` at once, and the
/// chunks stay below a 32 MiB mmap threshold (`envace`'s speed tuning of glibc), where the
/// allocator reuses heap memory across steps instead of mapping (and the kernel zeroing)
/// hundreds of MB per step — 10–15 % of a training step on the 2-core machine.
pub(crate) fn logits_chunk_rows(model: &Model) -> i64 {
    (LOGITS_CHUNK_BYTES / (4 * model.config().vocab_size)).max(1) as i64
}

/// [`target_logprobs`] without a tape: the projection in chunks of [`logits_chunk_rows`] rows;
/// under autograd each chunk's log-softmax is kept for backward.
pub(crate) fn chunked_logprobs(
    model: &Model,
    selected: &Tensor,
    targets: &Tensor,
    temperature: f64,
) -> Tensor {
    let n = selected.size()[0];
    let chunk = logits_chunk_rows(model);
    let mut pieces = Vec::new();
    let mut start = 0;
    while start < n {
        let len = chunk.min(n - start);
        pieces.push(chunk_logprobs(
            model,
            &selected.narrow(0, start, len),
            &targets.narrow(0, start, len),
            temperature,
        ));
        start += len;
    }
    Tensor::cat(&pieces, 0)
}

/// One chunk: `selected: [len, hidden]`, `targets: [len]` → `[len, 1]` f32.
pub(crate) fn chunk_logprobs(
    model: &Model,
    selected: &Tensor,
    targets: &Tensor,
    temperature: f64,
) -> Tensor {
    let logits = model.logits(selected);
    let logits = if temperature == 1.0 {
        logits
    } else {
        logits / temperature
    };
    logits
        .log_softmax(-1, Kind::Float)
        .gather(1, &targets.unsqueeze(1), false)
}

/// Scores every row without autograd, in micro-batches of at most `max_tokens` padded tokens;
/// returns one `Vec` of completion log-probs per row.
///
/// # Errors
/// As [`score`].
pub fn score_no_grad(
    model: &Model,
    rows: &[ScoreRow],
    temperature: f64,
    max_tokens: usize,
) -> Result<Vec<Vec<f32>>> {
    let _guard = tch::no_grad_guard();
    let mut out = Vec::with_capacity(rows.len());
    for range in micro_batches(rows, max_tokens) {
        let batch = score(model, &rows[range.clone()], temperature)?;
        for (k, row) in rows[range].iter().enumerate() {
            let lp = batch
                .logprobs
                .get(k as i64)
                .narrow(0, 0, row.completion_ids.len() as i64);
            out.push(Vec::<f32>::try_from(&lp.to_device(tch::Device::Cpu))?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(p: usize, c: usize) -> ScoreRow {
        ScoreRow {
            prompt_ids: vec![1; p],
            completion_ids: vec![2; c],
        }
    }

    /// Chunked, padded, batched scoring equals a plain full-vocabulary log-softmax per row,
    /// and gradients reach the parameters.
    #[test]
    fn scores_match_a_direct_log_softmax_across_chunks() {
        let config = crate::ModelConfig::tiny();
        let model = Model::random(&config, 7, tch::Device::Cpu, Kind::Float).unwrap();
        // 300 completion tokens span three 128-row chunks of the tiny model's 49,152 vocabulary.
        let ids = |n: usize, k: u32| {
            (0..n as u32)
                .map(|t| 100 + (t * 37 + k) % 5000)
                .collect::<Vec<u32>>()
        };
        let rows = vec![
            ScoreRow {
                prompt_ids: ids(5, 1),
                completion_ids: ids(300, 2),
            },
            ScoreRow {
                prompt_ids: ids(40, 3),
                completion_ids: ids(7, 4),
            },
        ];
        let batch = score(&model, &rows, 0.7).unwrap();
        assert_eq!(batch.logprobs.size(), [2, 300]);
        assert_eq!(batch.mask.sum(Kind::Float).double_value(&[]), 307.0);
        for (i, row) in rows.iter().enumerate() {
            let all: Vec<i64> = row
                .prompt_ids
                .iter()
                .chain(&row.completion_ids)
                .map(|&t| i64::from(t))
                .collect();
            let input = Tensor::from_slice(&all).view([1, -1]);
            let direct = tch::no_grad(|| {
                (model.logits(&model.forward_hidden(&input)) / 0.7).log_softmax(-1, Kind::Float)
            });
            let p = row.prompt_ids.len();
            for (j, &tok) in row.completion_ids.iter().enumerate() {
                let expected = direct.double_value(&[0, (p + j - 1) as i64, i64::from(tok)]);
                let ours = batch.logprobs.double_value(&[i as i64, j as i64]);
                assert!(
                    (ours - expected).abs() < 1e-4,
                    "row {i} token {j}: {ours} vs {expected}"
                );
            }
            // Padding past the completion is zero.
            if row.completion_ids.len() < 300 {
                assert_eq!(batch.logprobs.double_value(&[i as i64, 299]), 0.0);
            }
        }
        let loss = -(batch.logprobs.sum(Kind::Float) / batch.mask.sum(Kind::Float));
        loss.backward();
        let grad_norm: f64 = model
            .var_store()
            .trainable_variables()
            .iter()
            .map(|v| v.grad().norm().double_value(&[]).powi(2))
            .sum();
        assert!(
            grad_norm > 0.0 && grad_norm.is_finite(),
            "grad norm² {grad_norm}"
        );
    }

    #[test]
    fn bad_rows_are_rejected() {
        let model = Model::random(
            &crate::ModelConfig::tiny(),
            7,
            tch::Device::Cpu,
            Kind::Float,
        )
        .unwrap();
        let empty = ScoreRow {
            prompt_ids: vec![],
            completion_ids: vec![1],
        };
        assert!(score(&model, &[empty], 1.0)
            .unwrap_err()
            .to_string()
            .contains("non-empty"));
        let bad = ScoreRow {
            prompt_ids: vec![1],
            completion_ids: vec![49_152],
        };
        assert!(score(&model, &[bad], 1.0)
            .unwrap_err()
            .to_string()
            .contains("outside the vocabulary"));
        let ok = ScoreRow {
            prompt_ids: vec![1],
            completion_ids: vec![2],
        };
        assert!(score(&model, &[ok], 0.0).is_err());
        assert!(score(&model, &[], 1.0)
            .unwrap_err()
            .to_string()
            .contains("no rows"));
    }

    #[test]
    fn micro_batches_respect_the_padded_budget() {
        let rows = vec![row(3, 2), row(1, 1), row(4, 4), row(10, 10), row(1, 1)];
        // padded sizes: {5,2} → 2×5=10; +8 → 3×8=24 > 16 → split; {8}; +20 → split; {20}; +2 → 2×20=40 > 16.
        assert_eq!(micro_batches(&rows, 16), vec![0..2, 2..3, 3..4, 4..5]);
        assert_eq!(micro_batches(&rows, 1000), vec![0..5]);
        assert!(micro_batches(&[], 10).is_empty());
    }
}
