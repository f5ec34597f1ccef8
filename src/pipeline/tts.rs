//! Test-time scaling by private rehearsal (issue 6; DESIGN.md §1, from the paper).
//!
//! Per task: N rehearsed trajectories (Act and Rehearse by the same policy, no real environment
//! call, judged by a [`PassThroughJudge`] so no ground truth reaches them), a self-critique of
//! each by the same model, a rehearsal memory m_x condensed from both
//! ([`crate::actors::protocol::condense`], bounded), then one committed real execution whose
//! Act prompts carry m_x, judged by the BFCL checker. Parallel: the N rehearsals are
//! independent. Sequential: rehearsal n is shown the memory of rehearsals `< n`.
//!
//! Few-shot facts for the Rehearse role come from train-split seeds of the same tools only
//! ([`crate::actors::protocol::SeedPool::facts_for`]): a test task's own ground truth never
//! reaches a prompt.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, Result};
use serde::{Deserialize, Serialize};

use super::{progress, secs, Pipeline, Variant};
use crate::actors::engine_actor::EngineMsg;
use crate::actors::episode::{run_episode_supervised, Agents, EpisodeConfig, EpisodeSpec};
use crate::actors::memory_actor::MemoryMsg;
use crate::actors::protocol::{condense, critique_messages};
use crate::actors::{EpisodeTask, PassThroughJudge};
use crate::kernels::{GenerationRequest, SamplingParams};
use crate::storage::{RehearsalMemory, RehearsalMode, RunId, Termination, Trajectory};

/// How much private rehearsal precedes the committed execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TtsSpec {
    /// Parallel or sequential.
    pub mode: RehearsalMode,
    /// Number of rehearsals N (at least 1).
    pub n: u32,
}

impl std::str::FromStr for TtsSpec {
    type Err = String;
    /// `parallel:N` or `sequential:N`, N ≥ 1.
    fn from_str(s: &str) -> Result<Self, String> {
        let (mode, n) = s
            .split_once(':')
            .ok_or_else(|| format!("--tts {s:?}: expected parallel:N or sequential:N"))?;
        let mode = match mode {
            "parallel" => RehearsalMode::Parallel,
            "sequential" => RehearsalMode::Sequential,
            other => {
                return Err(format!(
                    "--tts mode {other:?}: expected parallel or sequential"
                ))
            }
        };
        let n: u32 = n
            .parse()
            .map_err(|_| format!("--tts {s:?}: N must be a whole number"))?;
        if n == 0 {
            return Err(format!("--tts {s:?}: N must be at least 1"));
        }
        Ok(Self { mode, n })
    }
}

impl TtsSpec {
    /// `parallel-2`, `sequential-3`: the run name suffix.
    pub fn name(self) -> String {
        let mode = match self.mode {
            RehearsalMode::Parallel => "parallel",
            RehearsalMode::Sequential => "sequential",
        };
        format!("{mode}-{}", self.n)
    }
}

/// Limits of test-time scaling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TtsConfig {
    /// Longest rehearsal memory, characters (see `protocol::memory`).
    pub max_memory_chars: usize,
    /// New-token budget of one critique.
    pub critique_max_new_tokens: usize,
}

impl Default for TtsConfig {
    fn default() -> Self {
        Self {
            max_memory_chars: 1600,
            critique_max_new_tokens: 96,
        }
    }
}

/// One test-time-scaling evaluation, as written to `report.json` under `tts`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TtsResult {
    pub variant: String,
    /// `none`, `parallel` or `sequential`.
    pub mode: String,
    /// Rehearsals per task (0 for `none`).
    pub n: u32,
    pub split: String,
    pub tasks: u64,
    pub task_success: f64,
    pub turn_success: f64,
    /// Real environment calls while rehearsing (must be 0).
    pub real_env_calls_rehearsal: u64,
    /// Real environment calls of the committed executions.
    pub real_env_calls_committed: u64,
    /// Committed real calls per task.
    pub real_env_calls_per_task: f64,
    /// Tokens (prompt + completion) spent on rehearsals and critiques.
    pub extra_tokens: u64,
    pub extra_tokens_per_task: f64,
    /// Memories taken from the store instead of rehearsed again.
    pub reused_memories: u64,
    pub wall_s: f64,
}

