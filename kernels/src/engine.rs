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
//!
//! Automatic prefix caching ([`crate::prefix_cache`]): a finished sequence's KV is kept; a new
//! prompt that shares at least [`MIN_REUSE_TOKENS`] leading tokens with a kept sequence copies
//! that KV into its slot and prefills only the remaining tokens ([`Model::prefill_extend`]).
//! Prompts without a hit share one batched prefill as before.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::error::{Error, Result};
use crate::kv_cache::KvCache;
use crate::model::Model;
use crate::prefix_cache::{common_prefix, PrefixCache, MIN_REUSE_TOKENS};
use crate::sampling::{sample, RowSampler, SamplingParams};
use crate::tokenizer::Tokenizer;

/// Waiting prompts sharing this many more tokens with a prompt being prefilled than the prefix
/// cache can give wait one step to copy them instead (see `Engine::admit`).
pub const DEFER_MIN_SHARED: usize = 64;

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
    /// The most tokens of finished sequences' KV kept for reuse by later prompts (automatic
    /// prefix caching, LRU eviction); 0 turns it off. Memory: `tokens × 2 × layers × kv_heads
    /// × head_dim × bytes(dtype)`, on the model's device — SmolLM2-135M in f32 takes 46 KiB
    /// per token, about 720 MiB at the default 16,384 (half in bf16). Kept on top of the
    /// slot-based KV cache.
    pub prefix_cache_tokens: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_batch: 32,
            max_prefill_tokens: 8192,
            prefix_cache_tokens: 16384,
        }
    }
}

/// Cumulative work counters of an [`Engine`] (since it was built), all in tokens except
/// `prefix_hits` and `prefix_evictions`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineStats {
    /// Prompt tokens run through prefill (real tokens, padding not counted), tokens.
    pub prefill_tokens_computed: u64,
    /// Prompt tokens whose KV was copied from the prefix cache instead, tokens.
    pub prefill_tokens_reused: u64,
    /// Tokens run through decode steps (one per running sequence per step), tokens.
    pub decode_tokens: u64,
    /// Prompts that reused a cached prefix.
    pub prefix_hits: u64,
    /// Prefix-cache entries evicted to stay within `prefix_cache_tokens`.
    pub prefix_evictions: u64,
    /// KV currently held by the prefix cache, tokens.
    pub prefix_cache_tokens: u64,
}

/// Identifies a request within one engine.
pub type RequestId = u64;

#[derive(Debug)]
struct Running {
    id: RequestId,
    sampler: RowSampler,
    prompt_len: usize,
    /// The prompt, kept when the prefix cache is on (its ids key the stored KV).
    prompt_ids: Vec<u32>,
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
    prefix: PrefixCache,
    prefill_tokens_computed: u64,
    decode_tokens: u64,
}

/// A request taken into a slot this step, with the prefix it reuses (`reuse` tokens, 0 = none).
struct Admitted {
    slot: usize,
    id: RequestId,
    request: GenerationRequest,
    reuse: usize,
}

impl<'a> Engine<'a> {
    /// An engine over `model`. `tokenizer` is needed only for requests with stop strings.
    pub fn new(model: &'a Model, tokenizer: Option<&'a Tokenizer>, config: EngineConfig) -> Self {
        let slots = (0..config.max_batch.max(1)).map(|_| None).collect();
        Self {
            model,
            tokenizer,
            cache: None,
            slots,
            waiting: VecDeque::new(),
            next_id: 0,
            prefix: PrefixCache::new(config.prefix_cache_tokens),
            prefill_tokens_computed: 0,
            decode_tokens: 0,
            config,
        }
    }

    /// Cumulative work counters since the engine was built.
    pub fn stats(&self) -> EngineStats {
        let p = self.prefix.stats();
        EngineStats {
            prefill_tokens_computed: self.prefill_tokens_computed,
            prefill_tokens_reused: p.reused_tokens,
            decode_tokens: self.decode_tokens,
            prefix_hits: p.hits,
            prefix_evictions: p.evictions,
            prefix_cache_tokens: self.prefix.tokens() as u64,
        }
    }

