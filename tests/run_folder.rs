//! Run folders are owned by one process and remember their config (issue 13): `--fresh`
//! against a live run changes nothing, a typo in `--out` is not a new run, and a run resumes
//! only with the config it started with. Each case runs the `envace` binary as a user would.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use envace::run_folder::RunLock;

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("envace-rf-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("temp dir");
        Self(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn envace(args: &[&str], out: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_envace"))
        .args(args)
        .arg("--out")
        .arg(out)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run envace")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn fresh_against_a_live_run_is_refused_before_anything_changes() {
    let dir = TempDir::new("fresh");
    std::fs::create_dir_all(dir.0.join("db")).unwrap();
    std::fs::write(dir.0.join("db").join("marker"), b"live run").unwrap();
    std::fs::write(dir.0.join("config.toml"), b"# the live run's config\n").unwrap();
    // The live run: this process holds the folder's lock.
    let live = RunLock::acquire(&dir.0).expect("lock");
    for stage in ["demo", "collect", "sft", "train"] {
        let out = envace(&[stage, "--preset", "tiny", "--fresh"], &dir.0);
        assert!(!out.status.success(), "{stage} ran beside a live run");
        assert!(
            stderr(&out).contains("in use by another envace process"),
            "{}",
            stderr(&out)
        );
        assert_eq!(
            std::fs::read(dir.0.join("db").join("marker")).unwrap(),
            b"live run"
        );
        assert_eq!(
            std::fs::read(dir.0.join("config.toml")).unwrap(),
            b"# the live run's config\n",
            "{stage}: a refused process must not write the live run's config"
        );
    }
    drop(live);
}

#[test]
fn a_folder_without_a_run_is_an_error_for_eval_and_is_not_created() {
    let dir = TempDir::new("missing");
    let missing = dir.0.join("no").join("such");
    for args in [
        &["eval", "--variant", "base"][..],
        &["tts-table", "--n", "1"][..],
    ] {
        let out = envace(args, &missing);
        assert!(!out.status.success(), "{args:?}");
        assert!(stderr(&out).contains("no run at"), "{}", stderr(&out));
        assert!(!missing.exists(), "{args:?} created {}", missing.display());
    }
}

#[test]
fn a_run_resumes_only_with_its_own_config() {
    let dir = TempDir::new("config");
    let first = envace(&["collect", "--preset", "tiny"], &dir.0);
    assert!(first.status.success(), "{}", stderr(&first));
    let own = std::fs::read_to_string(dir.0.join("config.toml")).unwrap();
    assert!(own.contains("source = \"tiny\""), "{own}");

    // Another k and learning rate: refused, naming both keys; the folder's config stays.
    let changed = dir.0.with_extension("changed.toml");
    let text = own
        .replacen("k = 2", "k = 8", 1)
        .replacen("lr = 0.00001", "lr = 0.5", 1);
    assert_ne!(text, own);
    std::fs::write(&changed, &text).unwrap();
    let changed_arg = changed.to_str().unwrap();
    let out = envace(&["collect", "--config", changed_arg], &dir.0);
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(e.contains("train.k: 2 → 8"), "{e}");
    assert!(e.contains("train.learner.lr"), "{e}");
    assert!(e.contains("--allow-config-change"), "{e}");
    assert_eq!(
        std::fs::read_to_string(dir.0.join("config.toml")).unwrap(),
        own
    );

    // Without --preset or --config the folder's own config is used: nothing changed.
    let same = envace(&["collect"], &dir.0);
    assert!(same.status.success(), "{}", stderr(&same));
    // More steps extend the run; they are not a change of it.
    let longer = dir.0.with_extension("longer.toml");
    std::fs::write(&longer, own.replacen("steps = 2", "steps = 5", 1)).unwrap();
    let more = envace(&["collect", "--config", longer.to_str().unwrap()], &dir.0);
    assert!(more.status.success(), "{}", stderr(&more));
    std::fs::remove_file(&longer).ok();
    // Asked for explicitly, the change goes through and becomes the folder's config.
    let out = envace(
        &["collect", "--allow-config-change", "--config", changed_arg],
        &dir.0,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("changed config"), "{}", stderr(&out));
    let now = std::fs::read_to_string(dir.0.join("config.toml")).unwrap();
    assert!(now.contains("k = 8"), "{now}");
    std::fs::remove_file(&changed).ok();
}

#[test]
fn budgets_are_validated_after_scaling() {
    let dir = TempDir::new("scale");
    let out = envace(
        &[
            "collect",
            "--preset",
            "tiny",
            "--scale",
            "9223372036854775808",
        ],
        &dir.0,
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--scale"), "{}", stderr(&out));
    let big = dir.0.with_extension("big.toml");
    let text = Command::new(env!("CARGO_BIN_EXE_envace"))
        .args(["config", "--preset", "tiny"])
        .output()
        .expect("config")
        .stdout;
    let text = String::from_utf8(text).unwrap();
    std::fs::write(
        &big,
        text.replacen(
            "act_max_new_tokens = 24",
            "act_max_new_tokens = 100000000",
            1,
        ),
    )
    .unwrap();
    let out = envace(
        &["collect", "--config", big.to_str().unwrap()],
        &dir.0.join("big"),
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("act_max_new_tokens = 100000000"),
        "{}",
        stderr(&out)
    );
    std::fs::remove_file(&big).ok();
    let run = dir.0.join("run");
    let made = envace(&["collect", "--preset", "tiny"], &run);
    assert!(made.status.success(), "{}", stderr(&made));
    let zero = envace(&["eval", "--variant", "base", "--limit", "0"], &run);
    assert!(!zero.status.success());
    assert!(stderr(&zero).contains("0 tasks"), "{}", stderr(&zero));
}

#[test]
fn a_database_with_fewer_steps_than_the_report_is_not_trained_on() {
    let dir = TempDir::new("lost");
    let demo = envace(&["demo", "--preset", "tiny"], &dir.0);
    assert!(demo.status.success(), "{}", stderr(&demo));
    // The database loses its records (here: replaced by a new one with only the seeds).
    std::fs::remove_dir_all(dir.0.join("db")).unwrap();
    let collect = envace(&["collect"], &dir.0);
    assert!(collect.status.success(), "{}", stderr(&collect));
    let steps = |dir: &Path| -> serde_json::Value {
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("report.json")).unwrap()).unwrap();
        report["train"]["steps"].clone()
    };
    let before = steps(&dir.0);
    assert_eq!(before.as_array().map(Vec::len), Some(2));
    let train = envace(&["train"], &dir.0);
    assert!(
        !train.status.success(),
        "trained on a database that lost its steps"
    );
    let e = stderr(&train);
    assert!(
        e.contains("report.json has 2 training step(s) but the database only 0"),
        "{e}"
    );
    assert_eq!(steps(&dir.0), before, "the report keeps its training steps");
}

/// The tiny preset without periodic evaluation, as a config file beside `dir`.
fn tiny_config(dir: &Path) -> PathBuf {
    let text = Command::new(env!("CARGO_BIN_EXE_envace"))
        .args(["config", "--preset", "tiny"])
        .output()
        .expect("envace config")
        .stdout;
    let text = String::from_utf8(text)
        .unwrap()
        .replacen("eval_every = 1\n", "", 1);
    let path = dir.with_extension("tiny.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The files in `DIR/checkpoints`, sorted.
fn checkpoint_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("checkpoints"))
        .map(|entries| {
            entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn with_crash(args: &[&str], out: &Path, point: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_envace"))
        .args(args)
        .arg("--out")
        .arg(out)
        .env("RUST_LOG", "warn")
        .env(envace::kernels::fault::CRASH_AT, point)
        .output()
        .expect("run envace")
}

#[test]
fn a_crash_during_each_checkpoint_write_resumes_with_complete_files() {
    for point in [
        "checkpoint-file-written",
        "train-weights-saved",
        "train-state-saved",
        "train-committed",
    ] {
        let dir = TempDir::new(point);
        let config = tiny_config(&dir.0);
        let config = config.to_str().unwrap();
        let collect = envace(&["collect", "--config", config], &dir.0);
        assert!(collect.status.success(), "{}", stderr(&collect));
        // No warm-up: training starts from the base weights, and its first step updates them
        // (as in pipeline_tiny), so it saves a checkpoint.
        let crashed = with_crash(&["train"], &dir.0, point);
        assert!(
            !crashed.status.success(),
            "{point}: the crash point was not reached"
        );
        assert!(
            stderr(&crashed).contains("aborting here"),
            "{point}: {}",
            stderr(&crashed)
        );
        let resumed = envace(&["train"], &dir.0);
        assert!(resumed.status.success(), "{point}: {}", stderr(&resumed));
        let files = checkpoint_files(&dir.0);
        assert!(
            files.iter().all(|f| !f.contains(".tmp")),
            "{point}: temporary files left: {files:?}"
        );
        let weights: Vec<&String> = files
            .iter()
            .filter(|f| f.starts_with("envace-step") && !f.ends_with(".learner.safetensors"))
            .collect();
        assert_eq!(weights.len(), 1, "{point}: {files:?}");
        let state = weights[0].replace(".safetensors", ".learner.safetensors");
        assert!(
            files.contains(&state),
            "{point}: no learner state beside {}: {files:?}",
            weights[0]
        );
        let eval = envace(&["eval", "--variant", "envace", "--limit", "1"], &dir.0);
        assert!(eval.status.success(), "{point}: {}", stderr(&eval));
        std::fs::remove_file(config).ok();
    }
}

#[test]
fn a_crash_while_the_warm_up_checkpoint_is_saved_keeps_a_loadable_one() {
    for point in ["checkpoint-file-written", "sft-saved"] {
        let dir = TempDir::new(&format!("sft-{point}"));
        let config = tiny_config(&dir.0);
        let config = config.to_str().unwrap();
        let collect = envace(&["collect", "--config", config], &dir.0);
        assert!(collect.status.success(), "{}", stderr(&collect));
        let crashed = with_crash(&["sft"], &dir.0, point);
        assert!(
            !crashed.status.success(),
            "{point}: the crash point was not reached"
        );
        let again = envace(&["sft"], &dir.0);
        assert!(again.status.success(), "{point}: {}", stderr(&again));
        let files = checkpoint_files(&dir.0);
        assert_eq!(files, ["sft.safetensors"], "{point}");
        let eval = envace(&["eval", "--variant", "sft", "--limit", "1"], &dir.0);
        assert!(eval.status.success(), "{point}: {}", stderr(&eval));
        std::fs::remove_file(config).ok();
    }
}
