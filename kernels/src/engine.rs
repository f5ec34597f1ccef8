//! The generation engine: batched prefill and decode over a slot-based KV cache.
//!
//! Requests wait in a queue; each [`Engine::step`] first admits waiting requests into free
//! cache slots (one batched, right-padded prefill for all of them), then runs one decode step
//! for every occupied slot. A finished request frees its slot at once, so a waiting request
//! joins the running batch between two decode steps (continuous batching). Every request
//! keeps its own sampling parameters and random stream (see [`crate::sampling`]).
//!
//! Token-in, token-out: a [`Completion`] carries the exact sampled ids and their log-probs;
//! text is only decoded to check stop strings.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::error::{Error, Result};
use crate::kv_cache::KvCache;
use crate::model::Model;
use crate::sampling::{sample, RowSampler, SamplingParams};
use crate::tokenizer::Tokenizer;

/// One prompt to complete.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerationRequest {
    /// Prompt token ids (already rendered through the chat template), at least one.
    pub prompt_ids: Vec<u32>,
    pub params: SamplingParams,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// A stop token or stop string was produced.
    Stop,
    /// `max_new_tokens` were generated.
    Length,
}

/// The result of one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    /// Sampled ids, including the stop token when one ended generation.
    pub completion_ids: Vec<u32>,
    /// Log-prob of each sampled id under its sampling distribution (natural log), same length.
    pub logprobs: Vec<f32>,
    pub finish_reason: FinishReason,
}

/// Engine limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// Concurrent sequences (KV cache slots).
    pub max_batch: usize,
    /// Padded tokens (`rows × longest prompt`) one prefill call may process.
    pub max_prefill_tokens: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_batch: 32,
            max_prefill_tokens: 8192,
        }
    }
}

/// Identifies a request within one engine.
pub type RequestId = u64;

#[derive(Debug)]
struct Running {
    id: RequestId,
    sampler: RowSampler,
    prompt_len: usize,
    completion: Vec<u32>,
    logprobs: Vec<f32>,
}

impl Running {
    /// Position of the last sampled token, which the next decode step writes to the cache.
    fn next_position(&self) -> usize {
        self.prompt_len + self.completion.len() - 1
    }
}

/// Batched generation over one model. Not `Sync`: one thread drives it.
pub struct Engine<'a> {
    model: &'a Model,
    tokenizer: Option<&'a Tokenizer>,
    config: EngineConfig,
    cache: Option<KvCache>,
    slots: Vec<Option<Running>>,
    waiting: VecDeque<(RequestId, GenerationRequest)>,
    next_id: RequestId,
}

impl<'a> Engine<'a> {
    /// An engine over `model`. `tokenizer` is needed only for requests with stop strings.
    pub fn new(model: &'a Model, tokenizer: Option<&'a Tokenizer>, config: EngineConfig) -> Self {
        let slots = (0..config.max_batch.max(1)).map(|_| None).collect();
        Self {
            model,
            tokenizer,
            config,
            cache: None,
            slots,
            waiting: VecDeque::new(),
            next_id: 0,
        }
    }

    /// Queues a request; it starts at the next [`Engine::step`] with a free slot.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for an empty prompt, an id outside the vocabulary, bad sampling
    /// values or stop strings without a tokenizer; [`Error::ContextOverflow`] when the prompt
    /// plus `max_new_tokens` exceeds the model's context.
    pub fn add_request(&mut self, request: GenerationRequest) -> Result<RequestId> {
        request.params.validate()?;
        let cfg = self.model.config();
        if request.prompt_ids.is_empty() {
            return Err(Error::InvalidRequest("empty prompt".into()));
        }
        if let Some(&bad) = request
            .prompt_ids
            .iter()
            .find(|&&t| t as usize >= cfg.vocab_size)
        {
            return Err(Error::InvalidRequest(format!(
                "prompt token id {bad} is outside the vocabulary of {} tokens",
                cfg.vocab_size
            )));
        }
        let needed = request
            .prompt_ids
            .len()
            .checked_add(request.params.max_new_tokens);
        if needed.is_none_or(|n| n > cfg.max_position_embeddings) {
            return Err(Error::ContextOverflow {
                prompt_tokens: request.prompt_ids.len(),
                max_new_tokens: request.params.max_new_tokens,
                context_len: cfg.max_position_embeddings,
            });
        }
        if !request.params.stop_strings.is_empty() && self.tokenizer.is_none() {
            return Err(Error::InvalidRequest(
                "stop strings need a tokenizer".into(),
            ));
        }
        let id = self.next_id;
        self.next_id += 1;
        self.waiting.push_back((id, request));
        Ok(id)
    }

