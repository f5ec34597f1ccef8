//! [`Store`]: the sled database, its trees, and the write and scan paths.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sled::transaction::{TransactionError, Transactional};

use crate::codec::{self, Failure, SCHEMA_VERSION};
use crate::disk::{self, BlobSync, Survey, SEGMENT_SIZE};
use crate::error::{Error, Result};
use crate::journal::{Journal, Op, JOURNAL_FILE};
use crate::keys::{leading_run, CheckpointKey, Prefix, RecordKey, SampleKey, SeedKey};
use crate::records::{RunId, TaskId};
use crate::scan::{key_text, Entries, Keys, Scan};
use crate::schema::{Record, TreeName};

/// When acknowledged writes reach the disk.
///
/// The default is [`FlushPolicy::EveryWrite`]: a training daemon writes a few batches per
/// optimizer step (a step of 16 tasks × 4 samples takes minutes on the model side), so one fsync
/// per batch costs nothing measurable there, and it makes `Ok` mean "on disk": a crash, `SIGKILL`
/// or power loss after `Ok` loses nothing of that write or any earlier one, whatever their size
/// (given a disk that honours fsync; power loss is argued from what is fsynced, while the crash
/// test exercises `SIGKILL`).
///
/// sled 0.34 fsyncs only its log file (`db`). A log message longer than a quarter of a segment
/// (about 2 MiB for databases this build creates, [`SEGMENT_SIZE`] / 4: a record that large, or a
/// leaf node of up to ~17 records that sled rewrites whole) goes to its own file under `blobs/`,
/// which sled never fsyncs. Every flush of the store ([`Store::flush`], and each write under
/// `EveryWrite`) therefore fsyncs, after sled's log, the blob files written since the last one
/// and then the `blobs/` folder; a blob file that a flushed log entry points to was complete
/// before that entry was written, so none is missed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlushPolicy {
    /// Every write call ([`Store::put`], [`Store::put_many`], [`Store::commit`]) fsyncs before it
    /// returns `Ok`.
    #[default]
    EveryWrite,
    /// sled's background thread fsyncs its log every N milliseconds (N ≥ 1). `Ok` then means
    /// "applied and visible to readers"; if the process dies (crash, `SIGKILL`) at most the last
    /// N ms of acknowledged writes are lost. That thread does not fsync blob files: after a
    /// power loss a blob file written since the last [`Store::flush`] may be torn, and sled's
    /// recovery then drops every write logged after it. So under this policy only what a
    /// [`Store::flush`] has returned for survives power loss. The journal too is fsynced only
    /// by [`Store::flush`]. For bulk imports and benchmarks.
    IntervalMs(u64),
}

/// How to open a [`Store`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreOptions {
    /// Durability of acknowledged writes.
    pub flush: FlushPolicy,
    /// sled's page cache, bytes. The default (128 MiB) leaves memory to the model sharing the
    /// process.
    pub cache_capacity_bytes: u64,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            flush: FlushPolicy::EveryWrite,
            cache_capacity_bytes: 128 << 20,
        }
    }
}

/// The envace database: one sled directory with a tree per record type ([`TreeName`]).
///
/// Cheap to clone (handles share the database); `Send + Sync`. sled admits one process per
/// directory at a time: a second process gets [`Error::Locked`].
#[derive(Debug, Clone)]
pub struct Store {
    db: sled::Db,
    trees: Vec<sled::Tree>,
    path: PathBuf,
    options: StoreOptions,
    blobs: Arc<BlobSync>,
    /// The private copy a read-only open works on ([`Store::open_existing`]); dropped (and
    /// removed) after the database above with the last handle.
    snapshot: Option<Arc<Snapshot>>,
    /// What sled's recovery discarded of the copy's log, if anything.
    discarded: Option<Discarded>,
    /// The journal every commit is appended to first (read-write opens only).
    journal: Option<Arc<Journal>>,
    /// Held from a commit's journal append through sled's apply, so that concurrent commits
    /// reach sled in journal order (a replay then ends in sled's state).
    commit_order: Arc<std::sync::Mutex<()>>,
}

