//! The decoder: Llama / SmolLM2, Qwen2 (q/k/v bias) and Qwen3 (q/k norm) in one implementation.
//!
//! RMSNorm, RoPE (HF `rotate_half` layout), grouped-query attention through libtorch's
//! `scaled_dot_product_attention`, SwiGLU MLP, optionally tied embeddings. The same weights serve
//! training ([`Model::forward_hidden`], autograd) and inference with a KV cache
//! ([`Model::prefill`], [`Model::decode`]).
//!
//! Parameters live in one [`nn::VarStore`], the handle the optimizer steps. At load the q, k and v
//! projections are fused into one matrix and gate/up into another (two matmuls fewer per layer),
//! and every projection is stored `[in, out]` (transposed from HF's `[out, in]`): on the CPU,
//! MKL's GEMM at decode-sized batches (1–32 rows) runs 15–20 % faster on that layout than on
//! `linear`'s transposed operand (measured on the 2-core reference machine).

use tch::{nn, Device, Kind, Tensor};

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::kv_cache::KvCache;
use crate::weights::Weights;

/// RoPE angles, computed per forward pass from the positions as HF does (no table sized by the
/// context length, which a corrupt config could make huge).
#[derive(Debug)]
pub(crate) struct Rope {
    /// `[head_dim / 2]` f32: `1/θ^(2i/d)`.
    inv_freq: Tensor,
    dtype: Kind,
}

impl Rope {
    fn new(config: &ModelConfig, device: Device, dtype: Kind) -> Self {
        let d = config.head_dim as i64;
        let exponent = Tensor::arange_start_step(0, d, 2, (Kind::Int64, device))
            .to_kind(Kind::Float)
            / d as f64;
        let inv_freq = Tensor::from(config.rope_theta as f32)
            .to_device(device)
            .pow(&exponent)
            .reciprocal();
        Self { inv_freq, dtype }
    }

    /// `cos, sin: [batch, 1, seq, head_dim]` (model dtype) for `positions: [batch, seq]` i64;
    /// angles in f32, duplicated over both halves (`rotate_half` convention).
    pub(crate) fn tables(&self, positions: &Tensor) -> (Tensor, Tensor) {
        let freqs = positions.to_kind(Kind::Float).unsqueeze(-1) * &self.inv_freq;
        let emb = Tensor::cat(&[&freqs, &freqs], -1).unsqueeze(1);
        (emb.cos().to_kind(self.dtype), emb.sin().to_kind(self.dtype))
    }
}

/// `x * cos + rotate_half(x) * sin` for `x: [batch, heads, seq, head_dim]`.
fn apply_rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    let halves = x.chunk(2, -1);
    let rotated = Tensor::cat(&[&halves[1].neg(), &halves[0]], -1);
    x * cos + rotated * sin
}

#[derive(Debug)]
pub(crate) struct Layer {
    input_norm: Tensor,
    /// `[hidden, (heads + 2·kv_heads)·head_dim]`
    qkv: Tensor,
    qkv_bias: Option<Tensor>,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    /// `[heads·head_dim, hidden]`
    o_proj: Tensor,
    post_norm: Tensor,
    /// `[hidden, 2·ffn]`: gate columns then up columns.
    gate_up: Tensor,
    /// `[ffn, hidden]`
    down: Tensor,
}

/// How a forward pass attends, chosen by the caller.
enum Attention<'a> {
    /// Causal over the given tokens only (training, scoring, fresh prefill).
    Causal,
    /// One new token per cache slot, attending to that slot's cache (decode).
    Cached {
        cache: &'a mut KvCache,
        layer: usize,
        /// `[slots]` i64: where each slot's new token goes.
        positions: &'a Tensor,
        /// `[slots, 1, 1, keys]` bool: which cached positions each slot may see.
        mask: &'a Tensor,
    },
}

/// A decoder-only transformer on one device, in one dtype.
#[derive(Debug)]
pub struct Model {
    config: ModelConfig,
    vs: nn::VarStore,
    dtype: Kind,
    pub(crate) embed: Tensor,
    pub(crate) layers: Vec<Layer>,
    norm: Tensor,
    /// `None` when tied to `embed`.
    lm_head: Option<Tensor>,
    pub(crate) rope: Rope,
}

