//! GGUF files (llama.cpp's model format): metadata, model config and dequantised weights.
//!
//! [`GgufFile::open`] parses the header, metadata and tensor table of a GGUF v3 (or v2) file
//! with bounds checks on every read, and memory-maps the file so that tensors are read lazily.
//! Every malformed input is an [`Error::Gguf`], never a panic.
//!
//! GGUF stores dimensions innermost first (`ne[0]` = row length); this module returns tensors
//! in torch order, i.e. the GGUF dims reversed (`[out_features, in_features]` for matrices).
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use serde_json::Value;
use tch::Tensor;

use crate::config::{Architecture, ModelConfig};
use crate::dequant;
use crate::error::{Error, Result};
use crate::weights::Weights;

/// The four bytes every GGUF file starts with.
const MAGIC: &[u8; 4] = b"GGUF";
/// Default alignment of the tensor data section, bytes.
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's maximum number of tensor dimensions.
const MAX_DIMS: u32 = 4;
/// Maximum nesting of metadata arrays (arrays of arrays are legal but rare).
const MAX_ARRAY_DEPTH: usize = 4;

/// One entry of a GGUF file's tensor table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufTensorInfo {
    /// GGUF tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions in GGUF order (innermost first); torch order is this reversed.
    pub dims: Vec<u64>,
    /// GGML type id (see [`dequant::type_name`]).
    pub kind: u32,
    /// Absolute byte offset of the tensor data in the file.
    pub offset: u64,
    /// Size of the tensor data in bytes; `None` for types this crate cannot dequantise.
    pub n_bytes: Option<u64>,
}

impl GgufTensorInfo {
    /// Number of elements (product of the dims).
    pub fn n_elements(&self) -> u64 {
        // Checked at open: the product fits an i64.
        self.dims.iter().product()
    }

    /// Shape in torch order (GGUF dims reversed), e.g. `[out, in]` for a matrix.
    pub fn torch_shape(&self) -> Vec<i64> {
        self.dims
            .iter()
            .rev()
            .map(|&d| i64::try_from(d).unwrap_or(i64::MAX))
            .collect()
    }
}