/// Log bytes that sled's recovery zeroed when it opened a read-only copy
/// ([`Store::open_existing`]): data past a damaged or torn log entry, whose records that view
/// cannot show. The user's files are unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Discarded {
    /// Offset in `db` of the first zeroed byte, bytes.
    pub first_offset: u64,
    /// Bytes that held data in the original `db` and are zero in the recovered copy.
    pub bytes: u64,
}

impl Store {
    /// Opens the database in directory `path`, creating it if needed (new databases get
    /// [`SEGMENT_SIZE`]). On an existing database sled runs its recovery, which rewrites its own
    /// bookkeeping (a `snap.*` file; the unwritten rest of the last log segment) but no record
    /// that was acknowledged.
    ///
    /// A blob file that sled's recovery would read and that fails its checksum is logged as a
    /// warning (`tracing`), not refused, so that a trainer restarts after a power loss: the torn
    /// file is then the last write, unacknowledged, and sled drops it with everything logged
    /// after it, none of which was acknowledged under [`FlushPolicy::EveryWrite`] (under
    /// [`FlushPolicy::IntervalMs`]: nothing before the last [`Store::flush`]). A blob file the
    /// disk damaged loses acknowledged writes that way; [`Store::open_existing`] refuses it.
    ///
    /// Every commit is first appended to the database's journal ([`crate::journal`]), from
    /// which [`crate::repair`] rebuilds a damaged database.
    ///
    /// # Errors
    /// [`Error::Invalid`] if `path` holds files that are not a sled database (sled would write
    /// over them), or a journal with writes but no sled log (repair it instead);
    /// [`Error::Locked`] if another process holds it; [`Error::Open`] if sled cannot open or
    /// recover it; [`Error::Journal`] if the journal cannot be opened; [`Error::Sync`] /
    /// [`Error::Flush`] if making the new database's files durable fails.
    pub fn open(path: impl AsRef<Path>, options: StoreOptions) -> Result<Store> {
        let path = path.as_ref().to_path_buf();
        let created = !path.exists();
        let segment_size = match disk::survey(&path) {
            Ok(Survey::New { segment_size, .. }) => {
                refuse_lost_log(&path)?;
                segment_size.unwrap_or(SEGMENT_SIZE)
            }
            Ok(Survey::Database { segment_size }) => {
                refuse_if_locked(&path)?;
                if let Err(reason) = disk::check_replayed_blobs(&path, segment_size) {
                    tracing::warn!(path = %path.display(), "{reason}");
                }
                segment_size
            }
            Err(reason) => return Err(Error::Invalid { path, reason }),
        };
        Store::start(path, options, segment_size, created, false)
    }

    /// Opens an existing database and never creates one (for read-only commands such as
    /// `envace inspect`). Before sled sees the directory it checks, reading only, that it holds
    /// a sled database: a valid `conf`, a `db` with a valid log segment, a `blobs` folder, intact
    /// blob files where sled's recovery will read, and (once open) every envace tree. So it never
    /// lets sled re-create a damaged directory as an empty database, nor drop writes behind a
    /// damaged blob file. sled has no read-only mode and its recovery rewrites the log it opens,
    /// so the handle works on a private copy of the directory under the system temp dir
    /// (removed with the last handle): the user's files are never opened by sled, and writes
    /// through this handle reach only the copy. What recovery discarded of the copy's log (data
    /// past a damaged entry) is [`Store::discarded`]; [`Store::path`] is the copy.
    ///
    /// # Errors
    /// [`Error::Missing`] if `path` is not a directory, holds no `db` file, or holds a sled
    /// database without the envace trees; [`Error::Invalid`] if it holds something else than a
    /// sound sled database; [`Error::Snapshot`] if the copy cannot be made; otherwise as
    /// [`Store::open`].
    pub fn open_existing(path: impl AsRef<Path>, options: StoreOptions) -> Result<Store> {
        let path = path.as_ref();
        let missing = |reason: &str| Error::Missing {
            path: path.to_path_buf(),
            reason: reason.to_owned(),
        };
        let invalid = |reason: String| Error::Invalid {
            path: path.to_path_buf(),
            reason,
        };
        if !path.is_dir() {
            return Err(missing("no such directory"));
        }
        let segment_size = match disk::survey(path).map_err(invalid)? {
            Survey::New { db_file: false, .. } => {
                return Err(missing(
                    "the directory holds no sled database (no `db` file)",
                ))
            }
            Survey::New { db_file: true, .. } => {
                return Err(invalid(
                    "`db` is empty (0 bytes): nothing was ever written there".to_owned(),
                ))
            }
            Survey::Database { segment_size } => segment_size,
        };
        refuse_if_locked(path)?;
        disk::check_replayed_blobs(path, segment_size).map_err(invalid)?;
        let snapshot = Snapshot::copy_of(path).map_err(|cause| Error::Snapshot {
            path: path.to_path_buf(),
            cause,
        })?;
        let mut store = Store::start(snapshot.dir.clone(), options, segment_size, false, true)?;
        store.discarded = zeroed(&path.join("db"), &snapshot.dir.join("db")).map_err(|cause| {
            Error::Snapshot {
                path: path.to_path_buf(),
                cause,
            }
        })?;
        if let Some(d) = store.discarded {
            tracing::warn!(
                path = %path.display(),
                first_offset = d.first_offset,
                bytes = d.bytes,
                "sled's recovery discarded log data of the read-only copy: records written \
                 there are missing from this view (the database is damaged; its files are \
                 unchanged)"
            );
        }
        store.snapshot = Some(Arc::new(snapshot));
        Ok(store)
    }

