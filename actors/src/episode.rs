//! The episode driver: runs one task through the turn protocol (DESIGN.md §2) and returns the
//! finished, judged trajectory.
//!
//! Per user turn: the user messages join the history; Act generates a turn; a final answer (no
//! `<tool_call>` block) ends the user turn, otherwise every call of the turn is executed —
//! rehearsed by the policy (self-rehearsal) or run in the real environment — each against the
//! same history, and all results are appended after the last one. When a user turn ends the
//! judge scores the transcript so far; the next user turn follows only if no required item
//! failed. An Act parse error, a Rehearse format error, the generation-call cap or the context
//! cap end the episode inside the turn in progress; the judge then scores the whole
//! [`transcript`], in which that turn has no final answer (the rule checklist and BFCL's checker
//! give it 0, as the reference does; the dense checklist gives partial credit) and later turns
//! are never reached.
//!
//! The driver knows no protocol: the [`Agents::protocol`] opens one
//! [`Transcript`](crate::protocol::Transcript) per episode, which renders every prompt, reads
//! every completion and keeps the history (and, inline, the token stream); the driver asks the
//! Policy actor for completions, the Environment or Rehearse role for results and the Judge
//! for verdicts, and keeps the rows.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::env_actor::EnvMsg;
use crate::environment::ToolCall;
use crate::judge::{TurnCalls, Verdict};
use crate::judge_actor::JudgeMsg;
use crate::kernels::{pyjson, SamplingParams};
use crate::policy::{PolicyError, PolicyMsg, PolicyRequest, PolicyTurn};
use crate::protocol::{parse_act, EpisodeContext, Protocol, ProtocolError, ToolResult, Transcript};
use crate::slot::{ActorCallError, Pool, Slot};
use crate::storage::{
    ExecutionMode, Message, MessageRole, Role, Row, RunId, Termination, Timings, ToolExchange,
    Trajectory, TurnVerdict,
};
use crate::task::EpisodeTask;

/// Protocol settings of an episode; defaults are the authors' (DESIGN.md §2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EpisodeConfig {
    /// Most generation calls (Act turns plus Rehearse calls) per episode.
    pub max_generation_calls: usize,
    /// Most Act turns in one user turn (`None`: only `max_generation_calls` bounds them). A
    /// policy that keeps calling tools without a final answer ends the episode here, as at the
    /// generation-call cap, instead of filling the context.
    pub max_act_turns_per_user_turn: Option<usize>,
    /// Play at most this many user turns of each task (`None`: all); the judge still divides
    /// by the task's number of turns.
    pub max_user_turns: Option<usize>,
    /// New-token budget of one Act turn.
    pub act_max_new_tokens: usize,
    /// New-token budget of one Rehearse call.
    pub rehearse_max_new_tokens: usize,
    /// Sampling temperature (training rollouts: 1.0; evaluation: 0.6).
    pub temperature: f32,
    /// Nucleus mass (training: 1.0, so log-probs match the learner's).
    pub top_p: f32,
    /// Top-k (training: 0, every token).
    pub top_k: usize,
    /// Times an episode is rerun when an actor fails under it, before it is recorded failed.
    pub max_retries: u32,
}

impl Default for EpisodeConfig {
    fn default() -> Self {
        Self {
            max_generation_calls: 200,
            max_act_turns_per_user_turn: None,
            max_user_turns: None,
            act_max_new_tokens: 512,
            rehearse_max_new_tokens: 512,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            max_retries: 1,
        }
    }
}

impl EpisodeConfig {
    fn params(&self, max_new_tokens: usize, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            seed,
            max_new_tokens,
            stop_token_ids: Vec::new(),
            stop_strings: Vec::new(),
        }
    }
}

/// How tool calls are answered.
#[derive(Clone)]
pub enum ObservationSource {
    /// The policy's Rehearse role predicts every result (no real environment call), on the
    /// same Policy workers as Act.
    Rehearsal,
    /// A real environment executes every call (counted by the Environment actor).
    Real(Slot<EnvMsg>),
}