/// An open, memory-mapped GGUF file with its parsed metadata and tensor table.
pub struct GgufFile {
    path: PathBuf,
    mmap: Mmap,
    version: u32,
    metadata: BTreeMap<String, Value>,
    tensors: Vec<GgufTensorInfo>,
    by_name: BTreeMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Opens and parses a GGUF file (version 3; version 2 has the same layout and is accepted).
    ///
    /// Checks that every tensor of a supported type lies inside the file, so a truncated file
    /// fails here rather than on first read.
    ///
    /// # Errors
    /// * [`Error::Io`] when the file cannot be opened or mapped;
    /// * [`Error::Gguf`] (with the byte offset at fault) for a bad magic, an unsupported
    ///   version, a truncated or corrupt header, absurd counts or lengths, duplicate keys or
    ///   tensor names, misaligned tensor offsets, or tensor data extending past the end of the
    ///   file (the message names the tensor).
    pub fn open(path: &Path) -> Result<GgufFile> {
        let io_err = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io_err)?;
        let len = file.metadata().map_err(io_err)?.len();
        if len < 4 {
            return Err(gguf_err(
                path,
                Some(0),
                format!("file of {len} bytes is too short for a GGUF header"),
            ));
        }
        // SAFETY: the map is read-only and lives as long as `GgufFile`. Modifying the file
        // while it is mapped is undefined behaviour, as for every memory-mapped model loader;
        // model files are not written while being loaded.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io_err)?;
        let header = parse_header(path, &mmap)?;
        let mut by_name = BTreeMap::new();
        for (i, t) in header.tensors.iter().enumerate() {
            by_name.insert(t.name.clone(), i);
        }
        Ok(GgufFile {
            path: path.to_path_buf(),
            mmap,
            version: header.version,
            metadata: header.metadata,
            tensors: header.tensors,
            by_name,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// All metadata key/values as JSON: integers as JSON integers, `f32`/`f64` as JSON floats
    /// (`f32` values go through their shortest decimal form, so `1e-5f32` reads as `1e-5`;
    /// NaN/infinity become `null`), bools, strings (invalid UTF-8 replaced by U+FFFD) and
    /// arrays of these. E.g. `tokenizer.ggml.tokens` is an array of strings,
    /// `tokenizer.ggml.token_type` an array of integers.
    pub fn metadata(&self) -> &BTreeMap<String, Value> {
        &self.metadata
    }

    /// Tensor names in file order.
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> + '_ {
        self.tensors.iter().map(|t| t.name.as_str())
    }

    /// The tensor table in file order.
    pub fn tensor_infos(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    /// The table entry of tensor `name`, if present.
    pub fn tensor_info(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.by_name.get(name).and_then(|&i| self.tensors.get(i))
    }

    /// Reads tensor `name` dequantised to an `f32` CPU tensor in torch order (GGUF dims
    /// reversed: `[out_features, in_features]` for a matrix, `[n]` for a vector). No layout
    /// fix-ups are applied (see [`GgufFile::load_weights`] for those).
    ///
    /// # Errors
    /// [`Error::MissingTensor`] when absent, [`Error::UnsupportedTensorType`] for a GGML type
    /// other than F32, F16, BF16, Q4_0, Q4_1, Q8_0, [`Error::Gguf`] if the data lies outside
    /// the file, [`Error::Torch`] if libtorch fails.
    pub fn read_f32(&self, name: &str) -> Result<Tensor> {
        let info = self.tensor_info(name).ok_or_else(|| Error::MissingTensor {
            name: name.to_string(),
        })?;
        let Some(n_bytes) = info.n_bytes else {
            return Err(Error::UnsupportedTensorType {
                tensor: name.to_string(),
                kind: dequant::type_name(info.kind),
            });
        };
        let range = usize::try_from(info.offset)
            .ok()
            .zip(usize::try_from(n_bytes).ok())
            .and_then(|(start, n)| Some(start..start.checked_add(n)?));
        let data = range.and_then(|r| self.mmap.get(r)).ok_or_else(|| {
            gguf_err(
                &self.path,
                Some(info.offset),
                format!("tensor {name}: data of {n_bytes} bytes extends past the end of the file"),
            )
        })?;
        let n_elements = usize::try_from(info.n_elements()).map_err(|_| {
            gguf_err(
                &self.path,
                Some(info.offset),
                format!("tensor {name}: too many elements"),
            )
        })?;
        let values = dequant::dequantize(name, info.kind, data, n_elements)?;
        Ok(Tensor::from_slice(&values).f_reshape(info.torch_shape())?)
    }

    /// Builds the model config from the metadata: `general.architecture` (`llama`, `qwen2`,
    /// `qwen3`) and the `{arch}.` keys `block_count`, `context_length`, `embedding_length`,
    /// `feed_forward_length`, `attention.head_count`, `attention.head_count_kv` (default: the
    /// head count), `rope.freq_base` (default 10000), `attention.layer_norm_rms_epsilon`
    /// (default 1e-5) and `attention.key_length` (head_dim, default hidden / heads). The
    /// vocabulary size comes from `{arch}.vocab_size`, else the length of
    /// `tokenizer.ggml.tokens`, else the rows of `token_embd.weight`. Embeddings are tied
    /// when there is no `output.weight` tensor; qwen2 has attention bias, qwen3 q/k norms.
    ///
    /// # Errors
    /// [`Error::Config`] naming a missing or ill-typed key, an unsupported architecture, or a
    /// config failing [`ModelConfig::validate`].
    pub fn model_config(&self) -> Result<ModelConfig> {
        let arch_name = self
            .metadata
            .get("general.architecture")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                Error::Config(format!(
                    "{}: GGUF metadata has no string general.architecture",
                    self.path.display()
                ))
            })?;
        let architecture = Architecture::from_name(arch_name)?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let hidden_size = self.meta_usize(&key("embedding_length"))?;
        let num_attention_heads = self.meta_usize(&key("attention.head_count"))?;
        let num_key_value_heads = match self.metadata.get(&key("attention.head_count_kv")) {
            None => num_attention_heads,
            Some(_) => self.meta_usize(&key("attention.head_count_kv"))?,
        };
        let head_dim = match self.metadata.get(&key("attention.key_length")) {
            Some(_) => self.meta_usize(&key("attention.key_length"))?,
            None => hidden_size.checked_div(num_attention_heads).ok_or_else(|| {
                Error::Config(format!("{} is 0", key("attention.head_count")))
            })?,
        };
        let vocab_size = match self.metadata.get(&key("vocab_size")) {
            Some(_) => self.meta_usize(&key("vocab_size"))?,
            None => match self
                .metadata
                .get("tokenizer.ggml.tokens")
                .and_then(Value::as_array)
            {
                Some(tokens) => tokens.len(),
                None => self
                    .tensor_info("token_embd.weight")
                    .and_then(|t| t.dims.get(1))
                    .and_then(|&d| usize::try_from(d).ok())
                    .ok_or_else(|| {
                        Error::Config(format!(
                            "{}: no {}, tokenizer.ggml.tokens or token_embd.weight to size the vocabulary",
                            self.path.display(),
                            key("vocab_size")
                        ))
                    })?,
            },
        };
        let config = ModelConfig {
            architecture,
            vocab_size,
            hidden_size,
            intermediate_size: self.meta_usize(&key("feed_forward_length"))?,
            num_hidden_layers: self.meta_usize(&key("block_count"))?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rope_theta: self.meta_f64_or(&key("rope.freq_base"), 10_000.0)?,
            rms_norm_eps: self.meta_f64_or(&key("attention.layer_norm_rms_epsilon"), 1e-5)?,
            tie_word_embeddings: self.tensor_info("output.weight").is_none(),
            max_position_embeddings: self.meta_usize(&key("context_length"))?,
            attention_bias: architecture == Architecture::Qwen2,
            qk_norm: architecture == Architecture::Qwen3,
        };
        config.validate()?;
        Ok(config)
    }

