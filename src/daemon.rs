//! The long-running self-rehearsal training daemon (`envace daemon`) and its control socket
//! (`envace ctl`).
//!
//! The daemon is [`Pipeline::train_loop`] with the `[daemon]` checkpoint policy, a budget
//! (`--steps N`: the run's total steps; `--hours H`: this process's wall time; neither: no
//! end), a live line per step, and:
//!
//! * **Signals.** SIGTERM or SIGINT finishes the step in flight, writes a checkpoint and
//!   exits 0; a second one exits at once (130), like a killed process, and the next start
//!   resumes from the last checkpoint.
//! * **Control.** `DIR/ctl.sock` (a Unix socket, mode 0600, no network port) takes one JSON
//!   request per line ([`CtlRequest`]) and answers one JSON line ([`CtlReply`]): `status`,
//!   `stop`, `judge NAME` (in force from the next step, recorded in `control.json`) and
//!   `add-tasks FILE` (drawn from the next step on).
//! * **Metrics.** With `--metrics-addr`, a Prometheus endpoint ([`METRICS`] lists the series).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use crate::pipeline::control::{Control, RunStatus};
use crate::pipeline::train_loop::{CheckpointPolicy, EndReason, LoopOptions, LoopOutcome};
use crate::pipeline::{Pipeline, SFT_RUN};

/// The control socket in a run folder.
pub const SOCKET: &str = "ctl.sock";

/// One request on the control socket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
pub enum CtlRequest {
    /// Where the run stands.
    Status,
    /// Finish the step in flight, checkpoint, exit 0.
    Stop,
    /// Swap the self-rehearsal judge (a registered name) from the next step.
    Judge { name: String },
    /// Add the tasks of an add-tasks file (JSON lines, [`crate::pipeline::control::AddedTask`])
    /// to the train pool from the next step.
    AddTasks { file: PathBuf },
}

/// The answer to a [`CtlRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CtlReply {
    pub ok: bool,
    /// What happened, or the error.
    pub message: String,
    pub status: Option<RunStatus>,
}

/// Every series the daemon exports, with its kind, unit and meaning (the README's table is
/// this list). Labels: `role` = `act`/`rehearse`; `actor` = an actor's name or kind.
pub const METRICS: &[(&str, &str, &str, &str)] = &[
    ("train_steps", "counter", "steps", "training steps played by this process"),
    ("train_step", "gauge", "steps", "steps done in the run (the last step's index + 1)"),
    ("train_policy_version", "gauge", "versions", "policy version after the last step (optimizer steps taken)"),
    ("train_skipped_steps", "counter", "steps", "steps without any informative group: no update"),
    ("train_reward_mean", "gauge", "reward", "mean trajectory reward of the last step (all rollouts)"),
    ("train_reward_mean_role", "gauge", "reward", "mean reward of the last step's rows, per role"),
    ("train_adv_mean", "gauge", "advantage", "mean advantage of the trained rows, per role"),
    ("train_adv_std", "gauge", "advantage", "standard deviation of the advantage, per role"),
    ("train_rows", "gauge", "rows", "rows of the last step's rollouts, per role"),
    ("train_zero_variance_fraction", "gauge", "ratio", "fraction of the last step's groups with equal rewards (no signal)"),
    ("train_informative_groups", "gauge", "groups", "groups of the last step with a reward spread"),
    ("train_loss", "gauge", "loss", "policy loss of the last step (NaN when skipped)"),
    ("train_kl", "gauge", "nats/token", "k3 KL to the reference policy (0 without kl_coef)"),
    ("train_approx_kl", "gauge", "nats/token", "mean log pi_old - log pi_theta before the update"),
    ("train_clip_frac", "gauge", "ratio", "fraction of tokens whose ratio was clipped"),
    ("train_grad_norm", "gauge", "L2 norm", "gradient norm before clipping"),
    ("train_tokens_per_s", "gauge", "tokens/s", "tokens of the last step (prompt + completion) per wall second"),
    ("actor_tokens_per_second", "gauge", "tokens/s", "generated tokens per second of rollout (actor=policy), trained tokens per second of update (actor=learner)"),
    ("actor_requests_in_flight", "gauge", "requests", "requests sent to an actor and not yet answered (its mailbox and queue as callers see them), per actor"),
    ("actor_restarts", "counter", "restarts", "actor failures restarted by the supervisor, per actor"),
    ("train_real_env_calls", "counter", "calls", "real environment calls during training (must stay 0)"),
    ("real_env_calls", "counter", "calls", "real environment calls of the Environment actor (evaluations; seed collection counts in seed_env_calls)"),
    ("seed_env_calls", "counter", "calls", "real environment calls of seed collection"),
    ("checkpoint_step", "gauge", "steps", "step of the last checkpoint"),
    ("checkpoint_age_seconds", "gauge", "seconds", "time since the last checkpoint was written"),
    ("checkpoint_bytes", "gauge", "bytes", "size of the last checkpoint (weights + optimizer state)"),
    ("checkpoint_write_seconds", "gauge", "seconds", "time to write and commit the last checkpoint"),
    ("checkpoints_written", "counter", "checkpoints", "checkpoints written by this process"),
    ("run_disk_bytes", "gauge", "bytes", "bytes of the run folder's checkpoints/ and db/"),
    ("eval_checklist_score", "gauge", "ratio", "checklist score of the last periodic evaluation (0-1)"),
    ("eval_fidelity_equal_values", "gauge", "ratio", "Rehearse fidelity (exact values) of the last periodic evaluation"),
    ("eval_step", "gauge", "steps", "steps done at the last periodic evaluation"),
    ("judge_swaps", "counter", "swaps", "judge swaps applied"),
    ("episode_retries", "counter", "episodes", "episodes retried after an actor failure"),
    ("episodes_failed", "counter", "episodes", "episodes recorded as failed"),
];

