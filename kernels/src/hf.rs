//! HF checkpoints: a directory with `config.json` and safetensors weights.
//!
//! [`load_checkpoint`] reads the config of a Llama, Qwen2 or Qwen3 model and every tensor of
//! `model.safetensors`, of the shards listed in `model.safetensors.index.json`, or (with
//! neither) of every `*.safetensors` file in the directory, converted to `f32` on the CPU.
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;
use tch::Tensor;

use crate::config::{Architecture, ModelConfig};
use crate::error::{Error, Result};
use crate::weights::Weights;

/// Name of the single-file weights.
const SINGLE_FILE: &str = "model.safetensors";
/// Name of the shard index of sharded weights.
const INDEX_FILE: &str = "model.safetensors.index.json";

/// The fields of an HF `config.json` this crate reads; unknown fields are ignored.
#[derive(Debug, Deserialize)]
struct RawConfig {
    architectures: Option<Vec<String>>,
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rope_theta: Option<f64>,
    /// transformers ≥ 5 writes `rope_parameters: {rope_theta, rope_type}`.
    rope_parameters: Option<RopeParameters>,
    /// transformers < 5 writes RoPE scaling here (`null` when plain).
    rope_scaling: Option<RopeParameters>,
    rms_norm_eps: Option<f64>,
    tie_word_embeddings: Option<bool>,
    max_position_embeddings: Option<usize>,
    attention_bias: Option<bool>,
}

/// RoPE settings: only the plain (`default`) RoPE is implemented.
#[derive(Debug, Deserialize)]
struct RopeParameters {
    rope_theta: Option<f64>,
    rope_type: Option<String>,
    #[serde(rename = "type")]
    legacy_type: Option<String>,
}

/// The part of `model.safetensors.index.json` this crate reads.
#[derive(Debug, Deserialize)]
struct ShardIndex {
    weight_map: BTreeMap<String, String>,
}

/// Loads an HF checkpoint directory: `config.json` plus safetensors weights.
///
/// The architecture comes from `architectures[0]` (e.g. `LlamaForCausalLM`) or else
/// `model_type` (`llama`, `qwen2`, `qwen3`, `mistral`). Defaults for absent fields:
/// `num_key_value_heads` = `num_attention_heads`, `head_dim` = `hidden_size /
/// num_attention_heads`, `rope_theta` 10000, `rms_norm_eps` 1e-6,
/// `max_position_embeddings` 2048, `attention_bias` false. Qwen2 always has attention bias
/// and Qwen3 always has q/k norms. `tie_word_embeddings` is the config's value; when absent
/// it is true exactly when the weights have no `lm_head.weight`. When embeddings are tied, a
/// stored `lm_head.weight` is dropped.
///
/// Weights are read from `model.safetensors.index.json` (every shard it lists must exist and
/// hold the tensors the index assigns to it), else `model.safetensors`, else every
/// `*.safetensors` file in `dir`. Tensors keep their HF names and layout (`[out, in]` for
/// linear weights) and are converted from F32, F16 or BF16 to `f32` CPU tensors.
///
/// # Errors
/// * [`Error::Io`] when a file cannot be read;
/// * [`Error::Checkpoint`] naming the file for: unparseable `config.json` or index (including
///   missing required fields), a missing shard, no safetensors file, a corrupt or truncated
///   safetensors file, a tensor of another dtype (named), a tensor stored twice or absent from
///   the shard the index names;
/// * [`Error::Config`] for an unsupported architecture or a config failing
///   [`ModelConfig::validate`].
pub fn load_checkpoint(dir: &Path) -> Result<(ModelConfig, Weights)> {
    let config_path = dir.join("config.json");
    let raw: RawConfig = read_json(&config_path)?;
    let mut weights = Weights::new();
    let index_path = dir.join(INDEX_FILE);
    if index_path.exists() {
        let index: ShardIndex = read_json(&index_path)?;
        let shards: BTreeSet<&str> = index.weight_map.values().map(String::as_str).collect();
        let mut found: BTreeMap<String, String> = BTreeMap::new();
        for shard in &shards {
            let path = dir.join(shard);
            if !path.is_file() {
                return Err(Error::Checkpoint {
                    path,
                    message: format!("shard {shard} listed in {INDEX_FILE} is missing"),
                });
            }
            for name in read_safetensors(&path, &mut weights)? {
                found.insert(name, (*shard).to_string());
            }
        }
        for (name, shard) in &index.weight_map {
            if found.get(name) != Some(shard) {
                return Err(Error::Checkpoint {
                    path: dir.join(shard),
                    message: format!("tensor {name} listed in {INDEX_FILE} is not in this shard"),
                });
            }
        }
    } else if dir.join(SINGLE_FILE).is_file() {
        read_safetensors(&dir.join(SINGLE_FILE), &mut weights)?;
    } else {
        let entries = std::fs::read_dir(dir).map_err(|source| Error::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(Error::Checkpoint {
                path: dir.to_path_buf(),
                message: format!("no {SINGLE_FILE}, {INDEX_FILE} or other *.safetensors file"),
            });
        }
        for path in &files {
            read_safetensors(path, &mut weights)?;
        }
    }
    let config = build_config(&config_path, raw, &mut weights)?;
    Ok((config, weights))
}

