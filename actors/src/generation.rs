//! The generation path Acting and Rehearsal share: render a chat prompt (or take the inline
//! protocol's ready one), add the end-of-turn stop, apply the context cap, then ask the Engine
//! and turn its answer into a [`Row`].

use ractor::RpcReplyPort;

use crate::engine::EngineMsg;
use crate::kernels::{ChatMessage, GenerationRequest, SamplingParams};
use crate::protocol::PromptKit;
use crate::slot::Slot;
use crate::storage::{Role, Row};
use crate::worker::ModelInfo;

/// A prompt ready to generate from, or the context cap hit.
pub(crate) enum Prepared {
    Ready(GenerationRequest),
    /// Prompt plus `max_new_tokens` exceed the context.
    TooLong {
        prompt_tokens: usize,
    },
}

/// Renders `messages` (with the generation prompt), then as [`prepare_ids`].
///
/// # Errors
/// The template or tokenizer fails (`what` names the role in the message).
pub(crate) fn prepare(
    kit: &PromptKit,
    info: ModelInfo,
    messages: &[ChatMessage],
    params: SamplingParams,
    stop_string: Option<&str>,
    what: &str,
) -> Result<Prepared, String> {
    let prompt_ids = kit
        .encode_chat(messages, true)
        .map_err(|e| format!("rendering the {what} prompt: {e}"))?;
    Ok(prepare_ids(kit, info, prompt_ids, params, stop_string))
}

/// Takes a ready prompt (the inline protocol builds its own), adds the end-of-turn token and
/// `stop_string` to the stops, and checks prompt plus `max_new_tokens` against the context.
pub(crate) fn prepare_ids(
    kit: &PromptKit,
    info: ModelInfo,
    prompt_ids: Vec<u32>,
    mut params: SamplingParams,
    stop_string: Option<&str>,
) -> Prepared {
    if let Some(eos) = kit.eos_id() {
        if !params.stop_token_ids.contains(&eos) {
            params.stop_token_ids.push(eos);
        }
    }
    if let Some(stop) = stop_string {
        if !params.stop_strings.iter().any(|s| s == stop) {
            params.stop_strings.push(stop.to_string());
        }
    }
    if prompt_ids.len() + params.max_new_tokens > info.context_len {
        return Prepared::TooLong {
            prompt_tokens: prompt_ids.len(),
        };
    }
    Prepared::Ready(GenerationRequest { prompt_ids, params })
}

/// Generates `request` and returns the row (exact ids, log-probs, policy version) with the
/// completion decoded without special tokens.
///
/// # Errors
/// The Engine is unreachable, generation fails, or decoding fails.
pub(crate) async fn generate_row(
    engine: &Slot<EngineMsg>,
    kit: &PromptKit,
    role: Role,
    request: GenerationRequest,
) -> Result<(Row, String), String> {
    let prompt_ids = request.prompt_ids.clone();
    let generated = engine
        .ask("engine", |r| EngineMsg::Generate(request, r))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let text = kit
        .decode(&generated.completion_ids)
        .map_err(|e| format!("decoding a {role} turn: {e}"))?;
    let row = Row {
        role,
        prompt_ids,
        completion_ids: generated.completion_ids,
        logprobs: generated.logprobs,
        policy_version: generated.policy_version,
    };
    Ok((row, text))
}

/// Replies to `reply` from a task off the mailbox, so the actor takes its next message while
/// the Engine works.
pub(crate) fn reply_later<T: Send + 'static>(
    reply: RpcReplyPort<Result<T, String>>,
    work: impl std::future::Future<Output = Result<T, String>> + Send + 'static,
) {
    tokio::spawn(async move {
        let _ = reply.send(work.await);
    });
}
