//! Repair: a new database rebuilt from the journal ([`crate::journal`]) and from what sled can
//! still read of the old one, with an exact account of what was lost.
//!
//! The journal is replayed in order (commits that sled refused, recorded as aborted, are
//! skipped). A sled database that recovers without discarding anything and reads with no
//! damaged record holds every acknowledged write, and is copied as it is. Otherwise the
//! journal's final values win (sled may have lost the latest writes behind a damaged log entry)
//! and every record that sled reads intact and the journal does not mention is added (the
//! records of damaged journal entries, or of a database older than its journal).
//!
//! Nothing is lost when either source is complete: a journal begun on an empty database with no
//! damaged entry, or a sled database that recovered without discarding anything and reads with
//! no damaged record. Otherwise [`Lost`] names the damaged records that neither source holds
//! and says which damage may hide further ones (their keys cannot be known).
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::codec::{self, Failure};
use crate::error::{Error, Result};
use crate::journal::{self, Entry, Op, ScanSummary, JOURNAL_FILE};
use crate::schema::TreeName;
use crate::store::{key_text_of, refuse_if_locked, Discarded, Store, StoreOptions, WriteSet};

/// What [`rebuild`] found in the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JournalState {
    /// No `journal` file (a database written before journals, or the file was removed).
    Missing,
    /// The file could not be read (I/O error).
    Unreadable(String),
    /// Read; damage (if any) is in the summary.
    Read(ScanSummary),
}

/// What [`rebuild`] found in sled's files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SledState {
    /// sled's files could not be opened at all (why); only the journal's records were used.
    pub error: Option<String>,
    /// What sled's recovery discarded of its log (on a private copy).
    pub discarded: Option<Discarded>,
    /// Parts of trees sled could not read, as [`Error::Unreadable`] messages.
    pub unreadable: Vec<String>,
    /// Records whose value fails its checksum, `tree key`.
    pub corrupt: Vec<String>,
    /// Intact records read.
    pub records: u64,
}

impl SledState {
    /// sled opened, its recovery discarded nothing and every record read intact.
    pub fn is_complete(&self) -> bool {
        self.error.is_none()
            && self.discarded.is_none()
            && self.unreadable.is_empty()
            && self.corrupt.is_empty()
    }
}

/// What is gone for good.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lost {
    /// Records known lost, `tree key`: damaged in sled and in no intact journal entry.
    pub records: Vec<String>,
    /// Damage that may hide further lost records, whose keys cannot be known.
    pub unknown: Vec<String>,
}

impl Lost {
    /// Nothing was lost.
    pub fn is_nothing(&self) -> bool {
        self.records.is_empty() && self.unknown.is_empty()
    }
}

/// The account of one repair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairReport {
    pub journal: JournalState,
    pub sled: SledState,
    /// Records in the rebuilt database, per tree.
    pub records: BTreeMap<TreeName, u64>,
    /// Records the journal supplied that a damaged sled database had lost, damaged or held an
    /// older value of (0 when sled is undamaged: it is then copied as it is).
    pub restored_from_journal: u64,
    /// Records of sled's in no intact journal entry.
    pub from_sled_only: u64,
    pub lost: Lost,
}

impl RepairReport {
    /// Records in the rebuilt database.
    pub fn total(&self) -> u64 {
        self.records.values().sum()
    }
}

