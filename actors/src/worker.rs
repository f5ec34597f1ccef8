//! The model worker: the one thread that owns the shared model handle.
//!
//! libtorch's grad mode is thread-local and a `tch::Tensor` is not `Sync`, so all tensor work
//! (generation, scoring, learner steps, weight loads and saves) runs on one dedicated OS thread
//! that owns the [`Model`]. Actors reach it through a [`WorkerHandle`]: a job queue whose
//! replies come back on oneshot channels, so no actor mailbox ever waits on tensor work.
//!
//! Generation requests from all actors share one continuous-batching [`Engine`]: requests that
//! arrive while others are decoding join the running batch between two decode steps. Learner
//! and weight jobs wait until no generation is in flight, so every completion is sampled by
//! exactly one policy version, which it reports.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::kernels::{
    self, score_no_grad, Engine, EngineConfig, EngineStats, FinishReason, GenerationRequest,
    Learner, LearnerConfig, LoadedModel, Model, ScoreRow, SftStats, StepStats, Tokenizer, TrainRow,
};
use crate::learner_actor::{grpo_step, Step};
use crate::storage::{PolicyVersion, Trajectory};

/// Padded tokens per scoring micro-batch.
const SCORE_BATCH_TOKENS: usize = 4096;

/// A finished generation: the exact sampled ids, their sampling log-probs and the policy version
/// that sampled them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Generated {
    /// Sampled ids, including the stop token when one ended generation.
    pub completion_ids: Vec<u32>,
    /// `log π_old` of each sampled id (natural log), same length.
    pub logprobs: Vec<f32>,
    /// Why generation ended (a stop token or string, or the token budget).
    pub finish_reason: FinishReason,
    /// The weights' version when the request was admitted (0 = as loaded).
    pub policy_version: PolicyVersion,
}

/// Why a job of the model thread failed; callers match on it (a context overflow is the
/// request's fault, a stopped thread is the run's).
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The job itself failed: a bad request ([`kernels::Error::InvalidRequest`]), a prompt
    /// over the context ([`kernels::Error::ContextOverflow`]), a torch or I/O error.
    #[error(transparent)]
    Kernel(#[from] kernels::Error),
    /// A decode step of the continuous batch failed; every request in the batch fails with
    /// the same error and the engine starts afresh.
    #[error("generation step failed: {0}")]
    GenerationStep(Arc<kernels::Error>),
    /// A learner job arrived before any `SetLearner`.
    #[error("no learner configured: send SetLearner first")]
    NoLearner,
    /// The weights were loaded but the learner's f32 masters could not follow them.
    #[error("resyncing the learner after a load: {0}")]
    LearnerResync(kernels::Error),
    /// The model thread is gone (it panicked, or every handle was dropped) or dropped the
    /// request unanswered.
    #[error("the model thread has stopped (it crashed or was shut down)")]
    Stopped,
}

/// What a job of the model thread returns.
pub type JobResult<T> = Result<T, WorkerError>;