    /// Drops every kept prefix. Call it whenever the weights change: KV computed by other
    /// weights is stale.
    pub fn clear_prefix_cache(&mut self) {
        self.prefix.clear();
    }

    /// Frees the prefix cache, and the KV cache when no request is running (e.g. before a
    /// learner step, so they and its activations are not resident together); the next
    /// admission allocates again. Counters are kept.
    pub fn release_memory(&mut self) {
        if self.slots.iter().all(Option::is_none) {
            self.cache = None;
        }
        self.prefix.clear();
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

    /// Moves waiting requests into free slots; samples their first token. Prompts with a cached
    /// prefix copy its KV and prefill the rest alone; the others share one batched prefill.
    ///
    /// A waiting prompt that shares at least [`DEFER_MIN_SHARED`] more leading tokens with a
    /// prompt prefilled in this admission than the prefix cache can give it waits for the next
    /// step instead: the prefilled prompts are kept in the cache right away, so it then copies
    /// that prefix (the K samples of a task, or tasks with the same tools, compute their common
    /// prompt once).
    fn admit(&mut self) -> Result<Vec<(RequestId, Completion)>> {
        let mut admitted: Vec<Admitted> = Vec::new();
        // Padded prefill cost so far: batched rows × their longest prompt, plus hits' suffixes.
        let (mut rows, mut longest, mut extend_tokens) = (0, 0, 0);
        let mut next_waiting = 0;
        for slot in 0..self.slots.len() {
            if self.slots[slot].is_some() {
                continue;
            }
            // The first waiting request that is not deferred (see above).
            let pick = loop {
                let Some((_, next)) = self.waiting.get(next_waiting) else {
                    break None;
                };
                let reuse = self.prefix.peek(&next.prompt_ids);
                let shared = if self.prefix.budget() == 0 {
                    0
                } else {
                    admitted
                        .iter()
                        .filter(|a| a.reuse == 0)
                        .map(|a| common_prefix(&a.request.prompt_ids, &next.prompt_ids))
                        .max()
                        .unwrap_or(0)
                };
                if shared >= reuse + DEFER_MIN_SHARED {
                    next_waiting += 1;
                    continue;
                }
                break Some((next_waiting, next.prompt_ids.len(), reuse));
            };
            let Some((at, len, reuse)) = pick else {
                break;
            };
            let cost = if reuse > 0 {
                rows * longest + extend_tokens + (len - reuse)
            } else {
                (rows + 1) * longest.max(len) + extend_tokens
            };
            if !admitted.is_empty() && cost > self.config.max_prefill_tokens {
                break;
            }
            let Some((id, request)) = self.waiting.remove(at) else {
                break;
            };
            if reuse > 0 {
                extend_tokens += len - reuse;
            } else {
                rows += 1;
                longest = longest.max(len);
            }
            admitted.push(Admitted {
                slot,
                id,
                request,
                reuse,
            });
        }
        if admitted.is_empty() {
            return Ok(Vec::new());
        }
        let model = self.model;
        // Prompt + budget was checked against the context in `add_request`.
        let need = admitted
            .iter()
            .map(|a| a.request.prompt_ids.len() + a.request.params.max_new_tokens)
            .max()
            .unwrap_or(1);
        let slots_needed = admitted.iter().map(|a| a.slot + 1).max().unwrap_or(1);
        let (max_slots, context) = (self.slots.len(), model.config().max_position_embeddings);
        let cache = self.cache.get_or_insert_with(|| {
            KvCache::new(
                model.config(),
                slots_needed,
                need,
                model.device(),
                model.kv_dtype(),
            )
        });
        cache.ensure(slots_needed, need, max_slots, context);
        let device = model.device();

        // Hits first: copy the cached prefix into the slot, prefill the rest of the prompt.
        let mut hit_logits: Vec<Option<Tensor>> = Vec::with_capacity(admitted.len());
        for a in &mut admitted {
            if a.reuse == 0 {
                hit_logits.push(None);
                continue;
            }
            let prompt = &a.request.prompt_ids;
            match self.prefix.lookup(prompt) {
                Some((entry, n)) if n == a.reuse => {
                    cache.load_slot(a.slot, entry.k(), entry.v(), n);
                    let rest: Vec<i64> = prompt[n..].iter().map(|&t| i64::from(t)).collect();
                    let input = Tensor::from_slice(&rest)
                        .view([1, rest.len() as i64])
                        .to_device(device);
                    hit_logits.push(Some(model.prefill_extend(
                        &input,
                        n as i64,
                        a.slot as i64,
                        cache,
                    )));
                    self.prefill_tokens_computed += rest.len() as u64;
                }
                // `peek` and `lookup` see the same entries, so this does not happen; if it did,
                // the batched prefill below would serve the request.
                _ => {
                    a.reuse = 0;
                    hit_logits.push(None);
                }
            }
        }

        let misses: Vec<&Admitted> = admitted.iter().filter(|a| a.reuse == 0).collect();
        let miss_logits = if misses.is_empty() {
            None
        } else {
            let b = misses.len();
            let longest = misses
                .iter()
                .map(|a| a.request.prompt_ids.len())
                .max()
                .unwrap_or(1);
            let mut ids = vec![0i64; b * longest];
            for (row, a) in misses.iter().enumerate() {
                for (t, &tok) in a.request.prompt_ids.iter().enumerate() {
                    ids[row * longest + t] = i64::from(tok);
                }
                self.prefill_tokens_computed += a.request.prompt_ids.len() as u64;
            }
            let input = Tensor::from_slice(&ids)
                .view([b as i64, longest as i64])
                .to_device(device);
            let slots: Vec<i64> = misses.iter().map(|a| a.slot as i64).collect();
            let last: Vec<i64> = misses
                .iter()
                .map(|a| a.request.prompt_ids.len() as i64 - 1)
                .collect();
            let logits = model.prefill(
                &input,
                &Tensor::from_slice(&slots).to_device(device),
                &Tensor::from_slice(&last).to_device(device),
                cache,
            );
            // Keep the prompts at once, for the requests deferred above.
            for a in &misses {
                let len = a.request.prompt_ids.len();
                if len >= MIN_REUSE_TOKENS && len <= self.prefix.budget() {
                    let (k, v) = cache.read_slot(a.slot, len);
                    self.prefix.insert(a.request.prompt_ids.clone(), k, v);
                }
            }
            Some(logits)
        };
        // One row per admitted request, in admission order.
        let mut next_miss = 0;
        let mut rows_logits = Vec::with_capacity(admitted.len());
        for hit in hit_logits {
            match (hit, &miss_logits) {
                (Some(l), _) => rows_logits.push(l),
                (None, Some(m)) => {
                    rows_logits.push(m.narrow(0, next_miss, 1));
                    next_miss += 1;
                }
                (None, None) => {
                    return Err(Error::InvalidRequest(
                        "a request was admitted without a prefill".into(),
                    ))
                }
            }
        }
        let logits = Tensor::cat(&rows_logits, 0);

        let mut samplers: Vec<RowSampler> = admitted
            .iter()
            .map(|a| RowSampler::new(a.request.params.clone()))
            .collect();
        let drawn = sample(&logits, &mut samplers.iter_mut().collect::<Vec<_>>())?;
        let keep_prompt = self.prefix.budget() > 0;
        let mut finished = Vec::new();
        for ((a, sampler), (token, logprob)) in admitted.into_iter().zip(samplers).zip(drawn) {
            let prompt_len = a.request.prompt_ids.len();
            let mut running = Running {
                id: a.id,
                sampler,
                prompt_len,
                prompt_ids: if keep_prompt {
                    a.request.prompt_ids
                } else {
                    Vec::new()
                },
                completion: vec![token],
                logprobs: vec![logprob],
            };
            match finish_reason(self.tokenizer, &running)? {
                Some(reason) => {
                    self.keep_prefix(a.slot, &running);
                    finished.push((a.id, completion(&mut running, reason)));
                }
                None => self.slots[a.slot] = Some(running),
            }
        }
        Ok(finished)
    }

    /// Stores the KV of a finished sequence still in `slot`: its prompt and completion except
    /// the last sampled token, which was never fed back (`prompt + completion − 1` positions).
    fn keep_prefix(&mut self, slot: usize, r: &Running) {
        let len = r.prompt_len + r.completion.len() - 1;
        if r.prompt_ids.is_empty() || len < MIN_REUSE_TOKENS || len > self.prefix.budget() {
            return;
        }
        let Some(cache) = self.cache.as_ref() else {
            return;
        };
        let mut ids = Vec::with_capacity(len);
        ids.extend_from_slice(&r.prompt_ids);
        ids.extend_from_slice(&r.completion[..r.completion.len() - 1]);
        let (k, v) = cache.read_slot(slot, len);
        self.prefix.insert(ids, k, v);
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
        self.decode_tokens += self.slots[..end].iter().flatten().count() as u64;
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
                    self.keep_prefix(slot, &r);
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

#[cfg(test)]
mod tests {
    use tch::{Device, Kind};

    use super::*;
    use crate::config::ModelConfig;

    fn model() -> Model {
        Model::random(&ModelConfig::tiny(), 3, Device::Cpu, Kind::Float).unwrap()
    }

    /// Deterministic pseudo-random ids, distinct per `seed`.
    fn tokens(seed: u32, n: usize) -> Vec<u32> {
        (0..n as u32)
            .map(|i| (seed * 7919 + i * 104_729 + 17) % 49_000 + 100)
            .collect()
    }

    fn greedy(prompt: &[u32], max_new_tokens: usize) -> GenerationRequest {
        GenerationRequest {
            prompt_ids: prompt.to_vec(),
            params: SamplingParams {
                max_new_tokens,
                ..Default::default()
            },
        }
    }

    fn engine(model: &Model, prefix_cache_tokens: usize) -> Engine<'_> {
        Engine::new(
            model,
            None,
            EngineConfig {
                prefix_cache_tokens,
                ..Default::default()
            },
        )
    }

    /// Three append-only turns: each prompt is the previous prompt + completion + 10 new tokens.
    fn conversation(engine: &mut Engine<'_>) -> Vec<Completion> {
        let mut prompt = tokens(1, 40);
        let mut out = Vec::new();
        for turn in 0..3 {
            let c = engine
                .generate(vec![greedy(&prompt, 12)])
                .unwrap()
                .remove(0);
            prompt.extend(&c.completion_ids);
            prompt.extend(tokens(10 + turn, 10));
            out.push(c);
        }
        out
    }

    fn assert_same(a: &[Completion], b: &[Completion]) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert_eq!(x.completion_ids, y.completion_ids, "request {i}");
            for (p, q) in x.logprobs.iter().zip(&y.logprobs) {
                assert!((p - q).abs() < 1e-4, "request {i}: log-prob {p} vs {q}");
            }
        }
    }

