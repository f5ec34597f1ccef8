//! Trained weights out of envace: an HF checkpoint folder or a GGUF file.
//!
//! [`hf_tensors`] turns the model's fused parameters back into the family's HF tensors, the exact
//! inverse of [`Model::from_weights`]: `qkv` `[in, out]` → `q_proj` / `k_proj` / `v_proj`
//! `[out, in]`, `gate_up` → `gate_proj` / `up_proj`, and so on. [`write_hf`] writes them with the
//! config and tokenizer files that HF transformers and [`crate::hf::load_checkpoint`] read;
//! [`write_gguf`] writes a GGUF v3 file under llama.cpp's tensor names, with the metadata
//! (tokenizer, chat template) of a source GGUF, which llama.cpp and [`GgufFile`] read.
use std::fmt;
use std::io::Write as _;
use std::path::Path;
use std::str::FromStr;

use serde_json::{json, Value};
use tch::{Device, Kind, Tensor};

use crate::config::{Architecture, ModelConfig};
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::model::{write_atomically, Model};
use crate::tokenizer::Tokenizer;

/// How exported weights are stored. Half dtypes round to nearest (ties to even).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportDtype {
    /// 4 bytes per weight: exactly the trained values (of an f32 model).
    F32,
    /// IEEE half, 2 bytes per weight (≈ 3 significant decimal digits).
    F16,
    /// bfloat16, 2 bytes per weight (f32's range, ≈ 2 significant decimal digits).
    BF16,
}

impl ExportDtype {
    /// The HF `torch_dtype` name: `float32`, `float16` or `bfloat16`.
    pub fn torch_name(self) -> &'static str {
        match self {
            Self::F32 => "float32",
            Self::F16 => "float16",
            Self::BF16 => "bfloat16",
        }
    }

    /// Bytes per stored element.
    pub fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
        }
    }

    /// GGML tensor type: F32 = 0, F16 = 1, BF16 = 30.
    fn ggml_type(self) -> u32 {
        match self {
            Self::F32 => GGML_F32,
            Self::F16 => 1,
            Self::BF16 => 30,
        }
    }

    /// llama.cpp's `general.file_type` (`LLAMA_FTYPE_ALL_F32`, `MOSTLY_F16`, `MOSTLY_BF16`).
    fn gguf_file_type(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::BF16 => 32,
        }
    }

    fn safetensors_dtype(self) -> safetensors::Dtype {
        match self {
            Self::F32 => safetensors::Dtype::F32,
            Self::F16 => safetensors::Dtype::F16,
            Self::BF16 => safetensors::Dtype::BF16,
        }
    }

    /// `values` as little-endian bytes of this dtype.
    fn encode(self, values: &[f32]) -> Vec<u8> {
        match self {
            Self::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            Self::F16 => values
                .iter()
                .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                .collect(),
            Self::BF16 => values
                .iter()
                .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                .collect(),
        }
    }
}

impl FromStr for ExportDtype {
    type Err = String;

    /// `f32` / `float32`, `f16` / `float16`, `bf16` / `bfloat16` (any case).
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(Self::F32),
            "f16" | "float16" => Ok(Self::F16),
            "bf16" | "bfloat16" => Ok(Self::BF16),
            other => Err(format!(
                "unknown export dtype {other:?} (expected f32, f16 or bf16)"
            )),
        }
    }
}

impl fmt::Display for ExportDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::BF16 => "bf16",
        })
    }
}

/// GGML type id of F32 (norms and biases always use it, as llama.cpp's converter does).
const GGML_F32: u32 = 0;
/// GGUF metadata value types used when writing.
const GGUF_U32: u32 = 4;
const GGUF_F32: u32 = 6;
const GGUF_STRING: u32 = 8;
/// Alignment of the tensor data when the source GGUF sets none.
const DEFAULT_ALIGNMENT: u64 = 32;
/// The shard index an HF folder may hold; [`crate::hf::load_checkpoint`] prefers it.
const HF_INDEX: &str = "model.safetensors.index.json";

/// The model's parameters under the family's HF names and in HF layout, in the order HF
/// checkpoints list them: `model.embed_tokens.weight` `[vocab, hidden]`; per layer `N`
/// `model.layers.N.self_attn.{q,k,v}_proj.weight` `[heads·head_dim or kv_heads·head_dim,
/// hidden]`, their `.bias` (attention bias only), `self_attn.{q,k}_norm.weight` `[head_dim]`
/// (q/k norm only), `self_attn.o_proj.weight` `[hidden, heads·head_dim]`,
/// `mlp.{gate,up}_proj.weight` `[ffn, hidden]`, `mlp.down_proj.weight` `[hidden, ffn]`,
/// `input_layernorm.weight` and `post_attention_layernorm.weight` `[hidden]`; then
/// `model.norm.weight` `[hidden]` and, unless embeddings are tied, `lm_head.weight`
/// `[vocab, hidden]`. Every tensor is f32, contiguous, on the CPU, detached from autograd.
///
/// [`Model::from_weights`] on these tensors rebuilds the same parameters.
///
/// # Errors
/// [`Error::MissingTensor`] / [`Error::ShapeMismatch`] when a parameter the config implies is
/// absent from the model's var store or has another shape; [`Error::Torch`] if libtorch fails.
pub fn hf_tensors(model: &Model) -> Result<Vec<(String, Tensor)>> {
    let c = model.config();
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
    let (q_rows, kv_rows) = (nh * hd, nkv * hd);
    let vars = model.var_store().variables();
    let param = |name: &str, shape: &[i64]| -> Result<Tensor> {
        let t = vars.get(name).ok_or_else(|| Error::MissingTensor {
            name: name.to_string(),
        })?;
        if t.size() != shape {
            return Err(Error::ShapeMismatch {
                name: name.to_string(),
                expected: shape.to_vec(),
                found: t.size(),
            });
        }
        Ok(t.f_detach()?
            .f_to_device(Device::Cpu)?
            .f_to_kind(Kind::Float)?)
    };
    let mut out: Vec<(String, Tensor)> = Vec::new();
    let mut push = |name: String, t: Tensor| -> Result<()> {
        out.push((name, t.f_contiguous()?));
        Ok(())
    };
    push(
        "model.embed_tokens.weight".into(),
        param("embed_tokens", &[v, h])?,
    )?;
    for i in 0..c.num_hidden_layers {
        let (l, p) = (format!("layers.{i}"), format!("model.layers.{i}"));
        // `[hidden, q + k + v]` → `[q + k + v, hidden]`, rows split.
        let qkv = param(&format!("{l}.qkv"), &[h, q_rows + 2 * kv_rows])?.f_tr()?;
        let parts = qkv.f_split_with_sizes([q_rows, kv_rows, kv_rows], 0)?;
        for (proj, t) in ["q_proj", "k_proj", "v_proj"].iter().zip(parts) {
            push(format!("{p}.self_attn.{proj}.weight"), t)?;
        }
        if c.attention_bias {
            let bias = param(&format!("{l}.qkv_bias"), &[q_rows + 2 * kv_rows])?;
            let parts = bias.f_split_with_sizes([q_rows, kv_rows, kv_rows], 0)?;
            for (proj, t) in ["q_proj", "k_proj", "v_proj"].iter().zip(parts) {
                push(format!("{p}.self_attn.{proj}.bias"), t)?;
            }
        }
        if c.qk_norm {
            push(
                format!("{p}.self_attn.q_norm.weight"),
                param(&format!("{l}.q_norm"), &[hd])?,
            )?;
            push(
                format!("{p}.self_attn.k_norm.weight"),
                param(&format!("{l}.k_norm"), &[hd])?,
            )?;
        }
        push(
            format!("{p}.self_attn.o_proj.weight"),
            param(&format!("{l}.o_proj"), &[q_rows, h])?.f_tr()?,
        )?;
        // `[hidden, gate + up]` → `[gate + up, hidden]`.
        let gate_up = param(&format!("{l}.gate_up"), &[h, 2 * f])?.f_tr()?;
        let parts = gate_up.f_split_with_sizes([f, f], 0)?;
        for (proj, t) in ["gate_proj", "up_proj"].iter().zip(parts) {
            push(format!("{p}.mlp.{proj}.weight"), t)?;
        }
        push(
            format!("{p}.mlp.down_proj.weight"),
            param(&format!("{l}.down"), &[f, h])?.f_tr()?,
        )?;
        push(
            format!("{p}.input_layernorm.weight"),
            param(&format!("{l}.input_norm"), &[h])?,
        )?;
        push(
            format!("{p}.post_attention_layernorm.weight"),
            param(&format!("{l}.post_norm"), &[h])?,
        )?;
    }
    push("model.norm.weight".into(), param("norm", &[h])?)?;
    if !c.tie_word_embeddings {
        push("lm_head.weight".into(), param("lm_head", &[v, h])?)?;
    }
    Ok(out)
}

