//! sled 0.34's files, seen from outside sled: the segment size of new databases, the checks that
//! keep [`Store::open_existing`](crate::Store::open_existing) from letting sled re-create or
//! truncate a directory, and the fsyncs sled leaves out.
//!
//! A sled 0.34 database directory holds (as sled 0.34.7 writes it: `config.rs`,
//! `pagecache/logger.rs`, `pagecache/blob_io.rs`, `pagecache/snapshot.rs`):
//!
//! * `conf`: text lines `segment_size: N`, `use_compression: B`, `version: A.B`, then the CRC-32
//!   of that text, 4 bytes little-endian. sled refuses to open with a segment size other than
//!   the recorded one, and takes a `conf` of 8 bytes or less for absent (it writes a new one).
//! * `db`: the log, in segments of `segment_size` bytes, each starting with a 20-byte header: the
//!   CRC-32 (little-endian, XOR `0xFFFF_FFFF`) of the 16 bytes after it, then two log sequence
//!   numbers. sled recovers a `db` without one valid header as an empty database and writes
//!   over it.
//! * `blobs/LSN`: one file per log message longer than a quarter of a segment (one big value, or
//!   a whole leaf node of up to ~17 records when sled rewrites it), named by the message's log
//!   sequence number in decimal: the CRC-32 (little-endian) of the rest, a kind byte, the message.
//!   sled writes the file, without fsync, before the log entry that points to it; it never
//!   fsyncs the `blobs/` folder either.
//! * `snap.LSN` (16 hex digits): sled's page table as of log position LSN, rewritten when a
//!   database is opened. Recovery replays the log from the segment holding LSN; a blob file it
//!   meets there that fails its checksum it takes for the torn end of the log: it drops every
//!   later log entry and deletes the later blob files. A damaged blob file older than that only
//!   makes the records of its node unreadable ([`Error::Unreadable`](crate::Error::Unreadable)).
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use fs2::FileExt;

/// sled segment size of databases this build creates, bytes.
///
/// sled 0.34 writes a log message longer than a quarter of a segment to its own blob file. At
/// this size a value, or a leaf node of records, up to 2 MiB stays in the main log (`db`); at
/// sled's default of 512 KiB a leaf of 16 realistic trajectories (8 rows × 512 tokens, 17 KB
/// each) already went to a blob file. Larger values still go to blob files, which
/// [`Store`](crate::Store) fsyncs itself. sled requires a power of two of at most 16 MiB and the
/// same value on every open: an existing database keeps the size its `conf` records. A tool that
/// opens a database of this build with sled directly must pass it
/// (`sled::Config::new().path(dir).segment_size(SEGMENT_SIZE)`).
pub const SEGMENT_SIZE: usize = 8 << 20;

/// sled's segment header length, bytes.
const SEGMENT_HEADER_LEN: usize = 20;

/// What a directory holds, as far as sled is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Survey {
    /// Nothing was ever written: no `db` file (`db_file` false), or an empty one. `segment_size`
    /// is the one a valid `conf` records, if there is one.
    New {
        db_file: bool,
        segment_size: Option<usize>,
    },
    /// A sled log with at least one valid segment header, and its `conf`'s segment size.
    Database { segment_size: usize },
}

