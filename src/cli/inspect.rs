//! `envace inspect` and `envace export`: read-only views of a storage database (runs, record
//! counts, one trajectory as a conversation; JSON lines for other tools). They open a private
//! copy of it with `Store::open_existing` (see [`OPENING`]) and never stop at damage: every
//! unreadable record or part of a tree is a warning on stderr.
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::storage::{
    Checkpoint, CheckpointKey, Message, MessageRole, Prefix, Record, RehearsalMemory, Role, RunId,
    RunState, SampleKey, SeedTrajectory, Store, StoreOptions, Task, Trajectory, TreeName,
    SCHEMA_VERSION,
};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;

/// How `inspect` and `export` open the database, for their `--help`.
const OPENING: &str = "The command never lets sled open the database itself: sled has no \
read-only mode, and its recovery rewrites the log it opens (it zeroes whatever follows a damaged \
entry). It checks the directory reading only, refusing one that is not a sound envace database \
(no or damaged `conf` or `db`, a damaged blob file that sled's recovery would read), then copies \
it under the system temp dir and opens the copy, and says so on stderr, with a warning when \
recovery discarded part of the copy's log (the records written there are then missing from the \
view). The database must not be open in another process: a running trainer holds sled's \
exclusive lock, and the command then fails with a `locked` error (stop the trainer first).";

#[derive(Debug, Args)]
#[command(after_help = OPENING)]
pub struct InspectArgs {
    /// Database directory (not open in a running trainer: see below).
    #[arg(long)]
    db: PathBuf,
    /// Without a subcommand: runs, record counts per tree and last steps.
    #[command(subcommand)]
    what: Option<InspectWhat>,
}