/// The actors an episode talks to, and the protocol its prompts follow.
#[derive(Clone)]
pub struct Agents {
    /// Policy workers (round-robin): every Act turn and Rehearse call.
    pub policy: Arc<Pool<PolicyMsg>>,
    /// Who answers tool calls.
    pub observations: ObservationSource,
    /// The judge scoring each user turn and the episode.
    pub judge: Slot<JudgeMsg>,
    /// Reference or inline prompts ([`crate::protocol::protocol_for`]).
    pub protocol: Arc<dyn Protocol>,
}

/// Why an episode could not be played to its end (the driver retries it, then records it
/// failed; see [`run_episode_supervised`]).
#[derive(Debug, thiserror::Error)]
pub enum EpisodeError {
    /// An actor (environment, judge) failed or stopped under the episode.
    #[error(transparent)]
    Actor(#[from] ActorCallError),
    /// A generation call failed (the Engine, the model thread, decoding).
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// A prompt could not be rendered or encoded.
    #[error("task {task}: {source}")]
    Protocol {
        task: String,
        #[source]
        source: ProtocolError,
    },
    /// The environment refused to reset or to execute a call.
    #[error("task {task}: environment: {message}")]
    Environment { task: String, message: String },
}

impl EpisodeError {
    /// Whether a rerun can succeed: an actor that failed or stopped (the supervisor restarts
    /// it) or a failed generation step. A prompt that does not render, a completion that does
    /// not decode or an environment that refuses the task fail the same way again.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Actor(_) | Self::Policy(PolicyError::Engine(_) | PolicyError::Generation { .. })
        )
    }
}

/// One episode to run.
#[derive(Debug, Clone)]
pub struct EpisodeSpec {
    /// The task to play.
    pub task: Arc<EpisodeTask>,
    /// Few-shot facts for Rehearse (see `protocol::SeedPool`).
    pub facts: Arc<Vec<ToolExchange>>,
    /// A rehearsal memory shown to Act (test-time scaling).
    pub memory: Option<String>,
    /// Run, step and sample index: the trajectory's key in storage.
    pub run: RunId,
    /// Training step (0 outside training).
    pub step: u64,
    /// Index of the trajectory in its group of K.
    pub sample: u32,
    /// Seed of this episode's sampling; generation call n uses a seed derived from it and n.
    pub seed: u64,
}

static NEXT_EPISODE: AtomicU64 = AtomicU64::new(1);

/// Runs `spec` and retries it when an actor fails under it ([`EpisodeError::is_transient`]);
/// after `max_retries` reruns, or at once for an error a rerun repeats, the trajectory is
/// recorded with [`Termination::ActorFailed`] and the reason as a system message, reward 0 —
/// never dropped.
pub async fn run_episode_supervised(
    agents: &Agents,
    cfg: &EpisodeConfig,
    spec: &EpisodeSpec,
) -> Trajectory {
    let mut attempt = 0;
    loop {
        match run_episode(agents, cfg, spec).await {
            Ok(t) => return t,
            Err(e) if attempt < cfg.max_retries && e.is_transient() => {
                attempt += 1;
                tracing::warn!(task = %spec.task.id, attempt, error = %e, "episode failed; retrying");
                metrics::counter!("episode_retries").increment(1);
                // Give the supervisor a moment to restart the failed actor.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(e) => {
                tracing::error!(task = %spec.task.id, error = %e, "episode failed; recorded as failed");
                metrics::counter!("episodes_failed").increment(1);
                return failed_trajectory(spec, mode_of(&agents.observations), &e);
            }
        }
    }
}

fn mode_of(observations: &ObservationSource) -> ExecutionMode {
    match observations {
        ObservationSource::Rehearsal => ExecutionMode::Rehearsal,
        ObservationSource::Real(_) => ExecutionMode::Real,
    }
}

