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
//! Two protocols ([`EpisodeConfig::protocol`]): `reference` renders a fresh prompt per Act turn
//! and per Rehearse call; `inline` keeps one [`InlineStream`] per trajectory — Act prompts are
//! the stream plus the assistant header, Rehearse prompts branch off it with a private block
//! (facts, call), and the stream grows by every Act turn's and every tool result's exact ids
//! (see `protocol::inline`). The message history, transcript and judge inputs are the same in
//! both.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::acting::{ActRequest, ActTurn, ActingMsg};
use crate::env_actor::EnvMsg;
use crate::environment::ToolCall;
use crate::judge::{TurnCalls, Verdict};
use crate::judge_actor::JudgeMsg;
use crate::kernels::{pyjson, SamplingParams};
use crate::protocol::{parse_act, InlineStream, PromptKit, RolloutProtocol, ToolRendering};
use crate::rehearsal::{RehearsalMsg, RehearseRequest, RehearseTurn};
use crate::slot::{ActorCallError, Pool, Slot};
use crate::storage::{
    ExecutionMode, Message, MessageRole, RunId, Termination, Timings, ToolExchange, Trajectory,
    TurnVerdict,
};
use crate::task::EpisodeTask;

/// Protocol settings of an episode; defaults are the authors' (DESIGN.md §2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EpisodeConfig {
    /// How tool schemas are shown in prompts (set from the protocol section of a config).
    #[serde(skip)]
    pub tool_rendering: ToolRendering,
    /// Reference or inline prompts (set from the protocol section's `mode`). Inline needs
    /// [`Agents::kit`].
    #[serde(skip)]
    pub protocol: RolloutProtocol,
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
            tool_rendering: ToolRendering::Full,
            protocol: RolloutProtocol::Reference,
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
    /// The policy's Rehearse role predicts every result (no real environment call).
    Rehearsal(Arc<Pool<RehearsalMsg>>),
    /// A real environment executes every call (counted by the Environment actor).
    Real(Slot<EnvMsg>),
}