#[derive(Debug, Subcommand)]
enum InspectWhat {
    /// One trajectory as a conversation, with each segment's role, the reward and the verdicts.
    Trajectory {
        /// `RUN/STEP/TASK/SAMPLE`, as `inspect trajectories` prints it.
        id: String,
    },
    /// List trajectories: id, mode, reward, termination, rows and tokens.
    Trajectories {
        /// Only this run.
        #[arg(long)]
        run: Option<String>,
        /// Only this step (with --run).
        #[arg(long, requires = "run")]
        step: Option<u64>,
        /// At most this many lines; 0 lists all.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// The rehearsal memories of a task (test-time scaling): mode, N, policy version, each
    /// rehearsal's length and critique, and the condensed memory m_x.
    Memory {
        /// The task id, e.g. `multi_turn_base_150`.
        task: String,
        /// Only this run (e.g. `tts-envace-parallel-2`).
        #[arg(long)]
        run: Option<String>,
    },
}

#[derive(Debug, Args)]
#[command(after_help = OPENING)]
pub struct ExportArgs {
    /// Database directory (not open in a running trainer: see below).
    #[arg(long)]
    db: PathBuf,
    /// Which records.
    #[arg(long, value_enum)]
    what: ExportWhat,
    /// Output format: `jsonl` is one JSON object per line on stdout, with its key as `id`.
    #[arg(long, value_enum, default_value = "jsonl")]
    format: ExportFormat,
    /// Only records of this run (trajectories, memories, runs, checkpoints).
    #[arg(long)]
    run: Option<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ExportWhat {
    Trajectories,
    Memories,
    Seeds,
    Tasks,
    Runs,
    Checkpoints,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ExportFormat {
    Jsonl,
}

/// Opens a private copy of `db` ([`Store::open_existing`]) and says so on stderr, with what
/// sled's recovery discarded of the copy's log, if anything.
fn open(db: &Path) -> Result<Store> {
    let store = Store::open_existing(db, StoreOptions::default())?;
    eprintln!(
        "reading a private copy of {} (sled's recovery rewrites what it opens; the database \
         itself is not changed)",
        db.display()
    );
    if let Some(d) = store.discarded() {
        eprintln!(
            "warning: the database is damaged: sled's recovery discarded {} bytes of its log \
             from byte {} on; records written there are missing below",
            d.bytes, d.first_offset
        );
    }
    Ok(store)
}

pub fn inspect(args: InspectArgs) -> Result<()> {
    let store = open(&args.db).context("envace inspect")?;
    let text = match args.what {
        None => summary(&store, &args.db)?,
        Some(InspectWhat::Trajectory { id }) => {
            let key: SampleKey = id.parse()?;
            let trajectory = store.get::<Trajectory>(&key)?.with_context(|| {
                format!(
                    "no trajectory {key} in {}; `envace inspect --db {} trajectories` lists them",
                    args.db.display(),
                    args.db.display()
                )
            })?;
            render_trajectory(&key, &trajectory)
        }
        Some(InspectWhat::Trajectories { run, step, limit }) => {
            let prefix = match (run, step) {
                (Some(run), Some(step)) => SampleKey::step_prefix(&run.into(), step),
                (Some(run), None) => SampleKey::run_prefix(&run.into()),
                (None, _) => Prefix::all(),
            };
            list_trajectories(&store, &prefix, limit)
        }
        Some(InspectWhat::Memory { task, run }) => render_memories(&store, &task, run.as_deref())?,
    };
    write_stdout(&text)
}

/// Every stored rehearsal memory of `task` (of `run` only, when given), as text.
fn render_memories(store: &Store, task: &str, run: Option<&str>) -> Result<String> {
    let mut out = String::new();
    for entry in store.scan::<RehearsalMemory>(&Prefix::all()) {
        let (key, m) = entry?;
        if m.task.0 != task || run.is_some_and(|r| r != m.run.0) {
            continue;
        }
        out.push_str(&format!(
            "memory {key}\n  mode {} | N {} | policy v{} | {} characters\n",
            snake(&m.mode),
            m.n,
            m.policy_version.0,
            m.summary.chars().count()
        ));
        for (i, (r, c)) in m.rehearsals.iter().zip(&m.critiques).enumerate() {
            out.push_str(&format!(
                "\n  rehearsal {} ({} messages)\n  critique: {}\n",
                i + 1,
                r.len(),
                sanitize(c)
            ));
        }
        out.push_str(&format!(
            "\n  m_x:\n    {}\n\n",
            sanitize(&m.summary).replace('\n', "\n    ")
        ));
    }
    if out.is_empty() {
        anyhow::bail!(
            "no rehearsal memory for task {task}; `envace eval --tts parallel:N` makes them"
        );
    }
    Ok(out)
}

/// Writes to stdout; a closed pipe (`| head`) is not an error.
fn write_stdout(text: &str) -> Result<()> {
    match io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("writing to stdout"),
    }
}

/// What one run has in the run-scoped trees.
#[derive(Default)]
struct RunSummary {
    rollouts: usize,
    last_rollout_step: Option<u64>,
    memories: usize,
    checkpoints: usize,
    last_checkpoint_step: Option<u64>,
}

/// Unreadable parts of the database, reported on stderr once each.
#[derive(Default)]
struct Warnings(Vec<String>);

impl Warnings {
    fn add(&mut self, error: &crate::storage::Error) {
        let text = error.to_string();
        if !self.0.contains(&text) {
            eprintln!("warning: {text}");
            self.0.push(text);
        }
    }
}

/// Walks every key of `R`'s tree once (sled loads the values on the way: this is the summary's
/// cost); returns the tree, the readable keys counted and whether some part could not be read.
fn walk<R: Record>(
    store: &Store,
    warnings: &mut Warnings,
    mut each: impl FnMut(R::Key),
) -> (TreeName, usize, bool) {
    let (mut n, mut damaged) = (0, false);
    for item in store.keys::<R>(&Prefix::all()) {
        match item {
            Ok(key) => {
                n += 1;
                each(key);
            }
            Err(e) => {
                warnings.add(&e);
                damaged = true;
            }
        }
    }
    (R::TREE, n, damaged)
}

fn summary(store: &Store, db: &Path) -> Result<String> {
    let mut out = String::new();
    let size = store.size_on_disk()?;
    writeln!(
        out,
        "database {} ({}, record schema v{SCHEMA_VERSION})\n",
        db.display(),
        bytes(size)
    )?;
    let mut warnings = Warnings::default();
    let mut runs: BTreeMap<RunId, RunSummary> = BTreeMap::new();
    let mut state_runs = Vec::new();
    // Keys come in order, so the last one seen per run is its last step.
    let counts = [
        walk::<Task>(store, &mut warnings, |_| {}),
        walk::<SeedTrajectory>(store, &mut warnings, |_| {}),
        walk::<Trajectory>(store, &mut warnings, |k| {
            let run = runs.entry(k.run).or_default();
            run.rollouts += 1;
            run.last_rollout_step = Some(k.step);
        }),
        walk::<RehearsalMemory>(store, &mut warnings, |k| {
            runs.entry(k.run).or_default().memories += 1;
        }),
        walk::<RunState>(store, &mut warnings, |k| state_runs.push(k)),
        walk::<Checkpoint>(store, &mut warnings, |k| {
            let run = runs.entry(k.run).or_default();
            run.checkpoints += 1;
            run.last_checkpoint_step = Some(k.step);
        }),
    ];
    for run in state_runs {
        runs.entry(run).or_default();
    }
    let damaged = counts.iter().any(|&(_, _, damaged)| damaged);
    let counts: Vec<Vec<String>> = counts
        .iter()
        .map(|&(tree, n, damaged)| {
            let n = if damaged {
                format!("{n}*")
            } else {
                n.to_string()
            };
            vec![tree.to_string(), n]
        })
        .collect();
    out.push_str(&table(&["tree", "records"], &counts));
    if damaged {
        out.push_str(
            "* readable records only: part of the tree could not be read (see warnings)\n",
        );
    }

    if runs.is_empty() {
        out.push_str("\nno runs\n");
        return Ok(out);
    }
    let mut lines = Vec::new();
    for (run, s) in &runs {
        let state = match store.get::<RunState>(run) {
            Ok(state) => state,
            Err(e) => {
                warnings.add(&e);
                None
            }
        };
        let dash = || "-".to_owned();
        lines.push(vec![
            run.to_string(),
            state.as_ref().map_or_else(dash, |s| s.step.to_string()),
            state
                .as_ref()
                .map_or_else(dash, |s| s.data_cursor.to_string()),
            state
                .as_ref()
                .map_or_else(dash, |s| s.config_hash.chars().take(12).collect()),
            s.rollouts.to_string(),
            s.last_rollout_step.map_or_else(dash, |n| n.to_string()),
            s.memories.to_string(),
            s.checkpoints.to_string(),
            s.last_checkpoint_step.map_or_else(dash, |n| n.to_string()),
        ]);
    }
    out.push('\n');
    out.push_str(&table(
        &[
            "run",
            "step",
            "data cursor",
            "config",
            "rollouts",
            "last rollout step",
            "memories",
            "checkpoints",
            "last checkpoint",
        ],
        &lines,
    ));
    Ok(out)
}

fn list_trajectories(store: &Store, prefix: &Prefix<SampleKey>, limit: usize) -> String {
    let mut lines = Vec::new();
    let mut more = 0usize;
    for item in store.scan::<Trajectory>(prefix) {
        if limit != 0 && lines.len() >= limit {
            more += 1;
            continue;
        }
        match item {
            Ok((key, t)) => {
                let prompt: usize = t.rows.iter().map(|r| r.prompt_ids.len()).sum();
                let completion: usize = t.rows.iter().map(|r| r.completion_ids.len()).sum();
                lines.push(vec![
                    key.to_string(),
                    snake(&t.mode),
                    format!("{:.3}", t.reward),
                    snake(&t.termination),
                    t.rows.len().to_string(),
                    format!("{prompt}+{completion}"),
                ]);
            }
            Err(e) => eprintln!("warning: {e}"),
        }
    }
    let mut out = table(
        &[
            "id",
            "mode",
            "reward",
            "termination",
            "rows",
            "tokens (prompt+completion)",
        ],
        &lines,
    );
    if more > 0 {
        let _ = writeln!(out, "… {more} more (--limit 0 lists all)");
    }
    out
}

/// The conversation top to bottom; each user turn's verdict follows the turn it judges.
fn render_trajectory(key: &SampleKey, t: &Trajectory) -> String {
    let mut out = String::new();
    let count = |role: Role| t.rows.iter().filter(|r| r.role == role).count();
    let prompt: usize = t.rows.iter().map(|r| r.prompt_ids.len()).sum();
    let completion: usize = t.rows.iter().map(|r| r.completion_ids.len()).sum();
    let _ = writeln!(out, "trajectory {key}");
    let _ = writeln!(
        out,
        "  mode {} | reward {:.3} | termination {} | {} rows (act {}, rehearse {}) | tokens \
         {prompt} prompt + {completion} completion",
        snake(&t.mode),
        t.reward,
        snake(&t.termination),
        t.rows.len(),
        count(Role::Act),
        count(Role::Rehearse),
    );
    let tm = &t.timings;
    let _ = writeln!(
        out,
        "  time {:.2} s (act {:.2} s, rehearse {:.2} s, environment {:.2} s, judge {:.2} s)",
        tm.total_s, tm.act_s, tm.rehearse_s, tm.environment_s, tm.judge_s
    );

    let mut user_turn: Option<u32> = None;
    for (i, m) in t.messages.iter().enumerate() {
        if m.role == MessageRole::User {
            if let Some(turn) = user_turn {
                verdicts(&mut out, t, turn);
            }
            user_turn = Some(user_turn.map_or(0, |n| n + 1));
        }
        let _ = writeln!(out, "\n[{i}] {}", segment_header(t, m, user_turn));
        for line in sanitize(&m.content).lines() {
            let _ = writeln!(out, "    {line}");
        }
    }
    if let Some(turn) = user_turn {
        verdicts(&mut out, t, turn);
    }
    // Verdicts for turns the messages do not show (e.g. a trajectory stored without messages).
    for v in &t.verdicts {
        if user_turn.is_none_or(|last| v.user_turn > last) {
            verdicts(&mut out, t, v.user_turn);
        }
    }

    if !t.rows.is_empty() {
        let rows: Vec<Vec<String>> = t
            .rows
            .iter()
            .enumerate()
            .map(|(i, r)| {
                vec![
                    i.to_string(),
                    r.role.to_string(),
                    r.prompt_ids.len().to_string(),
                    r.completion_ids.len().to_string(),
                    mean(&r.logprobs).map_or_else(|| "-".to_owned(), |m| format!("{m:.3}")),
                    r.policy_version.0.to_string(),
                ]
            })
            .collect();
        out.push_str("\nrows\n");
        out.push_str(&table(
            &[
                "#",
                "role",
                "prompt",
                "completion",
                "mean logprob",
                "policy",
            ],
            &rows,
        ));
    }
    out
}

fn segment_header(t: &Trajectory, m: &Message, user_turn: Option<u32>) -> String {
    let mut h = m.role.to_string();
    if let Some(tool) = &m.tool_name {
        let _ = write!(h, " {tool}");
    }
    if m.role == MessageRole::User {
        if let Some(turn) = user_turn {
            let _ = write!(h, " (turn {turn})");
        }
    }
    match m.row.map(|r| (r, t.rows.get(r as usize))) {
        Some((r, Some(row))) => {
            let _ = write!(
                h,
                "  <{} row {r}, policy v{}, {} tokens{}>",
                row.role,
                row.policy_version.0,
                row.completion_ids.len(),
                mean(&row.logprobs).map_or_else(String::new, |m| format!(", mean logprob {m:.3}"))
            );
        }
        Some((r, None)) => {
            let _ = write!(h, "  <row {r}: missing>");
        }
        None if m.role == MessageRole::Tool => h.push_str("  <real>"),
        None => {}
    }
    h
}

fn verdicts(out: &mut String, t: &Trajectory, turn: u32) {
    for v in t.verdicts.iter().filter(|v| v.user_turn == turn) {
        let _ = writeln!(
            out,
            "\n  => verdict turn {}: score {:.3}, {}: {}",
            v.user_turn,
            v.score,
            if v.passed { "passed" } else { "FAILED" },
            sanitize(&v.reason)
        );
    }
}

/// Control characters from model output could drive the terminal: show them escaped.
fn sanitize(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() && c != '\n' && c != '\t' {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn mean(xs: &[f32]) -> Option<f64> {
    (!xs.is_empty()).then(|| xs.iter().map(|&x| f64::from(x)).sum::<f64>() / xs.len() as f64)
}

/// A unit enum's serde name (`rehearsal`, `act_parse_error`).
fn snake<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        _ => "?".to_owned(),
    }
}

fn bytes(n: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    if n >= 1 << 20 {
        format!("{:.1} MiB on disk", n as f64 / MIB)
    } else {
        format!("{:.1} KiB on disk", n as f64 / 1024.0)
    }
}

/// Columns aligned; the first left-aligned, the others right-aligned.
fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for (i, (cell, w)) in cells.zip(&widths).enumerate() {
            if i == 0 {
                let _ = write!(s, "{cell:<w$}");
            } else {
                let _ = write!(s, "  {cell:>w$}");
            }
        }
        out.push_str(s.trim_end());
        out.push('\n');
    };
    line(&mut headers.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

pub fn export(args: ExportArgs) -> Result<()> {
    let ExportFormat::Jsonl = args.format;
    let store = open(&args.db).context("envace export")?;
    let run = args.run.map(RunId);
    let mut out = io::BufWriter::new(io::stdout().lock());
    let (written, failed) = match (args.what, &run) {
        (ExportWhat::Trajectories, r) => jsonl::<Trajectory>(
            &store,
            &r.as_ref().map_or_else(Prefix::all, SampleKey::run_prefix),
            &mut out,
        )?,
        (ExportWhat::Memories, r) => jsonl::<RehearsalMemory>(
            &store,
            &r.as_ref().map_or_else(Prefix::all, SampleKey::run_prefix),
            &mut out,
        )?,
        (ExportWhat::Checkpoints, r) => jsonl::<Checkpoint>(
            &store,
            &r.as_ref()
                .map_or_else(Prefix::all, CheckpointKey::run_prefix),
            &mut out,
        )?,
        (ExportWhat::Runs, None) => jsonl::<RunState>(&store, &Prefix::all(), &mut out)?,
        (ExportWhat::Runs, Some(r)) => match store.get::<RunState>(r)? {
            Some(state) => (usize::from(write_json(&mut out, r, &state)?), 0),
            None => (0, 0),
        },
        (ExportWhat::Seeds, None) => jsonl::<SeedTrajectory>(&store, &Prefix::all(), &mut out)?,
        (ExportWhat::Tasks, None) => jsonl::<Task>(&store, &Prefix::all(), &mut out)?,
        (ExportWhat::Seeds | ExportWhat::Tasks, Some(_)) => {
            bail!("--run does not apply to seeds or tasks (they belong to no run)")
        }
    };
    match out.flush() {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => {
            return Err(e).context("writing to stdout")
        }
        _ => {}
    }
    if failed > 0 {
        bail!(
            "{failed} read error(s) (warnings above: a damaged record, or a part of the database \
             that could not be read); the {written} readable records were exported"
        );
    }
    Ok(())
}

/// Writes every readable record under `prefix` as one line; returns (written, read errors).
/// Read errors (a damaged record; a part of the tree sled cannot read, which the scan skips) are
/// reported on stderr.
fn jsonl<R: Record>(
    store: &Store,
    prefix: &Prefix<R::Key>,
    out: &mut impl Write,
) -> Result<(usize, usize)> {
    let (mut written, mut failed) = (0, 0);
    for item in store.scan::<R>(prefix) {
        match item {
            Ok((key, record)) => {
                if !write_json(out, &key, &record)? {
                    break;
                }
                written += 1;
            }
            Err(e) => {
                eprintln!("warning: {e}");
                failed += 1;
            }
        }
    }
    Ok((written, failed))
}

/// One line `{"id": KEY, ...fields}`; `Ok(false)` once the reader has gone (closed pipe).
fn write_json<K: std::fmt::Display, R: Serialize>(
    out: &mut impl Write,
    key: &K,
    record: &R,
) -> Result<bool> {
    let mut object = serde_json::Map::new();
    object.insert("id".to_owned(), key.to_string().into());
    match serde_json::to_value(record).context("converting a record to JSON")? {
        serde_json::Value::Object(fields) => object.extend(fields),
        other => {
            object.insert("value".to_owned(), other);
        }
    }
    let mut line = serde_json::to_vec(&object).context("writing JSON")?;
    line.push(b'\n');
    match out.write_all(&line) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e).context("writing to stdout"),
    }
}