/// Writes a new database at `target` (which must not exist) from `source`'s journal and
/// readable sled records; `source` is only read (sled opens a private copy of it).
///
/// # Errors
/// [`Error::Missing`] if `source` is not a directory holding a sled log or a journal;
/// [`Error::Locked`] if a process holds `source`; [`Error::Repair`] if `target` exists or
/// neither the journal nor sled's files can be read;
/// errors of [`Store::open`] and [`Store::commit`] writing `target`. Damage in `source` is
/// reported, not an error.
pub fn rebuild(source: &Path, target: &Path) -> Result<RepairReport> {
    // Nothing to rebuild from: refused before anything is written.
    let has = |name: &str| source.join(name).is_file();
    if !source.is_dir() || !(has("db") || has(JOURNAL_FILE)) {
        return Err(Error::Missing {
            path: source.to_path_buf(),
            reason: if source.is_dir() {
                format!("neither sled's log (`db`) nor a `{JOURNAL_FILE}` is there")
            } else {
                "no such directory".to_owned()
            },
        });
    }
    refuse_if_locked(source)?;
    if target.exists() {
        return Err(Error::Repair {
            path: source.to_path_buf(),
            reason: format!("the target {} exists", target.display()),
        });
    }
    let mut state: BTreeMap<(TreeName, Vec<u8>), Option<Vec<u8>>> = BTreeMap::new();
    let journal = replay(&source.join(JOURNAL_FILE), &mut state);

    let mut sled = SledState::default();
    let mut sled_records: BTreeMap<(TreeName, Vec<u8>), Vec<u8>> = BTreeMap::new();
    let mut corrupt_keys: Vec<(TreeName, Vec<u8>)> = Vec::new();
    match Store::open_existing(source, StoreOptions::default()) {
        Err(e) => sled.error = Some(e.to_string()),
        Ok(store) => {
            sled.discarded = store.discarded();
            for tree in TreeName::ALL {
                for item in store.raw_entries(tree) {
                    let (key, value) = match item {
                        Ok(kv) => kv,
                        Err(e) => {
                            sled.unreadable.push(e.to_string());
                            continue;
                        }
                    };
                    // A value of another schema version is intact: copied as it is.
                    if let Err(Failure::Damage(_)) = codec::check(&value) {
                        sled.corrupt
                            .push(format!("{tree} {}", key_text_of(tree)(&key)));
                        corrupt_keys.push((tree, key.to_vec()));
                        continue;
                    }
                    sled.records += 1;
                    sled_records.insert((tree, key.to_vec()), value.to_vec());
                }
            }
        }
    }
    if let (Some(e), false) = (&sled.error, matches!(journal, JournalState::Read(_))) {
        return Err(Error::Repair {
            path: source.to_path_buf(),
            reason: format!(
                "neither a journal nor sled's files can be read ({e}); nothing was changed"
            ),
        });
    }
    // An undamaged sled database holds every acknowledged write (the journal can only be one
    // unacknowledged commit ahead), so it is taken as it is. Otherwise the journal's final
    // values win (sled may have lost the latest writes) and sled fills in the keys the journal
    // does not hold (damaged entries, or writes older than the journal).
    let (mut restored_from_journal, mut from_sled_only) = (0, 0);
    if sled.is_complete() {
        from_sled_only = sled_records
            .keys()
            .filter(|id| !state.contains_key(*id))
            .count() as u64;
        state = sled_records
            .into_iter()
            .map(|(id, v)| (id, Some(v)))
            .collect();
    } else {
        for (id, value) in &state {
            if value.is_some() && sled_records.get(id) != value.as_ref() {
                restored_from_journal += 1;
            }
        }
        for (id, value) in sled_records {
            if let std::collections::btree_map::Entry::Vacant(slot) = state.entry(id) {
                slot.insert(Some(value));
                from_sled_only += 1;
            }
        }
    }

    let journal_complete = matches!(&journal, JournalState::Read(s)
        if s.started_empty && !s.header_damaged && s.damaged.is_empty());
    let mut lost = Lost::default();
    if !journal_complete && !sled.is_complete() {
        lost.records = corrupt_keys
            .iter()
            .filter(|id| !state.contains_key(*id))
            .map(|(tree, key)| format!("{tree} {}", key_text_of(*tree)(key)))
            .collect();
        let why = journal_gap(&journal);
        for gap in &sled.unreadable {
            lost.unknown.push(format!(
                "sled could not read a part of a tree ({gap}), and {why}"
            ));
        }
        if let Some(d) = sled.discarded {
            lost.unknown.push(format!(
                "sled's recovery discarded {} bytes of its log from byte {} on, and {why}",
                d.bytes, d.first_offset
            ));
        }
        if let Some(e) = &sled.error {
            lost.unknown
                .push(format!("sled's files could not be read ({e}), and {why}"));
        }
    }

    let mut records = BTreeMap::new();
    let store = Store::open(target, StoreOptions::default())?;
    let (mut set, mut bytes) = (WriteSet::new(), 0usize);
    for ((tree, key), value) in state {
        let Some(value) = value else { continue };
        bytes += key.len() + value.len();
        *records.entry(tree).or_insert(0) += 1;
        set.put_bytes(tree, key, value);
        // One commit per ~32 MB: memory and fsyncs both stay small.
        if bytes > 32 << 20 {
            store.commit(std::mem::take(&mut set))?;
            bytes = 0;
        }
    }
    store.commit(set)?;
    store.flush()?;
    Ok(RepairReport {
        journal,
        sled,
        records,
        restored_from_journal,
        from_sled_only,
        lost,
    })
}