    /// Reads every tensor, dequantised to `f32`, under its HF name and in HF layout:
    /// `token_embd` → `model.embed_tokens`, `output_norm` → `model.norm`, `output` →
    /// `lm_head`, `blk.N.attn_norm` / `ffn_norm` → `model.layers.N.input_layernorm` /
    /// `post_attention_layernorm`, `attn_q` / `attn_k` / `attn_v` / `attn_output` →
    /// `self_attn.q_proj` / `k_proj` / `v_proj` / `o_proj`, `attn_q_norm` / `attn_k_norm` →
    /// `self_attn.q_norm` / `k_norm`, `ffn_gate` / `ffn_up` / `ffn_down` → `mlp.gate_proj` /
    /// `up_proj` / `down_proj` (`.weight` and `.bias` alike).
    ///
    /// For [`Architecture::Llama`], llama.cpp's converter permuted the rows of `attn_q` and
    /// `attn_k` for its interleaved RoPE; this undoes it as HF transformers does
    /// (`w.reshape(n_head, rows / n_head / 2, 2, ..).swapaxes(1, 2).reshape(w.shape)`, with
    /// `config.num_attention_heads` for q and `config.num_key_value_heads` for k).
    ///
    /// # Errors
    /// [`Error::UnexpectedTensors`] listing GGUF names with no HF counterpart (checked before
    /// any data is read), then the errors of [`GgufFile::read_f32`], and [`Error::Gguf`] when
    /// a q/k row count is not a multiple of `2 * n_head`.
    pub fn load_weights(&self, config: &ModelConfig) -> Result<Weights> {
        let mut mapped = Vec::with_capacity(self.tensors.len());
        let mut unknown = Vec::new();
        for t in &self.tensors {
            match hf_name(&t.name) {
                Some(hf) => mapped.push((t, hf)),
                None => unknown.push(t.name.clone()),
            }
        }
        if !unknown.is_empty() {
            return Err(Error::UnexpectedTensors { names: unknown });
        }
        let mut weights = Weights::new();
        for (t, hf) in mapped {
            let mut tensor = self.read_f32(&t.name)?;
            if config.architecture == Architecture::Llama {
                let n_head = if t.name.contains(".attn_q.") {
                    Some(config.num_attention_heads)
                } else if t.name.contains(".attn_k.") {
                    Some(config.num_key_value_heads)
                } else {
                    None
                };
                if let Some(n_head) = n_head {
                    tensor = unpermute_rows(&tensor, n_head).map_err(|message| {
                        gguf_err(&self.path, Some(t.offset), format!("tensor {}: {message}", t.name))
                    })?;
                }
            }
            weights.insert(hf, tensor);
        }
        Ok(weights)
    }