/// What `envace daemon` was asked for.
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    /// Stop when the run has this many steps.
    pub steps: Option<u64>,
    /// Stop after this much wall time of this process.
    pub hours: Option<f64>,
    /// Serve Prometheus metrics here.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// When the process started (for the start-up time it reports).
    pub started: Instant,
}

/// Installs the Prometheus recorder (with the in-process one) and starts its HTTP listener on
/// the current runtime. Call before the pipeline opens (the first recorder installed wins).
///
/// # Errors
/// The address cannot be bound.
pub fn start_metrics_exporter(addr: std::net::SocketAddr) -> Result<()> {
    let (recorder, exporter) = metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
        .build()
        .with_context(|| format!("starting the metrics endpoint on {addr}"))?;
    crate::telemetry::install_metrics_recorder_with(Some(Box::new(recorder)));
    for (name, kind, unit, help) in METRICS {
        let help = format!("{help} ({unit})");
        match *kind {
            "counter" => {
                metrics::describe_counter!(*name, help);
                // Listed from the first scrape (labelled ones appear with their labels).
                metrics::counter!(*name).increment(0);
            }
            _ => metrics::describe_gauge!(*name, help),
        }
    }
    tokio::spawn(async move {
        if let Err(e) = exporter.await {
            tracing::error!(error = ?e, "the metrics endpoint stopped");
        }
    });
    eprintln!("daemon: Prometheus metrics at http://{addr}/metrics");
    Ok(())
}

