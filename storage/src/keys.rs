//! Key encoding. Keys are byte strings whose lexicographic order is the order users scan in:
//! run → step → task → sample. Integers are big-endian; strings are escaped (`0x00` → `0x00 0xFF`)
//! and terminated by `0x00 0x01`, so a string's encoding never prefixes another's and `"a" < "ab"`
//! holds in bytes as in text (the FoundationDB tuple-layer trick, with a two-byte terminator).
//!
//! Each key type also has a text form (`Display` / `FromStr`) for the CLI: components joined by
//! `/`, with `%` and `/` inside a component written `%25` and `%2F`.
use std::fmt;
use std::marker::PhantomData;
use std::str::FromStr;

use crate::error::{Error, KeyError};
use crate::records::{RunId, TaskId};

/// A key type of one tree: how it becomes bytes and back.
pub trait RecordKey: Sized + fmt::Display {
    /// The key's bytes, in scan order.
    fn to_bytes(&self) -> Vec<u8>;
    /// Parses bytes made by [`RecordKey::to_bytes`].
    ///
    /// # Errors
    /// [`KeyError`] when the bytes are truncated, badly escaped, not UTF-8 or too long.
    fn from_bytes(bytes: &[u8]) -> Result<Self, KeyError>;
}

/// Key of the `rollouts` and `memories` trees: one sample of one task at one step of one run.
/// Text form: `RUN/STEP/TASK/SAMPLE`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SampleKey {
    /// The run.
    pub run: RunId,
    /// The optimizer step.
    pub step: u64,
    /// The task.
    pub task: TaskId,
    /// Sample index within the task's group.
    pub sample: u32,
}

/// Key of the `seeds` tree: a task's n-th seed trajectory. Text form: `TASK/INDEX`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SeedKey {
    /// The task.
    pub task: TaskId,
    /// 0 for the first seed.
    pub index: u32,
}

/// Key of the `checkpoints` tree. Text form: `RUN/STEP`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CheckpointKey {
    /// The run.
    pub run: RunId,
    /// The step.
    pub step: u64,
}

/// A key prefix for scans of trees keyed by `K`; build one with [`Prefix::all`] or the
/// constructors on the key types ([`SampleKey::run_prefix`], …).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prefix<K> {
    bytes: Vec<u8>,
    _key: PhantomData<fn() -> K>,
}

impl<K> Prefix<K> {
    /// Every key of the tree.
    pub fn all() -> Self {
        Self::from_bytes(Vec::new())
    }

    fn from_bytes(bytes: Vec<u8>) -> Self {
        Prefix {
            bytes,
            _key: PhantomData,
        }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

impl SampleKey {
    /// Every sample of `run`.
    pub fn run_prefix(run: &RunId) -> Prefix<SampleKey> {
        let mut b = Vec::new();
        put_str(&mut b, &run.0);
        Prefix::from_bytes(b)
    }

    /// Every sample of `run` at `step`.
    pub fn step_prefix(run: &RunId, step: u64) -> Prefix<SampleKey> {
        let mut b = Self::run_prefix(run).bytes;
        b.extend_from_slice(&step.to_be_bytes());
        Prefix::from_bytes(b)
    }

    /// Every sample of `task` at (`run`, `step`): one GRPO group.
    pub fn task_prefix(run: &RunId, step: u64, task: &TaskId) -> Prefix<SampleKey> {
        let mut b = Self::step_prefix(run, step).bytes;
        put_str(&mut b, &task.0);
        Prefix::from_bytes(b)
    }
}

impl SeedKey {
    /// Every seed of `task`.
    pub fn task_prefix(task: &TaskId) -> Prefix<SeedKey> {
        let mut b = Vec::new();
        put_str(&mut b, &task.0);
        Prefix::from_bytes(b)
    }
}

impl CheckpointKey {
    /// Every checkpoint of `run`.
    pub fn run_prefix(run: &RunId) -> Prefix<CheckpointKey> {
        let mut b = Vec::new();
        put_str(&mut b, &run.0);
        Prefix::from_bytes(b)
    }
}

impl RecordKey for SampleKey {
    fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.run.0.len() + self.task.0.len() + 16);
        put_str(&mut b, &self.run.0);
        b.extend_from_slice(&self.step.to_be_bytes());
        put_str(&mut b, &self.task.0);
        b.extend_from_slice(&self.sample.to_be_bytes());
        b
    }