    fn meta_usize(&self, key: &str) -> Result<usize> {
        let value = self.metadata.get(key).ok_or_else(|| {
            Error::Config(format!(
                "{}: GGUF metadata key {key} is missing",
                self.path.display()
            ))
        })?;
        let as_usize = |v: &Value| v.as_u64().and_then(|u| usize::try_from(u).ok());
        let parsed = match value {
            // Some models store per-layer values; accept them when all layers agree.
            Value::Array(items) => {
                let first = items.first().and_then(as_usize);
                first.filter(|f| items.iter().all(|v| as_usize(v) == Some(*f)))
            }
            v => as_usize(v),
        };
        parsed.ok_or_else(|| {
            Error::Config(format!(
                "{}: GGUF metadata key {key} = {value} is not a non-negative integer",
                self.path.display()
            ))
        })
    }

    fn meta_f64_or(&self, key: &str, default: f64) -> Result<f64> {
        match self.metadata.get(key) {
            None => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| {
                Error::Config(format!(
                    "{}: GGUF metadata key {key} = {v} is not a number",
                    self.path.display()
                ))
            }),
        }
    }
}

/// Maps a GGUF tensor name to its HF name; `None` when it has no counterpart.
fn hf_name(gguf: &str) -> Option<String> {
    let (stem, suffix) = gguf.rsplit_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    let global = match stem {
        "token_embd" => Some("model.embed_tokens"),
        "output_norm" => Some("model.norm"),
        "output" => Some("lm_head"),
        _ => None,
    };
    if let Some(g) = global {
        return Some(format!("{g}.{suffix}"));
    }
    let rest = stem.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let hf_part = match part {
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf_part}.{suffix}"))
}

/// Undoes llama.cpp's q/k row permutation: with `w` of shape `[rows, rest..]`,
/// `w.reshape(n_head, rows / n_head / 2, 2, rest..).transpose(1, 2).reshape(w.shape)`.
fn unpermute_rows(w: &Tensor, n_head: usize) -> std::result::Result<Tensor, String> {
    let shape = w.size();
    let rows = shape.first().copied().unwrap_or(0);
    let n_head = i64::try_from(n_head).map_err(|_| "head count too large".to_string())?;
    if n_head == 0 || rows % (2 * n_head) != 0 {
        return Err(format!(
            "{rows} rows cannot be split into {n_head} heads of pairs"
        ));
    }
    let mut split = vec![n_head, rows / n_head / 2, 2];
    split.extend_from_slice(&shape[1..]);
    let out = w
        .f_reshape(&split)
        .and_then(|t| t.f_transpose(1, 2))
        .and_then(|t| t.f_contiguous())
        .and_then(|t| t.f_reshape(&shape))
        .map_err(|e| e.to_string())?;
    Ok(out)
}

fn gguf_err(path: &Path, offset: Option<u64>, message: String) -> Error {
    Error::Gguf {
        path: path.to_path_buf(),
        offset,
        message,
    }
}

