//! [`Store`]: the sled database, its trees, and the write and scan paths.
use std::collections::{BTreeMap, BTreeSet};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use sled::transaction::{TransactionError, Transactional};
use sled::IVec;

use crate::codec::{self, Failure, SCHEMA_VERSION};
use crate::error::{Error, Result};
use crate::keys::{leading_run, Prefix, RecordKey};
use crate::records::RunId;
use crate::schema::{Record, TreeName};

/// When acknowledged writes reach the disk.
///
/// The default is [`FlushPolicy::EveryWrite`]: a training daemon writes a few batches per
/// optimizer step (a step of 16 tasks × 4 samples takes minutes on the model side), so one fsync
/// per batch costs nothing measurable there, and it makes `Ok` mean "on disk": a crash, power
/// loss or `SIGKILL` after `Ok` loses nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlushPolicy {
    /// Every write call ([`Store::put`], [`Store::put_many`], [`Store::commit`]) fsyncs before it
    /// returns `Ok`.
    #[default]
    EveryWrite,
    /// A background thread fsyncs every N milliseconds (N ≥ 1). `Ok` then means "applied and
    /// visible to readers"; a crash loses at most the last N ms of acknowledged writes. For bulk
    /// imports and benchmarks; call [`Store::flush`] to make everything so far durable.
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
}

impl Store {
    /// Opens the database in directory `path`, creating it if needed.
    ///
    /// # Errors
    /// [`Error::Locked`] if another process holds it; [`Error::Open`] if sled cannot open or
    /// recover it.
    pub fn open(path: impl AsRef<Path>, options: StoreOptions) -> Result<Store> {
        let path = path.as_ref().to_path_buf();
        let flush_every_ms = match options.flush {
            FlushPolicy::EveryWrite => None,
            FlushPolicy::IntervalMs(ms) => Some(ms.max(1)),
        };
        let db = sled::Config::new()
            .path(&path)
            .cache_capacity(options.cache_capacity_bytes)
            .flush_every_ms(flush_every_ms)
            .open()
            .map_err(|cause| open_error(&path, cause))?;
        let trees = TreeName::ALL
            .iter()
            .map(|&tree| {
                db.open_tree(tree.as_str())
                    .map_err(|cause| Error::Sled { tree, cause })
            })
            .collect::<Result<Vec<_>>>()?;
        tracing::debug!(path = %path.display(), ?options, "opened store");
        Ok(Store {
            db,
            trees,
            path,
            options,
        })
    }

