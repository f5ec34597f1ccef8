//! The learner: one optimizer step of role-wise GRPO (or of supervised warm-up) over a batch of
//! training rows, with micro-batches and gradient accumulation.
//!
//! Sources: DESIGN.md §2 (AdamW lr 1e-6, weight decay 0.01, grad clip 1.0, constant schedule,
//! one optimizer step per batch) and issue 5 item 5 (micro-batches with gradient accumulation,
//! a supervised mode for the warm-up). Each micro-batch's loss is scaled by its share of the
//! batch's aggregation weight ([`PpoStats::weight`]) before `backward`, so the accumulated
//! gradient equals the gradient of the whole batch in one piece — the batch size is a memory
//! knob, never a change of objective.
//!
//! Prompt positions are never trained: [`crate::scoring::score`] only returns completion log-probs.
//!
//! Optional KL to a frozen reference (DESIGN.md §2: off by default, k3 `low_var_kl` available):
//! with `grpo.kl_coef = β` the learner holds a second, frozen [`Model`]
//! ([`Learner::with_reference`]) and adds `β·k3(π_θ ‖ π_ref)` to the loss, the reference
//! log-probs being scored without autograd per micro-batch. The reference is a full copy of the
//! weights (no gradients, no optimizer state): for SmolLM2-135M about 540 MB in f32 (270 MB in
//! bf16) on its device, plus one no-grad forward pass per micro-batch (about a third of the
//! policy's forward + backward).
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::checkpoint::LayerTape;
use crate::error::{Error, Result};
use crate::grpo::{ppo_loss, GrpoConfig, LossAggregation};
use crate::model::Model;
use crate::optimizer::{AdamWConfig, Optimizer};
use crate::packing::{pack_groups, score_packed_counted};
use crate::scoring::{micro_batches, score_with, ScoreRow};

/// How the learning rate evolves over steps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LrSchedule {
    /// The same learning rate at every step (the authors' setting).
    #[default]
    Constant,
}

/// Optimisation hyperparameters of the learner; defaults are DESIGN.md §2.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LearnerConfig {
    /// AdamW learning rate.
    pub lr: f64,
    /// AdamW decoupled weight decay.
    pub weight_decay: f64,
    /// AdamW `(β1, β2)`; written `betas = [0.9, 0.999]` in TOML.
    pub betas: (f64, f64),
    /// AdamW denominator epsilon.
    pub eps: f64,
    /// Global L2 norm the gradient is clipped to before the optimizer step.
    pub max_grad_norm: f64,
    /// Learning-rate schedule.
    pub schedule: LrSchedule,
    /// Budget of one micro-batch, padded tokens (`rows × longest prompt + completion`); with
    /// `pack_prefixes`, packed tokens (distinct prefix-tree tokens of the micro-batch's rows).
    pub micro_batch_tokens: usize,
    /// Score each micro-batch as one prefix-packed sequence ([`crate::packing`]) instead of a
    /// padded batch: rows that share a prompt prefix — the rows of one `inline` trajectory
    /// (DESIGN.md §3) — share its tokens, so a trajectory costs one forward/backward over its
    /// stream plus its branches. Micro-batches are then consecutive rows whose packed length
    /// stays within `micro_batch_tokens` ([`crate::packing::pack_groups`]); keep a trajectory's
    /// rows adjacent. Same loss and gradient as unpacked scoring up to float rounding; attention
    /// and its mask grow with the square of the packed length. Off by default.
    pub pack_prefixes: bool,
    /// Activation checkpointing per decoder layer: the forward keeps only each layer's input
    /// `[b, t, hidden]` and backward recomputes one layer at a time from it, so a micro-batch
    /// keeps the layer inputs plus one layer's activations instead of every layer's, for one
    /// more forward of every layer per micro-batch (Chen et al. 2016; HF transformers'
    /// `gradient_checkpointing_enable`). Same gradients up to float rounding. Off by default.
    pub checkpoint_activations: bool,
    /// Temperature the learner scores with; must match the one rollouts were sampled at.
    pub temperature: f64,
    /// Loss hyperparameters.
    pub grpo: GrpoConfig,
}

impl Default for LearnerConfig {
    fn default() -> Self {
        Self {
            lr: 1e-6,
            weight_decay: 0.01,
            betas: (0.9, 0.999),
            eps: 1e-8,
            max_grad_norm: 1.0,
            schedule: LrSchedule::Constant,
            micro_batch_tokens: 4096,
            pack_prefixes: false,
            checkpoint_activations: false,
            temperature: 1.0,
            grpo: GrpoConfig::default(),
        }
    }
}

impl LearnerConfig {
    /// Checks the values a learner can be built with.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] naming the field at fault (and those of
    /// [`GrpoConfig::validate`]). Whether a reference model is present for `grpo.kl_coef` is
    /// checked when the [`Learner`] is built, not here.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &str, v: String, want: &str| {
            Err(Error::InvalidRequest(format!(
                "learner.{field} = {v}: must be {want}"
            )))
        };
        let positive = |v: f64| v > 0.0 && v.is_finite();
        if !positive(self.lr) {
            return bad("lr", self.lr.to_string(), "finite and > 0");
        }
        if !(self.weight_decay >= 0.0 && self.weight_decay.is_finite()) {
            return bad(
                "weight_decay",
                self.weight_decay.to_string(),
                "finite and >= 0",
            );
        }
        let (b1, b2) = self.betas;
        if !((0.0..1.0).contains(&b1) && (0.0..1.0).contains(&b2)) {
            return bad("betas", format!("[{b1}, {b2}]"), "two values in [0, 1)");
        }
        if !positive(self.eps) {
            return bad("eps", self.eps.to_string(), "finite and > 0");
        }
        if !positive(self.max_grad_norm) {
            return bad(
                "max_grad_norm",
                self.max_grad_norm.to_string(),
                "finite and > 0",
            );
        }
        if self.micro_batch_tokens == 0 {
            return bad("micro_batch_tokens", "0".into(), "> 0");
        }
        if !positive(self.temperature) {
            return bad(
                "temperature",
                self.temperature.to_string(),
                "finite and > 0",
            );
        }
        self.grpo.validate()
    }
}