    fn from_bytes(bytes: &[u8]) -> Result<Self, KeyError> {
        let mut r = Reader(bytes);
        let key = SampleKey {
            run: RunId(r.string()?),
            step: r.u64()?,
            task: TaskId(r.string()?),
            sample: r.u32()?,
        };
        r.finish()?;
        Ok(key)
    }
}

impl RecordKey for SeedKey {
    fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.task.0.len() + 6);
        put_str(&mut b, &self.task.0);
        b.extend_from_slice(&self.index.to_be_bytes());
        b
    }

    fn from_bytes(bytes: &[u8]) -> Result<Self, KeyError> {
        let mut r = Reader(bytes);
        let key = SeedKey {
            task: TaskId(r.string()?),
            index: r.u32()?,
        };
        r.finish()?;
        Ok(key)
    }
}

impl RecordKey for CheckpointKey {
    fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.run.0.len() + 10);
        put_str(&mut b, &self.run.0);
        b.extend_from_slice(&self.step.to_be_bytes());
        b
    }

    fn from_bytes(bytes: &[u8]) -> Result<Self, KeyError> {
        let mut r = Reader(bytes);
        let key = CheckpointKey {
            run: RunId(r.string()?),
            step: r.u64()?,
        };
        r.finish()?;
        Ok(key)
    }
}

impl RecordKey for TaskId {
    fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.0.len() + 2);
        put_str(&mut b, &self.0);
        b
    }

    fn from_bytes(bytes: &[u8]) -> Result<Self, KeyError> {
        let mut r = Reader(bytes);
        let id = TaskId(r.string()?);
        r.finish()?;
        Ok(id)
    }
}

impl RecordKey for RunId {
    fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.0.len() + 2);
        put_str(&mut b, &self.0);
        b
    }

    fn from_bytes(bytes: &[u8]) -> Result<Self, KeyError> {
        let mut r = Reader(bytes);
        let id = RunId(r.string()?);
        r.finish()?;
        Ok(id)
    }
}

impl fmt::Display for SampleKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}/{}",
            escape(&self.run.0),
            self.step,
            escape(&self.task.0),
            self.sample
        )
    }
}

impl fmt::Display for SeedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", escape(&self.task.0), self.index)
    }
}

impl fmt::Display for CheckpointKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", escape(&self.run.0), self.step)
    }
}

impl FromStr for SampleKey {
    type Err = Error;

    /// Parses `RUN/STEP/TASK/SAMPLE` (the form `Display` writes).
    fn from_str(s: &str) -> Result<Self, Error> {
        const EXPECTED: &str = "RUN/STEP/TASK/SAMPLE";
        let bad = |why: &str| Error::BadKeyText {
            text: s.to_owned(),
            expected: EXPECTED,
            reason: why.to_owned(),
        };
        let parts: Vec<&str> = s.split('/').collect();
        let [run, step, task, sample] = parts.as_slice() else {
            return Err(bad(&format!("{} `/`-separated parts", parts.len())));
        };
        Ok(SampleKey {
            run: RunId(unescape(run).map_err(|e| bad(&e))?),
            step: step
                .parse()
                .map_err(|_| bad(&format!("step `{step}` is not an integer")))?,
            task: TaskId(unescape(task).map_err(|e| bad(&e))?),
            sample: sample
                .parse()
                .map_err(|_| bad(&format!("sample `{sample}` is not an integer")))?,
        })
    }
}

impl FromStr for SeedKey {
    type Err = Error;

