//! Batched generation through the public API: three chat prompts with different sampling
//! settings in one engine, printed with their finish reasons and mean log-probs.
//!
//! `cargo run --release --example batch_generate` (after `make setup`; `tiny` as first argument
//! uses the small random model instead of SmolLM2).
use envace::kernels::{
    load, ChatMessage, Engine, EngineConfig, GenerationRequest, ModelSource, SamplingParams,
};

fn main() -> Result<(), envace::kernels::Error> {
    let spec = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "smollm2-135m".into());
    let (device, dtype) = envace::runtime::resolve(Default::default(), Default::default())?;
    let loaded = load(&ModelSource::parse(&spec), device, dtype)?;
    let template = loaded
        .chat_template
        .as_ref()
        .ok_or_else(|| envace::kernels::Error::Template("model has no chat template".into()))?;
    let prompts = [
        ("Name three rivers in Europe.", 0.0, 1.0),
        ("Write a haiku about tools.", 0.7, 0.95),
        ("What is 12 * 12?", 1.0, 0.9),
    ];
    let mut requests = Vec::new();
    for (seed, (text, temperature, top_p)) in prompts.iter().enumerate() {
        let prompt = template.render(&[ChatMessage::user(*text)], None, true)?;
        requests.push(GenerationRequest {
            prompt_ids: loaded.tokenizer.encode(&prompt)?,
            params: SamplingParams {
                temperature: *temperature,
                top_p: *top_p,
                seed: seed as u64,
                max_new_tokens: 48,
                stop_token_ids: loaded.tokenizer.eos_token_ids.clone(),
                ..Default::default()
            },
        });
    }
    let mut engine = Engine::new(
        &loaded.model,
        Some(&loaded.tokenizer),
        EngineConfig::default(),
    );
    for ((text, ..), c) in prompts.iter().zip(engine.generate(requests)?) {
        let mean_lp = c.logprobs.iter().sum::<f32>() / c.logprobs.len().max(1) as f32;
        println!(
            "> {text}\n{}\n[{:?}, {} tokens, mean log-prob {mean_lp:.3}]\n",
            loaded.tokenizer.decode(&c.completion_ids, true)?,
            c.finish_reason,
            c.completion_ids.len()
        );
    }
    Ok(())
}
