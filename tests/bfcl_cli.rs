//! `envace bfcl replay` and `envace bfcl conform` end to end (needs the BFCL data that
//! `make setup` installs under `assets/`).

use std::process::{Command, Output};

fn envace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_envace"))
        .args(args)
        .output()
        .expect("run envace")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn replay_passes_every_task_it_can_run_and_names_the_skipped() {
    let out = envace(&["bfcl", "replay", "--category", "miss_func"]);
    let text = stdout(&out);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = text
        .lines()
        .find(|l| l.starts_with("miss_func: ") && l.contains("tasks pass"))
        .expect("summary line");
    let counts = summary["miss_func: ".len()..].split(' ').next().unwrap();
    let (pass, run) = counts.split_once('/').unwrap();
    assert_eq!(pass, run, "{summary}");
    if !text.contains("skipped") {
        assert_eq!(run, "200");
    }
    let bad = envace(&["bfcl", "replay", "--category", "nope"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown BFCL multi-turn category"));
}

#[test]
fn conform_reports_matches_and_fails_on_a_mismatch() {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/bfcl/conformance_base.jsonl"
    );
    let out = envace(&["bfcl", "conform", "--traces", fixture]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    let last = text.lines().last().unwrap();
    assert!(last.starts_with("calls: "), "{last}");
    let nums: Vec<&str> = last
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .collect();
    assert_eq!(nums.len(), 4, "{last}");
    assert_eq!((nums[0], nums[2]), (nums[1], nums[3]), "{last}");

    // One altered result: exit 1 and the mismatch in full.
    let text = std::fs::read_to_string(fixture).unwrap();
    let altered = text.replacen(
        "Function call exit is not allowed.",
        "Function call exit is allowed.",
        1,
    );
    assert_ne!(altered, text);
    let path = std::env::temp_dir().join(format!("envace-bfcl-cli-{}.jsonl", std::process::id()));
    std::fs::write(&path, altered).unwrap();
    let out = envace(&["bfcl", "conform", "--traces", path.to_str().unwrap()]);
    let _ = std::fs::remove_file(&path);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("MISMATCH "), "{text}");
    assert!(text.contains("want Error during execution: Function call exit is allowed."));
    assert!(text.contains("got  Error during execution: Function call exit is not allowed."));
}