    /// True while a request is waiting or running.
    pub fn has_unfinished(&self) -> bool {
        !self.waiting.is_empty() || self.slots.iter().any(Option::is_some)
    }

    /// Sequences currently holding a cache slot.
    pub fn running(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// Admits waiting requests (prefill), then decodes one token for every running sequence.
    /// Returns the requests that finished during this step.
    ///
    /// # Errors
    /// [`Error::Torch`] from libtorch, [`Error::Tokenizer`] when decoding for stop strings fails.
    pub fn step(&mut self) -> Result<Vec<(RequestId, Completion)>> {
        let _grad = tch::no_grad_guard();
        let mut finished = self.admit()?;
        finished.extend(self.decode()?);
        Ok(finished)
    }

    /// Runs `requests` to completion and returns their completions in order.
    ///
    /// # Errors
    /// As [`Engine::add_request`] (nothing runs if any request is invalid) and [`Engine::step`].
    pub fn generate(&mut self, requests: Vec<GenerationRequest>) -> Result<Vec<Completion>> {
        let mut ids = Vec::with_capacity(requests.len());
        for request in requests {
            match self.add_request(request) {
                Ok(id) => ids.push(id),
                Err(e) => {
                    self.waiting.retain(|(id, _)| !ids.contains(id));
                    return Err(e);
                }
            }
        }
        let mut done = std::collections::HashMap::with_capacity(ids.len());
        while self.has_unfinished() {
            done.extend(self.step()?);
        }
        ids.iter()
            .map(|id| {
                done.remove(id).ok_or_else(|| {
                    Error::InvalidRequest(format!("request {id} was lost by the engine"))
                })
            })
            .collect()
    }

    /// Moves waiting requests into free slots with one batched prefill; samples their first token.
    fn admit(&mut self) -> Result<Vec<(RequestId, Completion)>> {
        let mut admitted: Vec<(usize, RequestId, GenerationRequest)> = Vec::new();
        let mut longest = 0;
        for slot in 0..self.slots.len() {
            if self.slots[slot].is_some() {
                continue;
            }
            let Some((_, next)) = self.waiting.front() else {
                break;
            };
            let len = next.prompt_ids.len();
            let padded = (admitted.len() + 1) * longest.max(len);
            if !admitted.is_empty() && padded > self.config.max_prefill_tokens {
                break;
            }
            let Some((id, request)) = self.waiting.pop_front() else {
                break;
            };
            longest = longest.max(len);
            admitted.push((slot, id, request));
        }
        if admitted.is_empty() {
            return Ok(Vec::new());
        }
        let model = self.model;
        // Prompt + budget was checked against the context in `add_request`.
        let need = admitted
            .iter()
            .map(|(_, _, r)| r.prompt_ids.len() + r.params.max_new_tokens)
            .max()
            .unwrap_or(1);
        let slots_needed = admitted.iter().map(|(s, _, _)| s + 1).max().unwrap_or(1);
        let (max_slots, context) = (self.slots.len(), model.config().max_position_embeddings);
        let cache = self.cache.get_or_insert_with(|| {
            KvCache::new(
                model.config(),
                slots_needed,
                need,
                model.device(),
                model.dtype(),
            )
        });
        cache.ensure(slots_needed, need, max_slots, context);

        let b = admitted.len();
        let mut ids = vec![0i64; b * longest];
        for (row, (_, _, r)) in admitted.iter().enumerate() {
            for (t, &tok) in r.prompt_ids.iter().enumerate() {
                ids[row * longest + t] = i64::from(tok);
            }
        }
        let device = model.device();
        let input = Tensor::from_slice(&ids)
            .view([b as i64, longest as i64])
            .to_device(device);
        let slots: Vec<i64> = admitted.iter().map(|(s, _, _)| *s as i64).collect();
        let last: Vec<i64> = admitted
            .iter()
            .map(|(_, _, r)| r.prompt_ids.len() as i64 - 1)
            .collect();
        let logits = model.prefill(
            &input,
            &Tensor::from_slice(&slots).to_device(device),
            &Tensor::from_slice(&last).to_device(device),
            cache,
        );

        let mut samplers: Vec<RowSampler> = admitted
            .iter()
            .map(|(_, _, r)| RowSampler::new(r.params.clone()))
            .collect();
        let drawn = sample(&logits, &mut samplers.iter_mut().collect::<Vec<_>>())?;
        let mut finished = Vec::new();
        for (((slot, id, request), sampler), (token, logprob)) in
            admitted.into_iter().zip(samplers).zip(drawn)
        {
            let mut running = Running {
                id,
                sampler,
                prompt_len: request.prompt_ids.len(),
                completion: vec![token],
                logprobs: vec![logprob],
            };
            match finish_reason(self.tokenizer, &running)? {
                Some(reason) => finished.push((id, completion(&mut running, reason))),
                None => self.slots[slot] = Some(running),
            }
        }
        Ok(finished)
    }

    /// One decode step over slots `0..=last occupied`; free slots in that range idle at position 0.
    fn decode(&mut self) -> Result<Vec<(RequestId, Completion)>> {
        let Some(end) = self.slots.iter().rposition(Option::is_some).map(|i| i + 1) else {
            return Ok(Vec::new());
        };
        let Some(cache) = self.cache.as_mut() else {
            return Ok(Vec::new());
        };
        let mut tokens = vec![0i64; end];
        let mut positions = vec![0i64; end];
        for (i, slot) in self.slots[..end].iter().enumerate() {
            if let Some(r) = slot {
                tokens[i] = r.completion.last().copied().map_or(0, i64::from);
                positions[i] = r.next_position() as i64;
            }
        }
        let device = self.model.device();
        let logits = self.model.decode(
            &Tensor::from_slice(&tokens).to_device(device),
            &Tensor::from_slice(&positions).to_device(device),
            cache,
        );
        let occupied: Vec<usize> = (0..end).filter(|&i| self.slots[i].is_some()).collect();
        let rows = Tensor::from_slice(&occupied.iter().map(|&i| i as i64).collect::<Vec<_>>())
            .to_device(device);
        let logits = logits.index_select(0, &rows).to_kind(Kind::Float);
        let drawn = {
            let mut samplers: Vec<&mut RowSampler> = self.slots[..end]
                .iter_mut()
                .flatten()
                .map(|r| &mut r.sampler)
                .collect();
            sample(&logits, &mut samplers)?
        };
        let mut finished = Vec::new();
        let tokenizer = self.tokenizer;
        for (&slot, (token, logprob)) in occupied.iter().zip(drawn) {
            let reason = match self.slots[slot].as_mut() {
                Some(r) => {
                    r.completion.push(token);
                    r.logprobs.push(logprob);
                    finish_reason(tokenizer, r)?
                }
                None => None,
            };
            if let Some(reason) = reason {
                if let Some(mut r) = self.slots[slot].take() {
                    finished.push((r.id, completion(&mut r, reason)));
                }
            }
        }
        Ok(finished)
    }
}

/// Stop token, stop string or budget, checked after each sampled token.
fn finish_reason(tokenizer: Option<&Tokenizer>, r: &Running) -> Result<Option<FinishReason>> {
    let p = &r.sampler.params;
    let last = r.completion.last().copied();
    if last.is_some_and(|t| p.stop_token_ids.contains(&t)) {
        return Ok(Some(FinishReason::Stop));
    }
    if let (false, Some(tok)) = (p.stop_strings.is_empty(), tokenizer) {
        let text = tok.decode(&r.completion, false)?;
        if p.stop_strings.iter().any(|s| text.contains(s.as_str())) {
            return Ok(Some(FinishReason::Stop));
        }
    }
    if r.completion.len() >= p.max_new_tokens {
        return Ok(Some(FinishReason::Length));
    }
    Ok(None)
}

fn completion(r: &mut Running, finish_reason: FinishReason) -> Completion {
    Completion {
        completion_ids: std::mem::take(&mut r.completion),
        logprobs: std::mem::take(&mut r.logprobs),
        finish_reason,
    }
}