fn failed_trajectory(spec: &EpisodeSpec, mode: ExecutionMode, e: &EpisodeError) -> Trajectory {
    Trajectory {
        run: spec.run.clone(),
        step: spec.step,
        task: spec.task.id.clone(),
        sample: spec.sample,
        mode,
        rows: Vec::new(),
        messages: vec![Message::new(
            MessageRole::System,
            format!("episode failed: {e}"),
        )],
        reward: 0.0,
        verdicts: Vec::new(),
        termination: Termination::ActorFailed,
        timings: Timings::default(),
    }
}

/// Runs one episode (see the module doc).
///
/// # Errors
/// [`EpisodeError`] when an actor failed or stopped under the episode (retry it), a
/// generation call or the environment failed, or a prompt could not be rendered.
pub async fn run_episode(
    agents: &Agents,
    cfg: &EpisodeConfig,
    spec: &EpisodeSpec,
) -> Result<Trajectory, EpisodeError> {
    let start = Instant::now();
    let task = &spec.task;
    let episode = NEXT_EPISODE.fetch_add(1, Ordering::Relaxed);
    let mut run = Run {
        transcript: agents.protocol.open(EpisodeContext {
            task: task.clone(),
            facts: spec.facts.clone(),
            memory: spec.memory.clone(),
        }),
        rows: Vec::new(),
        timings: Timings::default(),
        calls: 0,
    };
    if let ObservationSource::Real(env) = &agents.observations {
        let t = Instant::now();
        let env_task = task.env.clone();
        env.ask("environment", |r| EnvMsg::Open(episode, env_task, r))
            .await?
            .map_err(|message| EpisodeError::Environment {
                task: task.id.to_string(),
                message: format!("reset: {message}"),
            })?;
        run.timings.environment_s += t.elapsed().as_secs_f64();
    }
    let result = drive(agents, cfg, spec, episode, &mut run).await;
    if let ObservationSource::Real(env) = &agents.observations {
        let _ = env.get().cast(EnvMsg::Close(episode));
    }
    let (transcript, termination) = result?;
    let t = Instant::now();
    let judge_task = Arc::new(task.judge.clone());
    let mut verdict = agents
        .judge
        .ask("judge", |r| {
            JudgeMsg::Judge(judge_task, transcript.clone(), r)
        })
        .await?;
    run.timings.judge_s += t.elapsed().as_secs_f64();
    fit_turns(&mut verdict, task.judge.num_turns());
    run.timings.total_s = start.elapsed().as_secs_f64();
    Ok(Trajectory {
        run: spec.run.clone(),
        step: spec.step,
        task: task.id.clone(),
        sample: spec.sample,
        mode: mode_of(&agents.observations),
        rows: run.rows,
        messages: run.transcript.into_history(),
        reward: verdict.reward,
        verdicts: verdict
            .turn_scores
            .iter()
            .enumerate()
            .map(|(t, s)| TurnVerdict {
                user_turn: t as u32,
                score: s.score,
                passed: s.passed_required,
                reason: s.reason.clone(),
            })
            .collect(),
        termination,
        timings: run.timings,
    })
}

/// Makes a verdict carry exactly one score per user turn of the task (a judge that returns
/// fewer would inflate R = Σ scores / turns): missing turns score 0, extra ones are dropped.
fn fit_turns(verdict: &mut Verdict, turns: usize) {
    if verdict.turn_scores.len() != turns {
        tracing::warn!(
            got = verdict.turn_scores.len(),
            turns,
            "the judge returned a score count other than the task's turns; padding with 0"
        );
        verdict.turn_scores.resize(
            turns,
            crate::judge::TurnScore {
                score: 0.0,
                passed_required: false,
                reason: "not scored by the judge".into(),
            },
        );
        *verdict = Verdict::from_turn_scores(std::mem::take(&mut verdict.turn_scores));
    }
}