impl Model {
    /// Builds the model from HF-named f32 weights (see [`Weights`]), moving them to `device` in
    /// `dtype` (`Kind::Float` or `Kind::BFloat16`).
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid config or dtype, [`Error::MissingTensor`],
    /// [`Error::ShapeMismatch`] and [`Error::UnexpectedTensors`] when the weights do not fit it.
    pub fn from_weights(
        config: &ModelConfig,
        mut weights: Weights,
        device: Device,
        dtype: Kind,
    ) -> Result<Self> {
        config.validate()?;
        if !matches!(dtype, Kind::Float | Kind::BFloat16 | Kind::Half) {
            return Err(Error::Config(format!("unsupported model dtype {dtype:?}")));
        }
        let c = config;
        let (h, v, f) = (
            c.hidden_size as i64,
            c.vocab_size as i64,
            c.intermediate_size as i64,
        );
        let (hd, nh, nkv) = (
            c.head_dim as i64,
            c.num_attention_heads as i64,
            c.num_key_value_heads as i64,
        );
        let mut vs = nn::VarStore::new(device);
        // New variables take the store's kind (`var_copy` would otherwise make them f32).
        vs.set_kind(dtype);
        let root = vs.root();
        // VarStore names are paths: `layers.3.qkv` is `root / "layers" / "3"` + `qkv`.
        let var = |name: &str, t: Tensor| -> Tensor {
            let (dir, leaf) = name.rsplit_once('.').unwrap_or(("", name));
            let path = dir
                .split('.')
                .filter(|p| !p.is_empty())
                .fold(root.clone(), |p, part| p.sub(part));
            path.var_copy(leaf, &t.to_kind(dtype))
        };

        let embed = var(
            "embed_tokens",
            weights.take("model.embed_tokens.weight", &[v, h])?,
        );
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let q = weights.take(&format!("{p}.self_attn.q_proj.weight"), &[nh * hd, h])?;
            let k = weights.take(&format!("{p}.self_attn.k_proj.weight"), &[nkv * hd, h])?;
            let vv = weights.take(&format!("{p}.self_attn.v_proj.weight"), &[nkv * hd, h])?;
            let qkv_bias = if c.attention_bias {
                let qb = weights.take(&format!("{p}.self_attn.q_proj.bias"), &[nh * hd])?;
                let kb = weights.take(&format!("{p}.self_attn.k_proj.bias"), &[nkv * hd])?;
                let vb = weights.take(&format!("{p}.self_attn.v_proj.bias"), &[nkv * hd])?;
                Some(var(
                    &format!("layers.{i}.qkv_bias"),
                    Tensor::cat(&[qb, kb, vb], 0),
                ))
            } else {
                None
            };
            let (q_norm, k_norm) = if c.qk_norm {
                let qn = weights.take(&format!("{p}.self_attn.q_norm.weight"), &[hd])?;
                let kn = weights.take(&format!("{p}.self_attn.k_norm.weight"), &[hd])?;
                (
                    Some(var(&format!("layers.{i}.q_norm"), qn)),
                    Some(var(&format!("layers.{i}.k_norm"), kn)),
                )
            } else {
                (None, None)
            };
            let gate = weights.take(&format!("{p}.mlp.gate_proj.weight"), &[f, h])?;
            let up = weights.take(&format!("{p}.mlp.up_proj.weight"), &[f, h])?;
            layers.push(Layer {
                input_norm: var(
                    &format!("layers.{i}.input_norm"),
                    weights.take(&format!("{p}.input_layernorm.weight"), &[h])?,
                ),
                qkv: var(&format!("layers.{i}.qkv"), Tensor::cat(&[q, k, vv], 0).tr()),
                qkv_bias,
                q_norm,
                k_norm,
                o_proj: var(
                    &format!("layers.{i}.o_proj"),
                    weights
                        .take(&format!("{p}.self_attn.o_proj.weight"), &[h, nh * hd])?
                        .tr(),
                ),
                post_norm: var(
                    &format!("layers.{i}.post_norm"),
                    weights.take(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
                ),
                gate_up: var(
                    &format!("layers.{i}.gate_up"),
                    Tensor::cat(&[gate, up], 0).tr(),
                ),
                down: var(
                    &format!("layers.{i}.down"),
                    weights
                        .take(&format!("{p}.mlp.down_proj.weight"), &[h, f])?
                        .tr(),
                ),
            });
        }
        let norm = var("norm", weights.take("model.norm.weight", &[h])?);
        let lm_head = if c.tie_word_embeddings {
            None
        } else {
            Some(var("lm_head", weights.take("lm_head.weight", &[v, h])?))
        };
        weights.finish()?;
        Ok(Self {
            config: c.clone(),
            rope: Rope::new(c, device, dtype),
            vs,
            dtype,
            embed,
            layers,
            norm,
            lm_head,
        })
    }