/// One GRPO training row: a generation call's exact sampled ids, the log-probs it was sampled
/// with, and its role-wise advantage ([`crate::role_wise_advantages`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainRow {
    /// Conditioning tokens (never trained), at least one.
    pub prompt_ids: Vec<u32>,
    /// Sampled tokens (trained), at least one.
    pub completion_ids: Vec<u32>,
    /// Per completion token, `log π_old` at sampling time; same length as `completion_ids`.
    pub old_logprobs: Vec<f32>,
    /// The row's advantage, broadcast over its tokens.
    pub advantage: f32,
}

/// What one optimizer step did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StepStats {
    /// The batch loss (the weighted sum of micro-batch losses, i.e. the loss of the whole
    /// batch, `β·ref_kl` included), before the update.
    pub loss: f64,
    /// Global L2 norm of the gradient before clipping.
    pub grad_norm: f64,
    /// Fraction of trained tokens where the PPO clip was active (0 for supervised steps).
    pub clip_frac: f64,
    /// Token mean of `old − new` log-prob (0 for supervised steps).
    pub approx_kl: f64,
    /// k3 KL of the policy to the frozen reference, aggregated as the loss
    /// (`grpo.loss_agg`), before the update; 0 without a reference and for supervised steps.
    #[serde(default)]
    pub ref_kl: f64,
    /// Trained (completion) tokens.
    pub tokens: usize,
    /// Tokens run through the policy's forward pass: padded micro-batch sizes (`rows × longest
    /// row`), or packed lengths with `pack_prefixes`. The reference model of the KL, when
    /// present, runs the same tokens again (not counted).
    #[serde(default)]
    pub forward_tokens: usize,
    /// Wall time of the step, seconds.
    pub seconds: f64,
}

/// What one supervised step did: the step's numbers and each row's own loss.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SftStats {
    /// Loss (token-mean NLL of the batch), grad norm, tokens and seconds of the step.
    pub stats: StepStats,
    /// Per row, in the order given: `Σ −log p` over its completion tokens (nats), before the
    /// update, so a caller can report the loss per role (`Σ row_nll / Σ completion tokens`).
    pub row_nll: Vec<f64>,
}

/// Sums of one gradient accumulation pass (before clipping and the step).
#[derive(Debug, Clone, Copy, Default)]
struct Accumulated {
    loss: f64,
    clip_frac: f64,
    approx_kl: f64,
    ref_kl: f64,
    tokens: usize,
    forward_tokens: usize,
}

/// Trains a [`Model`] in place: the optimizer updates the model's own variables, so every other
/// user of the same handle sees the new weights after [`Learner::step`].
///
/// With `grpo.kl_coef` set it also owns a frozen reference model (see the module docs).
///
/// Grad mode is thread-local in libtorch: call the learner from a dedicated thread.
#[derive(Debug)]
pub struct Learner<'m> {
    model: &'m Model,
    /// The frozen π_ref of the k3 penalty; `Some` exactly when `config.grpo.kl_coef` is.
    reference: Option<Model>,
    /// AdamW, over f32 master weights when the model is bf16 (see [`crate::optimizer`]).
    optimizer: Optimizer,
    config: LearnerConfig,
    steps: u64,
}

impl<'m> Learner<'m> {
    /// An AdamW learner over all trainable variables of `model`, without a reference model.
    ///
    /// # Errors
    /// [`LearnerConfig::validate`]'s errors; [`Error::InvalidRequest`] when `grpo.kl_coef` is
    /// set (the KL needs a reference: use [`Learner::with_reference`]); [`Error::Torch`] if
    /// libtorch cannot build the optimizer.
    pub fn new(model: &'m Model, config: LearnerConfig) -> Result<Self> {
        if let Some(beta) = config.grpo.kl_coef {
            config.validate()?;
            return Err(Error::InvalidRequest(format!(
                "grpo.kl_coef = {beta} needs a frozen reference model: build the learner with \
                 Learner::with_reference, or set grpo.kl_coef = false"
            )));
        }
        Self::build(model, None, config)
    }

    /// An AdamW learner over `model` with `reference` as the frozen π_ref of the k3 KL penalty
    /// (`grpo.kl_coef`). `reference` must be a separate copy of the weights — typically the
    /// same source loaded a second time — since `model` changes in place at every step; it can
    /// live on another device (e.g. the CPU, to spare accelerator memory). Its variables are
    /// marked as not requiring gradients; it is only ever run without autograd.
    ///
    /// # Errors
    /// [`LearnerConfig::validate`]'s errors; [`Error::InvalidRequest`] when `grpo.kl_coef` is
    /// off (a reference would be unused) or when the two models' vocabularies differ;
    /// [`Error::Torch`] if libtorch cannot build the optimizer.
    pub fn with_reference(
        model: &'m Model,
        reference: Model,
        config: LearnerConfig,
    ) -> Result<Self> {
        config.validate()?;
        if config.grpo.kl_coef.is_none() {
            return Err(Error::InvalidRequest(
                "a reference model was given but grpo.kl_coef is off: set grpo.kl_coef, or \
                 build the learner with Learner::new"
                    .into(),
            ));
        }
        check_reference(model, &reference)?;
        Self::build(model, Some(freeze(reference)), config)
    }

    fn build(model: &'m Model, reference: Option<Model>, config: LearnerConfig) -> Result<Self> {
        config.validate()?;
        let optimizer = Optimizer::adamw(
            model,
            AdamWConfig {
                lr: config.lr,
                betas: config.betas,
                eps: config.eps,
                weight_decay: config.weight_decay,
            },
        )?;
        Ok(Self {
            model,
            reference,
            optimizer,
            config,
            steps: 0,
        })
    }

    /// Replaces the reference model (e.g. to re-anchor the KL at the current policy, loaded
    /// from a checkpoint) and returns the previous one. The optimizer state is kept.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] when `grpo.kl_coef` is off or the vocabularies differ; the
    /// current reference is then kept.
    pub fn set_reference(&mut self, reference: Model) -> Result<Option<Model>> {
        if self.config.grpo.kl_coef.is_none() {
            return Err(Error::InvalidRequest(
                "set_reference: grpo.kl_coef is off, so a reference model would be unused".into(),
            ));
        }
        check_reference(self.model, &reference)?;
        Ok(self.reference.replace(freeze(reference)))
    }