    /// What sled's recovery discarded when a read-only open recovered its copy of the log
    /// (`None`: nothing, or a read-write open).
    pub fn discarded(&self) -> Option<Discarded> {
        self.discarded
    }

    /// True when this handle works on a private copy of the database ([`Store::open_existing`]).
    pub fn is_snapshot(&self) -> bool {
        self.snapshot.is_some()
    }

    /// Opens sled with `segment_size`, then the trees (when `existing`, only if they are all
    /// there), then makes the database's own files durable.
    fn start(
        path: PathBuf,
        options: StoreOptions,
        segment_size: usize,
        created: bool,
        existing: bool,
    ) -> Result<Store> {
        let flush_every_ms = match options.flush {
            FlushPolicy::EveryWrite => None,
            FlushPolicy::IntervalMs(ms) => Some(ms.max(1)),
        };
        // sled 0.34 marks `segment_size` as a testing knob, but it is the only way to keep
        // records up to 2 MiB out of blob files (see `SEGMENT_SIZE`); sled checks the value.
        let db = sled::Config::new()
            .path(&path)
            .cache_capacity(options.cache_capacity_bytes)
            .flush_every_ms(flush_every_ms)
            .segment_size(segment_size)
            .open()
            .map_err(|cause| open_error(&path, cause))?;
        if existing {
            let names = db.tree_names();
            if let Some(tree) = TreeName::ALL
                .iter()
                .find(|t| !names.iter().any(|n| n.as_ref() == t.as_str().as_bytes()))
            {
                return Err(Error::Missing {
                    path,
                    reason: format!("a sled database without the envace tree `{tree}`"),
                });
            }
        }
        let trees = TreeName::ALL
            .iter()
            .map(|&tree| {
                db.open_tree(tree.as_str())
                    .map_err(|cause| Error::Sled { tree, cause })
            })
            .collect::<Result<Vec<_>>>()?;
        let journal = if existing {
            None
        } else {
            let empty = trees.iter().all(sled::Tree::is_empty);
            let journal = Journal::open(&path, empty).map_err(|cause| Error::Journal {
                path: path.join(JOURNAL_FILE),
                cause,
            })?;
            Some(Arc::new(journal))
        };
        let store = Store {
            blobs: Arc::new(BlobSync::new(&path)),
            snapshot: None,
            discarded: None,
            journal,
            commit_order: Arc::default(),
            db,
            trees,
            path,
            options,
        };
        // New trees, a new `conf`, a new directory: on disk before any write is acknowledged.
        store.flush()?;
        disk::sync_layout(&store.path, created).map_err(sync_error)?;
        tracing::debug!(path = %store.path.display(), ?store.options, segment_size, "opened store");
        Ok(store)
    }

    /// The database directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The options it was opened with.
    pub fn options(&self) -> &StoreOptions {
        &self.options
    }

