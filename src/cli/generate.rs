//! `envace generate`: one prompt through the chat template and the generation engine.
use std::time::Instant;

use crate::kernels::{
    load, ChatMessage, Engine, EngineConfig, GenerationRequest, ModelSource, SamplingParams,
};
use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;

use super::ModelArgs;

#[derive(Debug, Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// One user message (or, with --raw, the exact prompt text).
    #[arg(long)]
    prompt: String,
    /// A system message placed before the user message.
    #[arg(long, conflicts_with = "raw")]
    system: Option<String>,
    /// Send --prompt as is, without the chat template.
    #[arg(long)]
    raw: bool,
    /// Generation budget, tokens.
    #[arg(long, default_value_t = 128)]
    max_new_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus mass; 1 disables it.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Keep the k most likely tokens; 0 disables it.
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Seed of the sampling stream.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Extra stop string (repeatable); the model's end-of-turn tokens always stop.
    #[arg(long = "stop")]
    stop: Vec<String>,
    /// Print one JSON object instead of the text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: GenerateArgs) -> Result<()> {
    let (device, dtype) = crate::runtime::resolve(args.model.device, args.model.dtype)?;
    let started = Instant::now();
    let loaded = load(&ModelSource::parse(&args.model.model), device, dtype)
        .with_context(|| format!("loading model {}", args.model.model))?;
    tracing::info!(
        model = %args.model.model,
        device = %crate::runtime::device_name(device),
        dtype = ?dtype,
        seconds = started.elapsed().as_secs_f32(),
        "model loaded"
    );
    let prompt_text = if args.raw {
        args.prompt.clone()
    } else {
        let template = loaded
            .chat_template
            .as_ref()
            .context("the model ships no chat template; pass --raw to send the prompt as is")?;
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(ChatMessage::system(system.as_str()));
        }
        messages.push(ChatMessage::user(args.prompt.as_str()));
        template.render(&messages, None, true)?
    };
    let prompt_ids = loaded.tokenizer.encode(&prompt_text)?;
    let params = SamplingParams {
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        seed: args.seed,
        max_new_tokens: args.max_new_tokens,
        stop_token_ids: loaded.tokenizer.eos_token_ids.clone(),
        stop_strings: args.stop.clone(),
    };
    let mut engine = Engine::new(
        &loaded.model,
        Some(&loaded.tokenizer),
        EngineConfig::default(),
    );
    let started = Instant::now();
    let completion = engine
        .generate(vec![GenerationRequest {
            prompt_ids: prompt_ids.clone(),
            params,
        }])?
        .into_iter()
        .next()
        .context("the engine returned no completion")?;
    let seconds = started.elapsed().as_secs_f64();
    let text = loaded.tokenizer.decode(&completion.completion_ids, false)?;
    if args.json {
        let out = json!({
            "prompt_ids": prompt_ids,
            "completion_ids": completion.completion_ids,
            "completion_text": text,
            "logprobs": completion.logprobs,
            "finish_reason": completion.finish_reason,
        });
        println!("{out}");
    } else {
        println!(
            "{}",
            loaded.tokenizer.decode(&completion.completion_ids, true)?
        );
        eprintln!(
            "[{} prompt tokens, {} new tokens in {seconds:.2} s ({:.1} tokens/s), finish: {:?}]",
            prompt_ids.len(),
            completion.completion_ids.len(),
            completion.completion_ids.len() as f64 / seconds,
            completion.finish_reason
        );
    }
    Ok(())
}