    /// The frozen reference model, when `grpo.kl_coef` is set.
    pub fn reference(&self) -> Option<&Model> {
        self.reference.as_ref()
    }

    /// To be called after the model's weights were replaced from outside (a checkpoint load):
    /// with bf16 master weights the masters are re-read and the moments restart
    /// ([`Optimizer::weights_replaced`]).
    ///
    /// # Errors
    /// [`Error::Torch`] from the copy.
    pub fn weights_replaced(&mut self) -> Result<()> {
        self.optimizer.weights_replaced()
    }

    /// Writes what an exact resume needs besides the weights to a safetensors file at `path`,
    /// durably and atomically ([`crate::model::write_atomically`]): the optimizer's state
    /// ([`Optimizer::state`]: AdamW moments, f32 masters, its step count) and the learner's
    /// step count (`learner.steps`, `[1]` i64, for the learning-rate schedule). The frozen KL
    /// reference is not part of it.
    ///
    /// # Errors
    /// [`Error::Torch`] / [`Error::Io`] when the file cannot be written.
    pub fn save_state(&self, path: &std::path::Path) -> Result<()> {
        let mut tensors = self.optimizer.state();
        tensors.push((
            "learner.steps".to_string(),
            Tensor::from_slice(&[self.steps as i64]),
        ));
        let tensors: Vec<(String, Tensor)> = tensors
            .into_iter()
            .map(|(k, t)| t.f_to_device(tch::Device::Cpu).map(|t| (k, t)))
            .collect::<std::result::Result<_, _>>()?;
        crate::model::write_atomically(path, |tmp| {
            Tensor::write_safetensors(&tensors, tmp)?;
            Ok(())
        })
    }

    /// Restores a file written by [`Learner::save_state`] for the same model, after its
    /// weights were loaded: the next step is the one an uninterrupted run would take.
    ///
    /// # Errors
    /// [`Error::Torch`] when the file cannot be read; [`Error::Checkpoint`] when a tensor is
    /// missing or has another shape (nothing is changed then).
    pub fn load_state(&mut self, path: &std::path::Path) -> Result<()> {
        let state: std::collections::HashMap<String, Tensor> =
            Tensor::read_safetensors(path)?.into_iter().collect();
        let steps = state
            .get("learner.steps")
            .ok_or_else(|| Error::Checkpoint {
                path: path.to_path_buf(),
                message: "learner.steps is missing".into(),
            })?
            .f_int64_value(&[0])?;
        self.optimizer.load_state(&state, path)?;
        self.steps = steps.max(0) as u64;
        Ok(())
    }

    /// The configuration the learner runs with.
    pub fn config(&self) -> &LearnerConfig {
        &self.config
    }

    /// Optimizer steps taken so far (GRPO and supervised together).
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The learning rate of step `step` under the configured schedule.
    pub fn lr_at(&self, _step: u64) -> f64 {
        match self.config.schedule {
            LrSchedule::Constant => self.config.lr,
        }
    }

    /// One role-wise GRPO optimizer step on `rows` (DESIGN.md §1): per micro-batch, score the
    /// completions with autograd (and, with `grpo.kl_coef`, with the reference model without
    /// autograd), [`ppo_loss`] against `old_logprobs` and the advantages, scale by the
    /// micro-batch's share of the aggregation weight and backpropagate; then clip
    /// the global gradient norm, step AdamW and zero the gradients.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for no rows, an empty prompt or completion, `old_logprobs` of
    /// the wrong length, a non-finite advantage or old log-prob, an id outside the vocabulary,
    /// or a non-finite gradient (the step is then skipped and the gradients dropped);
    /// [`Error::ContextOverflow`] for a row longer than the context; [`Error::Torch`].
    pub fn step(&mut self, rows: &[TrainRow]) -> Result<StepStats> {
        let start = Instant::now();
        validate_rows(rows)?;
        self.optimizer.zero_grad();
        let acc = match self.accumulate_gradients(rows, self.config.micro_batch_tokens) {
            Ok(acc) => acc,
            Err(e) => {
                self.optimizer.zero_grad();
                return Err(e);
            }
        };
        let grad_norm = self.clip_and_step()?;
        Ok(StepStats {
            loss: acc.loss,
            grad_norm,
            clip_frac: acc.clip_frac,
            approx_kl: acc.approx_kl,
            ref_kl: acc.ref_kl,
            tokens: acc.tokens,
            forward_tokens: acc.forward_tokens,
            seconds: start.elapsed().as_secs_f64(),
        })
    }

    /// One supervised optimizer step for the warm-up: the token-mean negative log-likelihood of
    /// the completion tokens given their prompts (prompt tokens are not trained), at the
    /// configured temperature, accumulated over micro-batches, then clip, AdamW step, zero.
    ///
    /// # Errors
    /// As [`Learner::step`] (no rows, empty prompt or completion, bad ids, context overflow,
    /// non-finite gradient).
    pub fn sft_step(&mut self, rows: &[ScoreRow]) -> Result<SftStats> {
        let start = Instant::now();
        if rows.is_empty() {
            return Err(Error::InvalidRequest("sft_step: no rows".into()));
        }
        for (i, r) in rows.iter().enumerate() {
            if r.prompt_ids.is_empty() || r.completion_ids.is_empty() {
                return Err(Error::InvalidRequest(format!(
                    "sft row {i}: prompt ({} tokens) and completion ({} tokens) must be non-empty",
                    r.prompt_ids.len(),
                    r.completion_ids.len()
                )));
            }
        }
        self.optimizer.zero_grad();
        let total: usize = rows.iter().map(|r| r.completion_ids.len()).sum();
        let pack = self.config.pack_prefixes;
        let result = tch::with_grad(|| -> Result<(f64, usize, Vec<f64>)> {
            let (mut loss_sum, mut forward_tokens) = (0.0, 0);
            let mut row_nll = Vec::with_capacity(rows.len());
            for range in groups(rows, self.config.micro_batch_tokens, pack) {
                let (batch, forward, tape) = score_group(
                    self.model,
                    &rows[range],
                    self.config.temperature,
                    pack,
                    self.config.checkpoint_activations,
                )?;
                forward_tokens += forward;
                // Padding log-probs are already 0, so the sums are over real tokens only.
                let per_row = batch.logprobs.f_sum_dim_intlist(1, false, Kind::Double)?;
                row_nll.extend(
                    Vec::<f64>::try_from(per_row.detach().f_to_device(tch::Device::Cpu)?)?
                        .into_iter()
                        .map(|lp| -lp),
                );
                let loss = -batch.logprobs.sum(Kind::Float) / total as f64;
                loss.f_backward()?;
                if let Some(tape) = tape {
                    tape.backward()?;
                }
                loss_sum += loss.double_value(&[]);
            }
            Ok((loss_sum, forward_tokens, row_nll))
        });
        let (loss, forward_tokens, row_nll) = match result {
            Ok(l) => l,
            Err(e) => {
                self.optimizer.zero_grad();
                return Err(e);
            }
        };
        let grad_norm = self.clip_and_step()?;
        Ok(SftStats {
            stats: StepStats {
                loss,
                grad_norm,
                clip_frac: 0.0,
                approx_kl: 0.0,
                ref_kl: 0.0,
                tokens: total,
                forward_tokens,
                seconds: start.elapsed().as_secs_f64(),
            },
            row_nll,
        })
    }