    /// A randomly initialised model (normal σ = 0.02, norms at 1) from a fixed `seed`: the `tiny`
    /// preset for tests.
    ///
    /// # Errors
    /// As [`Model::from_weights`].
    pub fn random(config: &ModelConfig, seed: u64, device: Device, dtype: Kind) -> Result<Self> {
        config.validate()?;
        let weights = with_torch_rng(Some(seed as i64), || Self::random_weights(config));
        Self::from_weights(config, weights, device, dtype)
    }

    /// The f32 weights of [`Model::random`], drawn from libtorch's global generator (seeded
    /// by the caller under the lock of [`with_torch_rng`]).
    fn random_weights(config: &ModelConfig) -> Weights {
        let c = config;
        let (h, v, f) = (
            c.hidden_size as i64,
            c.vocab_size as i64,
            c.intermediate_size as i64,
        );
        let (hd, nh, nkv) = (
            c.head_dim as i64,
            c.num_attention_heads as i64,
            c.num_key_value_heads as i64,
        );
        let normal = |shape: &[i64]| Tensor::randn(shape, (Kind::Float, Device::Cpu)) * 0.02;
        let ones = |n: i64| Tensor::ones([n], (Kind::Float, Device::Cpu));
        let mut w = Weights::new();
        w.insert("model.embed_tokens.weight", normal(&[v, h]));
        for i in 0..c.num_hidden_layers {
            let p = format!("model.layers.{i}");
            w.insert(
                format!("{p}.self_attn.q_proj.weight"),
                normal(&[nh * hd, h]),
            );
            w.insert(
                format!("{p}.self_attn.k_proj.weight"),
                normal(&[nkv * hd, h]),
            );
            w.insert(
                format!("{p}.self_attn.v_proj.weight"),
                normal(&[nkv * hd, h]),
            );
            if c.attention_bias {
                w.insert(format!("{p}.self_attn.q_proj.bias"), normal(&[nh * hd]));
                w.insert(format!("{p}.self_attn.k_proj.bias"), normal(&[nkv * hd]));
                w.insert(format!("{p}.self_attn.v_proj.bias"), normal(&[nkv * hd]));
            }
            if c.qk_norm {
                w.insert(format!("{p}.self_attn.q_norm.weight"), ones(hd));
                w.insert(format!("{p}.self_attn.k_norm.weight"), ones(hd));
            }
            w.insert(
                format!("{p}.self_attn.o_proj.weight"),
                normal(&[h, nh * hd]),
            );
            w.insert(format!("{p}.mlp.gate_proj.weight"), normal(&[f, h]));
            w.insert(format!("{p}.mlp.up_proj.weight"), normal(&[f, h]));
            w.insert(format!("{p}.mlp.down_proj.weight"), normal(&[h, f]));
            w.insert(format!("{p}.input_layernorm.weight"), ones(h));
            w.insert(format!("{p}.post_attention_layernorm.weight"), ones(h));
        }
        w.insert("model.norm.weight", ones(h));
        if !c.tie_word_embeddings {
            w.insert("lm_head.weight", normal(&[v, h]));
        }
        w
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The parameters, for an optimizer (`nn::AdamW::build(model.var_store(), lr)`).
    pub fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }

    /// Writes every parameter to a safetensors file at `path` (names as in the VarStore),
    /// durably and atomically ([`write_atomically`]).
    ///
    /// # Errors
    /// [`Error::Torch`] when the tensors cannot be written; [`Error::Io`] when the folder
    /// cannot be created, or the fsyncs or the rename fail.
    pub fn save_weights(&self, path: &std::path::Path) -> Result<()> {
        write_atomically(path, |tmp| {
            self.vs.save(tmp)?;
            Ok(())
        })
    }