/// The actors an episode talks to.
#[derive(Clone)]
pub struct Agents {
    /// Acting workers (round-robin).
    pub acting: Arc<Pool<ActingMsg>>,
    /// Who answers tool calls.
    pub observations: ObservationSource,
    /// The judge scoring each user turn and the episode.
    pub judge: Slot<JudgeMsg>,
    /// Tokenizer and chat template, for building the inline protocol's stream (required when
    /// [`EpisodeConfig::protocol`] is inline; the reference protocol renders in the actors).
    pub kit: Option<Arc<PromptKit>>,
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

/// Runs `spec` and retries it when an actor fails under it; after `max_retries` reruns the
/// trajectory is recorded with [`Termination::ActorFailed`] and the reason as a system
/// message, reward 0 — never dropped.
pub async fn run_episode_supervised(
    agents: &Agents,
    cfg: &EpisodeConfig,
    spec: &EpisodeSpec,
) -> Trajectory {
    let mut attempt = 0;
    loop {
        match run_episode(agents, cfg, spec).await {
            Ok(t) => return t,
            Err(e) if attempt < cfg.max_retries => {
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
        ObservationSource::Rehearsal(_) => ExecutionMode::Rehearsal,
        ObservationSource::Real(_) => ExecutionMode::Real,
    }
}

fn failed_trajectory(spec: &EpisodeSpec, mode: ExecutionMode, e: &ActorCallError) -> Trajectory {
    Trajectory {
        run: spec.run.clone(),
        step: spec.step,
        task: spec.task.id.clone(),
        sample: spec.sample,
        mode,
        rows: Vec::new(),
        messages: vec![message(
            MessageRole::System,
            format!("episode failed: {e}"),
            None,
        )],
        reward: 0.0,
        verdicts: Vec::new(),
        termination: Termination::ActorFailed,
        timings: Timings::default(),
    }
}

fn message(role: MessageRole, content: String, row: Option<u32>) -> Message {
    Message {
        role,
        content,
        tool_name: None,
        row,
    }
}

/// Runs one episode (see the module doc).
///
/// # Errors
/// [`ActorCallError`] when an actor failed or stopped under the episode (retry it), or an
/// actor replied with an internal error (a model-thread failure).
pub async fn run_episode(
    agents: &Agents,
    cfg: &EpisodeConfig,
    spec: &EpisodeSpec,
) -> Result<Trajectory, ActorCallError> {
    let start = Instant::now();
    let task = &spec.task;
    let episode = NEXT_EPISODE.fetch_add(1, Ordering::Relaxed);
    let mut run = Run {
        history: Vec::new(),
        rows: Vec::new(),
        timings: Timings::default(),
        calls: 0,
    };
    if let ObservationSource::Real(env) = &agents.observations {
        let t = Instant::now();
        let env_task = task.env.clone();
        env.ask("environment", |r| EnvMsg::Open(episode, env_task, r))
            .await?
            .map_err(|e| ActorCallError(format!("environment reset for {}: {e}", task.id)))?;
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
        messages: run.history,
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
/// Each assistant message is parsed with [`parse_act`] against `whitelist` (what the Acting
/// actor did when it was generated): its calls are the turn's executed calls, no call marks
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
            Ok(out) if out.is_final_answer() => turn.final_answer = true,
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
    history: Vec<Message>,
    rows: Vec<crate::storage::Row>,
    timings: Timings,
    /// Generation calls so far.
    calls: usize,
}

impl Run {
    fn push_row(&mut self, row: crate::storage::Row) -> u32 {
        self.rows.push(row);
        (self.rows.len() - 1) as u32
    }
}

async fn drive(
    agents: &Agents,
    cfg: &EpisodeConfig,
    spec: &EpisodeSpec,
    episode: u64,
    run: &mut Run,
) -> Result<(Vec<TurnCalls>, Termination), ActorCallError> {
    let task = &spec.task;
    let seed_of = |n: usize| {
        spec.seed
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(n as u64)
    };
    let turns = cfg
        .max_user_turns
        .map_or(task.user_turns.len(), |m| m.min(task.user_turns.len()));
    let kit = match cfg.protocol {
        RolloutProtocol::Reference => None,
        RolloutProtocol::Inline => Some(agents.kit.clone().ok_or_else(|| {
            ActorCallError(
                "the inline protocol needs a PromptKit in Agents::kit (Topology's agents set it)"
                    .into(),
            )
        })?),
    };
    let mut stream: Option<InlineStream> = None;
    let whitelist = task.tool_names();
    let done = |run: &Run, termination| Ok((transcript(&run.history, &whitelist), termination));
    for (t, user_messages) in task.user_turns.iter().enumerate().take(turns) {
        if let ObservationSource::Real(env) = &agents.observations {
            let _ = env.get().cast(EnvMsg::BeginTurn(episode, t));
        }
        for m in user_messages {
            run.history
                .push(message(MessageRole::User, m.clone(), None));
        }
        if let Some(kit) = &kit {
            let inline = |e: crate::protocol::ProtocolError| {
                ActorCallError(format!("building the inline stream of {}: {e}", task.id))
            };
            match &mut stream {
                None => {
                    stream = Some(
                        InlineStream::new(
                            kit,
                            &task.tools,
                            cfg.tool_rendering,
                            spec.memory.as_deref(),
                            user_messages,
                        )
                        .map_err(inline)?,
                    );
                }
                Some(s) => s.push_user(kit, user_messages).map_err(inline)?,
            }
        }
        let mut act_turns = 0;
        loop {
            let turn_cap = cfg
                .max_act_turns_per_user_turn
                .is_some_and(|cap| act_turns >= cap);
            if run.calls >= cfg.max_generation_calls || turn_cap {
                return done(run, Termination::MaxGenerationCalls);
            }
            act_turns += 1;
            let clock = Instant::now();
            let request = ActRequest {
                task: task.clone(),
                history: run.history.clone(),
                memory: spec.memory.clone(),
                rendering: cfg.tool_rendering,
                params: cfg.params(cfg.act_max_new_tokens, seed_of(run.calls)),
                prompt_ids: stream.as_ref().map(InlineStream::act_prompt),
            };
            let act = agents
                .acting
                .pick()
                .ask("acting", |r| ActingMsg::Act(request, r))
                .await?
                .map_err(ActorCallError)?;
            run.timings.act_s += clock.elapsed().as_secs_f64();
            run.calls += 1;
            let (row, text, parsed) = match act {
                ActTurn::LengthExceeded { .. } => {
                    return done(run, Termination::LengthExceeded);
                }
                ActTurn::Generated { row, text, parsed } => (row, text, parsed),
            };
            let before = run.history.clone();
            if let Some(s) = &mut stream {
                s.push_act(&row.completion_ids);
            }
            let r = run.push_row(row);
            run.history
                .push(message(MessageRole::Assistant, text.clone(), Some(r)));
            let output = match parsed {
                Ok(o) => o,
                Err(e) => {
                    run.history
                        .push(message(MessageRole::Tool, e.to_tool_message(), None));
                    return done(run, Termination::ActParseError);
                }
            };
            if output.is_final_answer() {
                break;
            }
            // Every call of the turn sees the same history; results are appended afterwards.
            let mut results = Vec::with_capacity(output.calls.len());
            for call in &output.calls {
                let inline = match (&kit, &stream) {
                    (Some(kit), Some(stream)) => Some((kit.as_ref(), stream)),
                    _ => None,
                };
                match execute(
                    agents, cfg, spec, episode, run, &before, &text, call, inline, &seed_of,
                )
                .await?
                {
                    Ok(result) => results.push((call.name.clone(), result)),
                    Err(termination) => return done(run, termination),
                }
            }
            for (name, result) in results {
                if let (Some(kit), Some(s)) = (&kit, &mut stream) {
                    // A rehearsed result joins the stream as the exact sampled ids; a real one
                    // (evaluation) as encoded text in the same tool frame.
                    match result.1 {
                        Some(r) => s.push_tool_result_ids(&run.rows[r as usize].completion_ids),
                        None => s.push_tool_result_text(kit, &result.0).map_err(|e| {
                            ActorCallError(format!("encoding a tool result of {}: {e}", task.id))
                        })?,
                    }
                }
                let mut m = message(MessageRole::Tool, result.0, result.1);
                m.tool_name = Some(name);
                run.history.push(m);
            }
        }
        let clock = Instant::now();
        let judge_task = Arc::new(task.judge.clone());
        let so_far = transcript(&run.history, &whitelist);
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
            return done(run, Termination::RequiredCheckFailed);
        }
    }
    done(run, Termination::Completed)
}

/// Executes one call: `Ok(Ok((result text, rehearse row index)))`, or `Ok(Err(termination))`
/// when the simulator's output is malformed or the caps are hit. `inline` is the kit and the
/// trajectory's stream in the inline protocol (the Rehearse prompt branches off the stream).
#[allow(clippy::too_many_arguments)]
async fn execute(
    agents: &Agents,
    cfg: &EpisodeConfig,
    spec: &EpisodeSpec,
    episode: u64,
    run: &mut Run,
    history: &[Message],
    act_text: &str,
    call: &ToolCall,
    inline: Option<(&PromptKit, &InlineStream)>,
    seed_of: &impl Fn(usize) -> u64,
) -> Result<Result<(String, Option<u32>), Termination>, ActorCallError> {
    let clock = Instant::now();
    match &agents.observations {
        ObservationSource::Real(env) => {
            let call = call.clone();
            let obs = env
                .ask("environment", |r| EnvMsg::Execute(episode, call, r))
                .await?
                .map_err(ActorCallError)?;
            run.timings.environment_s += clock.elapsed().as_secs_f64();
            Ok(Ok((obs.text, None)))
        }
        ObservationSource::Rehearsal(pool) => {
            if run.calls >= cfg.max_generation_calls {
                return Ok(Err(Termination::MaxGenerationCalls));
            }
            let prompt_ids = match inline {
                Some((kit, stream)) => Some(
                    stream
                        .rehearse_prompt(
                            kit,
                            &spec.task.tools,
                            cfg.tool_rendering,
                            &spec.facts,
                            call,
                        )
                        .map_err(|e| {
                            ActorCallError(format!(
                                "building the inline Rehearse prompt of {}: {e}",
                                spec.task.id
                            ))
                        })?,
                ),
                None => None,
            };
            let request = RehearseRequest {
                task: spec.task.clone(),
                facts: spec.facts.clone(),
                history: history.to_vec(),
                act_text: act_text.to_string(),
                call: call.clone(),
                rendering: cfg.tool_rendering,
                params: cfg.params(cfg.rehearse_max_new_tokens, seed_of(run.calls)),
                prompt_ids,
            };
            let turn = pool
                .pick()
                .ask("rehearsal", |r| RehearsalMsg::Rehearse(request, r))
                .await?
                .map_err(ActorCallError)?;
            run.timings.rehearse_s += clock.elapsed().as_secs_f64();
            run.calls += 1;
            match turn {
                RehearseTurn::LengthExceeded { .. } => Ok(Err(Termination::LengthExceeded)),
                RehearseTurn::Generated { row, text, parsed } => {
                    let r = run.push_row(row);
                    match parsed {
                        Ok(value) => Ok(Ok((pyjson::compact(&value), Some(r)))),
                        Err(e) => {
                            let mut m = message(
                                MessageRole::Tool,
                                format!("simulator error {}: {}", e.code.as_str(), e.message),
                                Some(r),
                            );
                            m.tool_name = Some(call.name.clone());
                            run.history.push(m);
                            tracing::debug!(raw = %text, "rehearse format error");
                            Ok(Err(Termination::RehearseFormatError))
                        }
                    }
                }
            }
        }
    }
}
