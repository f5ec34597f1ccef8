//! The store against sled's files: damaged blob files (scans go past them and always end; one
//! that sled's recovery would read is refused before sled sees it), directories that are not
//! databases (refused, left untouched), and the segment size that keeps records up to 2 MiB in
//! the log file.
mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::{copy_dir, key_of, small, trajectory, wait_closed, TempDir};
use envace_storage::{Error, Prefix, SampleKey, Store, StoreOptions, Trajectory, TreeName};

fn open(dir: &TempDir) -> Store {
    Store::open(dir.path(), StoreOptions::default()).unwrap()
}

fn blob_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

/// Overwrites 16 bytes inside a file, as a disk fault would.
fn damage(file: &Path) {
    let mut bytes = std::fs::read(file).unwrap();
    assert!(
        bytes.len() > 116,
        "{} is too short to damage",
        file.display()
    );
    for b in &mut bytes[100..116] {
        *b ^= 0xFF;
    }
    std::fs::write(file, bytes).unwrap();
}

/// Every file under `dir` with its bytes: to show a command changed nothing.
fn contents(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.insert(path.clone(), Vec::new());
            out.extend(contents(&path));
        } else {
            out.insert(path.clone(), std::fs::read(&path).unwrap());
        }
    }
    out
}

/// A rehearsal trajectory of `rows` rows of `prompt` + `completion` tokens; about
/// `rows × (3 × prompt + 7 × completion)` bytes encoded.
fn big(run: &str, rows: usize, prompt: usize, completion: usize) -> Trajectory {
    trajectory(run, 0, "t", 0, rows, prompt, completion)
}

#[test]
fn records_up_to_2_mib_stay_in_the_log_file() {
    let dir = TempDir::new("inline");
    let store = open(&dir);
    // ~1.8 MB encoded: under a quarter of the 8 MiB segment, so sled keeps it in `db`.
    let under = big("under", 4, 100_000, 20_000);
    store.put(&under).unwrap();
    assert_eq!(blob_files(dir.path()), Vec::<PathBuf>::new());
    // ~2.6 MB: sled puts it in a blob file, which the store fsyncs before `put` returns.
    let over = big("over", 6, 100_000, 20_000);
    store.put(&over).unwrap();
    assert!(!blob_files(dir.path()).is_empty());
    drop(store);
    let store = Store::open_existing(dir.path(), StoreOptions::default()).unwrap();
    assert_eq!(store.get(&key_of(&under)).unwrap().as_ref(), Some(&under));
    assert_eq!(store.get(&key_of(&over)).unwrap().as_ref(), Some(&over));
}

/// What [`damaged_blob_database`] wrote, in key order, and the big record's index.
struct Written {
    records: Vec<Trajectory>,
    big: usize,
}

/// 40 small records, one big enough for a blob file, 3,000 small ones after it; reopened once so
/// that sled's snapshot lies past the blob's log segment (recovery no longer reads it), then
/// every blob file damaged. Small segments (256 KiB: messages over 64 KiB go to blob files) keep
/// it fast; the store keeps the segment size a database's `conf` records.
fn damaged_blob_database(dir: &TempDir) -> Written {
    drop(
        sled::Config::new()
            .path(dir.path())
            .segment_size(1 << 18)
            .open()
            .unwrap(),
    );
    let mut records: Vec<Trajectory> = (0..40).map(|i| small("a", 0, "t", i)).collect();
    records.push(big("b", 2, 12_000, 2_000));
    records.extend((0..3000).map(|i| small("z", i / 100, "t", (i % 100) as u32)));
    {
        let store = open(dir);
        store.put_many(&records[..40]).unwrap();
        store.put(&records[40]).unwrap();
        for chunk in records[41..].chunks(100) {
            store.put_many(chunk).unwrap();
        }
    }
    drop(open(dir));
    wait_closed(dir.path());
    let blobs = blob_files(dir.path());
    assert!(!blobs.is_empty(), "the big record made no blob file");
    for file in &blobs {
        damage(file);
    }
    Written { records, big: 40 }
}