/// Runs the daemon on an open pipeline: seeds and warm-up first when the run has none, then
/// training until the budget is spent or a stop is asked for.
///
/// # Errors
/// Any stage's error; the control socket cannot be created.
pub async fn run(p: &mut Pipeline, options: &DaemonOptions) -> Result<LoopOutcome> {
    let has_steps = p.latest_checkpoint().await?.is_some();
    if !has_steps && p.seed_pool().await?.is_empty() {
        eprintln!("daemon: no seed trajectories yet: collecting them first");
        p.collect().await?;
        p.save_report()?;
    }
    let sft = p.checkpoint_path(SFT_RUN);
    if !has_steps && !sft.exists() {
        eprintln!("daemon: no warm-up checkpoint yet: warming up first");
        p.sft().await?;
        p.save_report()?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let control = p.open_control()?;
    let socket = serve_control(&p.dir, control.clone(), stop.clone())?;
    spawn_signal_handler(stop.clone(), control.clone());
    spawn_ticker(control.clone());
    let loop_options = LoopOptions {
        until_step: options.steps,
        deadline: options
            .hours
            .map(|h| options.started + Duration::from_secs_f64(h * 3600.0)),
        checkpoints: CheckpointPolicy::daemon(&p.cfg.daemon),
        stop,
        control: Some(control),
        live_line: true,
        started: Some(options.started),
    };
    let init = sft.exists().then_some(sft);
    let outcome = p.train_loop(init, loop_options).await;
    let _ = std::fs::remove_file(&socket);
    let outcome = outcome?;
    let why = match outcome.reason {
        EndReason::Steps => "the step budget is spent",
        EndReason::Deadline => "the time budget is spent",
        EndReason::Stopped => "a stop was asked for",
    };
    eprintln!(
        "daemon: stopped after step {} ({why}); the last checkpoint is at step {}",
        outcome.steps, outcome.steps
    );
    Ok(outcome)
}

/// SIGTERM/SIGINT: a graceful stop; a second one exits at once.
fn spawn_signal_handler(stop: Arc<AtomicBool>, control: Arc<Control>) {
    use tokio::signal::unix::{signal, SignalKind};
    tokio::spawn(async move {
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::error!("cannot install the SIGTERM/SIGINT handlers");
            return;
        };
        loop {
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            if stop.swap(true, Ordering::SeqCst) {
                eprintln!("daemon: second {name}: exiting now; the next start resumes from the last checkpoint");
                std::process::exit(130);
            }
            control.update(|s| s.stopping = true);
            eprintln!(
                "daemon: {name}: finishing the step in flight, then a checkpoint (again to exit at once)"
            );
        }
    });
}

