//! `envace conformance`: the embedded model against the HF reference through the binary, as
//! the GPU smoke script runs it; here in bf16 on the CPU, whose deviations set its bounds.
use serde_json::Value;

#[test]
fn bf16_conformance_passes_its_documented_bounds_on_the_cpu() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_envace"))
        .args([
            "conformance",
            "--device",
            "cpu",
            "--dtype",
            "bf16",
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
    assert_eq!(report["passed"], true);
    assert_eq!(report["dtype"], "BFloat16");
    assert_eq!(report["device"], "cpu");
    let cases = report["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 3);
    for c in cases {
        assert_eq!(c["prompt_ids_equal"], true);
        assert_eq!(c["top1_equal"], true);
        // bf16 really ran: its logits are off the f32 reference by more than f32 rounding,
        // and within the bound.
        let d = c["logit_abs"].as_f64().unwrap_or(f64::NAN);
        assert!(d > 1e-3 && d <= 1.0, "{c}");
    }
}