/// The judge's view of a conversation: one [`TurnCalls`] per user turn started (a turn starts
/// at a user message that follows a non-user one), read back from the messages themselves so
/// the episode driver, evaluation metrics and a stored trajectory all agree.
///
/// Each assistant message is parsed with [`parse_act`] against `whitelist` (what the
/// transcript did when it was generated): its calls are the turn's executed calls, no call marks
/// the final answer, and a parse error marks the turn malformed with the complete calls before
/// the bad block as [`TurnCalls::unexecuted_calls`]. Tool and system messages are skipped.
pub fn transcript(history: &[Message], whitelist: &[&str]) -> Vec<TurnCalls> {
    let mut turns: Vec<TurnCalls> = Vec::new();
    let mut previous_user = false;
    for m in history {
        let user = m.role == MessageRole::User;
        if user && !previous_user {
            turns.push(TurnCalls::default());
        }
        previous_user = user;
        let (MessageRole::Assistant, Some(turn)) = (m.role, turns.last_mut()) else {
            continue;
        };
        match parse_act(&m.content, whitelist) {
            Ok(out) if out.is_final_answer() => {
                turn.final_answer = true;
                turn.answer.clone_from(&m.content);
            }
            Ok(out) => turn.calls.extend(out.calls),
            Err(e) => {
                turn.malformed = true;
                turn.unexecuted_calls.extend(e.calls_before);
            }
        }
    }
    turns
}

struct Run {
    transcript: Box<dyn Transcript>,
    rows: Vec<Row>,
    timings: Timings,
    /// Generation calls so far.
    calls: usize,
}

impl Run {
    fn push_row(&mut self, row: Row) -> u32 {
        self.rows.push(row);
        (self.rows.len() - 1) as u32
    }
}

/// What the driver does after one tool call.
enum CallOutcome {
    /// The call was answered.
    Answered(ToolResult),
    /// The episode ends here (a malformed rehearsed result, a cap).
    Ends(Termination),
}

async fn drive(
    agents: &Agents,
    cfg: &EpisodeConfig,
    spec: &EpisodeSpec,
    episode: u64,
    run: &mut Run,
) -> Result<(Vec<TurnCalls>, Termination), EpisodeError> {
    let task = &spec.task;
    let seed_of = |n: usize| {
        spec.seed
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(n as u64)
    };
    let turns = cfg
        .max_user_turns
        .map_or(task.user_turns.len(), |m| m.min(task.user_turns.len()));
    let protocol_error = |source| EpisodeError::Protocol {
        task: task.id.to_string(),
        source,
    };
    let whitelist = task.tool_names();
    let done = |run: &Run, termination| {
        (
            transcript(run.transcript.history(), &whitelist),
            termination,
        )
    };
    for (t, user_messages) in task.user_turns.iter().enumerate().take(turns) {
        if let ObservationSource::Real(env) = &agents.observations {
            let _ = env.get().cast(EnvMsg::BeginTurn(episode, t));
        }
        run.transcript
            .push_user(user_messages)
            .map_err(protocol_error)?;
        let mut act_turns = 0;
        loop {
            let turn_cap = cfg
                .max_act_turns_per_user_turn
                .is_some_and(|cap| act_turns >= cap);
            if run.calls >= cfg.max_generation_calls || turn_cap {
                return Ok(done(run, Termination::MaxGenerationCalls));
            }
            act_turns += 1;
            let clock = Instant::now();
            let request = PolicyRequest {
                role: Role::Act,
                prompt: run.transcript.act_prompt().map_err(protocol_error)?,
                params: cfg.params(cfg.act_max_new_tokens, seed_of(run.calls)),
            };
            let act = generate(agents, request).await?;
            run.timings.act_s += clock.elapsed().as_secs_f64();
            run.calls += 1;
            let (row, text) = match act {
                PolicyTurn::LengthExceeded { .. } => {
                    return Ok(done(run, Termination::LengthExceeded));
                }
                PolicyTurn::Generated { row, text } => (row, text),
            };
            let r = run.push_row(row);
            let completion = &run.rows[r as usize].completion_ids;
            let output = match run.transcript.push_act(r, completion, &text) {
                Ok(o) => o,
                Err(e) => {
                    run.transcript
                        .push_message(Message::new(MessageRole::Tool, e.to_tool_message()));
                    return Ok(done(run, Termination::ActParseError));
                }
            };
            if output.is_final_answer() {
                break;
            }
            // Every call of the turn sees the same conversation; results are appended
            // afterwards.
            let mut results = Vec::with_capacity(output.calls.len());
            for call in &output.calls {
                match execute(agents, cfg, spec, episode, run, call, &seed_of).await? {
                    CallOutcome::Answered(result) => results.push(result),
                    CallOutcome::Ends(termination) => return Ok(done(run, termination)),
                }
            }
            run.transcript
                .push_results(results)
                .map_err(protocol_error)?;
        }
        let clock = Instant::now();
        let judge_task = Arc::new(task.judge.clone());
        let so_far = transcript(run.transcript.history(), &whitelist);
        let verdict = agents
            .judge
            .ask("judge", |r| JudgeMsg::Judge(judge_task, so_far, r))
            .await?;
        run.timings.judge_s += clock.elapsed().as_secs_f64();
        let passed = verdict
            .turn_scores
            .get(t)
            .is_some_and(|s| s.passed_required);
        if !passed {
            return Ok(done(run, Termination::RequiredCheckFailed));
        }
    }
    Ok(done(run, Termination::Completed))
}