    /// Replaces every parameter, in place, with the tensors of a file written by
    /// [`Model::save_weights`]; other users of the same handle see the new weights at once.
    ///
    /// # Errors
    /// [`Error::Torch`] when the file cannot be read; [`Error::Checkpoint`] when a parameter
    /// is missing from it or has another shape.
    pub fn load_weights(&self, path: &std::path::Path) -> Result<()> {
        let tensors: std::collections::HashMap<String, Tensor> =
            Tensor::read_safetensors(path)?.into_iter().collect();
        let vars = self.vs.variables();
        for (name, var) in &vars {
            let src = tensors.get(name).ok_or_else(|| Error::Checkpoint {
                path: path.to_path_buf(),
                message: format!("parameter {name} is missing"),
            })?;
            if src.size() != var.size() {
                return Err(Error::Checkpoint {
                    path: path.to_path_buf(),
                    message: format!(
                        "parameter {name} has shape {:?}, the model has {:?}",
                        src.size(),
                        var.size()
                    ),
                });
            }
        }
        tch::no_grad(|| {
            for (name, var) in &vars {
                if let Some(src) = tensors.get(name) {
                    let mut v = var.shallow_clone();
                    v.copy_(&src.to_device(var.device()).to_kind(var.kind()));
                }
            }
        });
        Ok(())
    }

    /// A deep copy of the model (same configuration, device and dtype; its own parameter
    /// storage): e.g. the frozen reference of the k3 KL. Costs one more copy of the weights
    /// (about 540 MB for SmolLM2-135M in f32).
    ///
    /// # Errors
    /// [`Error::Torch`] when the copy cannot be allocated.
    pub fn deep_copy(&self) -> Result<Model> {
        let copy = Model::random(&self.config, 0, self.device(), self.dtype)?;
        let src = self.vs.variables();
        tch::no_grad(|| {
            for (name, dst) in copy.vs.variables() {
                if let Some(s) = src.get(&name) {
                    let mut d = dst.shallow_clone();
                    d.copy_(s);
                }
            }
        });
        Ok(copy)
    }

    /// Device of the parameters.
    pub fn device(&self) -> Device {
        self.vs.device()
    }

    /// Compute dtype of the parameters and activations.
    pub fn dtype(&self) -> Kind {
        self.dtype
    }

    /// Dtype of the generation KV cache: f32 for a bf16 model on the CPU, else the model dtype.
    /// libtorch's CPU attention kernels convert bf16 keys and values to f32 block by block,
    /// which makes a decode step (one query per sequence against its whole cache) several times
    /// slower than in f32 at batch 30 (1.4 s against 0.32 s per step, SmolLM2-135M, 1.3k-token
    /// contexts); keeping the cache in f32 keeps the weights' matmuls in bf16 and decode
    /// attention at f32 speed, for twice the KV memory of bf16.
    pub fn kv_dtype(&self) -> Kind {
        if self.dtype == Kind::BFloat16 && self.device() == Device::Cpu {
            Kind::Float
        } else {
            self.dtype
        }
    }

    /// Number of parameters (tied embeddings counted once).
    pub fn num_parameters(&self) -> i64 {
        self.vs
            .trainable_variables()
            .iter()
            .map(Tensor::numel)
            .sum::<usize>() as i64
    }

    /// Training / scoring forward: `input_ids: [batch, seq]` i64 → final hidden states
    /// `[batch, seq, hidden]` (model dtype), causal attention, positions `0..seq`.
    ///
    /// Rows may be right-padded: causal attention means real tokens never see the padding.
    /// Records autograd unless called under `tch::no_grad`.
    pub fn forward_hidden(&self, input_ids: &Tensor) -> Tensor {
        let (b, t) = input_ids.size2().unwrap_or((1, 1));
        let positions = Tensor::arange(t, (Kind::Int64, self.device()))
            .unsqueeze(0)
            .expand([b, t], false);
        let (cos, sin) = self.rope.tables(&positions);
        let mut x = Tensor::embedding(&self.embed, input_ids, -1, false, false);
        for layer in &self.layers {
            x = self.causal_layer(layer, &x, &cos, &sin);
        }
        self.final_norm(&x)
    }

    /// One decoder layer, causal over each row: `x: [b, t, hidden]` → same shape.
    pub(crate) fn causal_layer(
        &self,
        layer: &Layer,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
    ) -> Tensor {
        self.layer_forward(layer, x, cos, sin, Attention::Causal)
    }