/// The parsed header of a GGUF file.
struct Header {
    version: u32,
    metadata: BTreeMap<String, Value>,
    tensors: Vec<GgufTensorInfo>,
}

/// A bounds-checked little-endian reader over the mapped file.
struct Reader<'a> {
    path: &'a Path,
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn err(&self, message: String) -> Error {
        gguf_err(self.path, Some(self.pos as u64), message)
    }

    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn bytes(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        match end.and_then(|e| self.buf.get(self.pos..e)) {
            Some(b) => {
                self.pos += n;
                Ok(b)
            }
            None => Err(self.err(format!(
                "truncated header: {what} needs {n} bytes, {} left in the file",
                self.remaining()
            ))),
        }
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let b = self.bytes(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count or length that must fit the remaining bytes at `min_item_bytes` each.
    fn count(&mut self, what: &str, min_item_bytes: usize) -> Result<usize> {
        let at = self.pos;
        let n = self.u64(what)?;
        let fits = usize::try_from(n)
            .ok()
            .filter(|&n| n.saturating_mul(min_item_bytes) <= self.remaining());
        fits.ok_or_else(|| {
            gguf_err(
                self.path,
                Some(at as u64),
                format!(
                    "{what} {n} is impossible: the {} remaining bytes hold fewer",
                    self.remaining()
                ),
            )
        })
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.count(&format!("length of {what}"), 1)?;
        let b = self.bytes(n, what)?;
        Ok(String::from_utf8_lossy(b).into_owned())
    }

    /// Reads one metadata value of GGUF value type `ty`.
    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<Value> {
        Ok(match ty {
            0 => Value::from(self.array::<1>(key)?[0]),
            1 => Value::from(i8::from_le_bytes(self.array(key)?)),
            2 => Value::from(u16::from_le_bytes(self.array(key)?)),
            3 => Value::from(i16::from_le_bytes(self.array(key)?)),
            4 => Value::from(u32::from_le_bytes(self.array(key)?)),
            5 => Value::from(i32::from_le_bytes(self.array(key)?)),
            6 => {
                let x = f32::from_le_bytes(self.array(key)?);
                // Shortest decimal form, so that 1e-5f32 becomes 1e-5 rather than 9.99999974e-6.
                let x64 = x.to_string().parse::<f64>().unwrap_or(f64::from(x));
                serde_json::Number::from_f64(x64).map_or(Value::Null, Value::Number)
            }
            7 => match self.array::<1>(key)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.err(format!("metadata {key}: invalid bool byte {b}"))),
            },
            8 => Value::String(self.string(key)?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.err(format!("metadata {key}: arrays nested too deeply")));
                }
                let item_ty = self.u32(key)?;
                let item_bytes = match item_ty {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    9 => 12,
                    t => {
                        return Err(
                            self.err(format!("metadata {key}: invalid array item type {t}"))
                        )
                    }
                };
                let n = self.count(&format!("length of array {key}"), item_bytes)?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(item_ty, key, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::from(u64::from_le_bytes(self.array(key)?)),
            11 => Value::from(i64::from_le_bytes(self.array(key)?)),
            12 => {
                let x = f64::from_le_bytes(self.array(key)?);
                serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)
            }
            t => return Err(self.err(format!("metadata {key}: invalid value type {t}"))),
        })
    }
}

