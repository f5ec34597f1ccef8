//! Activation checkpointing per decoder layer (`learner.checkpoint_activations`).
//!
//! A training forward keeps every layer's intermediate activations for backward: for
//! SmolLM2-135M in f32 about 50 KB per token per layer (norms, q/k/v before and after RoPE,
//! attention output, the `[t, 2·ffn]` gate/up product and its SiLU), 1.5 GB per 1 000 tokens
//! over 30 layers. With checkpointing the forward runs without autograd and keeps only each
//! layer's input `[b, t, hidden]`; the last layer's output becomes a leaf the loss is built
//! on. After the loss's backward, [`LayerTape::backward`] walks the layers from the top: it
//! recomputes one layer with autograd from its saved input and back-propagates the gradient
//! that reached the layer's output, which gives the gradient at its input for the layer below
//! (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"; per-layer
//! `torch.utils.checkpoint` in HF transformers' `gradient_checkpointing_enable`). The cost is
//! one more forward of every layer per step; the gradients are those of the plain backward up
//! to float rounding.
//!
//! The vocabulary projection is checkpointed the same way ([`HeadStage`]): the forward keeps
//! the `[n, hidden]` states that predict the completion tokens and the picked log-probs as a
//! leaf, and the backward recomputes the projection one chunk of rows at a time, instead of
//! keeping every `[n, vocab]` log-softmax (196 KB per completion token for a 49 152-token
//! vocabulary, f32).

use tch::{Kind, Tensor};

use crate::error::Result;
use crate::model::{Layer, Model};
use crate::packing::PackedLayout;
use crate::scoring::{chunk_logprobs, logits_chunk_rows};

/// How the layers of a training forward attend.
#[derive(Debug)]
pub(crate) enum Plan {
    /// Causal over each row (padded batches, [`crate::scoring::score`]).
    Causal,
    /// Tree attention of one packed sequence ([`Model::forward_hidden_packed`]).
    Packed(PackedLayout),
}

impl Model {
    /// One decoder layer of a training forward under `plan`: `x: [b, t, hidden]` → same shape.
    fn train_layer(
        &self,
        layer: &Layer,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        plan: &Plan,
    ) -> Tensor {
        match plan {
            Plan::Causal => self.causal_layer(layer, x, cos, sin),
            Plan::Packed(layout) => self.packed_layer(layer, x, cos, sin, layout),
        }
    }

    /// Checkpointed training forward: `ids, positions: [b, t]` i64 → the final hidden states
    /// `[b, t, hidden]` (model dtype, after the final norm; autograd from the last layer's
    /// output on) and the tape whose [`LayerTape::backward`] completes the backward pass once
    /// the loss built on them has run its own.
    pub(crate) fn forward_checkpointed(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        plan: Plan,
    ) -> (Tensor, LayerTape<'_>) {
        let (cos, sin) = self.rope.tables(positions);
        let mut inputs = Vec::with_capacity(self.layers.len());
        let top = tch::no_grad(|| {
            let mut x = Tensor::embedding(&self.embed, ids, -1, false, false);
            for layer in &self.layers {
                let next = self.train_layer(layer, &x, &cos, &sin, &plan);
                inputs.push(x);
                x = next;
            }
            x
        })
        .set_requires_grad(true);
        let hidden = self.final_norm(&top);
        let tape = LayerTape {
            model: self,
            ids: ids.shallow_clone(),
            cos,
            sin,
            plan,
            inputs,
            top,
            head: None,
        };
        (hidden, tape)
    }
}

/// What [`Model::forward_checkpointed`] kept: each layer's input (no autograd), the attention
/// plan, and the leaf that stands for the last layer's output.
#[derive(Debug)]
pub(crate) struct LayerTape<'m> {
    model: &'m Model,
    /// `[b, t]` i64, for the embedding's gradient.
    ids: Tensor,
    cos: Tensor,
    sin: Tensor,
    plan: Plan,
    /// `inputs[i]`: layer `i`'s input `[b, t, hidden]`.
    inputs: Vec<Tensor>,
    /// The last layer's output as a leaf: the loss's backward leaves its gradient here (or the
    /// head's recomputation does, with a [`HeadStage`]).
    top: Tensor,
    /// The vocabulary projection, when it was run without autograd.
    head: Option<HeadStage>,
}