/// HF class name and `model_type` of a family.
fn hf_names(arch: Architecture) -> (&'static str, &'static str) {
    match arch {
        Architecture::Llama => ("LlamaForCausalLM", "llama"),
        Architecture::Qwen2 => ("Qwen2ForCausalLM", "qwen2"),
        Architecture::Qwen3 => ("Qwen3ForCausalLM", "qwen3"),
    }
}

/// Refuses a config whose switches the target format cannot state: both readers derive q/k
/// norm from the family (Qwen3), HF always gives Qwen2 attention bias, and GGUF gives it to
/// Qwen2 alone.
fn check_switches(c: &ModelConfig, format: &str) -> Result<()> {
    let family = hf_names(c.architecture).1;
    if c.qk_norm != (c.architecture == Architecture::Qwen3) {
        return Err(Error::Config(format!(
            "cannot export to {format}: a {family} model with qk_norm = {} (only qwen3 has q/k norms)",
            c.qk_norm
        )));
    }
    let bias_fixed = c.architecture == Architecture::Qwen2 || format == "GGUF";
    if bias_fixed && c.attention_bias != (c.architecture == Architecture::Qwen2) {
        return Err(Error::Config(format!(
            "cannot export to {format}: a {family} model with attention_bias = {} ({format} \
             gives attention bias to qwen2 models{})",
            c.attention_bias,
            if format == "GGUF" { " only" } else { " always" }
        )));
    }
    Ok(())
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io { path, source }
}

/// Writes `bytes` to `path` durably and atomically.
fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomically(path, |tmp| std::fs::write(tmp, bytes).map_err(io_err(tmp)))
}

fn pretty_json(value: &Value) -> Vec<u8> {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    text.push('\n');
    text.into_bytes()
}