/// Replays the journal at `path` into `state` (the final value of every key it names, `None`
/// for removed), skipping aborted commits.
fn replay(path: &Path, state: &mut BTreeMap<(TreeName, Vec<u8>), Option<Vec<u8>>>) -> JournalState {
    if !path.exists() {
        return JournalState::Missing;
    }
    // Aborts follow their commits, so a first pass finds them.
    let mut aborted = BTreeSet::new();
    if let Err(e) = journal::scan(path, |entry| {
        if let Entry::Abort { aborted: seq, .. } = entry {
            aborted.insert(seq);
        }
    }) {
        return JournalState::Unreadable(e.to_string());
    }
    let scanned = journal::scan(path, |entry| {
        let Entry::Commit { seq, ops } = entry else {
            return;
        };
        if aborted.contains(&seq) {
            return;
        }
        for op in ops {
            match op {
                Op::Put { tree, key, value } => state.insert((tree, key), Some(value)),
                Op::Remove { tree, key } => state.insert((tree, key), None),
            };
        }
    });
    match scanned {
        Ok(summary) => JournalState::Read(summary),
        Err(e) => JournalState::Unreadable(e.to_string()),
    }
}

/// Why the journal cannot vouch for every record, for [`Lost::unknown`].
fn journal_gap(journal: &JournalState) -> String {
    match journal {
        JournalState::Missing => "there is no journal".to_owned(),
        JournalState::Unreadable(e) => format!("the journal could not be read ({e})"),
        JournalState::Read(s) => {
            let mut why = Vec::new();
            if s.header_damaged {
                why.push("its header is damaged".to_owned());
            } else if !s.started_empty {
                why.push("it began after the database already held records".to_owned());
            }
            if !s.damaged.is_empty() {
                why.push(format!(
                    "{} damaged byte range(s) {:?} (entries {:?} missing{})",
                    s.damaged.len(),
                    s.damaged,
                    s.missing_seqs,
                    if s.torn_tail() {
                        ", or a torn last entry"
                    } else {
                        ""
                    }
                ));
            }
            format!("the journal is incomplete: {}", why.join("; "))
        }
    }
}

/// Repairs `dir` in place: rebuilds into `DIR.repairing` ([`rebuild`]), then moves the damaged
/// database to `DIR.damaged` (`.damaged-2`, … if taken) and the rebuilt one to `DIR`. Returns
/// the report and where the damaged files were kept; nothing is deleted.
///
/// # Errors
/// As [`rebuild`] (then `dir` is unchanged; a leftover `DIR.repairing` of an interrupted
/// repair is removed first); [`Error::Repair`] if a rename fails, saying where each copy is.
pub fn repair_in_place(dir: &Path) -> Result<(RepairReport, PathBuf)> {
    let sibling = |suffix: &str| {
        let mut name = dir.file_name().unwrap_or_default().to_os_string();
        name.push(suffix);
        dir.with_file_name(name)
    };
    let target = sibling(".repairing");
    if target.exists() {
        std::fs::remove_dir_all(&target).map_err(|e| Error::Repair {
            path: dir.to_path_buf(),
            reason: format!("cannot remove the leftover {}: {e}", target.display()),
        })?;
    }
    let report = rebuild(dir, &target)?;
    let kept = std::iter::once(sibling(".damaged"))
        .chain((2..).map(|n| sibling(&format!(".damaged-{n}"))))
        .find(|p| !p.exists())
        .expect("an unused name");
    let rename_error = |what: &str, e: std::io::Error| Error::Repair {
        path: dir.to_path_buf(),
        reason: format!(
            "{what}: {e}; the rebuilt database is at {}, the damaged one at {}",
            target.display(),
            if kept.exists() { &kept } else { dir }.display()
        ),
    };
    std::fs::rename(dir, &kept).map_err(|e| rename_error("cannot move the damaged database", e))?;
    std::fs::rename(&target, dir)
        .map_err(|e| rename_error("cannot move the rebuilt database", e))?;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        if let Ok(d) = std::fs::File::open(parent) {
            let _ = d.sync_all();
        }
    }
    Ok((report, kept))
}
