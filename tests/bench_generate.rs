//! `envace bench generate` on the tiny model: the JSON report carries every rate, the GEMM
//! peak and the utilisation of each rate against it, and the packed-training comparison.
use serde_json::Value;

#[test]
fn bench_generate_reports_rates_utilisation_and_packed_training() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_envace"))
        .args([
            "bench",
            "generate",
            "--model",
            "tiny",
            "--device",
            "cpu",
            "--no-hf",
            "--batch-sizes",
            "1,4",
            "--prompt-len",
            "16",
            "--new-tokens",
            "8",
            "--train-batch",
            "2",
            "--train-len",
            "32",
            "--train-steps",
            "1",
            "--pack-len",
            "600",
            "--row-len",
            "100",
            "--json",
        ])
        .output()
        .expect("envace runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let peak = report["gemm_peak_gflop_s"].as_f64().unwrap_or(0.0);
    assert!(peak > 0.1, "GEMM peak {peak} GFLOP/s");
    let util = &report["utilisation"];
    for u in [
        &util["decode"]["1"],
        &util["decode"]["4"],
        &util["prefill"],
        &util["train"],
    ] {
        let u = u.as_f64().unwrap_or(-1.0);
        // A share of the peak measured in the same run: positive, and not far above 1 (the
        // peak is the best of a few timings, a rate may beat it by timing noise only).
        assert!(u > 0.0 && u < 1.5, "utilisation {u} in {util}");
    }
    let packed = &report["packed_train"];
    // Trunk 200 tokens + four branches of 100, each sharing a prefix of the trunk.
    assert_eq!(packed["pack_len"], 600);
    assert_eq!(packed["row_len"], 100);
    for key in ["pack_tok_s", "rows_tok_s"] {
        assert!(packed[key].as_f64().unwrap_or(0.0) > 0.0, "{key}: {packed}");
    }
}