#[test]
fn a_damaged_blob_file_fails_its_node_alone_and_scans_go_on() {
    let dir = TempDir::new("blob");
    let Written { records, big } = damaged_blob_database(&dir);
    let keys: Vec<String> = records.iter().map(|t| key_of(t).to_string()).collect();
    let store = Store::open_existing(dir.path(), StoreOptions::default()).unwrap();

    // Forward: every record before the damaged node, one error, every record after it.
    let items: Vec<_> = store.scan::<Trajectory>(&Prefix::all()).collect();
    let errors: Vec<usize> = (0..items.len()).filter(|&i| items[i].is_err()).collect();
    assert_eq!(errors.len(), 1, "{:?}", errors);
    let at = errors[0];
    let after = items.len() - at - 1;
    let skipped = records.len() - at - after;
    // The gap is the damaged leaf node: the big record and its neighbours (≤ ~17 records).
    assert!((1..=20).contains(&skipped), "{skipped} records skipped");
    assert!(at <= big && big < at + skipped);
    for (i, item) in items.iter().enumerate().filter(|&(i, _)| i != at) {
        let r = if i < at { i } else { i - 1 + skipped };
        let (k, t) = item.as_ref().unwrap();
        assert_eq!((k.to_string(), t), (keys[r].clone(), &records[r]));
    }
    let err = items[at].as_ref().unwrap_err();
    assert!(
        matches!(
            err,
            Error::Unreadable {
                tree: TreeName::Rollouts,
                ..
            }
        ),
        "{err:?}"
    );
    let message = err.to_string();
    let expected = format!(
        "cannot read tree `rollouts` after key {} and before key {}: ",
        keys[at - 1],
        keys[at + skipped]
    );
    assert!(message.starts_with(&expected), "{message}");
    assert!(message.contains("corrupted"), "{message}");

    // Backward: the same records, the same single gap.
    let back: Vec<_> = store.scan::<Trajectory>(&Prefix::all()).rev().collect();
    assert_eq!(back.len(), items.len());
    assert_eq!(back.iter().filter(|i| i.is_err()).count(), 1);
    let mut back_keys: Vec<String> = back
        .iter()
        .filter_map(|i| i.as_ref().ok())
        .map(|(k, _)| k.to_string())
        .collect();
    back_keys.reverse();
    let forward_keys: Vec<String> = items
        .iter()
        .filter_map(|i| i.as_ref().ok())
        .map(|(k, _)| k.to_string())
        .collect();
    assert_eq!(back_keys, forward_keys);
    let back_message = back.iter().find_map(|i| i.as_ref().err()).unwrap();
    assert!(
        back_message.to_string().starts_with(&expected),
        "{back_message}"
    );

    // Keys, len and point reads end too; prefixes clear of the gap read cleanly.
    let key_items: Vec<_> = store.keys::<Trajectory>(&Prefix::all()).collect();
    assert_eq!(key_items.iter().filter(|k| k.is_ok()).count(), at + after);
    assert_eq!(key_items.iter().filter(|k| k.is_err()).count(), 1);
    assert!(matches!(
        store.len(TreeName::Rollouts),
        Err(Error::Unreadable { .. })
    ));
    assert!(store.get::<Trajectory>(&key_of(&records[big])).is_err());
    let late = SampleKey::step_prefix(&"z".into(), 29);
    let late: Vec<_> = store.scan::<Trajectory>(&late).collect();
    assert_eq!(late.len(), 100);
    assert!(late.iter().all(Result::is_ok));
    // Mixing both ends never crosses or repeats the gap.
    let mut both = store.scan::<Trajectory>(&Prefix::all());
    let (mut seen, mut gaps) = (0, 0);
    loop {
        let item = if seen % 2 == 0 {
            both.next()
        } else {
            both.next_back()
        };
        match item {
            Some(Ok(_)) => seen += 1,
            Some(Err(_)) => gaps += 1,
            None => break,
        }
    }
    assert_eq!((seen, gaps), (at + after, 1));
}

