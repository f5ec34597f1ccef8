//! The one error type of the kernels crate.
use std::path::PathBuf;

/// Everything that can go wrong loading a model or running it. Each variant names the file,
/// tensor, offset or value at fault, so a message alone tells the user what to fix.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be opened or read.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A model named by the user does not exist where it should.
    #[error("model file not found: {path} ({hint})")]
    ModelNotFound { path: PathBuf, hint: String },
    /// A GGUF file is malformed: truncated, corrupt, or not GGUF at all.
    #[error("{path}: invalid GGUF{}: {message}", offset.map(|o| format!(" at byte offset {o}")).unwrap_or_default())]
    Gguf {
        path: PathBuf,
        offset: Option<u64>,
        message: String,
    },
    /// A tensor is stored in a quantisation type this crate cannot dequantise.
    #[error("tensor {tensor}: unsupported GGML type {kind} (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1)")]
    UnsupportedTensorType { tensor: String, kind: String },
    /// A safetensors file or checkpoint directory is malformed.
    #[error("{path}: invalid checkpoint: {message}")]
    Checkpoint { path: PathBuf, message: String },
    /// The model needs a tensor that the weights do not have.
    #[error("missing tensor {name}")]
    MissingTensor { name: String },
    /// The weights have tensors the model does not use (usually: wrong architecture).
    #[error("unexpected tensors not used by the model: {}", names.join(", "))]
    UnexpectedTensors { names: Vec<String> },
    /// A tensor has a different shape than the config implies.
    #[error("tensor {name}: expected shape {expected:?}, found {found:?}")]
    ShapeMismatch {
        name: String,
        expected: Vec<i64>,
        found: Vec<i64>,
    },
    /// The model config is missing a field or has an unsupported value.
    #[error("model config: {0}")]
    Config(String),
    /// The tokenizer could not be built or failed to encode/decode.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template failed to parse or render.
    #[error("chat template: {0}")]
    Template(String),
    /// A prompt plus its generation budget does not fit the model's context.
    #[error("prompt of {prompt_tokens} tokens + {max_new_tokens} new tokens exceeds the context length of {context_len} tokens")]
    ContextOverflow {
        prompt_tokens: usize,
        max_new_tokens: usize,
        context_len: usize,
    },
    /// The requested device is not available.
    #[error("device: {0}")]
    Device(String),
    /// A generation or scoring request is invalid (empty prompt, bad sampling value, …).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// libtorch reported an error.
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}

/// Result alias of the kernels crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