/// Writes an HF checkpoint folder `dir` (created if needed; files already there are replaced):
///
/// * `config.json`: architecture (`LlamaForCausalLM`, `Qwen2ForCausalLM`, `Qwen3ForCausalLM`),
///   `model_type`, every dimension of [`ModelConfig`], `rope_theta`, `rms_norm_eps`,
///   `tie_word_embeddings`, `attention_bias`, `torch_dtype`, `hidden_act` `silu`, and the
///   tokenizer's BOS / first EOS / pad ids;
/// * `model.safetensors`: [`hf_tensors`] stored in `dtype` (every tensor, norms included);
/// * `tokenizer.json`: the tokenizer ([`Tokenizer::to_json`]);
/// * `tokenizer_config.json`: `tokenizer_class` `PreTrainedTokenizerFast`, BOS / EOS / pad
///   token texts, `add_bos_token`, `model_max_length` (the context length, tokens) and
///   `chat_template` (the Jinja source, when given: usually the tokenizer's own
///   [`Tokenizer::chat_template`]);
/// * `generation_config.json`: `bos_token_id`, `eos_token_id` (every EOS id), `pad_token_id`.
///
/// Each file is written atomically ([`write_atomically`]). [`crate::hf::load_checkpoint`] and
/// [`Tokenizer::from_file`] read the folder back to the same config, weights (exactly, in f32)
/// and special tokens.
///
/// # Errors
/// [`Error::Config`] for a config HF cannot state (q/k norm outside Qwen3, Qwen2 without
/// attention bias) or a tokenizer with more ids than the model has embedding rows;
/// [`Error::Checkpoint`] when `dir` holds a `model.safetensors.index.json` (a sharded
/// checkpoint the loader would read instead) or safetensors serialisation fails;
/// [`Error::Tokenizer`] from [`Tokenizer::to_json`]; [`Error::Io`] for a file that cannot be
/// written; the errors of [`hf_tensors`].
pub fn write_hf(
    model: &Model,
    tokenizer: &Tokenizer,
    chat_template: Option<&str>,
    dtype: ExportDtype,
    dir: &Path,
) -> Result<()> {
    let c = model.config();
    check_switches(c, "HF")?;
    if tokenizer.vocab_size() > c.vocab_size {
        return Err(Error::Config(format!(
            "the tokenizer has {} token ids but the model only {} embedding rows: not this \
             model's tokenizer",
            tokenizer.vocab_size(),
            c.vocab_size
        )));
    }
    let index = dir.join(HF_INDEX);
    if index.exists() {
        return Err(Error::Checkpoint {
            path: index,
            message: "the export folder holds a sharded checkpoint's index, which loaders \
                      would read instead of the exported model.safetensors: choose an empty \
                      folder"
                .into(),
        });
    }

    let tensors = hf_tensors(model)?;
    let mut encoded = Vec::with_capacity(tensors.len());
    for (name, t) in &tensors {
        let values = Vec::<f32>::try_from(&t.f_flatten(0, -1)?)?;
        let shape: Vec<usize> = t.size().iter().map(|&d| d as usize).collect();
        encoded.push((name.clone(), shape, dtype.encode(&values)));
    }
    drop(tensors);
    write_atomically(&dir.join("model.safetensors"), |tmp| {
        let st_err = |message: String| Error::Checkpoint {
            path: tmp.to_path_buf(),
            message,
        };
        let views = encoded
            .iter()
            .map(|(name, shape, bytes)| {
                safetensors::tensor::TensorView::new(
                    dtype.safetensors_dtype(),
                    shape.clone(),
                    bytes,
                )
                .map(|view| (name.clone(), view))
                .map_err(|e| st_err(format!("tensor {name}: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let metadata = [("format".to_string(), "pt".to_string())].into();
        safetensors::serialize_to_file(views, Some(metadata), tmp)
            .map_err(|e| st_err(format!("writing safetensors: {e}")))
    })?;

    let (class, model_type) = hf_names(c.architecture);
    let bos = tokenizer.bos_token_id;
    let eos = tokenizer.eos_token_ids.first().copied();
    let pad = tokenizer.pad_token_id;
    let config = json!({
        "architectures": [class],
        "model_type": model_type,
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": c.max_position_embeddings,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "rope_scaling": null,
        "tie_word_embeddings": c.tie_word_embeddings,
        "attention_bias": c.attention_bias,
        "attention_dropout": 0.0,
        "mlp_bias": false,
        "torch_dtype": dtype.torch_name(),
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "use_cache": true,
    });
    write_file(&dir.join("config.json"), &pretty_json(&config))?;

    write_file(&dir.join("tokenizer.json"), tokenizer.to_json()?.as_bytes())?;
    let mut tokenizer_config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tokenizer.bos_token(),
        "eos_token": tokenizer.eos_token(),
        "pad_token": pad.and_then(|id| tokenizer.id_to_token(id)),
        "add_bos_token": tokenizer.add_bos_token,
        "add_eos_token": false,
        "clean_up_tokenization_spaces": false,
        "model_max_length": c.max_position_embeddings,
    });
    if let (Some(template), Some(map)) = (chat_template, tokenizer_config.as_object_mut()) {
        map.insert("chat_template".into(), Value::from(template));
    }
    write_file(
        &dir.join("tokenizer_config.json"),
        &pretty_json(&tokenizer_config),
    )?;
    let eos_ids = match tokenizer.eos_token_ids.as_slice() {
        [] => Value::Null,
        [one] => json!(one),
        many => json!(many),
    };
    let generation = json!({
        "bos_token_id": bos,
        "eos_token_id": eos_ids,
        "pad_token_id": pad,
    });
    write_file(
        &dir.join("generation_config.json"),
        &pretty_json(&generation),
    )?;
    Ok(())
}

/// llama.cpp's `general.architecture` of a family.
fn gguf_arch(arch: Architecture) -> &'static str {
    match arch {
        Architecture::Llama => "llama",
        Architecture::Qwen2 => "qwen2",
        Architecture::Qwen3 => "qwen3",
    }
}

/// llama.cpp's name of an HF tensor (the inverse of the GGUF reader's mapping); `None` when
/// it has none.
fn gguf_name(hf: &str) -> Option<String> {
    let (stem, suffix) = hf.rsplit_once('.')?;
    let global = match stem {
        "model.embed_tokens" => Some("token_embd"),
        "model.norm" => Some("output_norm"),
        "lm_head" => Some("output"),
        _ => None,
    };
    if let Some(g) = global {
        return Some(format!("{g}.{suffix}"));
    }
    let rest = stem.strip_prefix("model.layers.")?;
    let (layer, part) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let gguf_part = match part {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "ffn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{layer}.{gguf_part}.{suffix}"))
}

/// llama.cpp's q/k row permutation for its interleaved RoPE (`convert_hf_to_gguf.py`'s
/// `permute`): with `w` of shape `[rows, rest..]`,
/// `w.reshape(n_head, 2, rows / n_head / 2, rest..).transpose(1, 2).reshape(w.shape)`. The GGUF
/// reader's `unpermute_rows` undoes it.
fn permute_rows(w: &Tensor, n_head: usize) -> Result<Tensor> {
    let shape = w.size();
    let rows = shape.first().copied().unwrap_or(0);
    let n_head = n_head as i64;
    if n_head == 0 || rows % (2 * n_head) != 0 {
        return Err(Error::Config(format!(
            "{rows} q/k rows cannot be split into {n_head} heads of pairs"
        )));
    }
    let mut split = vec![n_head, 2, rows / n_head / 2];
    split.extend_from_slice(&shape[1..]);
    Ok(w.f_reshape(&split)?
        .f_transpose(1, 2)?
        .f_contiguous()?
        .f_reshape(&shape)?)
}

/// One metadata entry of a GGUF file as stored: key, GGUF value type, value bytes.
#[derive(Debug, Clone, PartialEq)]
struct RawKv {
    key: String,
    ty: u32,
    value: Vec<u8>,
}

impl RawKv {
    fn u32(key: &str, v: u32) -> Self {
        Self {
            key: key.into(),
            ty: GGUF_U32,
            value: v.to_le_bytes().to_vec(),
        }
    }

    fn f32(key: &str, v: f32) -> Self {
        Self {
            key: key.into(),
            ty: GGUF_F32,
            value: v.to_le_bytes().to_vec(),
        }
    }

    fn string(key: &str, v: &str) -> Self {
        let mut value = (v.len() as u64).to_le_bytes().to_vec();
        value.extend(v.as_bytes());
        Self {
            key: key.into(),
            ty: GGUF_STRING,
            value,
        }
    }
}

/// Replaces the entry of `kv.key` in place (keeping the order), or appends it.
fn set_kv(kvs: &mut Vec<RawKv>, kv: RawKv) {
    match kvs.iter_mut().find(|k| k.key == kv.key) {
        Some(old) => *old = kv,
        None => kvs.push(kv),
    }
}

/// A bounds-checked reader over a GGUF header.
struct Cursor<'a> {
    path: &'a Path,
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64) -> Result<&'a [u8]> {
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| self.pos.checked_add(n))
            .filter(|&e| e <= self.buf.len());
        match end {
            Some(end) => {
                let bytes = &self.buf[self.pos..end];
                self.pos = end;
                Ok(bytes)
            }
            None => Err(Error::Gguf {
                path: self.path.to_path_buf(),
                offset: Some(self.pos as u64),
                message: format!("truncated metadata: {n} bytes needed"),
            }),
        }
    }

    fn u32(&mut self) -> Result<u32> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self) -> Result<u64> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }

    /// Steps over one value of GGUF type `ty`.
    fn skip_value(&mut self, ty: u32, depth: usize) -> Result<()> {
        let fixed = |ty: u32| match ty {
            0 | 1 | 7 => Some(1u64),
            2 | 3 => Some(2),
            4..=6 => Some(4),
            10..=12 => Some(8),
            _ => None,
        };
        if let Some(n) = fixed(ty) {
            self.take(n)?;
            return Ok(());
        }
        match ty {
            GGUF_STRING => {
                let n = self.u64()?;
                self.take(n)?;
            }
            9 if depth < 4 => {
                let item = self.u32()?;
                let n = self.u64()?;
                match fixed(item) {
                    Some(size) => {
                        self.take(n.saturating_mul(size))?;
                    }
                    // Each item takes at least 8 bytes, so a bogus count runs out of file.
                    None => {
                        for _ in 0..n {
                            self.skip_value(item, depth + 1)?;
                        }
                    }
                }
            }
            t => {
                return Err(Error::Gguf {
                    path: self.path.to_path_buf(),
                    offset: Some(self.pos as u64),
                    message: format!("metadata value of type {t} cannot be copied"),
                })
            }
        }
        Ok(())
    }
}