    /// Writes one record under its key, replacing any record there; returns the key.
    ///
    /// # Errors
    /// [`Error::Encode`], [`Error::Sled`], or [`Error::Flush`] / [`Error::Sync`] (under
    /// [`FlushPolicy::EveryWrite`]; the write is applied but may then not be durable).
    pub fn put<R: Record>(&self, record: &R) -> Result<R::Key> {
        let mut writes = WriteSet::new();
        let key = writes.put(record)?;
        self.commit(writes)?;
        Ok(key)
    }

    /// Writes records atomically (all or none, also across a crash) with one flush; returns
    /// their keys in order.
    ///
    /// # Errors
    /// As [`Store::put`]; on error none of the records is written.
    pub fn put_many<R: Record>(&self, records: &[R]) -> Result<Vec<R::Key>> {
        let mut writes = WriteSet::new();
        let keys = records
            .iter()
            .map(|r| writes.put(r))
            .collect::<Result<Vec<_>>>()?;
        self.commit(writes)?;
        Ok(keys)
    }

    /// Applies a [`WriteSet`] atomically, across trees if it spans several (e.g. a step's
    /// rollouts together with the run state that points past them), then flushes per the policy.
    /// The set is appended to the journal (fsynced under [`FlushPolicy::EveryWrite`]) before
    /// sled applies it; a set sled refuses is recorded there as aborted.
    ///
    /// # Errors
    /// [`Error::Journal`] if the journal append fails (nothing is applied);
    /// [`Error::Sled`] / [`Error::Commit`] if sled fails (nothing is applied);
    /// [`Error::Flush`] / [`Error::Sync`] if the flush fails.
    pub fn commit(&self, writes: WriteSet) -> Result<()> {
        if writes.batches.is_empty() {
            return Ok(());
        }
        let sync = self.options.flush == FlushPolicy::EveryWrite;
        let journal_error = |j: &Journal, cause| Error::Journal {
            path: j.path().to_path_buf(),
            cause,
        };
        let order = self
            .commit_order
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let seq = match &self.journal {
            Some(j) => Some(
                j.append_commit(&writes.ops, sync)
                    .map_err(|cause| journal_error(j, cause))?,
            ),
            None => None,
        };
        if let Err(e) = self.apply(writes.batches.into_iter().collect()) {
            if let (Some(j), Some(seq)) = (&self.journal, seq) {
                if let Err(cause) = j.append_abort(seq, sync) {
                    tracing::warn!(
                        seq,
                        error = %cause,
                        "cannot journal the abort of a commit sled refused; `envace repair` \
                         would apply it"
                    );
                }
            }
            return Err(e);
        }
        drop(order);
        if sync {
            self.flush()?;
        }
        Ok(())
    }

    /// Applies the batches in sled, atomically across trees.
    fn apply(&self, mut batches: Vec<(TreeName, sled::Batch)>) -> Result<()> {
        match batches.len() {
            0 => return Ok(()),
            1 => {
                let (tree, batch) = batches.remove(0);
                self.tree(tree)
                    .apply_batch(batch)
                    .map_err(|cause| Error::Sled { tree, cause })?;
            }
            _ => {
                let trees: Vec<sled::Tree> =
                    batches.iter().map(|(t, _)| self.tree(*t).clone()).collect();
                trees[..]
                    .transaction(|txs| {
                        for (tx, (_, batch)) in txs.iter().zip(&batches) {
                            tx.apply_batch(batch)?;
                        }
                        Ok::<(), sled::transaction::ConflictableTransactionError<()>>(())
                    })
                    .map_err(|e: TransactionError<()>| Error::Commit {
                        trees: batches.iter().map(|(t, _)| *t).collect(),
                        cause: match e {
                            TransactionError::Storage(cause) => cause,
                            TransactionError::Abort(()) => sled::Error::ReportableBug(
                                "write transaction aborted without reason".to_owned(),
                            ),
                        },
                    })?;
            }
        }
        Ok(())
    }