/// The vocabulary projection of a checkpointed forward ([`crate::scoring::target_logprobs`]
/// with a tape): what its backward needs to recompute it.
#[derive(Debug)]
pub(crate) struct HeadStage {
    /// `[n, hidden]`: the states that predict the targets, on the graph from [`LayerTape`]'s
    /// `top` (through the final norm).
    pub(crate) selected: Tensor,
    /// `[n]` i64.
    pub(crate) targets: Tensor,
    pub(crate) temperature: f64,
    /// `[n, 1]` f32: the log-probs as a leaf; the loss's backward leaves its gradient here.
    pub(crate) picked: Tensor,
}

impl LayerTape<'_> {
    /// Back-propagates the gradient the loss left at the last layer's output through every
    /// layer (recomputed one at a time from its saved input) and the embedding, accumulating
    /// into the parameters' `.grad` like a plain `backward`. Call it after the loss's
    /// `backward`; a loss that never reached the hidden states leaves nothing to do.
    ///
    /// # Errors
    /// [`crate::Error::Torch`] when a recomputation or a backward fails.
    pub(crate) fn backward(self) -> Result<()> {
        if let Some(head) = &self.head {
            self.head_backward(head)?;
        }
        let mut grad = self.top.grad();
        if !grad.defined() {
            return Ok(());
        }
        tch::with_grad(|| -> Result<()> {
            for (layer, input) in self.model.layers.iter().zip(&self.inputs).rev() {
                let x = input.detach().set_requires_grad(true);
                let y = self
                    .model
                    .train_layer(layer, &x, &self.cos, &self.sin, &self.plan);
                // d/dy of sum(y · g) is g: the gradient arriving at y, back-propagated.
                (y * &grad).f_sum(Kind::Float)?.f_backward()?;
                grad = x.grad();
            }
            // A frozen embedding takes no gradient (the plain backward would skip it too).
            if self.model.embed.requires_grad() {
                let x = Tensor::embedding(&self.model.embed, &self.ids, -1, false, false);
                (x * &grad).f_sum(Kind::Float)?.f_backward()?;
            }
            Ok(())
        })
    }

    /// Records the vocabulary projection that ran without autograd on this forward's states.
    pub(crate) fn record_head(&mut self, head: HeadStage) {
        self.head = Some(head);
    }

    /// Recomputes the projection one chunk of rows at a time, back-propagating the gradient
    /// the loss left at the picked log-probs into the head's weights and the selected states,
    /// then through the final norm to `top`.
    fn head_backward(&self, head: &HeadStage) -> Result<()> {
        let grad = head.picked.grad();
        if !grad.defined() {
            return Ok(());
        }
        tch::with_grad(|| -> Result<()> {
            let x = head.selected.detach().set_requires_grad(true);
            let (n, chunk) = (x.size()[0], logits_chunk_rows(self.model));
            let mut start = 0;
            while start < n {
                let len = chunk.min(n - start);
                let picked = chunk_logprobs(
                    self.model,
                    &x.narrow(0, start, len),
                    &head.targets.narrow(0, start, len),
                    head.temperature,
                );
                (picked * grad.narrow(0, start, len))
                    .f_sum(Kind::Float)?
                    .f_backward()?;
                start += len;
            }
            (&head.selected * x.grad())
                .f_sum(Kind::Float)?
                .f_backward()?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelConfig;
    use crate::packing::score_packed_counted;
    use crate::scoring::{score_with, ScoreRow};
    use tch::Device;

    fn rows() -> Vec<ScoreRow> {
        let ids =
            |n: u32, k: u32| -> Vec<u32> { (0..n).map(|t| 10 + (t * 31 + k * 7) % 3000).collect() };
        let trunk = ids(20, 0);
        vec![
            ScoreRow {
                prompt_ids: trunk[..12].to_vec(),
                completion_ids: trunk[12..].to_vec(),
            },
            ScoreRow {
                prompt_ids: [&trunk[..6], &ids(4, 1)[..]].concat(),
                completion_ids: ids(5, 2),
            },
            ScoreRow {
                prompt_ids: ids(3, 3),
                completion_ids: ids(6, 4),
            },
        ]
    }

    /// Every parameter's gradient, by name (zeros where backward left none).
    fn grads(model: &Model) -> Vec<(String, Tensor)> {
        let mut out: Vec<(String, Tensor)> = model
            .var_store()
            .variables()
            .into_iter()
            .map(|(name, v)| {
                let g = v.grad();
                let g = if g.defined() {
                    g.copy()
                } else {
                    v.zeros_like()
                };
                (name, g)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    fn zero_grads(model: &Model) {
        for mut v in model.var_store().trainable_variables() {
            v.zero_grad();
        }
    }

    /// Rows whose completion tokens span three chunks of the vocabulary projection.
    fn long_rows(model: &Model) -> Vec<ScoreRow> {
        let chunk = logits_chunk_rows(model) as u32;
        let ids =
            |n: u32, k: u32| -> Vec<u32> { (0..n).map(|t| 5 + (t * 17 + k) % 4000).collect() };
        let trunk = ids(chunk + 40, 0);
        vec![
            ScoreRow {
                prompt_ids: trunk[..30].to_vec(),
                completion_ids: trunk[30..].to_vec(),
            },
            ScoreRow {
                prompt_ids: trunk[..20].to_vec(),
                completion_ids: ids(chunk + 5, 1),
            },
        ]
    }

    /// The tape carries the whole gradient: before its backward no parameter has one (the
    /// vocabulary projection is deferred too), after it every parameter matches the plain
    /// backward (relative to its own size), padded and packed, with the projection in one
    /// chunk and in several.
    #[test]
    fn the_tape_completes_the_plain_gradient_of_every_parameter() {
        let model = Model::random(&ModelConfig::tiny(), 9, Device::Cpu, Kind::Float).unwrap();
        let long = long_rows(&model);
        let completion: usize = long.iter().map(|r| r.completion_ids.len()).sum();
        assert!(completion as i64 > 2 * logits_chunk_rows(&model));
        for (rows, packed) in [
            (rows(), false),
            (rows(), true),
            (long.clone(), false),
            (long, true),
        ] {
            let run = |checkpoint: bool| {
                zero_grads(&model);
                tch::with_grad(|| {
                    let (batch, tape) = if packed {
                        let (b, _, t) =
                            score_packed_counted(&model, &rows, 1.0, checkpoint).unwrap();
                        (b, t)
                    } else {
                        score_with(&model, &rows, 1.0, checkpoint).unwrap()
                    };
                    assert_eq!(tape.is_some(), checkpoint);
                    (-batch.logprobs.sum(Kind::Float)).backward();
                    let before = grads(&model);
                    if let Some(tape) = tape {
                        tape.backward().unwrap();
                    }
                    (before, grads(&model))
                })
            };
            let (_, plain) = run(false);
            let (before, after) = run(true);
            for ((name, p), ((_, b), (_, a))) in plain.iter().zip(before.iter().zip(&after)) {
                let scale = p.abs().max().double_value(&[]);
                assert!(scale > 0.0, "packed {packed}: {name} has no gradient");
                let early = b.abs().max().double_value(&[]);
                assert_eq!(early, 0.0, "packed {packed}: {name} before the tape");
                let diff = (p - a).abs().max().double_value(&[]);
                assert!(
                    diff <= 1e-4 * scale,
                    "packed {packed}: {name} differs by {diff} (scale {scale})"
                );
            }
        }
    }
}
