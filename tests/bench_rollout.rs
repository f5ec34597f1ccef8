//! `envace bench rollout` on the tiny preset: one JSON object with every mode's generation and
//! learner costs and the reference-over-inline ratios; the seed replay processes the same
//! trajectories in both protocols, and on whole trajectories (`--all-turns`) the inline
//! protocol's token savings reach the targets (≥ 5× for the learner step, ≥ 3× for
//! generation; at the demo budget of one user turn they are 4.2× and 3.3×). The replay is
//! teacher-forced, so its token counts depend on the tokenizer, prompts and seed data, not on
//! the weights: the tiny model counts what SmolLM2 does. Wall times are only checked to be
//! measured.

use std::process::Command;

use serde_json::Value;

fn envace(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_envace"))
        .args(args)
        .output()
        .expect("run envace")
}

#[test]
fn bench_rollout_reports_both_protocols_and_their_ratios() {
    let dir = std::env::temp_dir().join(format!("envace-bench-rollout-{}", std::process::id()));
    let out = envace(&[
        "bench",
        "rollout",
        "--preset",
        "tiny",
        "--tasks",
        "2",
        "--all-turns",
        "--modes",
        "reference_f32,inline_f32,inline_f32_ckpt",
        "--json",
        "--out",
        dir.to_str().expect("utf-8 temp dir"),
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let modes = &report["modes"];
    let (reference, inline) = (&modes["reference_f32"], &modes["inline_f32"]);
    for (name, m) in [("reference_f32", reference), ("inline_f32", inline)] {
        for phase in ["generation", "learner"] {
            let p = &m[phase];
            for key in ["tokens", "wall_s", "peak_rss_mib", "tokens_per_trajectory"] {
                let v = p[key].as_f64().unwrap_or(-1.0);
                assert!(v > 0.0, "{name}.{phase}.{key} = {v}");
            }
        }
        assert_eq!(m["trajectories"], 2, "{name}: one seed per task");
        assert!(
            m["live"]["trajectories"].as_u64().unwrap_or(0) > 0,
            "{name}"
        );
    }
    // The replay plays the same calls in both protocols.
    for key in ["rows_act", "rows_rehearse"] {
        assert_eq!(reference[key], inline[key], "{key}");
        assert!(reference[key].as_u64().unwrap_or(0) > 0, "{key}");
    }
    // The reference mode is the authors' protocol: no KV reuse.
    assert_eq!(reference["engine"]["prefill_tokens_reused"], 0);
    assert!(
        inline["engine"]["prefill_tokens_reused"]
            .as_u64()
            .unwrap_or(0)
            > 0
    );
    // Rows scored one by one (padded micro-batches cover every row's tokens) vs packed
    // streams (each shared prefix once).
    let tokens = |m: &Value, k: &str| m[k].as_u64().unwrap_or(0);
    assert!(tokens(&reference["learner"], "tokens") >= tokens(reference, "row_tokens"));
    assert!(tokens(&inline["learner"], "tokens") < tokens(inline, "row_tokens"));
    let learner = report["learner_ratio"].as_f64().expect("learner_ratio");
    let generation = report["generation_ratio"]
        .as_f64()
        .expect("generation_ratio");
    assert!(learner >= 5.0, "learner_ratio {learner}");
    assert!(generation >= 3.0, "generation_ratio {generation}");
    let expected = reference["learner"]["tokens_per_trajectory"]
        .as_f64()
        .unwrap_or(0.0)
        / inline["learner"]["tokens_per_trajectory"]
            .as_f64()
            .unwrap_or(1.0);
    assert!((learner - expected).abs() < 1e-9, "{learner} vs {expected}");

    // Activation checkpointing scores the same tokens; its time and memory ratios are reported.
    let ckpt = &modes["inline_f32_ckpt"];
    assert_eq!(ckpt["learner"]["tokens"], inline["learner"]["tokens"]);
    for key in [
        "checkpoint_learner_time_ratio",
        "checkpoint_learner_memory_ratio",
    ] {
        let v = report[key].as_f64().unwrap_or(-1.0);
        assert!(v > 0.0, "{key} = {v}");
    }
    // Utilisation needs the GEMM peak of the same run and the model's FLOPs per token: the
    // tiny model's 2 layers of hidden 64, 4 heads of 16, 2 KV heads, ffn 128 (TokenFlops).
    for (name, m) in [("reference_f32", reference), ("inline_f32", inline)] {
        let peak = m["gemm_peak_flop_s"].as_f64().unwrap_or(0.0);
        assert!(peak > 1e8, "{name}: GEMM peak {peak}");
        // 2 · 2 layers · (64·(64 + 2·32) + 64·64 + 3·64·128) weights.
        assert_eq!(
            m["layer_flops_per_token"].as_f64(),
            Some(147_456.0),
            "{name}"
        );
    }
}

#[test]
fn bench_rollout_rejects_an_unknown_mode() {
    let out = envace(&[
        "bench",
        "rollout",
        "--preset",
        "tiny",
        "--modes",
        "inline_f8",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown mode \"inline_f8\""), "{err}");
}