impl Pipeline {
    /// Evaluates the current weights as `variant` with test-time scaling `tts` (`None`: no
    /// rehearsal, the baseline) on `eval.split`, `limit` (or `eval.tasks`) tasks spread over it; stores
    /// each m_x with its rehearsals and critiques (run `tts-<variant>-<mode>-<N>`) and the
    /// rehearsal trajectories (run `tts-<variant>-<mode>-<N>-rehearsal`, sample = n); adds a
    /// `tts` entry to the report. With `reuse_memory`, a memory already stored for the task is
    /// used instead of rehearsing again.
    ///
    /// # Errors
    /// An actor fails to start, the store fails, or a rehearsal made a real call (a bug).
    pub async fn eval_tts(
        &mut self,
        variant: Variant,
        tts: Option<TtsSpec>,
        limit: Option<usize>,
        reuse_memory: bool,
    ) -> Result<TtsResult> {
        let start = Instant::now();
        let (split, tasks) = self.eval_tasks(limit)?;
        let n_tasks = tasks.len();
        let pool = self.seed_pool().await?;
        let rehearsal_judge = self
            .topology
            .start_judge("pass-through", Arc::new(PassThroughJudge))
            .await?;
        let rehearse_agents = Agents {
            judge: rehearsal_judge.clone(),
            ..self.topology.rehearsal_agents()
        };
        let checker = self
            .topology
            .start_judge("evaluation-judge-tts", self.suite.evaluation_judge())
            .await?;
        let real_agents = self.topology.real_agents(checker.clone())?;
        let eval = self.eval_episode_config();
        let run_name = match tts {
            Some(t) => format!("tts-{}-{}", variant.name(), t.name()),
            None => format!("tts-{}-none", variant.name()),
        };
        let bar = progress(n_tasks as u64, &run_name);
        let (mut rehearsal_calls, mut committed_calls, mut extra_tokens, mut reused) =
            (0u64, 0u64, 0u64, 0u64);
        let mut committed: Vec<(Trajectory, usize)> = Vec::new();
        for (i, task) in tasks.iter().enumerate() {
            let task = Arc::new(task.clone());
            let memory = match tts {
                None => None,
                Some(spec) => {
                    let stored = if reuse_memory {
                        self.memory()
                            .ask("memory", |r| {
                                MemoryMsg::GetMemory(RunId(run_name.clone()), task.id.clone(), r)
                            })
                            .await??
                    } else {
                        None
                    };
                    match stored {
                        Some(m) => {
                            reused += 1;
                            Some(m.summary)
                        }
                        None => {
                            let before = self.topology.real_env_calls();
                            let facts = Arc::new(pool.facts_for(
                                &task,
                                self.cfg.protocol.max_facts,
                                self.cfg.protocol.max_fact_chars,
                            ));
                            let (m, tokens) = self
                                .rehearse(&rehearse_agents, &eval, spec, &task, facts, &run_name, i)
                                .await?;
                            let calls = self.topology.real_env_calls() - before;
                            if calls != 0 {
                                bail!(
                                    "tts: {calls} real environment calls while rehearsing {}",
                                    task.id
                                );
                            }
                            rehearsal_calls += calls;
                            extra_tokens += tokens;
                            let summary = m.summary.clone();
                            self.memory()
                                .ask("memory", |r| MemoryMsg::PutMemory(Box::new(m), r))
                                .await??;
                            Some(summary)
                        }
                    }
                }
            };
            let before = self.topology.real_env_calls();
            let spec = EpisodeSpec {
                task: task.clone(),
                facts: Arc::new(Vec::new()),
                memory,
                run: RunId(run_name.clone()),
                step: 0,
                sample: 0,
                seed: self.cfg.eval.seed ^ i as u64,
            };
            let t = run_episode_supervised(&real_agents, &eval, &spec).await;
            committed_calls += self.topology.real_env_calls() - before;
            committed.push((t, task.user_turns.len()));
            bar.inc(1);
        }
        bar.finish_and_clear();
        rehearsal_judge.get().stop(None);
        checker.get().stop(None);
        let turns: usize = committed.iter().map(|(_, n)| n).sum();
        let passed: usize = committed
            .iter()
            .map(|(t, _)| t.verdicts.iter().filter(|v| v.passed).count())
            .sum();
        let successes = committed
            .iter()
            .filter(|(t, n)| {
                *n > 0
                    && t.termination == Termination::Completed
                    && t.verdicts.iter().filter(|v| v.passed).count() == *n
            })
            .count();
        let trajectories: Vec<Trajectory> = committed.into_iter().map(|(t, _)| t).collect();
        self.memory()
            .ask("memory", |r| MemoryMsg::PutTrajectories(trajectories, r))
            .await??;
        let per = |x: u64| x as f64 / n_tasks.max(1) as f64;
        let result = TtsResult {
            variant: variant.name().into(),
            mode: tts.map_or("none".into(), |t| {
                t.name().split('-').next().unwrap_or("").to_string()
            }),
            n: tts.map_or(0, |t| t.n),
            split: split.name().into(),
            tasks: n_tasks as u64,
            task_success: per(successes as u64),
            turn_success: passed as f64 / turns.max(1) as f64,
            real_env_calls_rehearsal: rehearsal_calls,
            real_env_calls_committed: committed_calls,
            real_env_calls_per_task: per(committed_calls),
            extra_tokens,
            extra_tokens_per_task: per(extra_tokens),
            reused_memories: reused,
            wall_s: secs(start),
        };
        eprintln!(
            "{run_name}: {} tasks, task success {:.3}, turn success {:.3}, real calls \
             {} rehearsal + {} committed, {} extra tokens",
            n_tasks,
            result.task_success,
            result.turn_success,
            rehearsal_calls,
            committed_calls,
            extra_tokens
        );
        self.report.tts.push(serde_json::to_value(&result)?);
        Ok(result)
    }

