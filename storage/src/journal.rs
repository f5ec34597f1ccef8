//! The journal: an append-only, checksummed copy of every committed
//! [`WriteSet`](crate::WriteSet), written (and, under [`FlushPolicy::EveryWrite`](crate::FlushPolicy),
//! fsynced) **before** sled applies it, so that a damaged sled file costs no record:
//! [`crate::repair`] rebuilds the database from the journal and what sled can still read.
//!
//! File `DIR/journal`, beside sled's files:
//!
//! ```text
//! file header, 16 bytes:  b"envace-journal"  version u8 (1)  flags u8 (bit 0: begun on an
//!                         empty database, so the journal alone holds every record)
//! entry:   offset 0   8 bytes  ENTRY_MAGIC
//!          offset 8   8 bytes  sequence number, u64 LE (0, 1, 2, … in file order)
//!          offset 16  4 bytes  payload length, u32 LE
//!          offset 20  4 bytes  CRC-32 (IEEE) of bytes 8..20 and the payload, u32 LE
//!          offset 24  …        payload
//! payload: kind u8 — 0 commit: op count u32 LE, then per op: 0 put | 1 remove (u8), tree name
//!                    (u8 length + bytes), key (u32 LE length + bytes), for a put the value
//!                    (u32 LE length + bytes, the codec's checksummed value);
//!                    1 abort: the sequence number (u64 LE) of a commit sled then refused
//! ```
//!
//! A damaged entry fails its checksum and costs that entry alone: a reader looks for the next
//! `ENTRY_MAGIC` whose entry checks. An entry cut short at the end of the file is the torn end
//! of a write that was never acknowledged; a read-write open truncates it before appending.
//! The journal repeats every byte written to sled (bounded by what the run writes: the
//! trajectories and records, never weights), so it is about the size of the database.
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::schema::TreeName;

/// The journal's file name inside a database directory.
pub const JOURNAL_FILE: &str = "journal";
const FILE_MAGIC: &[u8; 14] = b"envace-journal";
const FILE_VERSION: u8 = 1;
/// File header length, bytes.
pub(crate) const FILE_HEADER_LEN: u64 = 16;
const ENTRY_MAGIC: [u8; 8] = *b"\xE5EnvJrn\x01";
const ENTRY_HEADER_LEN: usize = 24;
/// Largest payload a reader accepts, bytes (a damaged length must not allocate gigabytes).
const MAX_PAYLOAD: usize = 1 << 31;

/// One write of a committed set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `value` (codec bytes) under `key` in `tree`.
    Put {
        tree: TreeName,
        key: Vec<u8>,
        value: Vec<u8>,
    },
    /// Removal of `key` from `tree`.
    Remove { tree: TreeName, key: Vec<u8> },
}

/// A valid entry read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// The writes of one commit, in order.
    Commit { seq: u64, ops: Vec<Op> },
    /// Commit `aborted` was not applied by sled.
    Abort { seq: u64, aborted: u64 },
}

impl Entry {
    fn seq(&self) -> u64 {
        match self {
            Entry::Commit { seq, .. } | Entry::Abort { seq, .. } => *seq,
        }
    }
}

/// What [`scan`] found in a journal file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanSummary {
    /// The header says the journal began on an empty database (`false` when the header is
    /// damaged).
    pub started_empty: bool,
    /// The header failed its check.
    pub header_damaged: bool,
    /// Valid entries.
    pub entries: u64,
    /// Byte ranges `[start, end)` that held no valid entry, in file order.
    pub damaged: Vec<(u64, u64)>,
    /// Sequence numbers missing between valid entries (entries lost to damage).
    pub missing_seqs: Vec<u64>,
    /// End of the last valid entry, bytes (the file header's end when there is none).
    pub valid_end: u64,
    /// File length, bytes.
    pub len: u64,
    /// The next sequence number to write.
    pub next_seq: u64,
}

impl ScanSummary {
    /// Damage after the last valid entry only: the torn end of an unacknowledged append (or a
    /// damaged last entry, which sled then holds).
    pub fn torn_tail(&self) -> bool {
        self.valid_end < self.len
            && self
                .damaged
                .iter()
                .all(|&(start, _)| start >= self.valid_end)
    }
}