    /// Runs forward and backward over `rows` in micro-batches of `max_tokens` padded tokens
    /// (packed tokens with `pack_prefixes`), leaving the accumulated gradient of the whole batch's loss in the parameters' `.grad`.
    /// `rows` must have passed [`validate_rows`].
    fn accumulate_gradients(
        &mut self,
        rows: &[TrainRow],
        max_tokens: usize,
    ) -> Result<Accumulated> {
        let agg = self.config.grpo.loss_agg;
        // Every row has at least one completion token, so the batch weight is known up front.
        let tokens: usize = rows.iter().map(|r| r.completion_ids.len()).sum();
        let total_weight = match agg {
            LossAggregation::TokenMean => tokens as f64,
            LossAggregation::SeqMeanTokenMean => rows.len() as f64,
        };
        let score_rows: Vec<ScoreRow> = rows
            .iter()
            .map(|r| ScoreRow {
                prompt_ids: r.prompt_ids.clone(),
                completion_ids: r.completion_ids.clone(),
            })
            .collect();
        let device = self.model.device();
        let pack = self.config.pack_prefixes;
        tch::with_grad(|| {
            let mut acc = Accumulated {
                tokens,
                ..Accumulated::default()
            };
            for range in groups(&score_rows, max_tokens, pack) {
                let part = &rows[range.clone()];
                let scored_rows = &score_rows[range];
                let (batch, forward, tape) = score_group(
                    self.model,
                    scored_rows,
                    self.config.temperature,
                    pack,
                    self.config.checkpoint_activations,
                )?;
                acc.forward_tokens += forward;
                let width = batch.logprobs.size()[1] as usize;
                let mut old = vec![0f32; part.len() * width];
                for (i, r) in part.iter().enumerate() {
                    old[i * width..i * width + r.old_logprobs.len()]
                        .copy_from_slice(&r.old_logprobs);
                }
                let old = Tensor::from_slice(&old)
                    .view([part.len() as i64, width as i64])
                    .to_device(device);
                let adv: Vec<f32> = part.iter().map(|r| r.advantage).collect();
                let adv = Tensor::from_slice(&adv).to_device(device);
                // Same rows, so the same `[rows, longest completion]` layout as `batch`.
                let reference = match &self.reference {
                    Some(r) => {
                        let (scored, _, _) = tch::no_grad(|| {
                            score_group(r, scored_rows, self.config.temperature, pack, false)
                        })?;
                        Some(scored.logprobs.to_device(device))
                    }
                    None => None,
                };
                let (loss, stats) = ppo_loss(
                    &batch.logprobs,
                    &old,
                    &adv,
                    &batch.mask,
                    reference.as_ref(),
                    &self.config.grpo,
                )?;
                let share = stats.weight(agg) / total_weight;
                (loss * share).f_backward()?;
                if let Some(tape) = tape {
                    tape.backward()?;
                }
                let beta = self.config.grpo.kl_coef.unwrap_or(0.0);
                acc.loss += (stats.pg_loss + beta * stats.kl) * share;
                acc.ref_kl += stats.kl * share;
                acc.clip_frac += stats.clip_frac * stats.tokens / tokens as f64;
                acc.approx_kl += stats.approx_kl * stats.tokens / tokens as f64;
            }
            Ok(acc)
        })
    }

    /// Clips the accumulated gradient to `max_grad_norm`, steps the optimizer and zeroes the
    /// gradients; returns the norm before clipping. A non-finite norm skips the step.
    fn clip_and_step(&mut self) -> Result<f64> {
        let norm = clip_gradients(self.model, self.config.max_grad_norm);
        let norm = match norm {
            Ok(n) if n.is_finite() => n,
            Ok(n) => {
                self.optimizer.zero_grad();
                return Err(Error::InvalidRequest(format!(
                    "gradient norm is {n}; step {} skipped",
                    self.steps
                )));
            }
            Err(e) => {
                self.optimizer.zero_grad();
                return Err(e);
            }
        };
        self.optimizer.set_lr(self.lr_at(self.steps));
        let stepped = self.optimizer.step();
        self.optimizer.zero_grad();
        stepped?;
        self.steps += 1;
        Ok(norm)
    }
}

/// Marks every variable of `reference` as not requiring gradients: it is π_ref, never trained.
fn freeze(reference: Model) -> Model {
    for v in reference.var_store().variables().values() {
        let _frozen = v.set_requires_grad(false);
    }
    reference
}

/// A reference must score the same token ids as the policy.
fn check_reference(model: &Model, reference: &Model) -> Result<()> {
    let (p, r) = (model.config().vocab_size, reference.config().vocab_size);
    if p != r {
        return Err(Error::InvalidRequest(format!(
            "reference model has a vocabulary of {r} tokens, the policy {p}: a reference must \
             share the policy's tokenizer"
        )));
    }
    Ok(())
}

