//! Repair from the journal: a damaged byte in sled's files or in the journal costs no record,
//! damage in both names exactly the records lost, and the damaged files are kept.
mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{copy_dir, key_of, small, trajectory, wait_closed, TempDir};
use envace_storage::journal::JOURNAL_FILE;
use envace_storage::{
    rebuild, repair_in_place, Error, JournalState, Prefix, RecordKey, SampleKey, Store,
    StoreOptions, Trajectory, TreeName, WriteSet, SEGMENT_SIZE,
};

fn flip(file: &Path, offset: usize) {
    let mut bytes = std::fs::read(file).unwrap();
    bytes[offset] ^= 0xFF;
    std::fs::write(file, bytes).unwrap();
}

/// Ten committed steps of four trajectories each (one of about 2.4 MB, which sled writes to a
/// blob file), and step 3's sample 0 removed again: what a run leaves, and what must come back.
fn written(dir: &TempDir) -> BTreeMap<SampleKey, Trajectory> {
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let mut expected = BTreeMap::new();
    for step in 0..10u64 {
        let batch: Vec<Trajectory> = (0..4)
            .map(|i| {
                if step == 6 && i == 2 {
                    trajectory("r", step, "big", i, 40, 20_000, 10)
                } else {
                    trajectory("r", step, "t", i, 2 + i as usize, 64, 16)
                }
            })
            .collect();
        store.put_many(&batch).unwrap();
        expected.extend(batch.into_iter().map(|t| (key_of(&t), t)));
    }
    let gone = key_of(&small("r", 3, "t", 0));
    let mut writes = WriteSet::new();
    writes.remove::<Trajectory>(&gone);
    store.commit(writes).unwrap();
    expected.remove(&gone);
    drop(store);
    wait_closed(dir.path());
    expected
}

fn contents(dir: &Path) -> BTreeMap<SampleKey, Trajectory> {
    wait_closed(dir);
    let store = Store::open_existing(dir, StoreOptions::default()).unwrap();
    store
        .scan::<Trajectory>(&Prefix::all())
        .map(|item| item.unwrap())
        .collect()
}

/// The offsets of the nonzero part of `file`, `n` of them evenly spread.
fn spread(file: &Path, n: usize) -> Vec<usize> {
    let bytes = std::fs::read(file).unwrap();
    let used = bytes.iter().rposition(|&b| b != 0).unwrap() + 1;
    (0..n).map(|i| i * used / n + 7).collect()
}