/// Reads `dir`'s `conf` and segment headers, never writing. `Err` says what is wrong, naming
/// the file.
pub(crate) fn survey(dir: &Path) -> Result<Survey, String> {
    let db = dir.join("db");
    let db_len = match fs::metadata(&db) {
        Ok(meta) if meta.is_file() => Some(meta.len()),
        Ok(_) => return Err("`db` is not a file".to_owned()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(format!("cannot read `db`: {e}")),
    };
    let conf = read_conf(dir);
    match db_len {
        None | Some(0) => {
            // A snapshot describes a log: without one, the log was lost, not never written.
            if newest_snapshot(dir).is_ok_and(|lsn| lsn.is_some()) {
                return Err(format!(
                    "`db` is {} but sled snapshot files are there: the log was lost",
                    if db_len.is_some() { "empty" } else { "missing" }
                ));
            }
            Ok(Survey::New {
                db_file: db_len.is_some(),
                segment_size: conf.ok().flatten(),
            })
        }
        Some(len) => {
            let segment_size = conf?.ok_or("`db` is there but `conf` is missing")?;
            if !blobs_dir(dir).is_dir() {
                return Err("the `blobs` folder is missing".to_owned());
            }
            if has_valid_segment(&db, len, segment_size)
                .map_err(|e| format!("cannot read `db`: {e}"))?
            {
                Ok(Survey::Database { segment_size })
            } else {
                Err(format!(
                    "`db` ({len} bytes) holds no valid sled log segment header (checked every \
                     {segment_size} bytes)"
                ))
            }
        }
    }
}

/// The segment size `dir/conf` records; `Ok(None)` if there is no `conf`.
fn read_conf(dir: &Path) -> Result<Option<usize>, String> {
    let bytes = match fs::read(dir.join("conf")) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read `conf`: {e}")),
    };
    // sled itself takes 8 bytes or less for "no conf" and writes a new one.
    let Some((text, crc)) = bytes.split_last_chunk::<4>().filter(|_| bytes.len() > 8) else {
        return Err(format!(
            "`conf` is {} bytes: empty or cut short",
            bytes.len()
        ));
    };
    if crc32fast::hash(text) != u32::from_le_bytes(*crc) {
        return Err("`conf` fails its checksum".to_owned());
    }
    std::str::from_utf8(text)
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|line| line.strip_prefix("segment_size: "))
        })
        .and_then(|value| value.trim().parse::<usize>().ok())
        .filter(|&size| size.is_power_of_two() && (256..=1 << 24).contains(&size))
        .map(Some)
        .ok_or_else(|| "`conf` records no valid `segment_size`".to_owned())
}

fn has_valid_segment(db: &Path, len: u64, segment_size: usize) -> io::Result<bool> {
    let mut file = File::open(db)?;
    let mut header = [0u8; SEGMENT_HEADER_LEN];
    let mut at = 0u64;
    while at + SEGMENT_HEADER_LEN as u64 <= len {
        file.seek(SeekFrom::Start(at))?;
        file.read_exact(&mut header)?;
        let (crc, rest) = header.split_at(4);
        let stored = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]) ^ 0xFFFF_FFFF;
        if crc32fast::hash(rest) == stored {
            return Ok(true);
        }
        at += segment_size as u64;
    }
    Ok(false)
}

/// Whether another process (or another handle in this one) holds sled's lock: sled 0.34 takes
/// an exclusive `flock` on `dir/db` (through fs2) for as long as the database is open.
pub(crate) fn locked(dir: &Path) -> io::Result<bool> {
    let file = File::open(dir.join("db"))?;
    // Closing `file` releases the probe's own lock.
    match FileExt::try_lock_exclusive(&file) {
        Ok(()) => Ok(false),
        Err(e) if e.kind() == fs2::lock_contended_error().kind() => Ok(true),
        Err(e) => Err(e),
    }
}

/// Checks the blob files sled's recovery will read on the next open (those from the segment of
/// the newest snapshot on): a damaged one would make sled drop every later write. `Err` names
/// the file.
pub(crate) fn check_replayed_blobs(dir: &Path, segment_size: usize) -> Result<(), String> {
    let snapshot = newest_snapshot(dir)
        .map_err(|e| format!("cannot list {}: {e}", dir.display()))?
        .unwrap_or(0);
    let from = snapshot / segment_size as u64 * segment_size as u64;
    let blobs = blobs_dir(dir);
    let entries = fs::read_dir(&blobs).map_err(|e| format!("cannot list `blobs`: {e}"))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot list `blobs`: {e}"))?;
        let name = entry.file_name();
        let Some(lsn) = name.to_str().and_then(|n| n.parse::<u64>().ok()) else {
            continue;
        };
        if lsn < from {
            continue;
        }
        let shown = format!("`blobs/{lsn}`");
        match blob_intact(&entry.path()) {
            Ok(true) => {}
            Ok(false) => {
                return Err(format!(
                    "blob file {shown} fails its checksum, and sled's recovery reads it: sled \
                     would refuse the database, or take the file for the torn end of the log and \
                     drop every write logged after it (after a power loss during a write, it is \
                     that unacknowledged write, and opening the database for writing, as the \
                     trainer does, drops it; otherwise the disk damaged it: copy the directory \
                     away before anything opens it)"
                ))
            }
            Err(e) => return Err(format!("cannot read blob file {shown}: {e}")),
        }
    }
    Ok(())
}

