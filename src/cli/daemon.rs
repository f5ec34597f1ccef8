//! `envace daemon` (long-running self-rehearsal training) and `envace ctl` (its control).

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, Subcommand};

use super::pipeline::RunArgs;
use crate::daemon::{request, status_text, CtlRequest, DaemonOptions};
use crate::pipeline::Pipeline;

/// Options of `envace daemon`.
#[derive(Debug, Clone, Args)]
pub struct DaemonArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// Serve Prometheus metrics at http://ADDR/metrics (loopback unless you name another
    /// interface), e.g. 127.0.0.1:9184.
    #[arg(long)]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Stop when the run has N steps (the run's total: the same command resumes to it).
    #[arg(long, conflicts_with = "hours")]
    pub steps: Option<u64>,
    /// Stop after H hours of this process's wall time.
    #[arg(long)]
    pub hours: Option<f64>,
}

/// `envace daemon`.
pub fn daemon(args: DaemonArgs) -> Result<()> {
    let started = std::time::Instant::now();
    if let Some(h) = args.hours {
        if !(h.is_finite() && h > 0.0) {
            bail!("--hours {h}: must be a positive number of hours");
        }
    }
    if let Some(addr) = args.metrics_addr {
        if !addr.ip().is_loopback() {
            eprintln!(
                "warning: --metrics-addr {addr} is not a loopback address: the metrics are \
                 reachable from other machines"
            );
        }
    }
    let (cfg, name) = args.run.config()?;
    let rt = args.run.runtime()?;
    // A folder in use is refused before the metrics port is bound (the pipeline takes the
    // lock for good below).
    if args.run.out.is_dir() {
        drop(crate::run_folder::RunLock::acquire(&args.run.out)?);
    }
    rt.block_on(async {
        if let Some(addr) = args.metrics_addr {
            crate::daemon::start_metrics_exporter(addr)?;
        }
        let mut p = Pipeline::open_with(cfg, &args.run.out, &name, args.run.open(true)).await?;
        let options = DaemonOptions {
            steps: args.steps,
            hours: args.hours,
            metrics_addr: args.metrics_addr,
            started,
        };
        let out = crate::daemon::run(&mut p, &options).await;
        let saved = p.save_report();
        p.close().await;
        out?;
        saved?;
        Ok(())
    })
}

/// Options of `envace ctl`.
#[derive(Debug, Clone, Args)]
pub struct CtlArgs {
    /// The run folder of the daemon.
    #[arg(long, alias = "out", default_value = "runs/demo")]
    pub run: PathBuf,
    /// Print the daemon's JSON reply as it is.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: CtlCommand,
}

/// What to ask the daemon.
#[derive(Debug, Clone, Subcommand)]
pub enum CtlCommand {
    /// Where the run stands: steps, rewards, judge, last evaluation and checkpoint, disk.
    Status,
    /// Finish the step in flight, write a checkpoint, exit 0.
    Stop,
    /// Swap the self-rehearsal judge (a registered name) from the next step.
    Judge { name: String },
    /// Add tasks (JSON lines: {"task": {...}, "seed": {...}}) to the train pool from the next
    /// step; they are drawn first.
    AddTasks { file: PathBuf },
}

/// `envace ctl`.
pub fn ctl(args: CtlArgs) -> Result<()> {
    let req = match args.command {
        CtlCommand::Status => CtlRequest::Status,
        CtlCommand::Stop => CtlRequest::Stop,
        CtlCommand::Judge { name } => CtlRequest::Judge { name },
        CtlCommand::AddTasks { file } => CtlRequest::AddTasks {
            // The daemon runs elsewhere: it gets an absolute path.
            file: std::path::absolute(&file)?,
        },
    };
    let status_only = req == CtlRequest::Status;
    let reply = request(&args.run, &req)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reply)?);
    } else if !reply.ok {
        bail!("the daemon refused: {}", reply.message);
    } else if status_only {
        if let Some(s) = &reply.status {
            println!("{}", status_text(s));
        }
    } else {
        println!("{}", reply.message);
    }
    if !reply.ok {
        bail!("the daemon refused the request");
    }
    Ok(())
}