/// One unit of work for the model thread.
pub enum Job {
    /// Generate one completion.
    Generate(GenerationRequest, oneshot::Sender<JobResult<Generated>>),
    /// Log-probs (temperature 1) of completions given prompts, without gradients: one
    /// `Vec<f32>` per row, one value per completion token.
    Score(Vec<ScoreRow>, oneshot::Sender<JobResult<Vec<Vec<f32>>>>),
    /// (Re)build the optimizer with this configuration (a fresh AdamW state); with
    /// `grpo.kl_coef` set, the current weights become the frozen KL reference.
    SetLearner(Box<LearnerConfig>, oneshot::Sender<JobResult<()>>),
    /// One GRPO optimizer step on rows with their advantages; bumps the policy version.
    Train(Vec<TrainRow>, oneshot::Sender<JobResult<StepStats>>),
    /// One role-wise GRPO step on a step's judged trajectories, with the configured learner's
    /// advantage settings ([`crate::learner_actor::grpo_step`]); the second field holds the ids
    /// that end a turn (empty rows). Bumps the policy version unless the step is skipped.
    GrpoStep(Vec<Trajectory>, Vec<u32>, oneshot::Sender<JobResult<Step>>),
    /// One supervised (warm-up) optimizer step; bumps the policy version.
    Sft(Vec<ScoreRow>, oneshot::Sender<JobResult<SftStats>>),
    /// Write all weights to a safetensors file.
    Save(PathBuf, oneshot::Sender<JobResult<()>>),
    /// Replace all weights from a safetensors file written by `Save`, and set the version.
    Load(PathBuf, PolicyVersion, oneshot::Sender<JobResult<()>>),
    /// Write the learner's state besides the weights (AdamW moments, f32 masters, step
    /// counts) to a safetensors file, durably ([`Learner::save_state`]).
    SaveLearner(PathBuf, oneshot::Sender<JobResult<()>>),
    /// Restore a state written by `SaveLearner` into the configured learner, after the weights
    /// were loaded ([`Learner::load_state`]).
    LoadLearner(PathBuf, oneshot::Sender<JobResult<()>>),
    /// The generation engine's cumulative counters (prefill tokens computed and reused,
    /// decode tokens, prefix-cache hits); answered at once, even while generating.
    EngineStats(oneshot::Sender<JobResult<EngineStats>>),
}

/// Facts about the served model that prompt builders need.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelInfo {
    /// Context length, tokens: prompt plus new tokens must fit.
    pub context_len: usize,
    /// Vocabulary size, tokens.
    pub vocab_size: usize,
}

/// A cloneable handle to the model thread. Dropping every handle stops the thread.
#[derive(Clone)]
pub struct WorkerHandle {
    tx: crossbeam_channel::Sender<Job>,
    version: Arc<AtomicU64>,
    info: ModelInfo,
}

impl std::fmt::Debug for WorkerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerHandle")
            .field("info", &self.info)
            .field("version", &self.policy_version())
            .finish()
    }
}

impl WorkerHandle {
    /// Starts the model thread over `model` (it takes ownership). `tokenizer` serves stop
    /// strings.
    pub fn spawn(model: Model, tokenizer: Tokenizer, engine: EngineConfig) -> Self {
        let info = ModelInfo {
            context_len: model.config().max_position_embeddings,
            vocab_size: model.config().vocab_size,
        };
        let (tx, rx) = crossbeam_channel::unbounded();
        let version = Arc::new(AtomicU64::new(0));
        let v = version.clone();
        // The thread ends when the last handle (sender) is dropped.
        let spawned = std::thread::Builder::new()
            .name("envace-model".into())
            .spawn(move || {
                // A panic here would silently fail every later request: log it loudly first.
                let run = std::panic::AssertUnwindSafe(|| serve(model, tokenizer, engine, rx, v));
                if let Err(panic) = std::panic::catch_unwind(run) {
                    let what = panic
                        .downcast_ref::<String>()
                        .map(String::as_str)
                        .or_else(|| panic.downcast_ref::<&str>().copied())
                        .unwrap_or("unknown panic");
                    tracing::error!(
                        panic = what,
                        "the model thread panicked; requests will fail"
                    );
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the model thread; every request will fail");
        }
        Self { tx, version, info }
    }

    /// [`WorkerHandle::spawn`] over a loaded checkpoint.
    pub fn from_loaded(loaded: LoadedModel, engine: EngineConfig) -> Self {
        Self::spawn(loaded.model, loaded.tokenizer, engine)
    }

    /// A handle around a job queue served by someone else (tests script a policy this way).
    pub fn from_queue(
        tx: crossbeam_channel::Sender<Job>,
        info: ModelInfo,
        version: Arc<AtomicU64>,
    ) -> Self {
        Self { tx, version, info }
    }

    /// Context length and vocabulary of the served model.
    pub fn info(&self) -> ModelInfo {
        self.info
    }

    /// The number of optimizer steps (or weight loads) applied to the shared weights.
    pub fn policy_version(&self) -> PolicyVersion {
        PolicyVersion(self.version.load(Ordering::SeqCst))
    }

    /// Queues `make(reply)` and awaits its reply.
    ///
    /// # Errors
    /// The job's own error, or [`WorkerError::Stopped`] when the model thread has stopped.
    pub async fn request<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<JobResult<T>>) -> Job,
    ) -> JobResult<T> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(make(tx)).map_err(|_| WorkerError::Stopped)?;
        rx.await.map_err(|_| WorkerError::Stopped)?
    }

    /// Generates one completion.
    ///
    /// # Errors
    /// [`WorkerError::Kernel`] as [`Engine::add_request`] (empty prompt, bad ids or sampling
    /// values, context overflow); [`WorkerError::GenerationStep`]; [`WorkerError::Stopped`].
    pub async fn generate(&self, request: GenerationRequest) -> JobResult<Generated> {
        self.request(|tx| Job::Generate(request, tx)).await
    }

    /// The generation engine's cumulative counters since the worker started (a failed
    /// generation step restarts them).
    ///
    /// # Errors
    /// [`WorkerError::Stopped`].
    pub async fn engine_stats(&self) -> JobResult<EngineStats> {
        self.request(Job::EngineStats).await
    }
}

