//! `envace repair`: rebuilds a damaged database from its journal and what sled can still read
//! ([`crate::storage::repair`]), and prints exactly what was lost.
use std::fmt::Write as _;
use std::path::PathBuf;

use crate::storage::{rebuild, repair_in_place, JournalState, RepairReport};
use anyhow::{Context, Result};
use clap::Args;

#[derive(Debug, Args)]
#[command(
    after_help = "Every commit of a run is appended to DIR/journal, checksummed, before \
sled applies it. Repair replays the journal, adds every intact record sled still reads that the \
journal does not hold, and writes a new database. Without --out it replaces DIR and keeps the \
damaged files as DIR.damaged (nothing is deleted). Nothing is lost when either the journal or \
sled's files are undamaged. The database must not be open in a running trainer."
)]
pub struct RepairArgs {
    /// Database directory (a run folder's `db`).
    #[arg(long)]
    db: PathBuf,
    /// Write the rebuilt database here (a new directory) and leave DIR as it is.
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn repair(args: RepairArgs) -> Result<()> {
    let (report, kept) = match &args.out {
        Some(out) => (rebuild(&args.db, out), None),
        None => match repair_in_place(&args.db) {
            Ok((report, kept)) => (Ok(report), Some(kept)),
            Err(e) => (Err(e), None),
        },
    };
    let report = report.with_context(|| format!("envace repair --db {}", args.db.display()))?;
    print!("{}", render(&report));
    match (&args.out, kept) {
        (Some(out), _) => println!("rebuilt database written to {}", out.display()),
        (None, Some(kept)) => println!(
            "{} is now the rebuilt database; the damaged files are kept at {}",
            args.db.display(),
            kept.display()
        ),
        (None, None) => {}
    }
    Ok(())
}

/// The report as text, one fact per line.
pub fn render(report: &RepairReport) -> String {
    let mut out = String::new();
    let _ = match &report.journal {
        JournalState::Missing => writeln!(out, "journal: none"),
        JournalState::Unreadable(e) => writeln!(out, "journal: unreadable ({e})"),
        JournalState::Read(s) => writeln!(
            out,
            "journal: {} entries, {}{}",
            s.entries,
            if s.header_damaged {
                "header damaged".to_owned()
            } else if s.started_empty {
                "begun on an empty database".to_owned()
            } else {
                "begun on a database that already held records".to_owned()
            },
            if s.damaged.is_empty() {
                ", no damage".to_owned()
            } else {
                format!(
                    ", damaged bytes {:?} (entries {:?} lost{})",
                    s.damaged,
                    s.missing_seqs,
                    if s.torn_tail() {
                        " or a torn last entry"
                    } else {
                        ""
                    }
                )
            }
        ),
    };
    let s = &report.sled;
    match &s.error {
        Some(e) => {
            let _ = writeln!(out, "sled: unreadable ({e})");
        }
        None => {
            let _ = writeln!(
                out,
                "sled: {} intact records, {} corrupt, {} unreadable part(s){}",
                s.records,
                s.corrupt.len(),
                s.unreadable.len(),
                match s.discarded {
                    Some(d) => format!(
                        "; recovery discarded {} log bytes from byte {} on",
                        d.bytes, d.first_offset
                    ),
                    None => String::new(),
                }
            );
        }
    }
    let per_tree: Vec<String> = report
        .records
        .iter()
        .map(|(tree, n)| format!("{tree} {n}"))
        .collect();
    let _ = writeln!(
        out,
        "rebuilt: {} records ({}); {} restored from the journal, {} from sled alone",
        report.total(),
        per_tree.join(", "),
        report.restored_from_journal,
        report.from_sled_only
    );
    if report.lost.is_nothing() {
        let _ = writeln!(out, "lost: nothing");
    } else {
        let _ = writeln!(out, "lost: {} known record(s)", report.lost.records.len());
        for record in &report.lost.records {
            let _ = writeln!(out, "  {record}");
        }
        for why in &report.lost.unknown {
            let _ = writeln!(out, "  possibly more: {why}");
        }
    }
    out
}