#[test]
fn a_damaged_blob_file_that_recovery_would_read_is_refused_untouched() {
    let dir = TempDir::new("replayed");
    {
        let store = open(&dir);
        store.put(&small("a", 0, "t", 0)).unwrap();
        store.put(&big("b", 6, 100_000, 20_000)).unwrap();
    }
    // No reopen: sled has no snapshot, so its recovery would replay the whole log, blob included.
    let blobs = blob_files(dir.path());
    assert_eq!(blobs.len(), 1);
    damage(&blobs[0]);
    let before = contents(dir.path());
    let err = Store::open_existing(dir.path(), StoreOptions::default()).unwrap_err();
    let name = blobs[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(matches!(err, Error::Invalid { .. }), "{err:?}");
    assert!(
        err.to_string().starts_with(&format!(
            "{} does not hold a valid envace database: blob file `blobs/{name}` fails its \
             checksum, and sled's recovery reads it",
            dir.path().display()
        )),
        "{err}"
    );
    assert!(contents(dir.path()) == before, "the directory changed");
}

#[test]
fn directories_that_are_not_databases_are_refused_and_left_alone() {
    let good = TempDir::new("good");
    open(&good).put(&small("a", 0, "t", 0)).unwrap();
    drop(open(&good)); // sled writes its first snapshot on this open
    assert!(std::fs::read_dir(good.path()).unwrap().any(|e| e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .starts_with("snap.")));
    let conf = std::fs::read(good.path().join("conf")).unwrap();
    let random: Vec<u8> = (0..100_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();

    /// How to spoil a fresh directory.
    type Make<'a> = &'a dyn Fn(&Path);
    let cases: [(&str, Make, &str); 6] = [
        (
            "random-db",
            &|d| {
                std::fs::write(d.join("conf"), &conf).unwrap();
                std::fs::create_dir(d.join("blobs")).unwrap();
                std::fs::write(d.join("db"), &random).unwrap();
            },
            "`db` (100000 bytes) holds no valid sled log segment header (checked every 8388608 \
             bytes)",
        ),
        (
            "no-conf",
            &|d| std::fs::write(d.join("db"), &random).unwrap(),
            "`db` is there but `conf` is missing",
        ),
        (
            "empty-db",
            &|d| {
                std::fs::write(d.join("conf"), &conf).unwrap();
                std::fs::write(d.join("db"), b"").unwrap();
            },
            "`db` is empty (0 bytes): nothing was ever written there",
        ),
        (
            "lost-log",
            &|d| {
                copy_dir(good.path(), d);
                std::fs::write(d.join("db"), b"").unwrap();
            },
            "`db` is empty but sled snapshot files are there: the log was lost",
        ),
        (
            "empty-conf",
            &|d| {
                copy_dir(good.path(), d);
                std::fs::write(d.join("conf"), b"").unwrap();
            },
            "`conf` is 0 bytes: empty or cut short",
        ),
        (
            "no-blobs",
            &|d| {
                copy_dir(good.path(), d);
                std::fs::remove_dir(d.join("blobs")).unwrap();
            },
            "the `blobs` folder is missing",
        ),
    ];
    for (name, make, reason) in cases {
        let dir = TempDir::new(name);
        std::fs::create_dir_all(dir.path()).unwrap();
        make(dir.path());
        let before = contents(dir.path());
        let err = Store::open_existing(dir.path(), StoreOptions::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{} does not hold a valid envace database: {reason}; nothing was changed there",
                dir.path().display()
            ),
            "{name}"
        );
        assert!(
            contents(dir.path()) == before,
            "{name}: the directory changed"
        );
        if name != "empty-db" {
            // The writer's open refuses too, rather than letting sled write over the files.
            let err = Store::open(dir.path(), StoreOptions::default()).unwrap_err();
            assert!(matches!(err, Error::Invalid { .. }), "{name}: {err:?}");
            assert!(
                contents(dir.path()) == before,
                "{name}: the directory changed"
            );
        }
    }
}

#[test]
fn a_second_handle_in_the_same_process_is_refused_as_locked() {
    let dir = TempDir::new("lock");
    let _held = open(&dir);
    let err = Store::open_existing(dir.path(), StoreOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Locked { .. }), "{err:?}");
}
