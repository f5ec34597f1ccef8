//! Iteration over a tree that goes past the parts sled cannot read.
//!
//! sled 0.34's iterator, when it cannot load a node (a damaged blob file, an I/O error), returns
//! the same error again on every later call without moving, so a plain `for` loop over it never
//! ends. [`Entries`] yields such an error once, as [`Error::Unreadable`] naming the readable keys
//! on both sides of the gap, and goes on: it walks from the other end of the range towards the
//! damage and resumes at the last key it could read there. Records between the two keys (the
//! damaged node's, and any readable ones between two damaged nodes) are skipped. That walk reads
//! the rest of the range once more, once per gap. An error right after such a resume, before any
//! record was read there, ends the iteration, so it always ends and never repeats an error.
use std::marker::PhantomData;
use std::ops::Bound;

use sled::IVec;

use crate::error::{Error, Result};
use crate::keys::RecordKey;
use crate::schema::{Record, TreeName};
use crate::store::{decode_key, decode_value, hex};

/// `(key, value)` bytes of one tree within a range, in key order, from both ends.
pub(crate) struct Entries {
    tree: sled::Tree,
    name: TreeName,
    /// Text form of a key, for messages.
    key_text: fn(&[u8]) -> String,
    /// What is left to read: `lo` moves up as the front reads, `hi` down as the back does.
    lo: Bound<IVec>,
    hi: Bound<IVec>,
    /// Whether `lo` (`hi`) is a key read or resumed at, rather than where the range began.
    lo_is_key: bool,
    hi_is_key: bool,
    /// sled's iterator over `lo..hi`; `None` once finished.
    inner: Option<sled::Iter>,
    /// Set when the front (back) resumed after a gap and has read nothing since.
    front_resumed: bool,
    back_resumed: bool,
}

impl Entries {
    /// Keys starting with `prefix`.
    pub(crate) fn prefix(
        tree: &sled::Tree,
        name: TreeName,
        key_text: fn(&[u8]) -> String,
        prefix: &[u8],
    ) -> Entries {
        let hi = prefix_end(prefix).map_or(Bound::Unbounded, |end| Bound::Excluded(end.into()));
        let lo = Bound::Included(IVec::from(prefix));
        Entries {
            inner: Some(tree.range((lo.clone(), hi.clone()))),
            tree: tree.clone(),
            name,
            key_text,
            lo,
            hi,
            lo_is_key: false,
            hi_is_key: false,
            front_resumed: false,
            back_resumed: false,
        }
    }

    fn restart(&mut self) {
        self.inner = Some(self.tree.range((self.lo.clone(), self.hi.clone())));
    }

    /// After an error at the front: the lowest key readable walking down from `hi`, where the
    /// front resumes; `None` ends the iteration.
    fn skip_front(&mut self, cause: sled::Error) -> Error {
        let resume = if self.front_resumed {
            None
        } else {
            let mut back = self.tree.range((self.lo.clone(), self.hi.clone()));
            let mut lowest = None;
            while let Some(Ok((key, _))) = back.next_back() {
                lowest = Some(key);
            }
            lowest
        };
        let gap = format!(
            "{} {}",
            self.low(&self.lo, self.lo_is_key),
            match &resume {
                Some(key) => self.high(&Bound::Excluded(key.clone()), true),
                None => self.high(&self.hi, self.hi_is_key),
            }
        );
        match resume {
            Some(key) => {
                self.lo = Bound::Included(key);
                self.lo_is_key = true;
                self.front_resumed = true;
                self.restart();
            }
            None => self.inner = None,
        }
        Error::Unreadable {
            tree: self.name,
            gap,
            cause,
        }
    }

    /// After an error at the back: the highest key readable walking up from `lo`, where the
    /// back resumes; `None` ends the iteration.
    fn skip_back(&mut self, cause: sled::Error) -> Error {
        let resume = if self.back_resumed {
            None
        } else {
            let mut front = self.tree.range((self.lo.clone(), self.hi.clone()));
            let mut highest = None;
            while let Some(Ok((key, _))) = front.next() {
                highest = Some(key);
            }
            highest
        };
        let gap = format!(
            "{} {}",
            match &resume {
                Some(key) => self.low(&Bound::Excluded(key.clone()), true),
                None => self.low(&self.lo, self.lo_is_key),
            },
            self.high(&self.hi, self.hi_is_key),
        );
        match resume {
            Some(key) => {
                self.hi = Bound::Included(key);
                self.hi_is_key = true;
                self.back_resumed = true;
                self.restart();
            }
            None => self.inner = None,
        }
        Error::Unreadable {
            tree: self.name,
            gap,
            cause,
        }
    }

