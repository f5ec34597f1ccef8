//! envace kernels: all tensor code of the project.
//!
//! * weights: [`gguf`] (GGUF v3 with dequantisation) and [`hf`] (safetensors checkpoints);
//! * text: [`tokenizer`] (the `tokenizers` crate) and [`chat`] (the model's Jinja template);
//! * [`model`]: one decoder (Llama, Qwen2, Qwen3) for training and for KV-cached inference;
//! * [`engine`]: batched generation with sampling; [`scoring`]: log-probs for the learner;
//! * [`packing`]: the rows of a trajectory scored in one prefix-packed (trie) forward pass;
//! * [`flops`]: FLOPs per token and the GEMM peak, for utilisation;
//! * [`grpo`]: role-wise GRPO advantages and the clipped PPO loss;
//! * [`learner`]: AdamW steps of GRPO or supervised warm-up with gradient accumulation.

pub mod chat;
mod checkpoint;
pub mod config;
pub mod dequant;
pub mod engine;
pub mod error;
pub mod export;
pub mod fault;
pub mod flops;
pub mod gguf;
pub mod grpo;
pub mod hf;
pub mod kv_cache;
pub mod learner;
pub mod loader;
pub mod model;
mod model_extend;
pub mod optimizer;
pub mod packing;
pub mod prefix_cache;
pub mod pyjson;
pub mod sampling;
pub mod scoring;
pub mod tokenizer;
pub mod weights;

pub use chat::{ChatMessage, ChatTemplate};
pub use config::{Architecture, ModelConfig};
pub use engine::EngineStats;
pub use engine::{Completion, Engine, EngineConfig, FinishReason, GenerationRequest};
pub use error::{Error, Result};
pub use grpo::{
    ppo_loss, role_wise_advantages, row_reward, GrpoConfig, LossAggregation, PpoStats, RowMeta,
};
pub use learner::{Learner, LearnerConfig, LrSchedule, SftStats, StepStats, TrainRow};
pub use loader::{load, LoadedModel, ModelSource};

pub use model::Model;
pub use packing::{pack_groups, packed_len, score_packed, PackedRows};
pub use sampling::SamplingParams;
pub use scoring::{score, score_no_grad, ScoreRow, ScoredBatch};
pub use tokenizer::Tokenizer;
pub use weights::Weights;