    /// Opens an existing database; never creates one (for read-only commands).
    ///
    /// # Errors
    /// [`Error::Missing`] if `path` is not a directory holding a sled database; otherwise as
    /// [`Store::open`].
    pub fn open_existing(path: impl AsRef<Path>, options: StoreOptions) -> Result<Store> {
        let path = path.as_ref();
        let missing = |reason: &str| Error::Missing {
            path: path.to_path_buf(),
            reason: reason.to_owned(),
        };
        if !path.is_dir() {
            return Err(missing("no such directory"));
        }
        // sled keeps its data in `DIR/db` (and its settings in `DIR/conf`).
        if !path.join("db").is_file() {
            return Err(missing(
                "the directory holds no sled database (no `db` file)",
            ));
        }
        Store::open(path, options)
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
    /// [`Error::Encode`], [`Error::Sled`], or [`Error::Flush`] (under
    /// [`FlushPolicy::EveryWrite`]; the write may then not be durable).
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
    ///
    /// # Errors
    /// [`Error::Sled`] / [`Error::Commit`] if sled fails (nothing is applied);
    /// [`Error::Flush`] if the flush fails.
    pub fn commit(&self, writes: WriteSet) -> Result<()> {
        let mut batches: Vec<(TreeName, sled::Batch)> = writes.batches.into_iter().collect();
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
        if self.options.flush == FlushPolicy::EveryWrite {
            self.flush()?;
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
    /// and key, and the scan goes on to the next one. Reversible (`.rev()`, `.next_back()`).
    pub fn scan<R: Record>(&self, prefix: &Prefix<R::Key>) -> Scan<R> {
        Scan {
            inner: self.tree(R::TREE).scan_prefix(prefix.as_bytes()),
            _record: PhantomData,
        }
    }

    /// Keys under `prefix` in order, without decoding values (for counts and listings).
    pub fn keys<R: Record>(&self, prefix: &Prefix<R::Key>) -> Keys<R> {
        Keys {
            inner: self.tree(R::TREE).scan_prefix(prefix.as_bytes()),
            _record: PhantomData,
        }
    }

    /// Number of records in `tree` (walks the tree: O(records)).
    pub fn len(&self, tree: TreeName) -> usize {
        self.tree(tree).len()
    }

    /// Whether every tree is empty.
    pub fn is_empty(&self) -> bool {
        self.trees.iter().all(sled::Tree::is_empty)
    }

    /// Every run that has a record in any run-scoped tree (rollouts, memories, run state,
    /// checkpoints), sorted. Skips from run to run, so it costs O(runs · log records).
    ///
    /// # Errors
    /// [`Error::Sled`] or [`Error::CorruptKey`].
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

    /// Makes every write so far durable; returns the bytes flushed.
    ///
    /// # Errors
    /// [`Error::Flush`].
    pub fn flush(&self) -> Result<usize> {
        self.db.flush().map_err(|cause| Error::Flush {
            path: self.path.clone(),
            cause,
        })
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

    fn tree(&self, tree: TreeName) -> &sled::Tree {
        &self.trees[tree.index()]
    }
}

/// Writes collected for one atomic [`Store::commit`], possibly spanning trees.
#[derive(Debug, Default)]
pub struct WriteSet {
    batches: BTreeMap<TreeName, sled::Batch>,
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
        self.batches
            .entry(R::TREE)
            .or_default()
            .insert(key.to_bytes(), value);
        self.len += 1;
        Ok(key)
    }

    /// Adds the removal of the record under `key` (a no-op if there is none).
    pub fn remove<R: Record>(&mut self, key: &R::Key) {
        self.batches
            .entry(R::TREE)
            .or_default()
            .remove(key.to_bytes());
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

/// Iterator over `(key, record)` of one tree; see [`Store::scan`].
pub struct Scan<R: Record> {
    inner: sled::Iter,
    _record: PhantomData<fn() -> R>,
}

impl<R: Record> Iterator for Scan<R> {
    type Item = Result<(R::Key, R)>;

    fn next(&mut self) -> Option<Self::Item> {
        self.inner.next().map(decode_entry::<R>)
    }
}

impl<R: Record> DoubleEndedIterator for Scan<R> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.inner.next_back().map(decode_entry::<R>)
    }
}

/// Iterator over the keys of one tree; see [`Store::keys`].
pub struct Keys<R: Record> {
    inner: sled::Iter,
    _record: PhantomData<fn() -> R>,
}

impl<R: Record> Iterator for Keys<R> {
    type Item = Result<R::Key>;

    fn next(&mut self) -> Option<Self::Item> {
        self.inner
            .next()
            .map(|item| decode_key::<R>(&entry::<R>(item)?.0))
    }
}

impl<R: Record> DoubleEndedIterator for Keys<R> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.inner
            .next_back()
            .map(|item| decode_key::<R>(&entry::<R>(item)?.0))
    }
}

fn entry<R: Record>(item: sled::Result<(IVec, IVec)>) -> Result<(IVec, IVec)> {
    item.map_err(|cause| Error::Sled {
        tree: R::TREE,
        cause,
    })
}

fn decode_entry<R: Record>(item: sled::Result<(IVec, IVec)>) -> Result<(R::Key, R)> {
    let (k, v) = entry::<R>(item)?;
    let key = decode_key::<R>(&k)?;
    let record = decode_value::<R>(&key, &v)?;
    Ok((key, record))
}

fn decode_key<R: Record>(bytes: &[u8]) -> Result<R::Key> {
    R::Key::from_bytes(bytes).map_err(|reason| Error::CorruptKey {
        tree: R::TREE,
        hex: hex(bytes),
        reason,
    })
}

fn decode_value<R: Record>(key: &R::Key, bytes: &[u8]) -> Result<R> {
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

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