    /// The low end of a gap, for messages.
    fn low(&self, bound: &Bound<IVec>, is_key: bool) -> String {
        match bound {
            Bound::Excluded(k) if is_key => format!("after key {}", (self.key_text)(k)),
            Bound::Included(k) if is_key => format!("from key {}", (self.key_text)(k)),
            _ => "from the start of the scanned range".to_owned(),
        }
    }

    /// The high end of a gap, for messages.
    fn high(&self, bound: &Bound<IVec>, is_key: bool) -> String {
        match bound {
            Bound::Excluded(k) if is_key => format!("and before key {}", (self.key_text)(k)),
            Bound::Included(k) if is_key => format!("through key {}", (self.key_text)(k)),
            _ => "to the end of the scanned range".to_owned(),
        }
    }
}

impl Iterator for Entries {
    type Item = Result<(IVec, IVec)>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.inner.as_mut()?.next() {
            None => {
                self.inner = None;
                None
            }
            Some(Ok((key, value))) => {
                self.lo = Bound::Excluded(key.clone());
                self.lo_is_key = true;
                self.front_resumed = false;
                Some(Ok((key, value)))
            }
            Some(Err(cause)) => Some(Err(self.skip_front(cause))),
        }
    }
}

impl DoubleEndedIterator for Entries {
    fn next_back(&mut self) -> Option<Self::Item> {
        match self.inner.as_mut()?.next_back() {
            None => {
                self.inner = None;
                None
            }
            Some(Ok((key, value))) => {
                self.hi = Bound::Excluded(key.clone());
                self.hi_is_key = true;
                self.back_resumed = false;
                Some(Ok((key, value)))
            }
            Some(Err(cause)) => Some(Err(self.skip_back(cause))),
        }
    }
}

/// The smallest byte string above every string starting with `prefix`; `None` if there is none
/// (`prefix` empty or all `0xFF`).
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xFF {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// Text form of a stored key of type `K`, or its hex if it does not parse.
pub(crate) fn key_text<K: RecordKey>(bytes: &[u8]) -> String {
    K::from_bytes(bytes).map_or_else(|_| hex(bytes), |k| k.to_string())
}

/// Iterator over `(key, record)` of one tree; see [`Store::scan`](crate::Store::scan).
pub struct Scan<R: Record> {
    entries: Entries,
    _record: PhantomData<fn() -> R>,
}

impl<R: Record> Scan<R> {
    pub(crate) fn new(entries: Entries) -> Self {
        Scan {
            entries,
            _record: PhantomData,
        }
    }
}

impl<R: Record> Iterator for Scan<R> {
    type Item = Result<(R::Key, R)>;

    fn next(&mut self) -> Option<Self::Item> {
        self.entries.next().map(|item| item.and_then(decode_entry))
    }
}

impl<R: Record> DoubleEndedIterator for Scan<R> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.entries
            .next_back()
            .map(|item| item.and_then(decode_entry))
    }
}

/// Iterator over the keys of one tree; see [`Store::keys`](crate::Store::keys).
pub struct Keys<R: Record> {
    entries: Entries,
    _record: PhantomData<fn() -> R>,
}

impl<R: Record> Keys<R> {
    pub(crate) fn new(entries: Entries) -> Self {
        Keys {
            entries,
            _record: PhantomData,
        }
    }
}

impl<R: Record> Iterator for Keys<R> {
    type Item = Result<R::Key>;

    fn next(&mut self) -> Option<Self::Item> {
        self.entries
            .next()
            .map(|item| item.and_then(|(key, _)| decode_key::<R>(&key)))
    }
}

impl<R: Record> DoubleEndedIterator for Keys<R> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.entries
            .next_back()
            .map(|item| item.and_then(|(key, _)| decode_key::<R>(&key)))
    }
}

fn decode_entry<R: Record>((key, value): (IVec, IVec)) -> Result<(R::Key, R)> {
    let key = decode_key::<R>(&key)?;
    let record = decode_value::<R>(&key, &value)?;
    Ok((key, record))
}

#[cfg(test)]
mod tests {
    use super::prefix_end;

    #[test]
    fn prefix_end_is_the_first_string_past_the_prefix() {
        assert_eq!(prefix_end(b""), None);
        assert_eq!(prefix_end(&[0xFF, 0xFF]), None);
        assert_eq!(prefix_end(&[1, 2]), Some(vec![1, 3]));
        assert_eq!(prefix_end(&[1, 0xFF]), Some(vec![2]));
    }
}