    /// N rehearsals of `task` with their critiques, condensed into m_x; returns the memory
    /// record and the tokens spent (rehearsal rows plus critique prompts and completions).
    #[allow(clippy::too_many_arguments)]
    async fn rehearse(
        &self,
        agents: &Agents,
        eval: &EpisodeConfig,
        spec: TtsSpec,
        task: &Arc<EpisodeTask>,
        facts: Arc<Vec<crate::storage::ToolExchange>>,
        run_name: &str,
        task_index: usize,
    ) -> Result<(RehearsalMemory, u64)> {
        let max_chars = self.cfg.tts.max_memory_chars;
        let mut rehearsals: Vec<Trajectory> = Vec::new();
        let mut critiques: Vec<String> = Vec::new();
        let mut tokens = 0u64;
        let episode = |n: u32, memory: Option<String>| EpisodeSpec {
            task: task.clone(),
            facts: facts.clone(),
            memory,
            run: RunId(format!("{run_name}-rehearsal")),
            step: 0,
            sample: n,
            seed: self.cfg.eval.seed ^ ((task_index as u64) << 8) ^ u64::from(n) ^ 0x7e5,
        };
        match spec.mode {
            RehearsalMode::Parallel => {
                let mut set = tokio::task::JoinSet::new();
                for n in 0..spec.n {
                    let (agents, eval, s) = (agents.clone(), eval.clone(), episode(n, None));
                    set.spawn(async move { run_episode_supervised(&agents, &eval, &s).await });
                }
                rehearsals = set.join_all().await;
                rehearsals.sort_by_key(|t| t.sample);
                for t in &rehearsals {
                    let (c, k) = self.critique(t).await?;
                    critiques.push(c);
                    tokens += k;
                }
            }
            RehearsalMode::Sequential => {
                for n in 0..spec.n {
                    let memory = (n > 0).then(|| memory_of(&rehearsals, &critiques, max_chars));
                    let t = run_episode_supervised(agents, eval, &episode(n, memory)).await;
                    let (c, k) = self.critique(&t).await?;
                    critiques.push(c);
                    tokens += k;
                    rehearsals.push(t);
                }
            }
        }
        tokens += rehearsals
            .iter()
            .flat_map(|t| &t.rows)
            .map(|r| (r.prompt_ids.len() + r.completion_ids.len()) as u64)
            .sum::<u64>();
        let summary = memory_of(&rehearsals, &critiques, max_chars);
        let memory = RehearsalMemory {
            run: RunId(run_name.to_string()),
            step: 0,
            task: task.id.clone(),
            sample: 0,
            mode: spec.mode,
            n: spec.n,
            rehearsals: rehearsals.iter().map(|t| t.messages.clone()).collect(),
            critiques,
            summary,
            policy_version: self.topology.worker.policy_version(),
        };
        self.memory()
            .ask("memory", |r| MemoryMsg::PutTrajectories(rehearsals, r))
            .await??;
        Ok((memory, tokens))
    }