    #[test]
    fn prefix_reuse_keeps_greedy_ids_in_an_append_only_conversation() {
        let model = model();
        let mut off = engine(&model, 0);
        let mut on = engine(&model, 16384);
        let expected = conversation(&mut off);
        let got = conversation(&mut on);
        assert_same(&expected, &got);
        assert!(expected.iter().all(|c| c.completion_ids.len() == 12));

        // Turn 2 reuses prompt 1 + completion 1 minus its last token (40 + 11), turn 3 reuses
        // prompt 2 + completion 2 minus one (62 + 11); each entry subsumes the previous one.
        let s = on.stats();
        assert_eq!(s.prefix_hits, 2);
        assert_eq!(s.prefill_tokens_reused, 51 + 73);
        assert_eq!(s.prefill_tokens_computed, 40 + 11 + 11);
        assert_eq!(s.prefix_cache_tokens, 84 + 11);
        assert_eq!(s.prefix_evictions, 0);
        assert_eq!(s.decode_tokens, 3 * 11);
        let s_off = off.stats();
        assert_eq!(s_off.prefill_tokens_computed, 40 + 62 + 84);
        assert_eq!(
            (s_off.prefill_tokens_reused, s_off.prefix_cache_tokens),
            (0, 0)
        );

        on.clear_prefix_cache();
        assert_eq!(on.stats().prefix_cache_tokens, 0);
    }