/// Log position of the newest `snap.LSN` file; `None` if there is none (or no directory).
fn newest_snapshot(dir: &Path) -> io::Result<Option<u64>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut newest = None;
    for entry in entries {
        let name = entry?.file_name();
        let lsn = name
            .to_str()
            .and_then(|n| n.strip_prefix("snap."))
            .filter(|hex| hex.len() == 16)
            .and_then(|hex| u64::from_str_radix(hex, 16).ok());
        newest = newest.max(lsn);
    }
    Ok(newest)
}

/// Whether a blob file's CRC-32 (its first 4 bytes) matches the rest.
fn blob_intact(path: &Path) -> io::Result<bool> {
    let mut file = File::open(path)?;
    let mut crc = [0u8; 4];
    if file.read_exact(&mut crc).is_err() {
        return Ok(false);
    }
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match file.read(&mut buf)? {
            0 => break,
            n => hasher.update(&buf[..n]),
        }
    }
    Ok(hasher.finalize() == u32::from_le_bytes(crc))
}

fn blobs_dir(dir: &Path) -> PathBuf {
    dir.join("blobs")
}

/// fsyncs `path`, a file or a directory (a directory's fsync makes its entries durable).
pub(crate) fn sync_path(path: &Path) -> Result<(), (PathBuf, io::Error)> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| (path.to_path_buf(), e))
}

/// Makes a database's own files durable once, at open: `conf`, the directory's entries and,
/// when the directory was just created, its entry in the parent.
pub(crate) fn sync_layout(dir: &Path, created: bool) -> Result<(), (PathBuf, io::Error)> {
    sync_path(&dir.join("conf"))?;
    sync_path(dir)?;
    sync_path(&blobs_dir(dir))?;
    if created {
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_path(parent)?;
        }
    }
    Ok(())
}

/// fsyncs the blob files sled wrote since the last call, and then the `blobs/` folder if a new
/// file appeared. Shared by all handles of one open database.
#[derive(Debug)]
pub(crate) struct BlobSync {
    dir: PathBuf,
    /// Blob files fsynced so far, with their length then: sled writes each file once, so a
    /// length that differs now means the earlier fsync caught it mid-write.
    synced: Mutex<BTreeMap<OsString, u64>>,
}

impl BlobSync {
    pub(crate) fn new(db_dir: &Path) -> BlobSync {
        BlobSync {
            dir: blobs_dir(db_dir),
            synced: Mutex::new(BTreeMap::new()),
        }
    }

    /// Call after sled's own flush: every blob file a flushed log entry points to was complete
    /// before that entry was written, so it is in the listing and gets fsynced here.
    pub(crate) fn sync(&self) -> Result<(), (PathBuf, io::Error)> {
        let mut synced = self.synced.lock().unwrap_or_else(PoisonError::into_inner);
        let listing_error = |e| (self.dir.clone(), e);
        let mut now = BTreeMap::new();
        let mut new_entry = false;
        for entry in fs::read_dir(&self.dir).map_err(listing_error)? {
            let entry = entry.map_err(listing_error)?;
            let path = entry.path();
            let len = match entry.metadata() {
                Ok(meta) => meta.len(),
                // sled removes blob files it no longer needs; that one is gone.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err((path, e)),
            };
            let name = entry.file_name();
            if synced.get(&name) != Some(&len) {
                match File::open(&path).and_then(|f| f.sync_all()) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err((path, e)),
                }
                new_entry |= !synced.contains_key(&name);
            }
            now.insert(name, len);
        }
        if new_entry {
            sync_path(&self.dir)?;
        }
        *synced = now;
        Ok(())
    }
}
