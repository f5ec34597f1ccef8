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

use tch::{Kind, Tensor};

use crate::error::Result;
use crate::model::{Layer, Model};
use crate::packing::PackedLayout;

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
    /// The last layer's output as a leaf: the loss's backward leaves its gradient here.
    top: Tensor,
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
            let x = Tensor::embedding(&self.model.embed, &self.ids, -1, false, false);
            (x * &grad).f_sum(Kind::Float)?.f_backward()?;
            Ok(())
        })
    }
}