    /// Reads the record under `key`.
    ///
    /// # Errors
    /// [`Error::Corrupt`], [`Error::NewerSchema`] or [`Error::OlderSchema`] if the stored value
    /// cannot be decoded; [`Error::Sled`] if the read fails.
    pub fn get<R: Record>(&self, key: &R::Key) -> Result<Option<R>> {
        let value = self
            .tree(R::TREE)
            .get(key.to_bytes())
            .map_err(|cause| Error::Sled {
                tree: R::TREE,
                cause,
            })?;
        value.map(|v| decode_value::<R>(key, &v)).transpose()
    }

    /// Whether a record exists under `key` (without decoding it).
    ///
    /// # Errors
    /// [`Error::Sled`] if the read fails.
    pub fn contains<R: Record>(&self, key: &R::Key) -> Result<bool> {
        self.tree(R::TREE)
            .contains_key(key.to_bytes())
            .map_err(|cause| Error::Sled {
                tree: R::TREE,
                cause,
            })
    }

    /// Records whose keys start with `prefix`, in key order (run → step → task → sample for
    /// rollouts). Each item is its own `Result`: a damaged record yields an error naming its tree
    /// and key, and the scan goes on to the next one; a part of the tree sled cannot read (a
    /// damaged blob file) yields one [`Error::Unreadable`] naming the readable keys around it,
    /// and the scan goes on past it (see [`crate::scan`]). Always ends. Reversible (`.rev()`,
    /// `.next_back()`).
    pub fn scan<R: Record>(&self, prefix: &Prefix<R::Key>) -> Scan<R> {
        Scan::new(self.entries(R::TREE, key_text::<R::Key>, prefix.as_bytes()))
    }

    /// Keys under `prefix` in order, errors as in [`Store::scan`] (for counts and listings).
    /// Values are not decoded, but sled 0.34 has no key-only iteration: it still loads every
    /// value on the way, blob files included, so this costs about the I/O of a [`Store::scan`]
    /// (O(bytes stored), not O(records)).
    pub fn keys<R: Record>(&self, prefix: &Prefix<R::Key>) -> Keys<R> {
        Keys::new(self.entries(R::TREE, key_text::<R::Key>, prefix.as_bytes()))
    }

    /// Number of records in `tree`: a walk over the whole tree that loads every value (see
    /// [`Store::keys`]), so O(bytes stored); seconds for a database of a few hundred MB.
    ///
    /// # Errors
    /// The first [`Error::Unreadable`] part of the tree; counting the `Ok` items of
    /// [`Store::keys`] counts past damage instead.
    pub fn len(&self, tree: TreeName) -> Result<usize> {
        let mut n = 0;
        for item in self.raw_entries(tree) {
            item?;
            n += 1;
        }
        Ok(n)
    }

    /// Whether every tree is empty.
    pub fn is_empty(&self) -> bool {
        self.trees.iter().all(sled::Tree::is_empty)
    }

    /// Every run that has a record in any run-scoped tree (rollouts, memories, run state,
    /// checkpoints), sorted. Skips from run to run, so it costs O(runs · log records).
    ///
    /// # Errors
    /// [`Error::Sled`] where sled cannot read (the first such place), or [`Error::CorruptKey`].
    pub fn runs(&self) -> Result<Vec<RunId>> {
        let mut runs = BTreeSet::new();
        for tree in TreeName::RUN_SCOPED {
            let mut from = Vec::new();
            while let Some(item) = self.tree(tree).range(from.as_slice()..).next() {
                let (key, _) = item.map_err(|cause| Error::Sled { tree, cause })?;
                let (run, next) = leading_run(&key).map_err(|reason| Error::CorruptKey {
                    tree,
                    hex: hex(&key),
                    reason,
                })?;
                runs.insert(run);
                from = next;
            }
        }
        Ok(runs.into_iter().collect())
    }

    /// Makes every write so far durable: fsyncs the journal, sled's log, then the blob files
    /// sled wrote since the last flush and the `blobs/` folder (see [`FlushPolicy`]); returns
    /// the bytes sled flushed.
    ///
    /// # Errors
    /// [`Error::Journal`], [`Error::Flush`] or [`Error::Sync`].
    pub fn flush(&self) -> Result<usize> {
        if let Some(j) = &self.journal {
            j.sync().map_err(|cause| Error::Journal {
                path: j.path().to_path_buf(),
                cause,
            })?;
        }
        let flushed = self.db.flush().map_err(|cause| Error::Flush {
            path: self.path.clone(),
            cause,
        })?;
        self.blobs.sync().map_err(sync_error)?;
        Ok(flushed)
    }

