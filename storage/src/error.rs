//! The storage error type. Every variant names what failed and where (database path, tree, key),
//! so a message read in a log is enough to find the record. Causes are written into the message
//! (not chained as `source`), so a plain `{}` shows them and anyhow's `{:#}` does not repeat them.
use std::path::PathBuf;

use crate::schema::TreeName;

/// Everything the store can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A read-only command was pointed at a directory that holds no database.
    #[error("no envace database at {path}: {reason}")]
    Missing {
        /// The directory given.
        path: PathBuf,
        /// What is missing.
        reason: String,
    },
    /// A directory holds files that are not a sled database this build can open safely; nothing
    /// was changed there (sled itself would re-create or truncate it).
    #[error("{path} does not hold a valid envace database: {reason}; nothing was changed there")]
    Invalid {
        /// The directory given.
        path: PathBuf,
        /// What is wrong, naming the file.
        reason: String,
    },
    /// Another process holds the database (sled allows one process at a time).
    #[error(
        "database at {path} is locked by another process (sled admits one process at a time: \
         stop the process that holds it, e.g. a running trainer, and retry)"
    )]
    Locked {
        /// The database directory.
        path: PathBuf,
    },
    /// A read-only open could not copy the database to work on (see
    /// [`crate::Store::open_existing`]); nothing was changed there.
    #[error(
        "cannot copy database at {path} for a read-only view: {cause}; nothing was changed there"
    )]
    Snapshot {
        /// The database directory.
        path: PathBuf,
        /// The I/O error.
        cause: std::io::Error,
    },
    /// sled could not open the database.
    #[error("cannot open database at {path}: {cause}")]
    Open {
        /// The database directory.
        path: PathBuf,
        /// sled's error.
        cause: sled::Error,
    },
    /// A sled read or write failed.
    #[error("sled failed on tree `{tree}`: {cause}")]
    Sled {
        /// The tree.
        tree: TreeName,
        /// sled's error.
        cause: sled::Error,
    },
    /// Part of a tree could not be read (a damaged blob file, an I/O error): the records between
    /// the two keys named are skipped; a scan goes on past them when it can.
    #[error("cannot read tree `{tree}` {gap}: {cause}")]
    Unreadable {
        /// The tree.
        tree: TreeName,
        /// Where, in keys' text form: e.g. `after key a/1/t/3 and before key a/2/t/0` (both
        /// readable), or `… to the end of the scanned range` when the scan stopped there.
        gap: String,
        /// sled's error.
        cause: sled::Error,
    },
    /// An atomic write spanning several trees failed; nothing of it was applied.
    #[error("atomic write to trees {} failed: {cause}", list(trees))]
    Commit {
        /// The trees it spanned.
        trees: Vec<TreeName>,
        /// sled's error.
        cause: sled::Error,
    },
    /// A database-wide sled operation failed.
    #[error("sled failed on database at {path}: {cause}")]
    Database {
        /// The database directory.
        path: PathBuf,
        /// sled's error.
        cause: sled::Error,
    },
    /// Flushing to disk failed: the writes since the last flush may not be durable.
    #[error("flushing database at {path} failed: {cause}")]
    Flush {
        /// The database directory.
        path: PathBuf,
        /// sled's error.
        cause: sled::Error,
    },
    /// fsync of a file sled leaves unsynced (a blob file, a directory) failed: the writes since
    /// the last flush may not be durable.
    #[error("fsync of {path} failed: {cause}; writes since the last flush may not be durable")]
    Sync {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        cause: std::io::Error,
    },
    /// The journal could not be opened, appended to or fsynced; a commit that fails this way
    /// was not applied.
    #[error("journal {path}: {cause}")]
    Journal {
        /// The journal file.
        path: PathBuf,
        /// The I/O error.
        cause: std::io::Error,
    },
    /// `repair` could not finish: the source database is unchanged unless `reason` says
    /// otherwise.
    #[error("repair of {path}: {reason}")]
    Repair {
        /// The database directory.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// A record could not be encoded (e.g. a non-UTF-8 checkpoint path).
    #[error("cannot encode record for tree `{tree}` at key {key}: {cause}")]
    Encode {
        /// The tree.
        tree: TreeName,
        /// The record's key, text form.
        key: String,
        /// bincode's error.
        cause: bincode::error::EncodeError,
    },
    /// A stored value is damaged; the other records stay readable.
    #[error("corrupt record in tree `{tree}` at key {key}: {damage}")]
    Corrupt {
        /// The tree.
        tree: TreeName,
        /// The record's key, text form.
        key: String,
        /// What is wrong with the bytes.
        damage: Damage,
    },
    /// A stored key is damaged.
    #[error("corrupt key in tree `{tree}` (bytes {hex}): {reason}")]
    CorruptKey {
        /// The tree.
        tree: TreeName,
        /// The key's bytes, hex.
        hex: String,
        /// What is wrong with them.
        reason: KeyError,
    },
    /// A record written by a newer envace; never decoded, so never misread.
    #[error(
        "record in tree `{tree}` at key {key} has schema version {found}, newer than the \
         version {supported} this build reads; upgrade envace to read it"
    )]
    NewerSchema {
        /// The tree.
        tree: TreeName,
        /// The record's key, text form.
        key: String,
        /// The version in the record's header.
        found: u16,
        /// [`crate::SCHEMA_VERSION`].
        supported: u16,
    },
    /// A record from an older schema that this build has no migration for.
    #[error(
        "record in tree `{tree}` at key {key} has schema version {found}, older than the \
         version {supported} this build reads, and no migration exists"
    )]
    OlderSchema {
        /// The tree.
        tree: TreeName,
        /// The record's key, text form.
        key: String,
        /// The version in the record's header.
        found: u16,
        /// [`crate::SCHEMA_VERSION`].
        supported: u16,
    },
    /// A key's text form (from the command line) does not parse.
    #[error("`{text}` is not a key of the form {expected}: {reason}")]
    BadKeyText {
        /// The text given.
        text: String,
        /// The expected form, e.g. `RUN/STEP/TASK/SAMPLE`.
        expected: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// How a stored value's bytes are wrong (see [`crate::codec`] for the layout).
#[derive(Debug, thiserror::Error)]
pub enum Damage {
    /// Shorter than the header.
    #[error("value is {len} bytes, shorter than the {header}-byte header")]
    TooShort {
        /// Value length, bytes.
        len: usize,
        /// Header length, bytes.
        header: usize,
    },
    /// The first bytes are not the envace magic.
    #[error("value does not start with the magic {expected:?} (found {found:?})")]
    BadMagic {
        /// [`crate::codec::MAGIC`].
        expected: [u8; 4],
        /// What is there.
        found: [u8; 4],
    },
    /// The payload's CRC-32 differs from the header's.
    #[error("checksum mismatch: header says {stored:#010x}, payload hashes to {computed:#010x}")]
    Checksum {
        /// CRC-32 in the header.
        stored: u32,
        /// CRC-32 of the payload as read.
        computed: u32,
    },
    /// The payload passed the checksum but is not a valid record of this type.
    #[error("payload does not decode: {0}")]
    Decode(bincode::error::DecodeError),
    /// The payload decoded with bytes to spare.
    #[error("{extra} bytes left after the record")]
    TrailingBytes {
        /// Unused bytes.
        extra: usize,
    },
}

/// How a stored key's bytes are wrong (see [`crate::keys`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// A string component has no terminator.
    #[error("a string component is not terminated")]
    Unterminated,
    /// `0x00` followed by something other than `0xFF` or `0x01`.
    #[error("bad escape at byte {offset}")]
    BadEscape {
        /// Offset of the `0x00` within the component.
        offset: usize,
    },
    /// A string component is not UTF-8.
    #[error("a string component is not UTF-8")]
    NotUtf8,
    /// An integer component is cut short.
    #[error("key ends inside a {needed}-byte integer")]
    Truncated {
        /// Bytes the integer needs.
        needed: usize,
    },
    /// Bytes after the last component.
    #[error("{bytes} bytes after the last component")]
    Trailing {
        /// How many.
        bytes: usize,
    },
}

fn list(trees: &[TreeName]) -> String {
    trees
        .iter()
        .map(|t| format!("`{t}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The storage crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