/// Turns the raw `config.json` into a [`ModelConfig`], resolving `tie_word_embeddings`
/// against the loaded weights (and dropping a tied `lm_head.weight`).
fn build_config(config_path: &Path, raw: RawConfig, weights: &mut Weights) -> Result<ModelConfig> {
    let arch_name = raw
        .architectures
        .as_ref()
        .and_then(|a| a.first())
        .or(raw.model_type.as_ref())
        .ok_or_else(|| Error::Checkpoint {
            path: config_path.to_path_buf(),
            message: "neither architectures nor model_type is set".into(),
        })?;
    let architecture = Architecture::from_name(arch_name)?;
    let has_lm_head = weights.get("lm_head.weight").is_some();
    let tie_word_embeddings = raw.tie_word_embeddings.unwrap_or(!has_lm_head);
    if tie_word_embeddings && has_lm_head {
        tracing::warn!(
            "{}: tie_word_embeddings is true; ignoring the stored lm_head.weight",
            config_path.display()
        );
        let shape = weights.get("lm_head.weight").map(Tensor::size);
        weights.take_optional("lm_head.weight", &shape.unwrap_or_default())?;
    }
    let head_dim = match raw.head_dim {
        Some(d) => d,
        None => raw
            .hidden_size
            .checked_div(raw.num_attention_heads)
            .ok_or_else(|| Error::Config("num_attention_heads is 0".into()))?,
    };
    let mut rope_theta = raw.rope_theta;
    for params in [&raw.rope_parameters, &raw.rope_scaling]
        .into_iter()
        .flatten()
    {
        let kind = params.rope_type.as_ref().or(params.legacy_type.as_ref());
        if let Some(kind) = kind.filter(|k| k.as_str() != "default") {
            return Err(Error::Checkpoint {
                path: config_path.to_path_buf(),
                message: format!("RoPE type {kind:?} is not supported (only plain RoPE)"),
            });
        }
        rope_theta = rope_theta.or(params.rope_theta);
    }
    let config = ModelConfig {
        architecture,
        vocab_size: raw.vocab_size,
        hidden_size: raw.hidden_size,
        intermediate_size: raw.intermediate_size,
        num_hidden_layers: raw.num_hidden_layers,
        num_attention_heads: raw.num_attention_heads,
        num_key_value_heads: raw.num_key_value_heads.unwrap_or(raw.num_attention_heads),
        head_dim,
        rope_theta: rope_theta.unwrap_or(10_000.0),
        rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
        tie_word_embeddings,
        max_position_embeddings: raw.max_position_embeddings.unwrap_or(2048),
        attention_bias: architecture == Architecture::Qwen2 || raw.attention_bias.unwrap_or(false),
        qk_norm: architecture == Architecture::Qwen3,
    };
    config.validate()?;
    Ok(config)
}