/// Parses magic, version, metadata and tensor table, and checks the tensors' data ranges.
fn parse_header(path: &Path, buf: &[u8]) -> Result<Header> {
    let mut r = Reader { path, buf, pos: 0 };
    let magic = r.array::<4>("magic")?;
    if &magic != MAGIC {
        return Err(gguf_err(
            path,
            Some(0),
            format!("not a GGUF file: magic bytes are {magic:02x?}, expected \"GGUF\""),
        ));
    }
    let version = r.u32("version")?;
    if version != 3 && version != 2 {
        let hint = if version.swap_bytes() <= 3 {
            " (a big-endian GGUF file?)"
        } else {
            ""
        };
        return Err(gguf_err(
            path,
            Some(4),
            format!("unsupported GGUF version {version}{hint}; supported: 3 and 2"),
        ));
    }
    // A tensor info takes at least 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset)
    // bytes; a key/value at least 8 (key length) + 4 (type) + 1 (value).
    let n_tensors = r.count("tensor count", 24)?;
    let n_kv = r.count("metadata count", 13)?;

    let mut metadata = BTreeMap::new();
    for _ in 0..n_kv {
        let at = r.pos as u64;
        let key = r.string("metadata key")?;
        let ty = r.u32(&key)?;
        let value = r.value(ty, &key, 0)?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(gguf_err(path, Some(at), format!("duplicate metadata key {key}")));
        }
    }

    let mut tensors: Vec<GgufTensorInfo> = Vec::with_capacity(n_tensors);
    let mut names = std::collections::BTreeSet::new();
    for _ in 0..n_tensors {
        let at = r.pos as u64;
        let name = r.string("tensor name")?;
        let n_dims = r.u32(&name)?;
        if n_dims > MAX_DIMS {
            return Err(r.err(format!(
                "tensor {name}: {n_dims} dimensions, at most {MAX_DIMS} allowed"
            )));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(r.u64(&name)?);
        }
        let kind = r.u32(&name)?;
        let offset = r.u64(&name)?;
        let n_elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| i64::try_from(n).is_ok())
            .ok_or_else(|| {
                gguf_err(path, Some(at), format!("tensor {name}: dims {dims:?} overflow"))
            })?;
        let n_bytes = match dequant::block_layout(kind) {
            None => None,
            Some((block, _)) => {
                let row = dims.first().copied().unwrap_or(1);
                if row % block as u64 != 0 {
                    return Err(gguf_err(
                        path,
                        Some(at),
                        format!(
                            "tensor {name}: row length {row} is not a multiple of the {} block size {block}",
                            dequant::type_name(kind)
                        ),
                    ));
                }
                let n = usize::try_from(n_elements)
                    .ok()
                    .and_then(|n| dequant::byte_size(kind, n))
                    .ok_or_else(|| {
                        gguf_err(path, Some(at), format!("tensor {name}: byte size overflows"))
                    })?;
                Some(n as u64)
            }
        };
        if !names.insert(name.clone()) {
            return Err(gguf_err(path, Some(at), format!("duplicate tensor name {name}")));
        }
        tensors.push(GgufTensorInfo {
            name,
            dims,
            kind,
            offset,
            n_bytes,
        });
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => v
            .as_u64()
            .filter(|&a| a > 0 && a.is_power_of_two())
            .ok_or_else(|| {
                gguf_err(
                    path,
                    None,
                    format!("general.alignment = {v} is not a positive power of two"),
                )
            })?,
    };
    let header_end = r.pos as u64;
    let data_start = header_end.div_ceil(alignment) * alignment;
    let file_len = buf.len() as u64;
    for t in &mut tensors {
        if t.offset % alignment != 0 {
            return Err(gguf_err(
                path,
                Some(data_start.saturating_add(t.offset)),
                format!(
                    "tensor {}: data offset {} is not a multiple of the alignment {alignment}",
                    t.name, t.offset
                ),
            ));
        }
        let start = data_start.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes.unwrap_or(0)));
        match (start, end) {
            (Some(start), Some(end)) if end <= file_len => t.offset = start,
            _ => {
                return Err(gguf_err(
                    path,
                    Some(data_start.saturating_add(t.offset)),
                    format!(
                        "tensor {}: data at offset {} (+{} bytes) extends past the end of the file ({file_len} bytes): truncated file?",
                        t.name,
                        data_start.saturating_add(t.offset),
                        t.n_bytes.map_or("?".to_string(), |n| n.to_string()),
                    ),
                ))
            }
        }
    }
    Ok(Header {
        version,
        metadata,
        tensors,
    })
}