/// The metadata entries of the GGUF file at `path`, in file order, values as stored.
fn read_raw_metadata(path: &Path) -> Result<Vec<RawKv>> {
    let file = std::fs::File::open(path).map_err(io_err(path))?;
    // SAFETY: a read-only map dropped before this function returns; model files are not
    // written while being read (as in `GgufFile::open`).
    let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err(path))?;
    let mut r = Cursor {
        path,
        buf: &mmap,
        pos: 0,
    };
    if r.take(4)? != b"GGUF" {
        return Err(Error::Gguf {
            path: path.to_path_buf(),
            offset: Some(0),
            message: "not a GGUF file".into(),
        });
    }
    let _version = r.u32()?;
    let _n_tensors = r.u64()?;
    let n_kv = r.u64()?;
    let mut kvs = Vec::new();
    for _ in 0..n_kv {
        let len = r.u64()?;
        let key = String::from_utf8_lossy(r.take(len)?).into_owned();
        let ty = r.u32()?;
        let start = r.pos;
        r.skip_value(ty, 0)?;
        kvs.push(RawKv {
            key,
            ty,
            value: r.buf[start..r.pos].to_vec(),
        });
    }
    Ok(kvs)
}

/// One tensor to write: GGUF name, f32 data in torch order, GGML type (F32, F16 or BF16).
struct GgufTensor {
    name: String,
    data: Tensor,
    dtype: ExportDtype,
}

/// Writes a GGUF v3 file: header, `kvs`, the tensor table, then each tensor's data at an
/// offset that is a multiple of `alignment` (bytes).
fn write_gguf_file(
    out: &Path,
    kvs: &[RawKv],
    tensors: &[GgufTensor],
    alignment: u64,
) -> Result<()> {
    let put_str = |buf: &mut Vec<u8>, s: &str| {
        buf.extend((s.len() as u64).to_le_bytes());
        buf.extend(s.as_bytes());
    };
    let align = |n: u64| n.div_ceil(alignment) * alignment;
    let mut header = b"GGUF".to_vec();
    header.extend(3u32.to_le_bytes());
    header.extend((tensors.len() as u64).to_le_bytes());
    header.extend((kvs.len() as u64).to_le_bytes());
    for kv in kvs {
        put_str(&mut header, &kv.key);
        header.extend(kv.ty.to_le_bytes());
        header.extend(&kv.value);
    }
    let mut offset = 0u64;
    for t in tensors {
        put_str(&mut header, &t.name);
        let shape = t.data.size();
        header.extend((shape.len() as u32).to_le_bytes());
        for &d in shape.iter().rev() {
            header.extend((d as u64).to_le_bytes());
        }
        header.extend(t.dtype.ggml_type().to_le_bytes());
        header.extend(offset.to_le_bytes());
        offset += align(t.data.numel() as u64 * t.dtype.size() as u64);
    }
    header.resize(align(header.len() as u64) as usize, 0);
    write_atomically(out, |tmp| {
        let file = std::fs::File::create(tmp).map_err(io_err(tmp))?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
        w.write_all(&header).map_err(io_err(tmp))?;
        for t in tensors {
            let values = Vec::<f32>::try_from(&t.data.f_flatten(0, -1)?)?;
            let bytes = t.dtype.encode(&values);
            let padding = align(bytes.len() as u64) as usize - bytes.len();
            w.write_all(&bytes).map_err(io_err(tmp))?;
            w.write_all(&vec![0u8; padding]).map_err(io_err(tmp))?;
        }
        w.flush().map_err(io_err(tmp))
    })
}