/// Reads the journal at `path`, calling `visit` for every valid entry in file order.
///
/// # Errors
/// I/O errors reading the file (damage is reported in the summary, not as an error).
pub fn scan(path: &Path, mut visit: impl FnMut(Entry)) -> io::Result<ScanSummary> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    let mut header = [0u8; FILE_HEADER_LEN as usize];
    let mut summary = ScanSummary {
        len,
        valid_end: FILE_HEADER_LEN.min(len),
        ..ScanSummary::default()
    };
    let read = read_up_to(&mut file, &mut header)?;
    if read == header.len() && &header[..14] == FILE_MAGIC && header[14] == FILE_VERSION {
        summary.started_empty = header[15] & 1 == 1;
    } else {
        summary.header_damaged = true;
    }
    let mut pos = FILE_HEADER_LEN.min(len);
    let mut expected_seq: Option<u64> = None;
    let mut damage_start: Option<u64> = None;
    while pos < len {
        match read_entry(&mut file, pos, len)? {
            Some((entry, end)) => {
                if let Some(start) = damage_start.take() {
                    summary.damaged.push((start, pos));
                }
                let seq = entry.seq();
                if let Some(want) = expected_seq {
                    summary.missing_seqs.extend(want..seq);
                }
                expected_seq = Some(seq + 1);
                summary.entries += 1;
                summary.valid_end = end;
                summary.next_seq = seq + 1;
                visit(entry);
                pos = end;
            }
            None => {
                damage_start.get_or_insert(pos);
                pos = next_magic(&mut file, pos + 1, len)?.unwrap_or(len);
            }
        }
    }
    if let Some(start) = damage_start {
        summary.damaged.push((start, len));
    }
    Ok(summary)
}

/// The entry at `pos` and its end offset, or `None` if no valid entry starts there.
fn read_entry(file: &mut File, pos: u64, len: u64) -> io::Result<Option<(Entry, u64)>> {
    if len - pos < ENTRY_HEADER_LEN as u64 {
        return Ok(None);
    }
    file.seek(SeekFrom::Start(pos))?;
    let mut header = [0u8; ENTRY_HEADER_LEN];
    file.read_exact(&mut header)?;
    if header[..8] != ENTRY_MAGIC {
        return Ok(None);
    }
    let size = u32::from_le_bytes(header[16..20].try_into().expect("4 bytes")) as usize;
    let end = pos + (ENTRY_HEADER_LEN + size) as u64;
    if size > MAX_PAYLOAD || end > len {
        return Ok(None);
    }
    let mut payload = vec![0u8; size];
    file.read_exact(&mut payload)?;
    let mut crc = crc32fast::Hasher::new();
    crc.update(&header[8..20]);
    crc.update(&payload);
    if crc.finalize() != u32::from_le_bytes(header[20..24].try_into().expect("4 bytes")) {
        return Ok(None);
    }
    let seq = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
    Ok(decode_payload(seq, &payload).map(|entry| (entry, end)))
}

/// The first offset `>= from` where `ENTRY_MAGIC` starts.
fn next_magic(file: &mut File, from: u64, len: u64) -> io::Result<Option<u64>> {
    const CHUNK: usize = 1 << 20;
    let mut at = from;
    let mut buf = vec![0u8; CHUNK + ENTRY_MAGIC.len()];
    while at < len {
        file.seek(SeekFrom::Start(at))?;
        let n = read_up_to(file, &mut buf)?;
        if let Some(i) = buf[..n]
            .windows(ENTRY_MAGIC.len())
            .position(|w| w == ENTRY_MAGIC)
        {
            return Ok(Some(at + i as u64));
        }
        if n < buf.len() {
            return Ok(None);
        }
        at += CHUNK as u64;
    }
    Ok(None)
}

fn read_up_to(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

fn encode_commit(ops: &[Op]) -> Vec<u8> {
    let mut out = vec![0u8];
    out.extend_from_slice(&(ops.len() as u32).to_le_bytes());
    for op in ops {
        let (kind, tree, key, value) = match op {
            Op::Put { tree, key, value } => (0u8, tree, key, Some(value)),
            Op::Remove { tree, key } => (1u8, tree, key, None),
        };
        out.push(kind);
        let name = tree.as_str().as_bytes();
        out.push(name.len() as u8);
        out.extend_from_slice(name);
        for bytes in std::iter::once(key).chain(value) {
            out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            out.extend_from_slice(bytes);
        }
    }
    out
}

fn decode_payload(seq: u64, payload: &[u8]) -> Option<Entry> {
    let mut r = Cursor(payload);
    let entry = match r.u8()? {
        0 => {
            let n = r.u32()? as usize;
            let mut ops = Vec::with_capacity(n.min(1 << 16));
            for _ in 0..n {
                let kind = r.u8()?;
                let name_len = r.u8()? as usize;
                let name = r.take(name_len)?;
                let tree = *TreeName::ALL
                    .iter()
                    .find(|t| t.as_str().as_bytes() == name)?;
                let key_len = r.u32()? as usize;
                let key = r.take(key_len)?.to_vec();
                ops.push(match kind {
                    0 => {
                        let value_len = r.u32()? as usize;
                        let value = r.take(value_len)?.to_vec();
                        Op::Put { tree, key, value }
                    }
                    1 => Op::Remove { tree, key },
                    _ => return None,
                });
            }
            Entry::Commit { seq, ops }
        }
        1 => Entry::Abort {
            seq,
            aborted: u64::from_le_bytes(r.take(8)?.try_into().ok()?),
        },
        _ => return None,
    };
    r.0.is_empty().then_some(entry)
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }
}