/// The global L2 norm of the gradients of `model`'s trainable variables (those that have one),
/// computed in f32 over all of them as one vector.
fn grad_norm(model: &Model) -> Result<f64> {
    tch::no_grad(|| {
        let mut sq = 0.0;
        for v in model.var_store().trainable_variables() {
            let g = v.grad();
            if g.defined() {
                sq += g
                    .f_to_kind(Kind::Float)?
                    .f_square()?
                    .f_sum(Kind::Double)?
                    .double_value(&[]);
            }
        }
        Ok(sq.sqrt())
    })
}

/// Scales the gradients so their global norm is at most `max` (as `torch.nn.utils.
/// clip_grad_norm_`: coefficient `max / (norm + 1e-6)` when below 1); returns the norm before
/// clipping. Gradients with a non-finite norm are left as they are.
fn clip_gradients(model: &Model, max: f64) -> Result<f64> {
    let norm = grad_norm(model)?;
    let coef = max / (norm + 1e-6);
    if norm.is_finite() && coef < 1.0 {
        tch::no_grad(|| -> Result<()> {
            for v in model.var_store().trainable_variables() {
                let mut g = v.grad();
                if g.defined() {
                    let _scaled = g.f_mul_scalar_(coef)?;
                }
            }
            Ok(())
        })?;
    }
    Ok(norm)
}

/// The micro-batches of `rows` under a budget of `max_tokens`: packed tokens
/// ([`pack_groups`]) when `packed`, padded tokens ([`micro_batches`]) otherwise.
fn groups(rows: &[ScoreRow], max_tokens: usize, packed: bool) -> Vec<std::ops::Range<usize>> {
    if packed {
        pack_groups(rows, max_tokens)
    } else {
        micro_batches(rows, max_tokens)
    }
}

/// Scores one micro-batch, prefix-packed ([`crate::packing::score_packed`]) when `packed`,
/// padded ([`crate::scoring::score`]) otherwise; also returns the tokens run through the forward pass (packed
/// length, or `rows × longest row`) and, with `checkpoint`, the tape to run after the loss's
/// backward.
fn score_group<'m>(
    model: &'m Model,
    rows: &[ScoreRow],
    temperature: f64,
    packed: bool,
    checkpoint: bool,
) -> Result<(crate::scoring::ScoredBatch, usize, Option<LayerTape<'m>>)> {
    if packed {
        score_packed_counted(model, rows, temperature, checkpoint)
    } else {
        let longest = rows.iter().map(ScoreRow::len).max().unwrap_or(0);
        let (batch, tape) = score_with(model, rows, temperature, checkpoint)?;
        Ok((batch, rows.len() * longest, tape))
    }
}