/// The model thread's loop: continuous batching for generation, other jobs between batches.
fn serve(
    model: Model,
    tokenizer: Tokenizer,
    config: EngineConfig,
    rx: crossbeam_channel::Receiver<Job>,
    version: Arc<AtomicU64>,
) {
    let _span = tracing::info_span!("model_thread").entered();
    let mut engine = Engine::new(&model, Some(&tokenizer), config.clone());
    let mut learner: Option<Learner<'_>> = None;
    let mut waiting: std::collections::HashMap<
        u64,
        (oneshot::Sender<JobResult<Generated>>, PolicyVersion),
    > = Default::default();
    let mut deferred: VecDeque<Job> = VecDeque::new();
    loop {
        if engine.has_unfinished() {
            // Admit whatever arrived since the last step, then decode one step.
            while let Ok(job) = rx.try_recv() {
                admit(job, &mut engine, &mut waiting, &mut deferred, &version);
            }
            match engine.step() {
                Ok(done) => {
                    for (id, c) in done {
                        if let Some((reply, v)) = waiting.remove(&id) {
                            let _ = reply.send(Ok(Generated {
                                completion_ids: c.completion_ids,
                                logprobs: c.logprobs,
                                finish_reason: c.finish_reason,
                                policy_version: v,
                            }));
                        }
                    }
                }
                Err(e) => {
                    // A failed step poisons every running request: fail them all, start over.
                    tracing::error!(error = %e, "generation step failed");
                    let e = Arc::new(e);
                    for (_, (reply, _)) in waiting.drain() {
                        let _ = reply.send(Err(WorkerError::GenerationStep(e.clone())));
                    }
                    engine = Engine::new(&model, Some(&tokenizer), config.clone());
                }
            }
            continue;
        }
        let job = match deferred.pop_front() {
            Some(job) => job,
            None => match rx.recv() {
                Ok(job) => job,
                Err(_) => return,
            },
        };
        match job {
            Job::Generate(..) => admit(job, &mut engine, &mut waiting, &mut deferred, &version),
            Job::Score(rows, reply) => {
                let out = score_no_grad(&model, &rows, 1.0, SCORE_BATCH_TOKENS)
                    .map_err(WorkerError::from);
                let _ = reply.send(out);
            }
            Job::SetLearner(cfg, reply) => {
                learner = None;
                // A k3 KL needs a frozen reference: the weights as they are now.
                let out = if cfg.grpo.kl_coef.is_some() {
                    model
                        .deep_copy()
                        .and_then(|reference| Learner::with_reference(&model, reference, *cfg))
                } else {
                    Learner::new(&model, *cfg)
                }
                .map(|l| learner = Some(l));
                let _ = reply.send(out.map_err(WorkerError::from));
            }
            Job::Train(rows, reply) => {
                // No request is running: free the KV cache so it and the step's activations
                // are not both resident (the next batch allocates it again). The step changes
                // the weights, so the kept prefixes' KV goes too.
                engine.release_memory();
                let out = with_learner(&mut learner, |l| l.step(&rows));
                if out.is_ok() {
                    version.fetch_add(1, Ordering::SeqCst);
                }
                let _ = reply.send(out);
            }
            Job::GrpoStep(trajectories, stop_ids, reply) => {
                let out = match learner.as_mut() {
                    None => Err(WorkerError::NoLearner),
                    Some(l) => grpo_step(l, &trajectories, &stop_ids, || engine.release_memory()),
                };
                let out = out.map(|mut step| {
                    if !step.skipped {
                        version.fetch_add(1, Ordering::SeqCst);
                    }
                    step.policy_version = PolicyVersion(version.load(Ordering::SeqCst));
                    step
                });
                let _ = reply.send(out);
            }
            Job::Sft(rows, reply) => {
                engine.release_memory();
                let out = with_learner(&mut learner, |l| l.sft_step(&rows));
                if out.is_ok() {
                    version.fetch_add(1, Ordering::SeqCst);
                }
                let _ = reply.send(out);
            }
            Job::EngineStats(reply) => {
                let _ = reply.send(Ok(engine.stats()));
            }
            Job::Save(path, reply) => {
                let _ = reply.send(model.save_weights(&path).map_err(WorkerError::from));
            }
            Job::SaveLearner(path, reply) => {
                let _ = reply.send(with_learner(&mut learner, |l| l.save_state(&path)));
            }
            Job::LoadLearner(path, reply) => {
                let _ = reply.send(with_learner(&mut learner, |l| l.load_state(&path)));
            }
            Job::Load(path, v, reply) => {
                // Even a failed load may have replaced some parameters: drop KV of the old ones.
                engine.clear_prefix_cache();
                let mut out = model.load_weights(&path).map_err(WorkerError::from);
                // bf16 master weights must follow the loaded ones (else the next step writes
                // the old master back).
                if let Some(l) = learner.as_mut() {
                    if let Err(e) = l.weights_replaced() {
                        out = out.and(Err(WorkerError::LearnerResync(e)));
                    }
                }
                if out.is_ok() {
                    version.store(v.0, Ordering::SeqCst);
                }
                let _ = reply.send(out);
            }
        }
    }
}

