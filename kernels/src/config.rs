//! Model hyper-parameters: a serde mirror of an HF `config.json`, also filled from GGUF metadata.
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The decoder families this crate runs. They share one implementation (`model.rs`) and
/// differ only in the switches of [`ModelConfig`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    /// Llama / SmolLM2: no attention bias, no q/k norm.
    Llama,
    /// Qwen2 / Qwen2.5: bias on the q, k and v projections.
    Qwen2,
    /// Qwen3: RMSNorm on each head of q and k before RoPE, no bias.
    Qwen3,
}

impl Architecture {
    /// Maps an HF `architectures[0]` or `model_type`, or a GGUF `general.architecture`.
    pub fn from_name(name: &str) -> Result<Self> {
        match name.to_ascii_lowercase().as_str() {
            "llama" | "llamaforcausallm" | "mistral" | "mistralforcausallm" => Ok(Self::Llama),
            "qwen2" | "qwen2forcausallm" => Ok(Self::Qwen2),
            "qwen3" | "qwen3forcausallm" => Ok(Self::Qwen3),
            other => Err(Error::Config(format!(
                "unsupported architecture {other:?} (supported: llama, qwen2, qwen3)"
            ))),
        }
    }
}

/// Decoder hyper-parameters. Field names follow HF `config.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub architecture: Architecture,
    /// Vocabulary size (rows of the embedding), tokens.
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    /// Per-head dimension; `hidden_size / num_attention_heads` unless the config says otherwise.
    pub head_dim: usize,
    /// RoPE base θ.
    pub rope_theta: f64,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    /// Context length, tokens (prompt + generated).
    pub max_position_embeddings: usize,
    /// Bias on q/k/v projections (Qwen2).
    pub attention_bias: bool,
    /// Per-head RMSNorm on q and k (Qwen3).
    pub qk_norm: bool,
}

impl ModelConfig {
    /// Checks the divisibility rules the model relies on.
    ///
    /// # Errors
    /// [`Error::Config`] naming the offending field.
    pub fn validate(&self) -> Result<()> {
        let fail = |m: String| Err(Error::Config(m));
        if self.num_attention_heads == 0 || self.num_key_value_heads == 0 {
            return fail("head counts must be positive".into());
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return fail(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return fail(format!(
                "head_dim {} must be even and positive",
                self.head_dim
            ));
        }
        if self.max_position_embeddings == 0 {
            return fail("max_position_embeddings (context length) must be positive".into());
        }
        if self.vocab_size == 0 || self.hidden_size == 0 || self.num_hidden_layers == 0 {
            return fail("vocab_size, hidden_size and num_hidden_layers must be positive".into());
        }
        Ok(())
    }

    /// The `tiny` preset: SmolLM2's architecture and vocabulary with small dimensions, for tests.
    pub fn tiny() -> Self {
        Self {
            architecture: Architecture::Llama,
            vocab_size: 49152,
            hidden_size: 64,
            intermediate_size: 128,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 16,
            rope_theta: 100_000.0,
            rms_norm_eps: 1e-5,
            tie_word_embeddings: true,
            max_position_embeddings: 2048,
            attention_bias: false,
            qk_norm: false,
        }
    }
}