/// Parses a JSON file; any read or parse failure is an [`Error::Checkpoint`] naming it.
fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::Checkpoint {
        path: path.to_path_buf(),
        message: format!("cannot read: {e}"),
    })?;
    serde_json::from_str(&text).map_err(|e| Error::Checkpoint {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Reads every tensor of one safetensors file into `weights` as `f32`; returns the names.
fn read_safetensors(path: &Path, weights: &mut Weights) -> Result<Vec<String>> {
    let checkpoint_err = |message: String| Error::Checkpoint {
        path: path.to_path_buf(),
        message,
    };
    let io_err = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io_err)?;
    // SAFETY: a read-only map dropped before this function returns; the checkpoint is not
    // modified while it is being loaded.
    let mmap = unsafe { Mmap::map(&file) }.map_err(io_err)?;
    let st = SafeTensors::deserialize(&mmap)
        .map_err(|e| checkpoint_err(format!("corrupt or truncated safetensors file: {e}")))?;
    let mut names = Vec::with_capacity(st.len());
    for (name, view) in st.iter() {
        if weights.get(name).is_some() {
            return Err(checkpoint_err(format!(
                "tensor {name} is stored in more than one file"
            )));
        }
        let data = view.data();
        let values: Vec<f32> = match view.dtype() {
            Dtype::F32 => data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F16 => data
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::BF16 => data
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            other => {
                return Err(checkpoint_err(format!(
                    "tensor {name} has dtype {other:?}; supported: F32, F16, BF16"
                )))
            }
        };
        let shape = view
            .shape()
            .iter()
            .map(|&d| i64::try_from(d))
            .collect::<std::result::Result<Vec<i64>, _>>()
            .map_err(|_| checkpoint_err(format!("tensor {name}: shape too large")))?;
        let tensor = Tensor::from_slice(&values).f_reshape(&shape)?;
        weights.insert(name, tensor);
        names.push(name.to_string());
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::TensorView;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A fresh directory under the temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> Self {
            static COUNTER: AtomicUsize = AtomicUsize::new(0);
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let path = std::env::temp_dir()
                .join(format!("envace-hf-test-{}-{n}-{tag}", std::process::id()));
            let _ = std::fs::remove_dir_all(&path);
            std::fs::create_dir_all(&path).unwrap();
            TempDir(path)
        }

        fn write(&self, name: &str, bytes: &[u8]) {
            std::fs::write(self.0.join(name), bytes).unwrap();
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A raw tensor to serialise: dtype, shape, little-endian bytes.
    type Raw = (String, Dtype, Vec<usize>, Vec<u8>);

    fn f32_raw(name: &str, t: &Tensor) -> Raw {
        let values = Vec::<f32>::try_from(t.flatten(0, -1)).unwrap();
        let shape = t.size().iter().map(|&d| d as usize).collect();
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        (name.to_string(), Dtype::F32, shape, bytes)
    }

    fn serialize(tensors: &[Raw]) -> Vec<u8> {
        let views: Vec<(String, TensorView<'_>)> = tensors
            .iter()
            .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize(views, None).unwrap()
    }

    fn config_json(arch: &str, extra: &str) -> String {
        format!(
            r#"{{"architectures": ["{arch}"], "vocab_size": 10, "hidden_size": 8,
                "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
                "num_key_value_heads": 1, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
                "max_position_embeddings": 128{extra}}}"#
        )
    }

    /// A tiny random llama checkpoint's tensors (f32).
    fn random_tensors() -> Vec<(String, Tensor)> {
        crate::model::with_torch_rng(Some(7), || {
            [
                ("model.embed_tokens.weight", vec![10, 8]),
                ("model.norm.weight", vec![8]),
                ("model.layers.0.self_attn.q_proj.weight", vec![8, 8]),
                ("model.layers.0.self_attn.k_proj.weight", vec![4, 8]),
                ("model.layers.0.mlp.down_proj.weight", vec![8, 16]),
            ]
            .into_iter()
            .map(|(n, s)| {
                (
                    n.to_string(),
                    Tensor::randn(s.as_slice(), tch::kind::FLOAT_CPU),
                )
            })
            .collect()
        })
    }

    fn assert_same(weights: &Weights, expected: &[(String, Tensor)]) {
        for (name, t) in expected {
            let got = weights
                .get(name)
                .unwrap_or_else(|| panic!("missing {name}"));
            assert_eq!(got.kind(), tch::Kind::Float);
            assert!(got.equal(t), "{name} differs");
        }
    }

    fn checkpoint_message(result: Result<(ModelConfig, Weights)>) -> String {
        match result {
            Err(e @ Error::Checkpoint { .. }) => e.to_string(),
            Err(e) => panic!("expected Error::Checkpoint, got {e:?}"),
            Ok(_) => panic!("expected an error"),
        }
    }

    #[test]
    fn single_file_roundtrip_and_tied_default() {
        let dir = TempDir::new("single");
        let tensors = random_tensors();
        let raws: Vec<Raw> = tensors.iter().map(|(n, t)| f32_raw(n, t)).collect();
        dir.write(SINGLE_FILE, &serialize(&raws));
        dir.write(
            "config.json",
            config_json("LlamaForCausalLM", "").as_bytes(),
        );
        let (config, weights) = load_checkpoint(&dir.0).unwrap();
        assert_eq!(config.architecture, Architecture::Llama);
        assert_eq!(
            (
                config.vocab_size,
                config.hidden_size,
                config.intermediate_size
            ),
            (10, 8, 16)
        );
        assert_eq!(
            (config.num_attention_heads, config.num_key_value_heads),
            (2, 1)
        );
        assert_eq!(config.head_dim, 4);
        assert_eq!((config.rope_theta, config.rms_norm_eps), (100_000.0, 1e-5));
        assert_eq!(config.max_position_embeddings, 128);
        // No flag and no lm_head.weight: tied.
        assert!(config.tie_word_embeddings);
        assert!(!config.attention_bias && !config.qk_norm);
        assert_eq!(weights.len(), tensors.len());
        assert_same(&weights, &tensors);
    }

    #[test]
    fn half_precision_dtypes_convert() {
        let dir = TempDir::new("half");
        let vals = [1.0f32, -2.5, 0.099_975_586, 3.0e4, -1.0e-3, 7.0];
        let f16_bytes = vals
            .iter()
            .flat_map(|&x| f16::from_f32(x).to_le_bytes())
            .collect();
        let bf16_bytes = vals
            .iter()
            .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
            .collect();
        dir.write(
            SINGLE_FILE,
            &serialize(&[
                ("a".into(), Dtype::F16, vec![2, 3], f16_bytes),
                ("b".into(), Dtype::BF16, vec![3, 2], bf16_bytes),
            ]),
        );
        dir.write(
            "config.json",
            config_json("Qwen3ForCausalLM", r#", "head_dim": 6"#).as_bytes(),
        );
        let (config, weights) = load_checkpoint(&dir.0).unwrap();
        assert_eq!(config.architecture, Architecture::Qwen3);
        assert!(config.qk_norm && !config.attention_bias);
        assert_eq!(config.head_dim, 6);
        let a = weights.get("a").unwrap();
        assert_eq!(a.size(), [2, 3]);
        let want_a: Vec<f32> = vals.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
        assert_eq!(Vec::<f32>::try_from(a.flatten(0, -1)).unwrap(), want_a);
        assert_eq!(a.double_value(&[0, 1]), -2.5);
        let b = weights.get("b").unwrap();
        assert_eq!(b.size(), [3, 2]);
        let want_b: Vec<f32> = vals.iter().map(|&x| bf16::from_f32(x).to_f32()).collect();
        assert_eq!(Vec::<f32>::try_from(b.flatten(0, -1)).unwrap(), want_b);
        assert_eq!(b.double_value(&[2, 1]), 7.0);
    }

    fn write_sharded(dir: &TempDir, tensors: &[(String, Tensor)]) {
        let (first, second) = tensors.split_at(2);
        let mut map = serde_json::Map::new();
        for (shard, part) in [
            ("model-00001-of-00002.safetensors", first),
            ("model-00002-of-00002.safetensors", second),
        ] {
            let raws: Vec<Raw> = part.iter().map(|(n, t)| f32_raw(n, t)).collect();
            dir.write(shard, &serialize(&raws));
            for (n, _) in part {
                map.insert(n.clone(), shard.into());
            }
        }
        let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
        dir.write(INDEX_FILE, index.to_string().as_bytes());
    }

    #[test]
    fn sharded_roundtrip() {
        let dir = TempDir::new("sharded");
        let mut tensors = random_tensors();
        tensors.push((
            "lm_head.weight".into(),
            crate::model::with_torch_rng(None, || Tensor::randn([10, 8], tch::kind::FLOAT_CPU)),
        ));
        tensors.push((
            "model.layers.0.self_attn.q_proj.bias".into(),
            crate::model::with_torch_rng(None, || Tensor::randn([8], tch::kind::FLOAT_CPU)),
        ));
        write_sharded(&dir, &tensors);
        dir.write("config.json", r#"{"model_type": "qwen2", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2}"#.as_bytes());
        let (config, weights) = load_checkpoint(&dir.0).unwrap();
        assert_eq!(config.architecture, Architecture::Qwen2);
        assert!(config.attention_bias && !config.qk_norm);
        // lm_head.weight present and no flag: untied. Defaults fill the rest.
        assert!(!config.tie_word_embeddings);
        assert_eq!(config.num_key_value_heads, 2);
        assert_eq!((config.rope_theta, config.rms_norm_eps), (10_000.0, 1e-6));
        assert_eq!(weights.len(), tensors.len());
        assert_same(&weights, &tensors);
    }

    #[test]
    fn tied_flag_drops_lm_head_and_glob_fallback() {
        let dir = TempDir::new("tied");
        let mut tensors = random_tensors();
        tensors.push((
            "lm_head.weight".into(),
            crate::model::with_torch_rng(None, || Tensor::randn([10, 8], tch::kind::FLOAT_CPU)),
        ));
        let raws: Vec<Raw> = tensors.iter().map(|(n, t)| f32_raw(n, t)).collect();
        dir.write("weights.safetensors", &serialize(&raws));
        dir.write(
            "config.json",
            config_json("LlamaForCausalLM", r#", "tie_word_embeddings": true"#).as_bytes(),
        );
        let (config, weights) = load_checkpoint(&dir.0).unwrap();
        assert!(config.tie_word_embeddings);
        assert!(weights.get("lm_head.weight").is_none());
        assert_eq!(weights.len(), tensors.len() - 1);
        assert_same(&weights, &tensors[..tensors.len() - 1]);
    }

    #[test]
    fn missing_shard_and_index_mismatch() {
        let dir = TempDir::new("missing");
        write_sharded(&dir, &random_tensors());
        dir.write(
            "config.json",
            config_json("LlamaForCausalLM", "").as_bytes(),
        );
        std::fs::remove_file(dir.0.join("model-00002-of-00002.safetensors")).unwrap();
        let msg = checkpoint_message(load_checkpoint(&dir.0));
        assert!(msg.contains("model-00002-of-00002.safetensors"), "{msg}");
        assert!(msg.contains("missing"), "{msg}");

        // The index assigns a tensor to a shard that does not hold it.
        let dir = TempDir::new("mismatch");
        write_sharded(&dir, &random_tensors());
        dir.write(
            "config.json",
            config_json("LlamaForCausalLM", "").as_bytes(),
        );
        let mut index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.0.join(INDEX_FILE)).unwrap()).unwrap();
        index["weight_map"]["model.norm.weight"] = "model-00002-of-00002.safetensors".into();
        dir.write(INDEX_FILE, index.to_string().as_bytes());
        let msg = checkpoint_message(load_checkpoint(&dir.0));
        assert!(msg.contains("model.norm.weight"), "{msg}");
    }

    #[test]
    fn truncated_and_corrupt_files() {
        let dir = TempDir::new("trunc");
        let raws: Vec<Raw> = random_tensors()
            .iter()
            .map(|(n, t)| f32_raw(n, t))
            .collect();
        let bytes = serialize(&raws);
        dir.write(
            "config.json",
            config_json("LlamaForCausalLM", "").as_bytes(),
        );
        for cut in [0, 5, 20, bytes.len() / 2, bytes.len() - 1] {
            dir.write(SINGLE_FILE, &bytes[..cut]);
            let msg = checkpoint_message(load_checkpoint(&dir.0));
            assert!(
                msg.contains(SINGLE_FILE) && msg.contains("safetensors file"),
                "{msg}"
            );
        }
        let mut garbage = bytes.clone();
        garbage[8] = b'[';
        dir.write(SINGLE_FILE, &garbage);
        checkpoint_message(load_checkpoint(&dir.0));
    }

    #[test]
    fn unsupported_dtype_names_the_tensor() {
        let dir = TempDir::new("dtype");
        dir.write(
            SINGLE_FILE,
            &serialize(&[(
                "model.step".into(),
                Dtype::I64,
                vec![1],
                5i64.to_le_bytes().to_vec(),
            )]),
        );
        dir.write(
            "config.json",
            config_json("LlamaForCausalLM", "").as_bytes(),
        );
        let msg = checkpoint_message(load_checkpoint(&dir.0));
        assert!(msg.contains("model.step") && msg.contains("I64"), "{msg}");
    }

    #[test]
    fn bad_configs() {
        let dir = TempDir::new("config");
        let raws: Vec<Raw> = random_tensors()
            .iter()
            .map(|(n, t)| f32_raw(n, t))
            .collect();
        dir.write(SINGLE_FILE, &serialize(&raws));
        // Missing config.json.
        let msg = checkpoint_message(load_checkpoint(&dir.0));
        assert!(msg.contains("config.json"), "{msg}");
        // Not JSON.
        dir.write("config.json", b"{ not json");
        let msg = checkpoint_message(load_checkpoint(&dir.0));
        assert!(msg.contains("config.json"), "{msg}");
        // A required field missing.
        dir.write(
            "config.json",
            br#"{"model_type": "llama", "vocab_size": 10}"#,
        );
        let msg = checkpoint_message(load_checkpoint(&dir.0));
        assert!(msg.contains("hidden_size"), "{msg}");
        // No architecture at all.
        dir.write(
            "config.json",
            config_json("X", "")
                .replace(r#""architectures": ["X"],"#, "")
                .as_bytes(),
        );
        let msg = checkpoint_message(load_checkpoint(&dir.0));
        assert!(msg.contains("model_type"), "{msg}");
        // Unsupported architecture, invalid head counts.
        dir.write(
            "config.json",
            config_json("GemmaForCausalLM", "").as_bytes(),
        );
        let err = load_checkpoint(&dir.0).unwrap_err();
        assert!(
            matches!(err, Error::Config(_)) && err.to_string().contains("gemmaforcausallm"),
            "{err}"
        );
        dir.write(
            "config.json",
            config_json("LlamaForCausalLM", r#", "num_key_value_heads": 3"#)
                .replace(r#""num_key_value_heads": 1,"#, "")
                .as_bytes(),
        );
        let err = load_checkpoint(&dir.0).unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err}");
        // No weights at all.
        let empty = TempDir::new("empty");
        empty.write(
            "config.json",
            config_json("LlamaForCausalLM", "").as_bytes(),
        );
        let msg = checkpoint_message(load_checkpoint(&empty.0));
        assert!(msg.contains("no model.safetensors"), "{msg}");
    }
}