    /// Parses `TASK/INDEX`.
    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = |why: String| Error::BadKeyText {
            text: s.to_owned(),
            expected: "TASK/INDEX",
            reason: why,
        };
        let (task, index) = s.rsplit_once('/').ok_or_else(|| bad("no `/`".to_owned()))?;
        Ok(SeedKey {
            task: TaskId(unescape(task).map_err(bad)?),
            index: index
                .parse()
                .map_err(|_| bad(format!("index `{index}` is not an integer")))?,
        })
    }
}

impl FromStr for CheckpointKey {
    type Err = Error;

    /// Parses `RUN/STEP`.
    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = |why: String| Error::BadKeyText {
            text: s.to_owned(),
            expected: "RUN/STEP",
            reason: why,
        };
        let (run, step) = s.rsplit_once('/').ok_or_else(|| bad("no `/`".to_owned()))?;
        Ok(CheckpointKey {
            run: RunId(unescape(run).map_err(bad)?),
            step: step
                .parse()
                .map_err(|_| bad(format!("step `{step}` is not an integer")))?,
        })
    }
}

/// The run a run-scoped key (`rollouts`, `memories`, `runs`, `checkpoints`) starts with, and the
/// smallest byte string greater than every key of that run (for skip-scans over runs).
pub(crate) fn leading_run(key: &[u8]) -> Result<(RunId, Vec<u8>), KeyError> {
    let mut r = Reader(key);
    let run = r.string()?;
    let used = key.len() - r.0.len();
    let mut next = key[..used].to_vec();
    // The terminator is 0x00 0x01 and the byte after an in-string 0x00 is 0xFF, so bumping the
    // terminator's last byte to 0x02 passes every key of this run and no key of any other.
    if let Some(last) = next.last_mut() {
        *last = 0x02;
    }
    Ok((RunId(run), next))
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    for &b in s.as_bytes() {
        if b == 0 {
            out.extend_from_slice(&[0x00, 0xFF]);
        } else {
            out.push(b);
        }
    }
    out.extend_from_slice(&[0x00, 0x01]);
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn string(&mut self) -> Result<String, KeyError> {
        let mut raw = Vec::new();
        let mut i = 0;
        loop {
            match self.0.get(i) {
                None => return Err(KeyError::Unterminated),
                Some(0) => match self.0.get(i + 1) {
                    Some(0xFF) => raw.push(0),
                    Some(0x01) => break,
                    _ => return Err(KeyError::BadEscape { offset: i }),
                },
                Some(&b) => {
                    raw.push(b);
                    i += 1;
                    continue;
                }
            }
            i += 2;
        }
        self.0 = &self.0[i + 2..];
        String::from_utf8(raw).map_err(|_| KeyError::NotUtf8)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], KeyError> {
        let (head, rest) = self
            .0
            .split_first_chunk::<N>()
            .ok_or(KeyError::Truncated { needed: N })?;
        self.0 = rest;
        Ok(*head)
    }

    fn u64(&mut self) -> Result<u64, KeyError> {
        self.array().map(u64::from_be_bytes)
    }

    fn u32(&mut self) -> Result<u32, KeyError> {
        self.array().map(u32::from_be_bytes)
    }

    fn finish(self) -> Result<(), KeyError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(KeyError::Trailing {
                bytes: self.0.len(),
            })
        }
    }
}

fn escape(s: &str) -> String {
    s.replace('%', "%25").replace('/', "%2F")
}