/// Keeps `checkpoint_age_seconds` current.
fn spawn_ticker(control: Arc<Control>) {
    tokio::spawn(async move {
        loop {
            let s = control.status();
            if s.checkpoint_step.is_some() {
                let age = crate::pipeline::control::unix_now().saturating_sub(s.checkpoint_unix_s);
                metrics::gauge!("checkpoint_age_seconds").set(age as f64);
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
    });
}

/// Binds `DIR/ctl.sock` (mode 0600, bound under a temporary name and renamed into place) and
/// serves it; returns its path.
fn serve_control(dir: &Path, control: Arc<Control>, stop: Arc<AtomicBool>) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(SOCKET);
    let tmp = dir.join(format!("{SOCKET}.tmp"));
    // The run lock is held: a socket here is a stopped daemon's.
    for p in [&path, &tmp] {
        let _ = std::fs::remove_file(p);
    }
    // Created 0600 (umask 0177 for the bind alone), so no other user can connect meanwhile.
    // SAFETY: umask(2) has no memory-safety preconditions.
    let old_mask = unsafe { libc::umask(0o177) };
    let bound = tokio::net::UnixListener::bind(&tmp);
    // SAFETY: as above.
    unsafe { libc::umask(old_mask) };
    let listener =
        bound.with_context(|| format!("creating the control socket {}", tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("restricting {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("placing {}", path.display()))?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (control, stop) = (control.clone(), stop.clone());
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut lines = tokio::io::BufReader::new(read).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    // Requests read files and fsync: off the runtime's threads.
                    let (c, s) = (control.clone(), stop.clone());
                    let reply = tokio::task::spawn_blocking(move || answer(&line, &c, &s))
                        .await
                        .unwrap_or_else(|e| CtlReply {
                            ok: false,
                            message: format!("the request failed: {e}"),
                            status: None,
                        });
                    let mut text = serde_json::to_string(&reply).unwrap_or_default();
                    text.push('\n');
                    if write.write_all(text.as_bytes()).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    Ok(path)
}

/// Answers one request line.
fn answer(line: &str, control: &Control, stop: &AtomicBool) -> CtlReply {
    let reply = |ok: bool, message: String| CtlReply {
        ok,
        message,
        status: Some(control.status()),
    };
    let request: CtlRequest = match serde_json::from_str(line) {
        Ok(r) => r,
        Err(e) => return reply(false, format!("not a control request: {e}")),
    };
    match request {
        CtlRequest::Status => reply(true, "running".into()),
        CtlRequest::Stop => {
            stop.store(true, Ordering::SeqCst);
            control.update(|s| s.stopping = true);
            let s = control.status();
            let at = s.step_in_flight.map_or_else(
                || format!("after step {}", s.steps_done),
                |i| format!("after step {} (in flight)", i + 1),
            );
            tracing::info!("stop asked over the control socket");
            reply(true, format!("stopping {at}, with a checkpoint"))
        }
        CtlRequest::Judge { name } => match control.request_judge(&name) {
            Ok(c) => reply(
                true,
                format!("judge {} in force from step {} (0-based)", c.judge, c.step),
            ),
            Err(e) => reply(false, format!("{e:#}")),
        },
        CtlRequest::AddTasks { file } => match control.request_tasks(&file) {
            Ok(b) => reply(
                true,
                format!(
                    "{} task(s) ({} with a seed) added as {}, drawn from step {} (0-based)",
                    b.tasks,
                    b.seeds,
                    b.file.display(),
                    b.step
                ),
            ),
            Err(e) => reply(false, format!("{e:#}")),
        },
    }
}

/// Sends one request to the daemon of the run in `dir` and returns its reply.
///
/// # Errors
/// No daemon runs there (no socket, or nobody answers it), or the reply is not one.
pub fn request(dir: &Path, req: &CtlRequest) -> Result<CtlReply> {
    let path = dir.join(SOCKET);
    if !path.exists() {
        bail!(
            "no daemon is running in {} (no {SOCKET}): start one with `envace daemon --out {0}`",
            dir.display()
        );
    }
    let mut stream = std::os::unix::net::UnixStream::connect(&path).with_context(|| {
        format!(
            "no daemon answers at {} (the socket of a daemon that was killed?)",
            path.display()
        )
    })?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut text = serde_json::to_string(req)?;
    text.push('\n');
    stream.write_all(text.as_bytes())?;
    let mut line = String::new();
    BufReader::new(&stream)
        .read_line(&mut line)
        .with_context(|| format!("reading the reply from {}", path.display()))?;
    serde_json::from_str(&line).with_context(|| format!("not a daemon reply: {line:?}"))
}

/// The status as lines for people.
pub fn status_text(s: &RunStatus) -> String {
    let eval = s.last_eval.map_or_else(
        || "none yet".to_string(),
        |(step, score)| format!("{:.1} % checklist score after step {step}", 100.0 * score),
    );
    let checkpoint = s.checkpoint_step.map_or_else(
        || "none yet".to_string(),
        |c| {
            format!(
                "step {c}, {:.1} MB, written in {:.1} s, {} s ago",
                s.checkpoint_bytes as f64 / 1e6,
                s.checkpoint_write_s,
                crate::pipeline::control::unix_now().saturating_sub(s.checkpoint_unix_s)
            )
        },
    );
    let step = s.step_in_flight.map_or_else(
        || format!("{} done", s.steps_done),
        |i| format!("{} done, step {} in flight", s.steps_done, i + 1),
    );
    format!(
        "pid {}{}\nsteps: {step} ({} committed), policy version {}\nlast step: reward act {:.3} \
         rehearse {:.3}, informative groups {}/{}{}, {:.0} tokens/s\njudge: {}\ntrain tasks: \
         {}\nlast evaluation: {eval}\nlast checkpoint: {checkpoint}\ndisk: {:.1} MB \
         (checkpoints/ + db/)",
        s.pid,
        if s.stopping { " (stopping)" } else { "" },
        s.committed_steps,
        s.policy_version,
        s.reward_act,
        s.reward_rehearse,
        s.informative_groups,
        s.groups,
        if s.skipped { " (skipped)" } else { "" },
        s.tokens_per_s,
        s.judge,
        s.train_tasks,
        s.disk_bytes as f64 / 1e6
    )
}