/// One generation call on the next Policy worker.
async fn generate(agents: &Agents, request: PolicyRequest) -> Result<PolicyTurn, EpisodeError> {
    Ok(agents
        .policy
        .pick()
        .ask("policy", |r| PolicyMsg::Generate(request, r))
        .await??)
}

/// Executes one call of the last Act turn: really (the environment's observation) or by the
/// Rehearse role (a prompt from the transcript, read by the protocol).
async fn execute(
    agents: &Agents,
    cfg: &EpisodeConfig,
    spec: &EpisodeSpec,
    episode: u64,
    run: &mut Run,
    call: &ToolCall,
    seed_of: &impl Fn(usize) -> u64,
) -> Result<CallOutcome, EpisodeError> {
    let clock = Instant::now();
    match &agents.observations {
        ObservationSource::Real(env) => {
            let exec = call.clone();
            let obs = env
                .ask("environment", |r| EnvMsg::Execute(episode, exec, r))
                .await?
                .map_err(|message| EpisodeError::Environment {
                    task: spec.task.id.to_string(),
                    message,
                })?;
            run.timings.environment_s += clock.elapsed().as_secs_f64();
            Ok(CallOutcome::Answered(ToolResult {
                name: call.name.clone(),
                text: obs.text,
                rehearsed: None,
            }))
        }
        ObservationSource::Rehearsal => {
            if run.calls >= cfg.max_generation_calls {
                return Ok(CallOutcome::Ends(Termination::MaxGenerationCalls));
            }
            let prompt =
                run.transcript
                    .rehearse_prompt(call)
                    .map_err(|source| EpisodeError::Protocol {
                        task: spec.task.id.to_string(),
                        source,
                    })?;
            let request = PolicyRequest {
                role: Role::Rehearse,
                prompt,
                params: cfg.params(cfg.rehearse_max_new_tokens, seed_of(run.calls)),
            };
            let turn = generate(agents, request).await?;
            run.timings.rehearse_s += clock.elapsed().as_secs_f64();
            run.calls += 1;
            let (row, text) = match turn {
                PolicyTurn::LengthExceeded { .. } => {
                    return Ok(CallOutcome::Ends(Termination::LengthExceeded))
                }
                PolicyTurn::Generated { row, text } => (row, text),
            };
            let completion = row.completion_ids.clone();
            let r = run.push_row(row);
            match agents.protocol.parse_rehearse(&text) {
                Ok(value) => Ok(CallOutcome::Answered(ToolResult {
                    name: call.name.clone(),
                    text: pyjson::compact(&value),
                    rehearsed: Some((r, completion)),
                })),
                Err(e) => {
                    let m = Message::new(
                        MessageRole::Tool,
                        format!("simulator error {}: {}", e.code.as_str(), e.message),
                    );
                    run.transcript
                        .push_message(m.with_row(Some(r)).with_tool(call.name.clone()));
                    tracing::debug!(raw = %text, "rehearse format error");
                    Ok(CallOutcome::Ends(Termination::RehearseFormatError))
                }
            }
        }
    }
}