/// The open journal of a read-write [`Store`](crate::Store).
#[derive(Debug)]
pub(crate) struct Journal {
    path: PathBuf,
    state: Mutex<Tail>,
}

#[derive(Debug)]
struct Tail {
    file: File,
    end: u64,
    next_seq: u64,
}

impl Journal {
    /// Opens `dir/journal` for appending, creating it (with `started_empty`, and the directory
    /// fsynced) if absent. A torn tail is truncated; damage before the last valid entry is
    /// logged (the live database is sled's; [`crate::repair`] reads around it).
    pub(crate) fn open(dir: &Path, started_empty: bool) -> io::Result<Journal> {
        let path = dir.join(JOURNAL_FILE);
        let (file, end, next_seq) = if path.exists() {
            let summary = scan(&path, |_| {})?;
            let file = OpenOptions::new().read(true).write(true).open(&path)?;
            if summary.torn_tail() {
                tracing::warn!(
                    path = %path.display(),
                    offset = summary.valid_end,
                    bytes = summary.len - summary.valid_end,
                    "the journal ends in a torn or damaged entry (an append that was never \
                     acknowledged); truncated"
                );
                file.set_len(summary.valid_end)?;
                file.sync_all()?;
            } else if !summary.damaged.is_empty() || summary.header_damaged {
                tracing::warn!(
                    path = %path.display(),
                    damaged = ?summary.damaged,
                    header_damaged = summary.header_damaged,
                    "the journal is damaged; the database is intact as far as sled can tell, \
                     and `envace repair` rebuilds from both"
                );
            }
            let end = if summary.torn_tail() {
                summary.valid_end
            } else {
                summary.len
            };
            (file, end, summary.next_seq)
        } else {
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)?;
            let mut header = [0u8; FILE_HEADER_LEN as usize];
            header[..14].copy_from_slice(FILE_MAGIC);
            header[14] = FILE_VERSION;
            header[15] = u8::from(started_empty);
            file.write_all(&header)?;
            file.sync_all()?;
            File::open(dir)?.sync_all()?;
            (file, FILE_HEADER_LEN, 0)
        };
        Ok(Journal {
            path,
            state: Mutex::new(Tail {
                file,
                end,
                next_seq,
            }),
        })
    }

    /// The journal file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Appends a commit of `ops`; fsyncs it when `sync`. Returns its sequence number. On error
    /// the file is cut back to where it was, so a failed append leaves no partial entry.
    pub(crate) fn append_commit(&self, ops: &[Op], sync: bool) -> io::Result<u64> {
        self.append(|seq| (seq, encode_commit(ops)), sync)
    }

    /// Records that commit `aborted` was not applied.
    pub(crate) fn append_abort(&self, aborted: u64, sync: bool) -> io::Result<u64> {
        self.append(
            |seq| {
                let mut payload = vec![1u8];
                payload.extend_from_slice(&aborted.to_le_bytes());
                (seq, payload)
            },
            sync,
        )
    }

    fn append(&self, payload: impl FnOnce(u64) -> (u64, Vec<u8>), sync: bool) -> io::Result<u64> {
        let mut tail = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (seq, payload) = payload(tail.next_seq);
        let size = u32::try_from(payload.len())
            .ok()
            .filter(|&n| n as usize <= MAX_PAYLOAD)
            .ok_or_else(|| io::Error::other("a commit over 2 GiB cannot be journaled"))?;
        let mut entry = Vec::with_capacity(ENTRY_HEADER_LEN + payload.len());
        entry.extend_from_slice(&ENTRY_MAGIC);
        entry.extend_from_slice(&seq.to_le_bytes());
        entry.extend_from_slice(&size.to_le_bytes());
        let mut crc = crc32fast::Hasher::new();
        crc.update(&entry[8..20]);
        crc.update(&payload);
        entry.extend_from_slice(&crc.finalize().to_le_bytes());
        entry.extend_from_slice(&payload);
        let start = tail.end;
        let written = (|| {
            tail.file.seek(SeekFrom::Start(start))?;
            tail.file.write_all(&entry)?;
            if sync {
                tail.file.sync_data()?;
            }
            Ok(())
        })();
        if let Err(e) = written {
            let _ = tail.file.set_len(start);
            return Err(e);
        }
        tail.end = start + entry.len() as u64;
        tail.next_seq = seq + 1;
        Ok(seq)
    }

    /// fsyncs what was appended.
    pub(crate) fn sync(&self) -> io::Result<()> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .file
            .sync_data()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("envace-journal-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn put(i: u8) -> Op {
        Op::Put {
            tree: TreeName::Rollouts,
            key: vec![b'k', i],
            value: vec![i; 40 + i as usize],
        }
    }

    fn entries(path: &Path) -> (Vec<Entry>, ScanSummary) {
        let mut out = Vec::new();
        let summary = scan(path, |e| out.push(e)).unwrap();
        (out, summary)
    }

    #[test]
    fn entries_round_trip_and_a_damaged_one_costs_itself_alone() {
        let d = dir("round-trip");
        let j = Journal::open(&d, true).unwrap();
        for i in 0..5u8 {
            let ops = vec![
                put(i),
                Op::Remove {
                    tree: TreeName::Checkpoints,
                    key: vec![i],
                },
            ];
            assert_eq!(j.append_commit(&ops, true).unwrap(), u64::from(i));
        }
        assert_eq!(j.append_abort(4, true).unwrap(), 5);
        drop(j);
        let path = d.join(JOURNAL_FILE);
        let (all, summary) = entries(&path);
        assert!(summary.started_empty && !summary.header_damaged);
        assert_eq!(summary.entries, 6);
        assert!(summary.damaged.is_empty() && summary.missing_seqs.is_empty());
        assert_eq!(all[5], Entry::Abort { seq: 5, aborted: 4 });
        assert_eq!(
            all[2],
            Entry::Commit {
                seq: 2,
                ops: vec![
                    put(2),
                    Op::Remove {
                        tree: TreeName::Checkpoints,
                        key: vec![2]
                    }
                ]
            }
        );

        // Flip a byte inside entry 2's value: only entry 2 is lost, and the scan says where.
        let mut bytes = std::fs::read(&path).unwrap();
        let clean = bytes.clone();
        let at = bytes.windows(42).position(|w| w == [2u8; 42]).unwrap();
        bytes[at + 3] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        let (left, summary) = entries(&path);
        assert_eq!(summary.entries, 5);
        assert_eq!(summary.missing_seqs, vec![2]);
        assert_eq!(summary.damaged.len(), 1);
        let (start, end) = summary.damaged[0];
        assert!(start < at as u64 && (at as u64) < end);
        assert!(!summary.torn_tail());
        assert_eq!(
            left.iter().map(Entry::seq).collect::<Vec<_>>(),
            [0, 1, 3, 4, 5]
        );

        // A damaged file header costs only the header's flag.
        let mut bytes = clean.clone();
        bytes[3] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let (left, summary) = entries(&path);
        assert!(summary.header_damaged && !summary.started_empty);
        assert_eq!(left.len(), 6);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_torn_tail_is_truncated_on_open_and_appends_continue() {
        let d = dir("torn");
        let j = Journal::open(&d, false).unwrap();
        j.append_commit(&[put(1)], true).unwrap();
        j.append_commit(&[put(2)], true).unwrap();
        drop(j);
        let path = d.join(JOURNAL_FILE);
        let full = std::fs::metadata(&path).unwrap().len();
        // Cut the last entry in half, as a crash mid-append would.
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(full - 20).unwrap();
        drop(file);
        let (_, summary) = entries(&path);
        assert!(summary.torn_tail());
        assert_eq!(summary.entries, 1);
        let j = Journal::open(&d, true).unwrap();
        assert_eq!(j.append_commit(&[put(3)], true).unwrap(), 1);
        drop(j);
        let (all, summary) = entries(&path);
        assert!(!summary.started_empty, "an existing header keeps its flag");
        assert!(summary.damaged.is_empty(), "{summary:?}");
        assert_eq!(
            all,
            vec![
                Entry::Commit {
                    seq: 0,
                    ops: vec![put(1)]
                },
                Entry::Commit {
                    seq: 1,
                    ops: vec![put(3)]
                }
            ]
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}