    #[test]
    fn branches_off_a_shared_prefix_match_with_hits_and_misses_in_one_batch() {
        let model = model();
        let shared = tokens(2, 30);
        let branch = |seed: u32, n: usize| {
            let mut p = shared.clone();
            p.extend(tokens(seed, n));
            p
        };
        let run = |budget: usize| {
            let mut e = engine(&model, budget);
            let mut out = e.generate(vec![greedy(&branch(20, 10), 8)]).unwrap();
            // One hit (the second branch) and one miss (an unrelated prompt) admitted together.
            out.extend(
                e.generate(vec![greedy(&branch(21, 8), 8), greedy(&tokens(3, 25), 8)])
                    .unwrap(),
            );
            (out, e.stats())
        };
        let (expected, _) = run(0);
        let (got, stats) = run(16384);
        assert_same(&expected, &got);
        assert_eq!(stats.prefix_hits, 1);
        assert_eq!(stats.prefill_tokens_reused, 30);
        assert_eq!(stats.prefill_tokens_computed, 40 + 8 + 25);
    }

    #[test]
    fn prompts_sharing_a_prefix_in_one_admission_compute_it_once() {
        let model = model();
        // Four samples of one prompt and two prompts sharing its first 80 tokens, all queued
        // together (the K samples of a task; tasks with the same tools).
        let prompt = tokens(7, 100);
        let mut sibling = prompt[..80].to_vec();
        sibling.extend(tokens(8, 20));
        let mut cousin = prompt[..80].to_vec();
        cousin.extend(tokens(9, 20));
        let requests = || {
            let mut r: Vec<GenerationRequest> = (0..4).map(|_| greedy(&prompt, 6)).collect();
            r.push(greedy(&sibling, 6));
            r.push(greedy(&cousin, 6));
            r
        };
        let mut off = engine(&model, 0);
        let expected = off.generate(requests()).unwrap();
        // Without a prefix cache every prompt is computed.
        assert_eq!(off.stats().prefill_tokens_computed, 6 * 100);
        let mut e = engine(&model, 16384);
        let got = e.generate(requests()).unwrap();
        assert_same(&expected, &got);
        let s = e.stats();
        // The first prompt is computed whole; the other five wait one step and copy it: the
        // three copies of it compute their last token, the two others their 20 own tokens.
        assert_eq!(s.prefix_hits, 5);
        assert_eq!(s.prefill_tokens_computed, 100 + 3 + 20 + 20);
        assert_eq!(s.prefill_tokens_reused, 3 * 99 + 2 * 80);
    }

    #[test]
    fn a_small_budget_evicts_and_keeps_ids() {
        let model = model();
        let p1 = tokens(4, 40);
        let p2 = tokens(5, 40);
        let run = |budget: usize| {
            let mut e = engine(&model, budget);
            let mut out = Vec::new();
            for p in [&p1, &p2, &p1] {
                out.extend(e.generate(vec![greedy(p, 12)]).unwrap());
            }
            // The next turn of the last conversation: its prefix is still held.
            let mut next = p1.clone();
            next.extend(&out[2].completion_ids);
            next.extend(tokens(6, 5));
            out.extend(e.generate(vec![greedy(&next, 12)]).unwrap());
            (out, e.stats())
        };
        let (expected, _) = run(0);
        // Room for one 51-token entry, not two.
        let (got, stats) = run(80);
        assert_same(&expected, &got);
        assert_eq!(
            stats.prefix_evictions, 2,
            "p1 evicted by p2, p2 by p1 again"
        );
        assert_eq!(stats.prefix_hits, 1);
        assert_eq!(stats.prefill_tokens_reused, 51);
        assert_eq!(stats.prefix_cache_tokens, 57 + 11);
    }
}
