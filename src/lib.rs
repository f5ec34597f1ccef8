//! envace: EnvACE-style agentic reinforcement learning for LLM tool-calling agents.
//!
//! One policy plays two roles — **Act** (emit tool calls) and **Rehearse** (predict the tool's
//! result) — trained by role-wise GRPO on trajectories whose observations the policy rehearsed
//! itself (arXiv:2608.06197). This crate wires the layers: [`kernels`] (model, tokenizer,
//! generation, scoring), [`actors`] and [`storage`], plus the CLI's runtime choices.
//!
//! ```no_run
//! use envace::kernels::{load, ChatMessage, Engine, EngineConfig, GenerationRequest, ModelSource, SamplingParams};
//! # fn main() -> Result<(), envace::kernels::Error> {
//! let (device, dtype) = envace::runtime::resolve(Default::default(), Default::default())?;
//! let loaded = load(&ModelSource::parse("smollm2-135m"), device, dtype)?;
//! let template = loaded.chat_template.as_ref().expect("SmolLM2 ships a template");
//! let prompt = template.render(&[ChatMessage::user("What is the capital of France?")], None, true)?;
//! let request = GenerationRequest {
//!     prompt_ids: loaded.tokenizer.encode(&prompt)?,
//!     params: SamplingParams { max_new_tokens: 32, stop_token_ids: loaded.tokenizer.eos_token_ids.clone(), ..Default::default() },
//! };
//! let mut engine = Engine::new(&loaded.model, Some(&loaded.tokenizer), EngineConfig::default());
//! let completion = &engine.generate(vec![request])?[0];
//! println!("{}", loaded.tokenizer.decode(&completion.completion_ids, true)?);
//! # Ok(()) }
//! ```

pub use envace_actors as actors;
pub use envace_kernels as kernels;
pub use envace_storage as storage;

pub mod bfcl;
pub mod cli;
pub mod config;
pub mod conformance;
pub mod daemon;
pub mod pipeline;
pub mod plot;
pub mod registry;
pub mod report;
pub mod run_folder;
pub mod runtime;
pub mod stats;
pub mod suite;
pub mod telemetry;