    /// Prefill of fresh sequences into `cache`: `input_ids: [batch, seq]` i64, right-padded, row
    /// `i` goes to cache slot `slots[i]` (positions `0..seq`), `last: [batch]` i64 the index of
    /// each row's last real token. Returns next-token logits `[batch, vocab]` f32.
    ///
    /// Padding writes garbage past a row's length; it is hidden by the decode mask and
    /// overwritten by later tokens.
    pub fn prefill(
        &self,
        input_ids: &Tensor,
        slots: &Tensor,
        last: &Tensor,
        cache: &mut KvCache,
    ) -> Tensor {
        let (b, t) = input_ids.size2().unwrap_or((1, 1));
        let positions = Tensor::arange(t, (Kind::Int64, self.device()))
            .unsqueeze(0)
            .expand([b, t], false);
        let (cos, sin) = self.rope.tables(&positions);
        let mut x = Tensor::embedding(&self.embed, input_ids, -1, false, false);
        for (i, layer) in self.layers.iter().enumerate() {
            let (q, k, v) = self.attention_inputs(layer, &x, &cos, &sin);
            cache.write_prefix(i, slots, &k, &v);
            let attn = Tensor::scaled_dot_product_attention::<Tensor>(
                &q, &k, &v, None, 0.0, true, None, true,
            );
            x = self.layer_output(layer, &x, &attn);
        }
        let hidden = x.gather(
            1,
            &last.view([b, 1, 1]).expand([b, 1, x.size()[2]], false),
            false,
        );
        self.logits(&self.final_norm(&hidden.squeeze_dim(1)))
    }

    /// One decode step for every slot `0..slots`: `input_ids: [slots]` i64 (the last sampled
    /// token), `positions: [slots]` i64 (its position = the slot's current length). Writes k/v
    /// into the cache and returns next-token logits `[slots, vocab]` f32.
    pub fn decode(&self, input_ids: &Tensor, positions: &Tensor, cache: &mut KvCache) -> Tensor {
        let s = input_ids.size()[0];
        let pos2 = positions.view([s, 1]);
        let (cos, sin) = self.rope.tables(&pos2);
        let keys = positions.max().int64_value(&[]) + 1;
        let mask = Tensor::arange(keys, (Kind::Int64, self.device()))
            .view([1, keys])
            .le_tensor(&pos2)
            .view([s, 1, 1, keys]);
        let mut x = Tensor::embedding(&self.embed, &input_ids.view([s, 1]), -1, false, false);
        for (i, layer) in self.layers.iter().enumerate() {
            let attention = Attention::Cached {
                cache: &mut *cache,
                layer: i,
                positions,
                mask: &mask,
            };
            x = self.layer_forward(layer, &x, &cos, &sin, attention);
        }
        self.logits(&self.final_norm(&x.squeeze_dim(1)))
    }

    /// Vocabulary logits in f32 for hidden states `[..., hidden]` → `[..., vocab]`.
    pub fn logits(&self, hidden: &Tensor) -> Tensor {
        let w = self.lm_head.as_ref().unwrap_or(&self.embed);
        hidden.linear::<&Tensor>(w, None).to_kind(Kind::Float)
    }

    /// Final RMSNorm, exposed for callers that select positions before the vocabulary projection.
    pub(crate) fn final_norm(&self, x: &Tensor) -> Tensor {
        self.rms_norm(x, &self.norm)
    }

    fn rms_norm(&self, x: &Tensor, weight: &Tensor) -> Tensor {
        let last = *x.size().last().unwrap_or(&1);
        x.rms_norm([last], Some(weight), self.config.rms_norm_eps)
    }