fn with_learner<T>(
    learner: &mut Option<Learner<'_>>,
    f: impl FnOnce(&mut Learner<'_>) -> crate::kernels::Result<T>,
) -> JobResult<T> {
    match learner {
        Some(l) => f(l).map_err(WorkerError::from),
        None => Err(WorkerError::NoLearner),
    }
}

fn admit(
    job: Job,
    engine: &mut Engine<'_>,
    waiting: &mut std::collections::HashMap<
        u64,
        (oneshot::Sender<JobResult<Generated>>, PolicyVersion),
    >,
    deferred: &mut VecDeque<Job>,
    version: &AtomicU64,
) {
    match job {
        // Behind a waiting learner or weight job, generation waits too: otherwise a steady
        // stream of requests would keep the batch busy and starve the job forever.
        job @ Job::Generate(..) if !deferred.is_empty() => deferred.push_back(job),
        Job::EngineStats(reply) => {
            let _ = reply.send(Ok(engine.stats()));
        }
        Job::Generate(request, reply) => match engine.add_request(request) {
            Ok(id) => {
                waiting.insert(id, (reply, PolicyVersion(version.load(Ordering::SeqCst))));
            }
            Err(e) => {
                let _ = reply.send(Err(WorkerError::Kernel(e)));
            }
        },
        other => deferred.push_back(other),
    }
}