#[test]
fn a_damaged_byte_in_sleds_files_costs_no_record() {
    let dir = TempDir::new("repair-sled");
    let expected = written(&dir);
    let blobs: Vec<_> = std::fs::read_dir(dir.path().join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(!blobs.is_empty(), "the big trajectory went to a blob file");
    let mut cases: Vec<(std::path::PathBuf, usize)> = spread(&dir.path().join("db"), 6)
        .into_iter()
        .map(|o| (Path::new("db").to_path_buf(), o))
        .collect();
    cases.push((
        blobs[0].strip_prefix(dir.path()).unwrap().to_path_buf(),
        1000,
    ));
    cases.push((Path::new("conf").to_path_buf(), 3));
    let mut damaged = 0;
    for (file, offset) in cases {
        let case = format!("{} byte {offset}", file.display());
        let copy = TempDir::new("repair-sled-copy");
        copy_dir(dir.path(), copy.path());
        flip(&copy.path().join(&file), offset);
        let target = TempDir::new("repair-sled-out");
        let report = rebuild(copy.path(), target.path()).unwrap();
        assert!(report.lost.is_nothing(), "{case}: {report:?}");
        assert!(
            matches!(&report.journal, JournalState::Read(s) if s.started_empty && s.damaged.is_empty()),
            "{case}: {report:?}"
        );
        assert_eq!(report.records.get(&TreeName::Rollouts), Some(&39), "{case}");
        assert_eq!(contents(target.path()), expected, "{case}");
        eprintln!("{case}: sled {:?}", report.sled);
        damaged += usize::from(!report.sled.is_complete());
    }
    // The flips did reach sled: most cases lose records there that the journal restores.
    assert!(
        damaged >= 5,
        "only {damaged} of 8 flips damaged sled's view"
    );
}

#[test]
fn a_damaged_byte_in_the_journal_costs_no_record() {
    let dir = TempDir::new("repair-journal");
    let expected = written(&dir);
    let journal = dir.path().join(JOURNAL_FILE);
    let len = std::fs::metadata(&journal).unwrap().len() as usize;
    let mut offsets = spread(&journal, 5);
    offsets.extend([3, len - 5]);
    for offset in offsets {
        let copy = TempDir::new("repair-journal-copy");
        copy_dir(dir.path(), copy.path());
        flip(&copy.path().join(JOURNAL_FILE), offset);
        let target = TempDir::new("repair-journal-out");
        let report = rebuild(copy.path(), target.path()).unwrap();
        let JournalState::Read(summary) = &report.journal else {
            panic!("byte {offset}: {report:?}")
        };
        assert!(
            summary.header_damaged || !summary.damaged.is_empty(),
            "byte {offset}: the damage is reported: {summary:?}"
        );
        assert!(report.lost.is_nothing(), "byte {offset}: {report:?}");
        assert_eq!(contents(target.path()), expected, "byte {offset}");
    }
}

#[test]
fn damage_in_both_names_exactly_the_record_lost() {
    let dir = TempDir::new("repair-both");
    let mut expected = written(&dir);
    let victim = key_of(&small("r", 8, "t", 1));
    // The journal entry of step 8: damage a byte of the victim's key there.
    let journal = dir.path().join(JOURNAL_FILE);
    let bytes = std::fs::read(&journal).unwrap();
    let key = victim.to_bytes();
    let at = bytes
        .windows(key.len())
        .position(|w| w == key.as_slice())
        .unwrap();
    flip(&journal, at + 2);
    // And the victim's value in sled, written past the store as a disk fault would be.
    {
        let db = sled::Config::new()
            .path(dir.path())
            .segment_size(SEGMENT_SIZE)
            .open()
            .unwrap();
        let tree = db.open_tree(TreeName::Rollouts.as_str()).unwrap();
        let mut value = tree.get(&key).unwrap().unwrap().to_vec();
        *value.last_mut().unwrap() ^= 1;
        tree.insert(&key, value).unwrap();
        db.flush().unwrap();
    }
    wait_closed(dir.path());
    let target = TempDir::new("repair-both-out");
    let report = rebuild(dir.path(), target.path()).unwrap();
    assert_eq!(
        report.lost.records,
        [format!("rollouts {victim}")],
        "{report:?}"
    );
    assert!(report.lost.unknown.is_empty(), "{report:?}");
    // Step 8's other samples were in the same damaged entry and come back from sled.
    expected.remove(&victim);
    assert_eq!(contents(target.path()), expected);
    assert_eq!(report.from_sled_only, 3, "{report:?}");
}

#[test]
fn repair_in_place_keeps_the_damaged_files_and_a_lost_log_is_refused() {
    let root = TempDir::new("repair-place");
    let dir = root.path().join("db");
    std::fs::create_dir_all(root.path()).unwrap();
    let store = Store::open(&dir, StoreOptions::default()).unwrap();
    let records: Vec<Trajectory> = (0..5).map(|i| small("r", 0, "t", i)).collect();
    store.put_many(&records).unwrap();
    drop(store);
    wait_closed(&dir);
    // sled's log gone: opening would start an empty database over the journal's records.
    std::fs::remove_file(dir.join("db")).unwrap();
    let err = Store::open(&dir, StoreOptions::default()).unwrap_err();
    assert!(
        matches!(&err, Error::Invalid { reason, .. } if reason.contains("envace repair")),
        "{err}"
    );
    assert!(!dir.join("db").exists(), "the refused open created nothing");
    let (report, kept) = repair_in_place(&dir).unwrap();
    assert!(report.lost.is_nothing(), "{report:?}");
    assert!(report.sled.error.is_some(), "{report:?}");
    assert_eq!(kept, root.path().join("db.damaged"));
    assert!(!kept.join("db").exists() && kept.join(JOURNAL_FILE).exists());
    let back: Vec<Trajectory> = contents(&dir).into_values().collect();
    assert_eq!(back, records);
}

#[test]
fn nothing_to_repair_from_is_refused_and_nothing_is_written() {
    let root = TempDir::new("repair-nothing");
    std::fs::create_dir_all(root.path().join("empty")).unwrap();
    for name in ["missing", "empty"] {
        let dir = root.path().join(name);
        let err = repair_in_place(&dir).unwrap_err();
        assert!(matches!(err, Error::Missing { .. }), "{name}: {err}");
        let left: Vec<_> = std::fs::read_dir(root.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, ["empty"], "{name}: nothing written beside it");
    }
    // A folder with a `db` that is not a sled log, and no journal: refused, left as it is.
    let dir = root.path().join("empty");
    std::fs::write(dir.join("db"), b"not a sled log").unwrap();
    let err = repair_in_place(&dir).unwrap_err();
    assert!(matches!(err, Error::Repair { .. }), "{err}");
    assert_eq!(std::fs::read(dir.join("db")).unwrap(), b"not a sled log");
    assert_eq!(
        std::fs::read_dir(root.path()).unwrap().count(),
        1,
        "nothing written beside it"
    );
}