    /// Normed input → `q: [b, heads, t, d]`, `k, v: [b, kv_heads, t, d]`, RoPE applied.
    pub(crate) fn attention_inputs(
        &self,
        layer: &Layer,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
    ) -> (Tensor, Tensor, Tensor) {
        let c = &self.config;
        let (b, t, _) = x.size3().unwrap_or((1, 1, 1));
        let (hd, nh, nkv) = (
            c.head_dim as i64,
            c.num_attention_heads as i64,
            c.num_key_value_heads as i64,
        );
        let h = self.rms_norm(x, &layer.input_norm);
        let qkv = match &layer.qkv_bias {
            Some(bias) => h.matmul(&layer.qkv) + bias,
            None => h.matmul(&layer.qkv),
        };
        let parts = qkv.split_with_sizes([nh * hd, nkv * hd, nkv * hd], -1);
        let mut q = parts[0].view([b, t, nh, hd]);
        let mut k = parts[1].view([b, t, nkv, hd]);
        let v = parts[2].view([b, t, nkv, hd]).transpose(1, 2);
        if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
            q = self.rms_norm(&q, qn);
            k = self.rms_norm(&k, kn);
        }
        let q = apply_rope(&q.transpose(1, 2), cos, sin);
        let k = apply_rope(&k.transpose(1, 2), cos, sin);
        (q, k, v)
    }

    /// Attention output `[b, heads, t, d]` → residual + o_proj, then the MLP block.
    pub(crate) fn layer_output(&self, layer: &Layer, x: &Tensor, attn: &Tensor) -> Tensor {
        let (b, t, _) = x.size3().unwrap_or((1, 1, 1));
        let attn = attn.transpose(1, 2).reshape([b, t, -1]);
        let x = x + attn.matmul(&layer.o_proj);
        let h = self.rms_norm(&x, &layer.post_norm);
        let gu = h.matmul(&layer.gate_up).chunk(2, -1);
        let mlp = (gu[0].silu() * &gu[1]).matmul(&layer.down);
        x + mlp
    }

    fn layer_forward(
        &self,
        layer: &Layer,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        attention: Attention,
    ) -> Tensor {
        let (q, k, v) = self.attention_inputs(layer, x, cos, sin);
        let attn = match attention {
            Attention::Causal => Tensor::scaled_dot_product_attention::<Tensor>(
                &q, &k, &v, None, 0.0, true, None, true,
            ),
            Attention::Cached {
                cache,
                layer: i,
                positions,
                mask,
            } => {
                let keys = mask.size()[3];
                let (k_all, v_all) = cache.append_one(i, positions, &k, &v, keys);
                // One query token per slot: fold each KV group's query heads into the query
                // length, `[s, kv_heads, group, d]`, so attention reads each cached key once
                // instead of expanding K/V to every query head. The attention runs in the
                // cache's dtype ([`Model::kv_dtype`]).
                let size = q.size();
                let grouped = q
                    .reshape([size[0], k_all.size()[1], -1, size[3]])
                    .to_kind(k_all.kind());
                Tensor::scaled_dot_product_attention(
                    &grouped,
                    &k_all,
                    &v_all,
                    Some(mask),
                    0.0,
                    false,
                    None,
                    false,
                )
                .reshape(size.as_slice())
                .to_kind(q.kind())
            }
        };
        self.layer_output(layer, x, &attn)
    }
}

/// Runs `f` holding the process-wide lock on libtorch's global random generator, seeded with
/// `seed` first when given. libtorch has one CPU generator per process: without the lock, two
/// threads seeding and drawing at once (tests run in parallel) interleave their streams, and
/// `Model::random(cfg, 5, …)` would not give the same weights twice.
pub(crate) fn with_torch_rng<T>(seed: Option<i64>, f: impl FnOnce() -> T) -> T {
    static TORCH_RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A panic while drawing leaves no state to protect: take the lock back.
    let _guard = TORCH_RNG
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(seed) = seed {
        tch::manual_seed(seed);
    }
    f()
}

/// Writes a file durably and atomically: `write` fills `NAME.tmp.EXT` beside `path` (the
/// extension kept last: libtorch picks a format by it), which is then fsynced, renamed over
/// `path`, and the folder fsynced. When this returns `Ok` the file is complete on disk; a crash
/// at any point leaves `path` as it was (the old file or none) and at most the temporary file.
///
/// # Errors
/// `write`'s error; [`Error::Io`] when the folder cannot be created, or an fsync or the rename
/// fails.
pub fn write_atomically(
    path: &std::path::Path,
    write: impl FnOnce(&std::path::Path) -> Result<()>,
) -> Result<()> {
    let io = |path: &std::path::Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { path, source }
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let tmp = match path.extension() {
        Some(ext) => path.with_extension(format!("tmp.{}", ext.to_string_lossy())),
        None => path.with_extension("tmp"),
    };
    write(&tmp)?;
    crate::fault::crash_point("checkpoint-file-written");
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))?;
    std::fs::File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(io(&dir))?;
    Ok(())
}
