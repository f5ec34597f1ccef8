//! Storage benchmark (a table, not a test): trajectory writes/s and reads/s for realistic
//! records under each flush policy, and bytes on disk per 1,000 trajectories.
//!
//! ```text
//! cargo run --release -p envace-storage --example bench_storage -- [--n 2000] [--dir DIR]
//! ```
//! Records are 8 rows × (384 prompt + 128 completion) tokens with log-probs, plus messages and
//! a verdict. `DIR` (default: the system temp dir) should be on the disk the trainer will use:
//! every-write numbers are fsync numbers.
#[path = "../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::time::Instant;

use envace_storage::{FlushPolicy, Prefix, SampleKey, Store, StoreOptions, Trajectory, HEADER_LEN};

const ROWS: usize = 8;
const PROMPT: usize = 384;
const COMPLETION: usize = 128;

fn record(i: usize) -> Trajectory {
    // 16 tasks × 4 samples per step, as in the reference recipe.
    let step = (i / 64) as u64;
    let task = format!("task-{}", (i % 64) / 4);
    common::trajectory(
        "bench",
        step,
        &task,
        (i % 4) as u32,
        ROWS,
        PROMPT,
        COMPLETION,
    )
}

fn key(t: &Trajectory) -> SampleKey {
    SampleKey {
        run: t.run.clone(),
        step: t.step,
        task: t.task.clone(),
        sample: t.sample,
    }
}

fn dir_bytes(path: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

struct Written {
    per_s: f64,
    sled_bytes: u64,
    file_bytes: u64,
}

/// Writes `records` in batches of `batch` under `flush`; the time includes the final flush.
fn write(dir: &Path, records: &[Trajectory], batch: usize, flush: FlushPolicy) -> Written {
    let _ = std::fs::remove_dir_all(dir);
    let options = StoreOptions {
        flush,
        ..StoreOptions::default()
    };
    let store = Store::open(dir, options).expect("open");
    let start = Instant::now();
    for chunk in records.chunks(batch) {
        store.put_many(chunk).expect("write");
    }
    store.flush().expect("flush");
    let per_s = records.len() as f64 / start.elapsed().as_secs_f64();
    let sled_bytes = store.size_on_disk().expect("size");
    drop(store);
    Written {
        per_s,
        sled_bytes,
        file_bytes: dir_bytes(dir),
    }
}

fn main() {
    let mut n = 2000usize;
    let mut base = std::env::temp_dir();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--n", Some(v)) => n = v.parse().expect("--n takes a count"),
            ("--dir", Some(v)) => base = PathBuf::from(v),
            _ => {
                eprintln!("usage: bench_storage [--n COUNT] [--dir DIR]");
                std::process::exit(2);
            }
        }
    }
    let dir = base.join(format!("envace-bench-storage-{}", std::process::id()));
    let records: Vec<Trajectory> = (0..n).map(record).collect();
    let encoded = {
        let probe = dir.with_extension("probe");
        let _ = std::fs::remove_dir_all(&probe);
        let store = Store::open(&probe, StoreOptions::default()).expect("open");
        store.put(&records[0]).expect("write");
        drop(store);
        let db = sled::Config::new()
            .path(&probe)
            .segment_size(envace_storage::SEGMENT_SIZE)
            .open()
            .expect("open");
        let tree = db.open_tree("rollouts").expect("tree");
        let len = tree
            .get(envace_storage::RecordKey::to_bytes(&key(&records[0])))
            .expect("get")
            .map_or(0, |v| v.len());
        drop(db);
        let _ = std::fs::remove_dir_all(&probe);
        len
    };

    println!(
        "envace storage benchmark: {n} trajectories of {ROWS} rows × ({PROMPT} prompt + \
         {COMPLETION} completion) tokens; {encoded} bytes encoded each ({HEADER_LEN}-byte header)"
    );
    println!("directory: {}\n", dir.display());
    println!("{:<46} {:>14} {:>10}", "case", "trajectories/s", "MiB/s");
    let mib = |per_s: f64| per_s * encoded as f64 / (1024.0 * 1024.0);
    let row = |name: &str, per_s: f64| println!("{name:<46} {per_s:>14.0} {:>10.1}", mib(per_s));

    let single_n = n.min(500);
    let w1 = write(&dir, &records[..single_n], 1, FlushPolicy::EveryWrite);
    row("write, every-write (default), 1 per put", w1.per_s);
    let w64 = write(&dir, &records, 64, FlushPolicy::EveryWrite);
    row("write, every-write (default), 64 per put", w64.per_s);
    let wi = write(&dir, &records, 1, FlushPolicy::IntervalMs(500));
    row("write, interval 500 ms, 1 per put", wi.per_s);

    // Reads on the 64-per-put database, reopened.
    let _ = write(&dir, &records, 64, FlushPolicy::EveryWrite);
    let store = Store::open(&dir, StoreOptions::default()).expect("open");
    let keys: Vec<SampleKey> = records.iter().map(key).collect();
    let mut order: Vec<usize> = (0..n).collect();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for i in (1..n).rev() {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        order.swap(i, (state >> 33) as usize % (i + 1));
    }
    let start = Instant::now();
    let mut rows = 0usize;
    for &i in &order {
        let t = store
            .get::<Trajectory>(&keys[i])
            .expect("read")
            .expect("present");
        rows += t.rows.len();
    }
    row(
        "read, point get (random order)",
        n as f64 / start.elapsed().as_secs_f64(),
    );
    let start = Instant::now();
    let mut scanned = 0usize;
    for item in store.scan::<Trajectory>(&Prefix::all()) {
        scanned += item.expect("read").1.rows.len();
    }
    row(
        "read, scan (key order)",
        n as f64 / start.elapsed().as_secs_f64(),
    );
    assert_eq!(rows, n * ROWS);
    assert_eq!(scanned, n * ROWS);
    drop(store);

    let per_1000 = |b: u64| b as f64 / n as f64 * 1000.0 / (1024.0 * 1024.0);
    println!("\nbytes on disk per 1,000 trajectories (MiB):");
    println!(
        "  encoded values alone                     {:>8.1}",
        per_1000(encoded as u64 * n as u64)
    );
    println!(
        "  every-write, 64 per put                  {:>8.1} (sled size_on_disk), {:>8.1} (files)",
        per_1000(w64.sled_bytes),
        per_1000(w64.file_bytes)
    );
    println!(
        "  interval 500 ms, 1 per put               {:>8.1} (sled size_on_disk), {:>8.1} (files)",
        per_1000(wi.sled_bytes),
        per_1000(wi.file_bytes)
    );
    println!(
        "  every-write, 1 per put ({single_n} written)     {:>8.1} (sled size_on_disk), {:>8.1} (files)",
        w1.sled_bytes as f64 / single_n as f64 * 1000.0 / (1024.0 * 1024.0),
        w1.file_bytes as f64 / single_n as f64 * 1000.0 / (1024.0 * 1024.0)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