    /// The database's size on disk, bytes (sled's own account: log and snapshot files).
    ///
    /// # Errors
    /// [`Error::Database`].
    pub fn size_on_disk(&self) -> Result<u64> {
        self.db.size_on_disk().map_err(|cause| Error::Database {
            path: self.path.clone(),
            cause,
        })
    }

    /// Every `(key, value)` of `tree` as bytes, going past unreadable parts
    /// ([`Error::Unreadable`] items).
    pub(crate) fn raw_entries(&self, tree: TreeName) -> Entries {
        self.entries(tree, key_text_of(tree), &[])
    }

    fn tree(&self, tree: TreeName) -> &sled::Tree {
        &self.trees[tree.index()]
    }

    fn entries(&self, tree: TreeName, key_text: fn(&[u8]) -> String, prefix: &[u8]) -> Entries {
        Entries::prefix(self.tree(tree), tree, key_text, prefix)
    }
}

/// Writes collected for one atomic [`Store::commit`], possibly spanning trees.
#[derive(Debug, Default)]
pub struct WriteSet {
    batches: BTreeMap<TreeName, sled::Batch>,
    /// The same writes in order, for the journal.
    ops: Vec<Op>,
    len: usize,
}

impl WriteSet {
    /// An empty set.
    pub fn new() -> Self {
        WriteSet::default()
    }

    /// Adds `record` under its key; returns the key.
    ///
    /// # Errors
    /// [`Error::Encode`] if the record cannot be encoded.
    pub fn put<R: Record>(&mut self, record: &R) -> Result<R::Key> {
        let key = record.key();
        let value = codec::encode(record).map_err(|cause| Error::Encode {
            tree: R::TREE,
            key: key.to_string(),
            cause,
        })?;
        self.put_bytes(R::TREE, key.to_bytes(), value);
        Ok(key)
    }

    /// Adds encoded `value` under encoded `key` (repair copies records as bytes).
    pub(crate) fn put_bytes(&mut self, tree: TreeName, key: Vec<u8>, value: Vec<u8>) {
        self.batches
            .entry(tree)
            .or_default()
            .insert(key.clone(), value.clone());
        self.ops.push(Op::Put { tree, key, value });
        self.len += 1;
    }

    /// Adds the removal of the record under `key` (a no-op if there is none).
    pub fn remove<R: Record>(&mut self, key: &R::Key) {
        let key = key.to_bytes();
        self.batches.entry(R::TREE).or_default().remove(key.clone());
        self.ops.push(Op::Remove { tree: R::TREE, key });
        self.len += 1;
    }