    /// The model's critique of one rehearsal, and its tokens (prompt + completion).
    async fn critique(&self, t: &Trajectory) -> Result<(String, u64)> {
        let kit = &self.topology.kit;
        let ending = format!("{:?}", t.termination);
        let prompt = kit.encode_chat(&critique_messages(&t.messages, &ending), true)?;
        let max_new = self.cfg.tts.critique_max_new_tokens;
        let context = self.topology.worker.info().context_len;
        if prompt.len() + max_new > context {
            return Ok((
                "(no critique: the transcript does not fit the context)".into(),
                0,
            ));
        }
        let request = GenerationRequest {
            prompt_ids: prompt.clone(),
            params: SamplingParams {
                temperature: self.cfg.eval.temperature,
                top_p: self.cfg.eval.top_p,
                top_k: 0,
                seed: self.cfg.eval.seed ^ u64::from(t.sample),
                max_new_tokens: max_new,
                stop_token_ids: kit.eos_id().into_iter().collect(),
                stop_strings: Vec::new(),
            },
        };
        let generated = self
            .topology
            .engine
            .ask("engine", |r| EngineMsg::Generate(request, r))
            .await?
            .map_err(|e| anyhow!("critique: {e}"))?;
        let text = kit.decode(&generated.completion_ids)?;
        Ok((
            text.trim().to_string(),
            (prompt.len() + generated.completion_ids.len()) as u64,
        ))
    }
}

/// m_x of the rehearsals so far (see `protocol::memory`).
fn memory_of(rehearsals: &[Trajectory], critiques: &[String], max_chars: usize) -> String {
    let messages: Vec<_> = rehearsals.iter().map(|t| t.messages.clone()).collect();
    let endings: Vec<String> = rehearsals
        .iter()
        .map(|t| format!("{:?}", t.termination))
        .collect();
    condense(&messages, &endings, critiques, max_chars)
}

/// The test-time-scaling table: one row per (variant, mode, N) with success, real calls per
/// task (rehearsal and committed) and the extra tokens per task.
pub fn tts_table(results: &[TtsResult]) -> String {
    let mut table = comfy_table::Table::new();
    table.load_preset(comfy_table::presets::ASCII_MARKDOWN);
    table.set_header(vec![
        "model",
        "tts",
        "task success",
        "turn success",
        "tasks",
        "real calls/task (rehearsal + committed)",
        "extra tokens/task",
    ]);
    for r in results {
        let tts = if r.n == 0 {
            "none".to_string()
        } else {
            format!("{} N={}", r.mode, r.n)
        };
        table.add_row(vec![
            r.variant.clone(),
            tts,
            format!("{:.1}%", 100.0 * r.task_success),
            format!("{:.1}%", 100.0 * r.turn_success),
            r.tasks.to_string(),
            format!(
                "{} + {:.1}",
                r.real_env_calls_rehearsal, r.real_env_calls_per_task
            ),
            format!("{:.0}", r.extra_tokens_per_task),
        ]);
    }
    table.to_string()
}