/// Checks what [`crate::scoring::score`] does not: no rows, empty prompt or completion, `old_logprobs` length,
/// finiteness of advantages and old log-probs.
fn validate_rows(rows: &[TrainRow]) -> Result<()> {
    if rows.is_empty() {
        return Err(Error::InvalidRequest("learner step: no rows".into()));
    }
    for (i, r) in rows.iter().enumerate() {
        if r.prompt_ids.is_empty() || r.completion_ids.is_empty() {
            return Err(Error::InvalidRequest(format!(
                "train row {i}: prompt ({} tokens) and completion ({} tokens) must be non-empty",
                r.prompt_ids.len(),
                r.completion_ids.len()
            )));
        }
        if r.old_logprobs.len() != r.completion_ids.len() {
            return Err(Error::InvalidRequest(format!(
                "train row {i}: {} old log-probs for {} completion tokens",
                r.old_logprobs.len(),
                r.completion_ids.len()
            )));
        }
        if !r.advantage.is_finite() {
            return Err(Error::InvalidRequest(format!(
                "train row {i}: advantage is {}",
                r.advantage
            )));
        }
        if let Some(j) = r.old_logprobs.iter().position(|l| !l.is_finite()) {
            return Err(Error::InvalidRequest(format!(
                "train row {i}: old log-prob of token {j} is {}",
                r.old_logprobs[j]
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scoring::score_no_grad;
    use crate::ModelConfig;
    use tch::Device;

    fn tiny(seed: u64) -> Model {
        Model::random(&ModelConfig::tiny(), seed, Device::Cpu, Kind::Float).unwrap()
    }

    fn ids(n: usize, k: u32) -> Vec<u32> {
        (0..n as u32)
            .map(|t| 10 + (t * 31 + k * 7) % 3000)
            .collect()
    }

    /// Rows of different prompt and completion lengths, old log-probs near the model's own
    /// (so both clipped and unclipped tokens occur) and advantages of both signs.
    fn rows(model: &Model) -> Vec<TrainRow> {
        let shapes = [(3, 5), (7, 2), (2, 9), (5, 4), (4, 1)];
        let score_rows: Vec<ScoreRow> = shapes
            .iter()
            .enumerate()
            .map(|(k, &(p, c))| ScoreRow {
                prompt_ids: ids(p, k as u32),
                completion_ids: ids(c, 100 + k as u32),
            })
            .collect();
        let current = score_no_grad(model, &score_rows, 1.0, 4096).unwrap();
        score_rows
            .into_iter()
            .zip(current)
            .enumerate()
            .map(|(k, (r, lp))| TrainRow {
                prompt_ids: r.prompt_ids,
                completion_ids: r.completion_ids,
                old_logprobs: lp
                    .iter()
                    .enumerate()
                    .map(|(j, l)| l + 0.3 * (((j + k) % 3) as f32 - 1.0))
                    .collect(),
                advantage: [1.0, -0.5, 0.25, -1.0, 0.75][k],
            })
            .collect()
    }

    fn grads(model: &Model) -> Vec<Tensor> {
        model
            .var_store()
            .trainable_variables()
            .iter()
            .map(|v| v.grad().copy())
            .collect()
    }

    fn params(model: &Model) -> Vec<Tensor> {
        tch::no_grad(|| {
            model
                .var_store()
                .trainable_variables()
                .iter()
                .map(Tensor::copy)
                .collect()
        })
    }

    fn max_abs_diff(a: &[Tensor], b: &[Tensor]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs().max().double_value(&[]))
            .fold(0.0, f64::max)
    }

    fn completion_logprob_sum(model: &Model, row: &TrainRow) -> f64 {
        let r = ScoreRow {
            prompt_ids: row.prompt_ids.clone(),
            completion_ids: row.completion_ids.clone(),
        };
        score_no_grad(model, &[r], 1.0, 4096).unwrap()[0]
            .iter()
            .map(|&l| f64::from(l))
            .sum()
    }

    /// Accumulating over one-row micro-batches gives the gradient of the whole batch, for
    /// both aggregations.
    #[test]
    fn micro_batch_accumulation_equals_one_batch() {
        for agg in [
            LossAggregation::TokenMean,
            LossAggregation::SeqMeanTokenMean,
        ] {
            let model = tiny(3);
            let batch = rows(&model);
            let config = LearnerConfig {
                grpo: GrpoConfig {
                    loss_agg: agg,
                    ..GrpoConfig::default()
                },
                ..LearnerConfig::default()
            };
            let mut learner = Learner::new(&model, config).unwrap();
            assert_eq!(micro_batches_of(&batch, 1).len(), batch.len());

            learner.optimizer.zero_grad();
            let whole = learner.accumulate_gradients(&batch, 1 << 20).unwrap();
            let g_whole = grads(&model);
            learner.optimizer.zero_grad();
            let split = learner.accumulate_gradients(&batch, 1).unwrap();
            let g_split = grads(&model);
            learner.optimizer.zero_grad();

            let scale = g_whole
                .iter()
                .map(|g| g.abs().max().double_value(&[]))
                .fold(0.0, f64::max);
            assert!(
                scale > 1e-4,
                "{agg:?}: gradient too small to compare: {scale}"
            );
            let diff = max_abs_diff(&g_whole, &g_split);
            assert!(
                diff < 1e-5,
                "{agg:?}: max grad difference {diff} (scale {scale})"
            );
            assert!(
                (whole.loss - split.loss).abs() < 1e-5,
                "{agg:?}: {whole:?} vs {split:?}"
            );
            assert!(whole.clip_frac > 0.0 && whole.clip_frac < 1.0, "{whole:?}");
            assert!(
                (whole.clip_frac - split.clip_frac).abs() < 1e-6,
                "{whole:?} vs {split:?}"
            );
            assert!((whole.approx_kl - split.approx_kl).abs() < 1e-6);
            assert_eq!(whole.tokens, 21);
        }
    }

    fn micro_batches_of(rows: &[TrainRow], max_tokens: usize) -> Vec<std::ops::Range<usize>> {
        let s: Vec<ScoreRow> = rows
            .iter()
            .map(|r| ScoreRow {
                prompt_ids: r.prompt_ids.clone(),
                completion_ids: r.completion_ids.clone(),
            })
            .collect();
        micro_batches(&s, max_tokens)
    }

    #[test]
    fn sft_steps_reduce_the_loss() {
        let model = tiny(5);
        let config = LearnerConfig {
            lr: 1e-3,
            micro_batch_tokens: 16,
            ..LearnerConfig::default()
        };
        let mut learner = Learner::new(&model, config).unwrap();
        let batch: Vec<ScoreRow> = (0..4)
            .map(|k| ScoreRow {
                prompt_ids: ids(3 + k, k as u32),
                completion_ids: ids(4, 50 + k as u32),
            })
            .collect();
        let losses: Vec<f64> = (0..6)
            .map(|_| learner.sft_step(&batch).unwrap().stats.loss)
            .collect();
        // Random init: the loss starts near ln(vocab) ≈ 10.8.
        assert!((losses[0] - 49152f64.ln()).abs() < 0.5, "{losses:?}");
        assert!(losses[5] < losses[0] - 0.5, "{losses:?}");
        assert_eq!(learner.steps(), 6);
    }

    #[test]
    fn advantage_sign_sets_the_direction_of_the_update() {
        for sign in [1.0f32, -1.0] {
            let model = tiny(9);
            let config = LearnerConfig {
                lr: 1e-3,
                ..LearnerConfig::default()
            };
            let mut learner = Learner::new(&model, config).unwrap();
            let mut row = rows(&model).swap_remove(0);
            // Ratio 1: old log-probs are the current ones.
            row.old_logprobs = score_no_grad(
                &model,
                &[ScoreRow {
                    prompt_ids: row.prompt_ids.clone(),
                    completion_ids: row.completion_ids.clone(),
                }],
                1.0,
                4096,
            )
            .unwrap()
            .remove(0);
            row.advantage = sign;
            let before = completion_logprob_sum(&model, &row);
            let stats = learner.step(std::slice::from_ref(&row)).unwrap();
            let after = completion_logprob_sum(&model, &row);
            assert!(stats.approx_kl.abs() < 1e-5, "{stats:?}");
            assert_eq!(stats.clip_frac, 0.0);
            assert!((stats.loss + f64::from(sign)).abs() < 1e-5, "{stats:?}");
            if sign > 0.0 {
                assert!(after > before + 1e-3, "A=+1: {before} → {after}");
            } else {
                assert!(after < before - 1e-3, "A=-1: {before} → {after}");
            }
        }
    }

    #[test]
    fn gradients_are_clipped_to_the_configured_norm() {
        let model = tiny(11);
        let config = LearnerConfig {
            max_grad_norm: 1e-3,
            ..LearnerConfig::default()
        };
        let mut learner = Learner::new(&model, config).unwrap();
        let batch = rows(&model);

        learner.optimizer.zero_grad();
        learner.accumulate_gradients(&batch, 4096).unwrap();
        let raw = grads(&model);
        let pre = clip_gradients(&model, 1e-3).unwrap();
        let post = grad_norm(&model).unwrap();
        assert!(pre > 1e-2, "pre-clip norm {pre}");
        assert!((post - 1e-3).abs() < 1e-6, "post-clip norm {post}");
        // Clipping rescales, it does not change the direction.
        let clipped = grads(&model);
        let coef = 1e-3 / (pre + 1e-6);
        let rescaled: Vec<Tensor> = raw.iter().map(|g| g * coef).collect();
        assert!(max_abs_diff(&clipped, &rescaled) < 1e-9);
        learner.optimizer.zero_grad();

        // A full step reports the pre-clip norm; AdamW's first update is at most lr per
        // element (m̂/√v̂ = ±1) plus decoupled weight decay, whatever the gradient scale, up to
        // f32 rounding of parameters near 1 (one ulp there is 1.2e-7).
        let before = params(&model);
        let stats = learner.step(&batch).unwrap();
        assert!(stats.grad_norm > 1e-3, "{stats:?}");
        let change = max_abs_diff(&before, &params(&model));
        let lr = learner.config().lr;
        let bound = lr * (1.0 + learner.config().weight_decay) + 2.5e-7;
        assert!(
            change > 0.5 * lr && change <= bound,
            "change {change}, bound {bound}"
        );
        // Gradients are zeroed after the step.
        assert_eq!(grad_norm(&model).unwrap(), 0.0);
    }

    #[test]
    fn invalid_rows_are_rejected() {
        let model = tiny(1);
        let mut learner = Learner::new(&model, LearnerConfig::default()).unwrap();
        let good = TrainRow {
            prompt_ids: vec![1, 2],
            completion_ids: vec![3, 4, 5],
            old_logprobs: vec![-1.0; 3],
            advantage: 0.5,
        };
        let mut err = |rows: &[TrainRow]| learner_err(&mut learner, rows);
        assert!(err(&[]).contains("no rows"));
        let mut short = good.clone();
        short.old_logprobs.pop();
        let msg = err(&[good.clone(), short]);
        assert!(
            msg.contains("train row 1") && msg.contains("2 old log-probs for 3"),
            "{msg}"
        );
        let mut empty = good.clone();
        empty.completion_ids.clear();
        empty.old_logprobs.clear();
        assert!(err(&[empty]).contains("non-empty"));
        let mut nan = good.clone();
        nan.advantage = f32::NAN;
        assert!(err(&[nan]).contains("advantage"));
        let mut vocab = good.clone();
        vocab.completion_ids[0] = 49_152;
        assert!(err(&[vocab]).contains("outside the vocabulary"));
        assert!(learner
            .sft_step(&[ScoreRow {
                prompt_ids: vec![],
                completion_ids: vec![1]
            }])
            .unwrap_err()
            .to_string()
            .contains("non-empty"));
        // Nothing was stepped, and no gradient was left behind.
        assert_eq!(learner.steps(), 0);
        assert_eq!(grad_norm(&model).unwrap(), 0.0);
        learner.step(&[good]).unwrap();
        assert_eq!(learner.steps(), 1);
    }

    fn learner_err(learner: &mut Learner<'_>, rows: &[TrainRow]) -> String {
        learner.step(rows).unwrap_err().to_string()
    }

    #[test]
    fn config_defaults_and_validation() {
        let c = LearnerConfig::default();
        assert_eq!(c.lr, 1e-6);
        assert_eq!(c.betas, (0.9, 0.999));
        c.validate().unwrap();
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<LearnerConfig>(&json).unwrap(), c);
        let partial: LearnerConfig =
            serde_json::from_str(r#"{"lr": 1e-5, "schedule": "constant"}"#).unwrap();
        assert_eq!(partial.lr, 1e-5);
        assert_eq!(partial.max_grad_norm, 1.0);
        assert!(serde_json::from_str::<LearnerConfig>(r#"{"learning_rate": 1.0}"#).is_err());
        let bad = LearnerConfig {
            max_grad_norm: 0.0,
            ..LearnerConfig::default()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("max_grad_norm"));
        // kl_coef is a valid value; whether a reference comes with it is the learner's check.
        let kl = LearnerConfig {
            grpo: GrpoConfig {
                kl_coef: Some(0.001),
                ..GrpoConfig::default()
            },
            ..LearnerConfig::default()
        };
        kl.validate().unwrap();
        // Old serialised stats without `ref_kl` still read.
        let old = r#"{"loss": 1.0, "grad_norm": 2.0, "clip_frac": 0.0, "approx_kl": 0.0,
                      "tokens": 3, "seconds": 0.1}"#;
        let stats: StepStats = serde_json::from_str(old).unwrap();
        assert_eq!((stats.tokens, stats.ref_kl), (3, 0.0));
    }

    /// An exact copy of `model`'s weights. (`Model::random` with the same seed is not one:
    /// libtorch's generator is process-wide and tests build models on parallel threads.)
    fn copy_of(model: &Model) -> Model {
        let copy = tiny(0);
        tch::no_grad(|| {
            let src = model.var_store().variables();
            for (name, dst) in copy.var_store().variables() {
                let mut dst = dst;
                dst.copy_(&src[&name]);
            }
        });
        copy
    }

    fn kl_config(beta: f64) -> LearnerConfig {
        LearnerConfig {
            lr: 1e-3,
            grpo: GrpoConfig {
                kl_coef: Some(beta),
                ..GrpoConfig::default()
            },
            ..LearnerConfig::default()
        }
    }

    /// A reference is required exactly when `grpo.kl_coef` is set, and must share the
    /// vocabulary.
    #[test]
    fn reference_is_required_iff_kl_coef_is_set() {
        let model = tiny(2);
        let err = Learner::new(&model, kl_config(0.1))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("grpo.kl_coef") && err.contains("reference"),
            "{err}"
        );
        let err = Learner::with_reference(&model, tiny(2), LearnerConfig::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("grpo.kl_coef is off"), "{err}");
        let small_vocab = ModelConfig {
            vocab_size: 512,
            ..ModelConfig::tiny()
        };
        let other = Model::random(&small_vocab, 2, Device::Cpu, Kind::Float).unwrap();
        let err = Learner::with_reference(&model, other, kl_config(0.1))
            .unwrap_err()
            .to_string();
        assert!(err.contains("vocabulary of 512"), "{err}");

        let mut learner = Learner::with_reference(&model, tiny(2), kl_config(0.1)).unwrap();
        assert!(learner.reference().is_some());
        let reference = learner.reference().unwrap();
        assert!(reference
            .var_store()
            .trainable_variables()
            .iter()
            .all(|v| !v.requires_grad()));
        let previous = learner.set_reference(tiny(4)).unwrap();
        assert!(previous.is_some());
        let mut plain = Learner::new(&model, LearnerConfig::default()).unwrap();
        assert!(plain.set_reference(tiny(2)).is_err());
        assert!(plain.reference().is_none());
    }

    /// With a reference identical to the policy the first step's KL is 0; advantages that push
    /// the policy make it positive and equal to the k3 mean computed by hand from the two
    /// models' own log-probs; micro-batching leaves it unchanged.
    #[test]
    fn reference_kl_starts_at_zero_and_grows_as_the_policy_moves() {
        let model = tiny(6);
        let config = LearnerConfig {
            micro_batch_tokens: 16,
            ..kl_config(0.05)
        };
        let mut learner = Learner::with_reference(&model, copy_of(&model), config).unwrap();
        let mut batch = rows(&model);
        let first = learner.step(&batch).unwrap();
        assert!(first.ref_kl.abs() < 1e-7, "{first:?}");
        let mut kls = vec![first.ref_kl];
        for _ in 0..4 {
            // On-policy old log-probs, so the PPO ratio never clips the push.
            let now = score_no_grad(&model, &score_rows_of(&batch), 1.0, 4096).unwrap();
            for (r, lp) in batch.iter_mut().zip(now) {
                r.old_logprobs = lp;
            }
            // The KL stats are taken before the update: compare with a hand-computed k3 now.
            let policy = score_no_grad(&model, &score_rows_of(&batch), 1.0, 4096).unwrap();
            let reference = score_no_grad(
                learner.reference().unwrap(),
                &score_rows_of(&batch),
                1.0,
                4096,
            )
            .unwrap();
            let (mut sum, mut n) = (0.0, 0.0);
            for (p, r) in policy.iter().zip(&reference) {
                for (&p, &r) in p.iter().zip(r) {
                    let d = f64::from(r - p);
                    sum += d.exp() - d - 1.0;
                    n += 1.0;
                }
            }
            let stats = learner.step(&batch).unwrap();
            assert!(
                (stats.ref_kl - sum / n).abs() < 1e-5 * (1.0 + sum / n),
                "{} vs {}",
                stats.ref_kl,
                sum / n
            );
            kls.push(stats.ref_kl);
        }
        assert!(kls[4] > 1e-4 && kls[4] > kls[1], "{kls:?}");

        // The whole batch in one piece gives the same KL as one-row micro-batches.
        learner.optimizer.zero_grad();
        let whole = learner.accumulate_gradients(&batch, 1 << 20).unwrap();
        let split = learner.accumulate_gradients(&batch, 1).unwrap();
        learner.optimizer.zero_grad();
        // f32 sums in another order: equal within f32 rounding of the value (~1e-7 relative).
        assert!(
            (whole.ref_kl - split.ref_kl).abs() < 1e-6 * (1.0 + whole.ref_kl.abs()),
            "{whole:?} vs {split:?}"
        );
        assert!(
            (whole.loss - split.loss).abs() < 1e-6,
            "{whole:?} vs {split:?}"
        );
    }

    fn score_rows_of(rows: &[TrainRow]) -> Vec<ScoreRow> {
        rows.iter()
            .map(|r| ScoreRow {
                prompt_ids: r.prompt_ids.clone(),
                completion_ids: r.completion_ids.clone(),
            })
            .collect()
    }

    /// Rows that share a prompt prefix (one trajectory's Act and Rehearse rows), so a packed
    /// micro-batch has a trunk and branch segments.
    fn shared_prefix_rows(model: &Model) -> Vec<TrainRow> {
        let trunk = ids(12, 0);
        let mut out = rows(model);
        for (k, r) in out.iter_mut().enumerate() {
            let own = std::mem::take(&mut r.prompt_ids);
            r.prompt_ids = trunk[..4 + 2 * k].iter().chain(&own).copied().collect();
        }
        out
    }

    /// `learner.checkpoint_activations` gives the gradients of the plain backward: GRPO
    /// (padded and packed micro-batches, several per batch) and the warm-up's SFT step.
    #[test]
    fn checkpointed_gradients_equal_plain_ones() {
        for pack_prefixes in [false, true] {
            let model = tiny(5);
            let batch = shared_prefix_rows(&model);
            let mut grads_of = Vec::new();
            for checkpoint_activations in [false, true] {
                let config = LearnerConfig {
                    pack_prefixes,
                    checkpoint_activations,
                    ..LearnerConfig::default()
                };
                let mut learner = Learner::new(&model, config).unwrap();
                learner.optimizer.zero_grad();
                let stats = learner.accumulate_gradients(&batch, 40).unwrap();
                grads_of.push((grads(&model), stats));
                learner.optimizer.zero_grad();
            }
            let ((plain, a), (checkpointed, b)) = (&grads_of[0], &grads_of[1]);
            let scale = plain
                .iter()
                .map(|g| g.abs().max().double_value(&[]))
                .fold(0.0, f64::max);
            assert!(scale > 1e-4, "gradient too small to compare: {scale}");
            let diff = max_abs_diff(plain, checkpointed);
            assert!(
                diff < 1e-5,
                "packed {pack_prefixes}: max grad difference {diff} (scale {scale})"
            );
            assert!((a.loss - b.loss).abs() < 1e-6, "{a:?} vs {b:?}");
            assert_eq!(a.forward_tokens, b.forward_tokens);
            assert!(a.forward_tokens > 40, "several micro-batches: {a:?}");
        }

        // SFT: the same step from the same weights lands on the same weights. AdamW's first
        // update is lr·g/(|g| + eps): eps = 1e-4 keeps rounding in g below the bound.
        let batch = score_rows_of(&shared_prefix_rows(&tiny(5)));
        let mut after = Vec::new();
        for checkpoint_activations in [false, true] {
            let model = tiny(5);
            let config = LearnerConfig {
                pack_prefixes: true,
                checkpoint_activations,
                lr: 1e-3,
                eps: 1e-4,
                micro_batch_tokens: 40,
                ..LearnerConfig::default()
            };
            let mut learner = Learner::new(&model, config).unwrap();
            let stats = learner.sft_step(&batch).unwrap();
            after.push((params(&model), stats));
        }
        let ((plain, a), (checkpointed, b)) = (&after[0], &after[1]);
        let moved = max_abs_diff(plain, &params(&tiny(5)));
        assert!(moved > 5e-4, "the step moved weights by {moved}");
        let diff = max_abs_diff(plain, checkpointed);
        assert!(diff < 1e-5, "weights differ by {diff} after one SFT step");
        assert!((a.stats.loss - b.stats.loss).abs() < 1e-6, "{a:?} vs {b:?}");
        assert_eq!(a.row_nll.len(), b.row_nll.len());
    }
}