    /// Number of puts and removes collected.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing was collected.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

pub(crate) fn decode_key<R: Record>(bytes: &[u8]) -> Result<R::Key> {
    R::Key::from_bytes(bytes).map_err(|reason| Error::CorruptKey {
        tree: R::TREE,
        hex: hex(bytes),
        reason,
    })
}

pub(crate) fn decode_value<R: Record>(key: &R::Key, bytes: &[u8]) -> Result<R> {
    codec::decode(bytes).map_err(|failure| match failure {
        Failure::Damage(damage) => Error::Corrupt {
            tree: R::TREE,
            key: key.to_string(),
            damage,
        },
        Failure::Version(found) if found > SCHEMA_VERSION => Error::NewerSchema {
            tree: R::TREE,
            key: key.to_string(),
            found,
            supported: SCHEMA_VERSION,
        },
        Failure::Version(found) => Error::OlderSchema {
            tree: R::TREE,
            key: key.to_string(),
            found,
            supported: SCHEMA_VERSION,
        },
    })
}

/// A private copy of a database directory under the system temp dir, which read-only opens
/// work on so that sled's recovery never writes the user's files; removed on drop.
#[derive(Debug)]
struct Snapshot {
    dir: PathBuf,
}

impl Snapshot {
    /// Copies sled's files under `source` (`conf`, `db`, `blobs/`, `snap.*`; not the journal,
    /// which a read-only view does not use), reading only.
    fn copy_of(source: &Path) -> std::io::Result<Snapshot> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("envace-snapshot-{}-{n}", std::process::id()));
        // A leftover of a killed process with the same id; and on error, Drop removes a
        // partial copy.
        let _ = std::fs::remove_dir_all(&dir);
        let snapshot = Snapshot { dir };
        copy_tree(source, &snapshot.dir, true)?;
        Ok(snapshot)
    }
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn copy_tree(from: &Path, to: &Path, top: bool) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        if top && entry.file_name() == JOURNAL_FILE {
            continue;
        }
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target, false)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// The bytes that held data in `original` and are zero in `recovered` (sled zeroes what its
/// recovery drops of a log segment), or `None`.
fn zeroed(original: &Path, recovered: &Path) -> std::io::Result<Option<Discarded>> {
    let (a, b) = (std::fs::read(original)?, std::fs::read(recovered)?);
    let mut found: Option<Discarded> = None;
    for (i, (&x, &y)) in a.iter().zip(&b).enumerate() {
        if x != 0 && y == 0 {
            found
                .get_or_insert(Discarded {
                    first_offset: i as u64,
                    bytes: 0,
                })
                .bytes += 1;
        }
    }
    // A log that recovery cut shorter lost its tail too.
    let cut = a.get(b.len()..).unwrap_or_default();
    let lost = cut.iter().filter(|&&x| x != 0).count() as u64;
    if lost > 0 {
        found
            .get_or_insert(Discarded {
                first_offset: b.len() as u64,
                bytes: 0,
            })
            .bytes += lost;
    }
    Ok(found)
}

/// Text form of a stored key of `tree` (its hex if it does not parse).
pub(crate) fn key_text_of(tree: TreeName) -> fn(&[u8]) -> String {
    match tree {
        TreeName::Tasks => key_text::<TaskId>,
        TreeName::Seeds => key_text::<SeedKey>,
        TreeName::Rollouts | TreeName::Memories => key_text::<SampleKey>,
        TreeName::Runs => key_text::<RunId>,
        TreeName::Checkpoints => key_text::<CheckpointKey>,
    }
}

/// [`Error::Invalid`] when a directory without a sled log holds a journal with writes: the log
/// was lost, and a new database there would hide the journal's records.
fn refuse_lost_log(path: &Path) -> Result<()> {
    let journal = path.join(JOURNAL_FILE);
    match std::fs::metadata(&journal) {
        Ok(meta) if meta.len() > crate::journal::FILE_HEADER_LEN => Err(Error::Invalid {
            path: path.to_path_buf(),
            reason: format!(
                "sled's log (`db`) is missing or empty, but the journal holds {} bytes of \
                 committed writes: `envace repair --db {}` rebuilds the database from it",
                meta.len(),
                path.display()
            ),
        }),
        _ => Ok(()),
    }
}

/// [`Error::Locked`] if another process holds the database; a failed probe is left to sled.
/// A handle dropped a moment ago may still hold the lock while sled's background threads let go
/// of the file, so a held lock is probed again for up to 100 ms.
pub(crate) fn refuse_if_locked(path: &Path) -> Result<()> {
    for attempt in 0..10 {
        match disk::locked(path) {
            Ok(true) if attempt < 9 => std::thread::sleep(std::time::Duration::from_millis(10)),
            Ok(true) => {
                return Err(Error::Locked {
                    path: path.to_path_buf(),
                })
            }
            Ok(false) | Err(_) => return Ok(()),
        }
    }
    Ok(())
}

fn sync_error((path, cause): (PathBuf, std::io::Error)) -> Error {
    Error::Sync { path, cause }
}

fn open_error(path: &Path, cause: sled::Error) -> Error {
    // sled 0.34 reports a held lock only as an `Other` io error with this text
    // (config.rs: "could not acquire lock on {path}: {fs2 error}").
    if let sled::Error::Io(io) = &cause {
        if io.to_string().contains("could not acquire lock") {
            return Error::Locked {
                path: path.to_path_buf(),
            };
        }
    }
    Error::Open {
        path: path.to_path_buf(),
        cause,
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