/// Writes the model as a GGUF v3 file at `out` (atomically, [`write_atomically`]).
///
/// Metadata: every entry of `source_gguf` (tokenizer, chat template, `general.*`), with its
/// stored value types, except that `general.architecture` is the model's family, the
/// `{arch}.` hyper-parameter keys (`block_count`, `context_length`, `embedding_length`,
/// `feed_forward_length`, `attention.head_count`, `attention.head_count_kv`,
/// `attention.key_length`, `attention.value_length`, `rope.dimension_count`, `vocab_size`:
/// u32; `rope.freq_base`, `attention.layer_norm_rms_epsilon`: f32) are the model's, the
/// source's `{arch}.` keys of another family are dropped, and `general.file_type` states
/// `dtype` (0 F32, 1 F16, 32 BF16). Tensor data is aligned to the source's
/// `general.alignment` (32 bytes when it sets none).
///
/// Tensors: [`hf_tensors`] under llama.cpp's names (`token_embd.weight`,
/// `blk.N.attn_q.weight`, …, `output_norm.weight`, `output.weight` unless tied), with GGUF dims
/// (innermost first), Llama's q/k rows permuted as llama.cpp's converter does, matrices stored
/// as `dtype` (GGML F32 = 0, F16 = 1, BF16 = 30) and 1-D tensors (norms, biases) as F32.
/// [`GgufFile::open`], [`GgufFile::model_config`] and [`GgufFile::load_weights`] read it back
/// to the same config and (in F32, exactly) the same weights.
///
/// # Errors
/// [`Error::Io`] / [`Error::Gguf`] when `source_gguf` cannot be read or is not a GGUF file;
/// [`Error::Config`] when its tokenizer has another number of tokens than the model has
/// embedding rows (not this model's GGUF), or the config has switches GGUF cannot state
/// (attention bias outside Qwen2, q/k norm outside Qwen3); [`Error::Io`] when `out` cannot be
/// written; the errors of [`hf_tensors`].
pub fn write_gguf(model: &Model, source_gguf: &Path, dtype: ExportDtype, out: &Path) -> Result<()> {
    let c = model.config();
    check_switches(c, "GGUF")?;
    let source = GgufFile::open(source_gguf)?;
    let meta = source.metadata();
    if let Some(tokens) = meta.get("tokenizer.ggml.tokens").and_then(Value::as_array) {
        if tokens.len() != c.vocab_size {
            return Err(Error::Config(format!(
                "{}: its tokenizer has {} tokens but the model has {} embedding rows: not this \
                 model's GGUF",
                source_gguf.display(),
                tokens.len(),
                c.vocab_size
            )));
        }
    }
    let alignment = meta
        .get("general.alignment")
        .and_then(Value::as_u64)
        .unwrap_or(DEFAULT_ALIGNMENT);
    let source_arch = meta
        .get("general.architecture")
        .and_then(Value::as_str)
        .map(str::to_string);
    drop(source);

    let arch = gguf_arch(c.architecture);
    let mut kvs = read_raw_metadata(source_gguf)?;
    if let Some(old) = source_arch.filter(|a| a != arch) {
        let prefix = format!("{old}.");
        kvs.retain(|kv| !kv.key.starts_with(&prefix));
    }
    let key = |k: &str| format!("{arch}.{k}");
    let as_u32 = |name: &str, v: usize| {
        u32::try_from(v).map_err(|_| Error::Config(format!("{name} {v} does not fit GGUF's u32")))
    };
    set_kv(&mut kvs, RawKv::string("general.architecture", arch));
    set_kv(
        &mut kvs,
        RawKv::u32("general.file_type", dtype.gguf_file_type()),
    );
    for (k, name, v) in [
        ("block_count", "num_hidden_layers", c.num_hidden_layers),
        (
            "context_length",
            "max_position_embeddings",
            c.max_position_embeddings,
        ),
        ("embedding_length", "hidden_size", c.hidden_size),
        (
            "feed_forward_length",
            "intermediate_size",
            c.intermediate_size,
        ),
        (
            "attention.head_count",
            "num_attention_heads",
            c.num_attention_heads,
        ),
        (
            "attention.head_count_kv",
            "num_key_value_heads",
            c.num_key_value_heads,
        ),
        ("attention.key_length", "head_dim", c.head_dim),
        ("attention.value_length", "head_dim", c.head_dim),
        ("rope.dimension_count", "head_dim", c.head_dim),
        ("vocab_size", "vocab_size", c.vocab_size),
    ] {
        set_kv(&mut kvs, RawKv::u32(&key(k), as_u32(name, v)?));
    }
    set_kv(
        &mut kvs,
        RawKv::f32(&key("rope.freq_base"), c.rope_theta as f32),
    );
    set_kv(
        &mut kvs,
        RawKv::f32(
            &key("attention.layer_norm_rms_epsilon"),
            c.rms_norm_eps as f32,
        ),
    );

    let mut tensors = Vec::new();
    for (hf, data) in hf_tensors(model)? {
        let name = gguf_name(&hf)
            .ok_or_else(|| Error::Config(format!("tensor {hf} has no llama.cpp name")))?;
        let n_head = match name.rsplit_once('.') {
            Some((stem, "weight")) if c.architecture == Architecture::Llama => {
                if stem.ends_with(".attn_q") {
                    Some(c.num_attention_heads)
                } else if stem.ends_with(".attn_k") {
                    Some(c.num_key_value_heads)
                } else {
                    None
                }
            }
            _ => None,
        };
        let data = match n_head {
            Some(n) => permute_rows(&data, n)?,
            None => data,
        };
        let dtype = if data.dim() == 1 {
            ExportDtype::F32
        } else {
            dtype
        };
        tensors.push(GgufTensor { name, data, dtype });
    }
    write_gguf_file(out, &kvs, &tensors, alignment)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hf::load_checkpoint;
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A fresh directory under the temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> Self {
            static COUNTER: AtomicUsize = AtomicUsize::new(0);
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let path = std::env::temp_dir().join(format!(
                "envace-export-test-{}-{n}-{tag}",
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&path);
            std::fs::create_dir_all(&path).unwrap();
            TempDir(path)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn fixture(name: &str) -> Model {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures")
            .join(name);
        let (config, weights) = load_checkpoint(&dir).unwrap();
        Model::from_weights(&config, weights, Device::Cpu, Kind::Float).unwrap()
    }

    fn tiny() -> Model {
        Model::random(&ModelConfig::tiny(), 1234, Device::Cpu, Kind::Float).unwrap()
    }

    /// Next-token logits `[2, 7, vocab]` of two fixed rows of ids below `vocab`.
    fn logits(model: &Model) -> Tensor {
        let vocab = model.config().vocab_size as i64;
        let ids: Vec<i64> = (0..14).map(|i| (i * 37 + 5) % vocab).collect();
        let input = Tensor::from_slice(&ids).view([2, 7]);
        tch::no_grad(|| model.logits(&model.forward_hidden(&input)))
    }

    /// Largest |a - b| over the largest |a|.
    fn relative_diff(a: &Tensor, b: &Tensor) -> f64 {
        let diff = (a - b).abs().max().double_value(&[]);
        diff / a.abs().max().double_value(&[])
    }

    fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b).abs().max().double_value(&[])
    }

    /// A five-token word-level tokenizer with BOS, two EOS ids, a pad token and a template.
    fn small_tokenizer(dir: &Path) -> Tokenizer {
        let special = |id: u32, content: &str| {
            json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        };
        let tokenizer = json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [special(0, "<s>"), special(1, "</s>"), special(2, "<|im_end|>")],
            "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel",
                      "vocab": {"<s>": 0, "</s>": 1, "<|im_end|>": 2, "hello": 3, "world": 4},
                      "unk_token": "hello"}
        });
        std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
        let config = json!({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "</s>",
                            "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"});
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
        Tokenizer::from_file(dir.join("tokenizer.json")).unwrap()
    }

    /// Exports `model` as HF in each dtype, reads it back, and checks config, tensors, logits,
    /// stored dtypes and the tokenizer files; returns the f16 and bf16 relative logit errors.
    fn hf_round_trip(model: &Model, tag: &str) -> (f64, f64) {
        let tmp = TempDir::new(tag);
        let tokenizer = small_tokenizer(&tmp.0);
        let want = logits(model);
        let original = hf_tensors(model).unwrap();
        let mut errors = Vec::new();
        for dtype in [ExportDtype::F32, ExportDtype::F16, ExportDtype::BF16] {
            let out = tmp.0.join(format!("out-{dtype}"));
            write_hf(
                model,
                &tokenizer,
                tokenizer.chat_template.as_deref(),
                dtype,
                &out,
            )
            .unwrap();
            let (config, weights) = load_checkpoint(&out).unwrap();
            assert_eq!(&config, model.config(), "{tag} {dtype}");
            assert_eq!(weights.len(), original.len());
            // The stored dtype is the requested one, for every tensor.
            let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
            let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            assert!(st
                .iter()
                .all(|(_, view)| view.dtype() == dtype.safetensors_dtype()));
            if dtype == ExportDtype::F32 {
                for (name, t) in &original {
                    let back = weights.get(name).unwrap();
                    assert_eq!(back.size(), t.size(), "{name}");
                    assert_eq!(max_abs_diff(back, t), 0.0, "{tag} {name}");
                }
            }
            let reread = Model::from_weights(&config, weights, Device::Cpu, Kind::Float).unwrap();
            let got = logits(&reread);
            let diff = max_abs_diff(&want, &got);
            let rel = relative_diff(&want, &got);
            println!("{tag} {dtype}: max |Δlogit| {diff:.3e} (relative {rel:.3e})");
            match dtype {
                ExportDtype::F32 => assert!(diff <= 1e-5, "{tag} f32: {diff}"),
                _ => errors.push(rel),
            }
            // config.json and the tokenizer files.
            let config: Value =
                serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
            assert_eq!(config["torch_dtype"], dtype.torch_name());
            assert_eq!(config["hidden_act"], "silu");
            assert_eq!(config["bos_token_id"], 0);
            assert_eq!(config["eos_token_id"], 1);
            let back = Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
            assert_eq!(back.bos_token_id, Some(0));
            assert_eq!(back.pad_token_id, Some(1));
            assert_eq!(back.eos_token_ids, tokenizer.eos_token_ids);
            assert_eq!(back.eos_token_ids, [1, 2]);
            assert_eq!(back.chat_template, tokenizer.chat_template);
            assert_eq!(back.encode("hello world <|im_end|>").unwrap(), [3, 4, 2]);
            let generation: Value =
                serde_json::from_slice(&std::fs::read(out.join("generation_config.json")).unwrap())
                    .unwrap();
            assert_eq!(generation["eos_token_id"], json!([1, 2]));
        }
        (errors[0], errors[1])
    }

    #[test]
    fn export_hf_tiny_llama_round_trips() {
        let model = tiny();
        assert!(model.config().tie_word_embeddings);
        let names: Vec<String> = hf_tensors(&model)
            .unwrap()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(names.len(), 1 + 2 * 9 + 1);
        assert_eq!(names[0], "model.embed_tokens.weight");
        assert_eq!(names[1], "model.layers.0.self_attn.q_proj.weight");
        assert!(!names.iter().any(|n| n == "lm_head.weight"));
        let (f16, bf16) = hf_round_trip(&model, "tiny");
        assert!(f16 < 2e-3, "f16 relative logit error {f16}");
        assert!(bf16 < 2e-2, "bf16 relative logit error {bf16}");
        assert!(
            f16 > 0.0 && bf16 > f16,
            "half dtypes do round: {f16} {bf16}"
        );
    }

    #[test]
    fn export_hf_qwen2_bias_and_qwen3_qk_norm_round_trip() {
        let qwen2 = fixture("tiny-qwen2");
        assert!(qwen2.config().attention_bias);
        let names: Vec<String> = hf_tensors(&qwen2)
            .unwrap()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert!(names.contains(&"model.layers.1.self_attn.v_proj.bias".to_string()));
        let (f16, bf16) = hf_round_trip(&qwen2, "qwen2");
        assert!(f16 < 2e-3 && bf16 < 2e-2, "{f16} {bf16}");

        let qwen3 = fixture("tiny-qwen3");
        assert!(qwen3.config().qk_norm && !qwen3.config().tie_word_embeddings);
        let (f16, bf16) = hf_round_trip(&qwen3, "qwen3");
        assert!(f16 < 2e-3 && bf16 < 2e-2, "{f16} {bf16}");
    }

    #[test]
    fn hf_tensors_match_the_checkpoint_they_came_from() {
        // The fixture's own tensors, as HF wrote them, are what hf_tensors gives back.
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-qwen3");
        let (config, weights) = load_checkpoint(&dir).unwrap();
        let (_, reference) = load_checkpoint(&dir).unwrap();
        let model = Model::from_weights(&config, weights, Device::Cpu, Kind::Float).unwrap();
        let exported = hf_tensors(&model).unwrap();
        assert_eq!(exported.len(), reference.len());
        for (name, t) in &exported {
            let r = reference.get(name).unwrap_or_else(|| panic!("{name}"));
            assert_eq!(t.size(), r.size(), "{name}");
            assert_eq!(max_abs_diff(t, r), 0.0, "{name}");
            assert_eq!(t.kind(), Kind::Float);
            assert!(t.is_contiguous());
        }
        // A bf16 model exports f32 tensors too.
        let (config, weights) = load_checkpoint(&dir).unwrap();
        let bf16 = Model::from_weights(&config, weights, Device::Cpu, Kind::BFloat16).unwrap();
        assert!(hf_tensors(&bf16)
            .unwrap()
            .iter()
            .all(|(_, t)| t.kind() == Kind::Float));
    }

    /// A source GGUF without tensors: `general.architecture = arch`, a stale hyper-parameter
    /// and `n_tokens` tokens.
    fn source_gguf(path: &Path, arch: &str, n_tokens: usize) {
        let tokens: Vec<String> = (0..n_tokens).map(|i| format!("t{i}")).collect();
        let mut value = GGUF_STRING.to_le_bytes().to_vec();
        value.extend((tokens.len() as u64).to_le_bytes());
        for t in &tokens {
            value.extend((t.len() as u64).to_le_bytes());
            value.extend(t.as_bytes());
        }
        let kvs = vec![
            RawKv::string("general.architecture", arch),
            RawKv::string("general.name", "source"),
            RawKv::u32(&format!("{arch}.block_count"), 30),
            RawKv {
                key: "tokenizer.ggml.tokens".into(),
                ty: 9,
                value,
            },
        ];
        write_gguf_file(path, &kvs, &[], 32).unwrap();
    }

    /// Exports `model` as GGUF in each dtype from `source`, reads it back with `GgufFile`, and
    /// checks config, stored types, tensors and logits; returns the f16 and bf16 errors.
    fn gguf_round_trip(model: &Model, source: &Path, tag: &str) -> (f64, f64) {
        let tmp = TempDir::new(tag);
        let want = logits(model);
        let original = hf_tensors(model).unwrap();
        let mut errors = Vec::new();
        for dtype in [ExportDtype::F32, ExportDtype::F16, ExportDtype::BF16] {
            let out = tmp.0.join(format!("{tag}-{dtype}.gguf"));
            write_gguf(model, source, dtype, &out).unwrap();
            let f = GgufFile::open(&out).unwrap();
            assert_eq!(f.version(), 3);
            let config = f.model_config().unwrap();
            assert_eq!(&config, model.config(), "{tag} {dtype}");
            let m = f.metadata();
            assert_eq!(
                m["general.file_type"].as_u64(),
                Some(u64::from(dtype.gguf_file_type()))
            );
            assert_eq!(
                m["general.architecture"],
                gguf_arch(model.config().architecture)
            );
            for t in f.tensor_infos() {
                let want_kind = if t.dims.len() == 1 {
                    GGML_F32
                } else {
                    dtype.ggml_type()
                };
                assert_eq!(t.kind, want_kind, "{}", t.name);
                assert_eq!(t.offset % 32, 0, "{}", t.name);
            }
            let weights = f.load_weights(&config).unwrap();
            assert_eq!(weights.len(), original.len());
            if dtype == ExportDtype::F32 {
                for (name, t) in &original {
                    let back = weights.get(name).unwrap_or_else(|| panic!("{name}"));
                    assert_eq!(max_abs_diff(back, t), 0.0, "{tag} {name}");
                }
            }
            let reread = Model::from_weights(&config, weights, Device::Cpu, Kind::Float).unwrap();
            let got = logits(&reread);
            let diff = max_abs_diff(&want, &got);
            let rel = relative_diff(&want, &got);
            println!("{tag} gguf {dtype}: max |Δlogit| {diff:.3e} (relative {rel:.3e})");
            match dtype {
                ExportDtype::F32 => assert!(diff <= 1e-5, "{tag} f32: {diff}"),
                _ => errors.push(rel),
            }
        }
        (errors[0], errors[1])
    }

    #[test]
    fn export_gguf_tiny_llama_round_trips_with_the_embedded_metadata() {
        let source = crate::loader::embedded_gguf_path();
        if !source.exists() {
            println!(
                "skipping: {} not found (run `make setup`)",
                source.display()
            );
            return;
        }
        let model = tiny();
        let (f16, bf16) = gguf_round_trip(&model, &source, "tiny");
        assert!(f16 < 2e-3, "f16 relative logit error {f16}");
        assert!(bf16 < 2e-2, "bf16 relative logit error {bf16}");
        assert!(f16 > 0.0 && bf16 > f16, "{f16} {bf16}");

        // The source's tokenizer, chat template and other metadata travel unchanged.
        let tmp = TempDir::new("tiny-meta");
        let out = tmp.0.join("tiny.gguf");
        write_gguf(&model, &source, ExportDtype::F16, &out).unwrap();
        let (src, exported) = (
            GgufFile::open(&source).unwrap(),
            GgufFile::open(&out).unwrap(),
        );
        let changed: Vec<&str> = src
            .metadata()
            .iter()
            .filter(|(k, v)| exported.metadata().get(*k) != Some(*v))
            .map(|(k, _)| k.as_str())
            .collect();
        let mut expected: Vec<&str> = [
            "general.file_type",
            "llama.attention.head_count",
            "llama.attention.head_count_kv",
            "llama.attention.key_length",
            "llama.attention.value_length",
            "llama.block_count",
            "llama.context_length",
            "llama.embedding_length",
            "llama.feed_forward_length",
            "llama.rope.dimension_count",
        ]
        .into_iter()
        .filter(|k| src.metadata().contains_key(*k))
        .collect();
        expected.sort_unstable();
        assert_eq!(changed, expected);
        // The raw types are kept: a round trip of the metadata is byte-identical.
        let raw_src = read_raw_metadata(&source).unwrap();
        let raw_out = read_raw_metadata(&out).unwrap();
        for kv in &raw_src {
            if changed.contains(&kv.key.as_str()) {
                continue;
            }
            assert!(raw_out.contains(kv), "{} differs", kv.key);
        }
        let t_src = Tokenizer::from_gguf_metadata(src.metadata()).unwrap();
        let t_out = Tokenizer::from_gguf_metadata(exported.metadata()).unwrap();
        let text = "<|im_start|>user\nHello, 12345 wörld!<|im_end|>";
        assert_eq!(t_src.encode(text).unwrap(), t_out.encode(text).unwrap());
        assert_eq!(t_out.chat_template, t_src.chat_template);
        assert!(t_out.chat_template.is_some());

        // The GGUF tokenizer exported as tokenizer.json encodes the same.
        let hf = tmp.0.join("hf");
        write_hf(
            &model,
            &t_src,
            t_src.chat_template.as_deref(),
            ExportDtype::BF16,
            &hf,
        )
        .unwrap();
        let t_hf = Tokenizer::from_file(hf.join("tokenizer.json")).unwrap();
        assert_eq!(t_hf.encode(text).unwrap(), t_src.encode(text).unwrap());
        assert_eq!(t_hf.eos_token_ids, t_src.eos_token_ids);
        assert_eq!(t_hf.bos_token_id, t_src.bos_token_id);
        assert_eq!(t_hf.pad_token_id, t_src.pad_token_id);
        assert_eq!(t_hf.chat_template, t_src.chat_template);
        let ids = t_src.encode(text).unwrap();
        assert_eq!(
            t_hf.decode(&ids, false).unwrap(),
            t_src.decode(&ids, false).unwrap()
        );
    }

    #[test]
    fn llama_q_k_permutation_matches_llama_cpp() {
        // The embedded GGUF was converted by llama.cpp: permuting our (HF-layout) q and k must
        // give its stored rows exactly.
        let source = crate::loader::embedded_gguf_path();
        if !source.exists() {
            println!("skipping: {} not found", source.display());
            return;
        }
        let f = GgufFile::open(&source).unwrap();
        let config = f.model_config().unwrap();
        let weights = f.load_weights(&config).unwrap();
        for (hf, gguf, heads) in [
            (
                "model.layers.0.self_attn.q_proj.weight",
                "blk.0.attn_q.weight",
                config.num_attention_heads,
            ),
            (
                "model.layers.7.self_attn.k_proj.weight",
                "blk.7.attn_k.weight",
                config.num_key_value_heads,
            ),
        ] {
            assert_eq!(gguf_name(hf).as_deref(), Some(gguf));
            let permuted = permute_rows(weights.get(hf).unwrap(), heads).unwrap();
            let stored = f.read_f32(gguf).unwrap();
            assert_eq!(max_abs_diff(&permuted, &stored), 0.0, "{gguf}");
        }
        // Small case by hand: 2 heads of 4 rows; HF row h*4 + j*2 + i ← GGUF row h*4 + i*2 + j.
        let w = Tensor::arange(8, (Kind::Float, Device::Cpu)).view([8, 1]);
        let p = permute_rows(&w, 2).unwrap();
        assert_eq!(
            Vec::<f32>::try_from(p.view([8])).unwrap(),
            [0., 2., 1., 3., 4., 6., 5., 7.]
        );
        assert!(permute_rows(&w, 3).is_err());
    }

    #[test]
    fn export_gguf_qwen2_and_qwen3_round_trip() {
        let tmp = TempDir::new("qwen-gguf");
        for (name, arch) in [("tiny-qwen2", "qwen2"), ("tiny-qwen3", "qwen3")] {
            let model = fixture(name);
            // A llama source: its llama.* keys are dropped, the model's written.
            let source = tmp.0.join(format!("{name}-source.gguf"));
            source_gguf(&source, "llama", model.config().vocab_size);
            let (f16, bf16) = gguf_round_trip(&model, &source, name);
            assert!(f16 < 2e-3 && bf16 < 2e-2, "{name}: {f16} {bf16}");
            let out = tmp.0.join(format!("{name}.gguf"));
            write_gguf(&model, &source, ExportDtype::F32, &out).unwrap();
            let f = GgufFile::open(&out).unwrap();
            let m = f.metadata();
            assert_eq!(m["general.architecture"], arch);
            assert_eq!(m["general.name"], "source");
            assert!(!m.contains_key("llama.block_count"));
            assert_eq!(m[&format!("{arch}.block_count")].as_u64(), Some(2));
            assert_eq!(
                m["tokenizer.ggml.tokens"].as_array().map(Vec::len),
                Some(model.config().vocab_size)
            );
            // Qwen's q rows are stored as HF has them (no permutation).
            let q = f.read_f32("blk.0.attn_q.weight").unwrap();
            let hf = hf_tensors(&model).unwrap();
            let hf_q = &hf
                .iter()
                .find(|(n, _)| n == "model.layers.0.self_attn.q_proj.weight")
                .unwrap()
                .1;
            assert_eq!(max_abs_diff(&q, hf_q), 0.0);
            assert_eq!(
                f.tensor_info("output.weight").is_some(),
                !model.config().tie_word_embeddings
            );
        }
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        let tmp = TempDir::new("errors");
        let model = tiny();
        let out = tmp.0.join("out.gguf");
        // Missing source, a source that is not GGUF, a source with another vocabulary.
        let missing = write_gguf(&model, &tmp.0.join("nope.gguf"), ExportDtype::F16, &out);
        assert!(matches!(missing, Err(Error::Io { .. })), "{missing:?}");
        let text = tmp.0.join("text.gguf");
        std::fs::write(&text, b"not a model at all").unwrap();
        let bad = write_gguf(&model, &text, ExportDtype::F16, &out);
        assert!(matches!(bad, Err(Error::Gguf { .. })), "{bad:?}");
        let other = tmp.0.join("other.gguf");
        source_gguf(&other, "llama", 100);
        let msg = write_gguf(&model, &other, ExportDtype::F16, &out)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("100 tokens") && msg.contains("49152 embedding rows"),
            "{msg}"
        );
        assert!(!out.exists());

        // Switches a format cannot state.
        let mut config = ModelConfig::tiny();
        config.vocab_size = 100;
        config.attention_bias = true;
        let biased = Model::random(&config, 1, Device::Cpu, Kind::Float).unwrap();
        let msg = write_gguf(&biased, &other, ExportDtype::F32, &out)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("attention_bias = true"), "{msg}");
        // … which HF can state for a llama.
        let tokenizer = small_tokenizer(&tmp.0);
        let hf = tmp.0.join("biased");
        write_hf(&biased, &tokenizer, None, ExportDtype::F32, &hf).unwrap();
        let (back, _) = load_checkpoint(&hf).unwrap();
        assert_eq!(&back, biased.config());
        let tokenizer_config: Value =
            serde_json::from_slice(&std::fs::read(hf.join("tokenizer_config.json")).unwrap())
                .unwrap();
        assert!(tokenizer_config.get("chat_template").is_none());
        let mut config = ModelConfig::tiny();
        config.vocab_size = 100;
        config.qk_norm = true;
        let normed = Model::random(&config, 1, Device::Cpu, Kind::Float).unwrap();
        let msg = write_hf(&normed, &tokenizer, None, ExportDtype::F32, &hf)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("qk_norm = true"), "{msg}");

        // A folder with a shard index is refused; a tokenizer bigger than the vocabulary too.
        std::fs::write(hf.join(HF_INDEX), b"{}").unwrap();
        let err = write_hf(&biased, &tokenizer, None, ExportDtype::F32, &hf).unwrap_err();
        assert!(matches!(err, Error::Checkpoint { .. }), "{err:?}");
        let mut config = ModelConfig::tiny();
        config.vocab_size = 4;
        let small = Model::random(&config, 1, Device::Cpu, Kind::Float).unwrap();
        let msg = write_hf(
            &small,
            &tokenizer,
            None,
            ExportDtype::F32,
            &tmp.0.join("small"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            msg.contains("5 token ids") && msg.contains("4 embedding rows"),
            "{msg}"
        );
    }

    #[test]
    fn dtype_names() {
        for (s, d) in [
            ("f32", ExportDtype::F32),
            ("F16", ExportDtype::F16),
            ("bfloat16", ExportDtype::BF16),
        ] {
            assert_eq!(s.parse::<ExportDtype>(), Ok(d));
        }
        assert!("q4"
            .parse::<ExportDtype>()
            .unwrap_err()
            .contains("f32, f16 or bf16"));
        assert_eq!(ExportDtype::BF16.to_string(), "bf16");
        assert_eq!(
            ExportDtype::F16.encode(&[1.0, -2.0]),
            [0x00, 0x3c, 0x00, 0xc0]
        );
        assert_eq!(ExportDtype::BF16.encode(&[1.0]), [0x80, 0x3f]);
    }
}