fn unescape(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let code = rest.get(at + 1..at + 3);
        match code {
            Some("25") => out.push('%'),
            Some("2F" | "2f") => out.push('/'),
            _ => return Err(format!("`%` at byte {at} of `{s}` is not `%25` or `%2F`")),
        }
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(run: &str, step: u64, task: &str, sample: u32) -> SampleKey {
        SampleKey {
            run: run.into(),
            step,
            task: task.into(),
            sample,
        }
    }

    #[test]
    fn byte_order_is_run_step_task_sample() {
        // Sorted as a user expects: run text first (with "a" < "a\0x" < "ab"), then step
        // numerically (255 < 256 < 2^40), then task text, then sample numerically.
        let sorted = [
            key("a", 0, "t", 0),
            key("a", 0, "t", 1),
            key("a", 0, "t", 256),
            key("a", 0, "t/x", 0),
            key("a", 0, "u", 0),
            key("a", 255, "a", 0),
            key("a", 256, "a", 0),
            key("a", 1 << 40, "", 0),
            key("a\0x", 0, "t", 0),
            key("ab", 0, "t", 0),
            key("b", 0, "", 0),
        ];
        let bytes: Vec<Vec<u8>> = sorted.iter().map(RecordKey::to_bytes).collect();
        for (i, pair) in bytes.windows(2).enumerate() {
            assert!(pair[0] < pair[1], "{} !< {}", sorted[i], sorted[i + 1]);
        }
        for (k, b) in sorted.iter().zip(&bytes) {
            assert_eq!(&SampleKey::from_bytes(b).unwrap(), k);
        }
    }

    #[test]
    fn prefixes_do_not_capture_other_runs() {
        // "a" must not prefix "a\0b": the terminator 0x00 0x01 differs from the escape 0x00 0xFF.
        let p = SampleKey::run_prefix(&"a".into());
        assert!(key("a", 3, "t", 0).to_bytes().starts_with(p.as_bytes()));
        assert!(!key("a\0b", 3, "t", 0).to_bytes().starts_with(p.as_bytes()));
        assert!(!key("ab", 3, "t", 0).to_bytes().starts_with(p.as_bytes()));
        let s = SampleKey::step_prefix(&"a".into(), 3);
        assert!(key("a", 3, "zz", 9).to_bytes().starts_with(s.as_bytes()));
        assert!(!key("a", 4, "zz", 9).to_bytes().starts_with(s.as_bytes()));
    }

    #[test]
    fn leading_run_skips_exactly_one_run() {
        let k = key("a", 7, "t", 1).to_bytes();
        let (run, next) = leading_run(&k).unwrap();
        assert_eq!(run.0, "a");
        assert!(key("a", u64::MAX, "\u{10FFFF}", u32::MAX).to_bytes() < next);
        assert!(next < key("a\0", 0, "", 0).to_bytes());
        assert!(next < key("a\u{1}", 0, "", 0).to_bytes());
    }

    #[test]
    fn text_form_round_trips_with_slashes_and_percents() {
        let k = key("run/1%", 12, "multi_turn/base 3", 4);
        assert_eq!(k.to_string(), "run%2F1%25/12/multi_turn%2Fbase 3/4");
        assert_eq!(k.to_string().parse::<SampleKey>().unwrap(), k);
        let err = "r/1/t".parse::<SampleKey>().unwrap_err().to_string();
        assert!(err.contains("RUN/STEP/TASK/SAMPLE"), "{err}");
        let err = "r/x/t/0".parse::<SampleKey>().unwrap_err().to_string();
        assert!(err.contains("step `x`"), "{err}");
        assert!("r/1/t%zz/0".parse::<SampleKey>().is_err());
        let s = SeedKey {
            task: "a/b".into(),
            index: 2,
        };
        assert_eq!(s.to_string().parse::<SeedKey>().unwrap(), s);
        let c = CheckpointKey {
            run: "r".into(),
            step: 9,
        };
        assert_eq!(c.to_string().parse::<CheckpointKey>().unwrap(), c);
    }

    #[test]
    fn malformed_bytes_are_errors() {
        assert!(matches!(
            SampleKey::from_bytes(b"abc"),
            Err(KeyError::Unterminated)
        ));
        assert!(matches!(
            SampleKey::from_bytes(b"a\0\x07"),
            Err(KeyError::BadEscape { offset: 1 })
        ));
        assert!(matches!(
            SampleKey::from_bytes(b"a\0\x01\0\0"),
            Err(KeyError::Truncated { needed: 8 })
        ));
        let mut k = key("a", 1, "t", 2).to_bytes();
        k.push(9);
        assert!(matches!(
            SampleKey::from_bytes(&k),
            Err(KeyError::Trailing { bytes: 1 })
        ));
    }
}
