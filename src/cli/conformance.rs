//! `envace conformance`: the embedded model against the HF reference on this machine's device.
use crate::kernels::{load, ModelSource};
use crate::runtime::{DeviceChoice, DtypeChoice};
use anyhow::{bail, Context, Result};
use clap::Args;

/// Options of `envace conformance`.
#[derive(Debug, Args)]
pub struct ConformanceArgs {
    /// `auto` (CUDA when present), `cpu` or `cuda`.
    #[arg(long, default_value = "auto")]
    device: DeviceChoice,
    /// `auto` (f32 on CPU, bf16 on CUDA), `fast` (bf16 where the hardware computes it, else
    /// f32), `f32` or `bf16`.
    #[arg(long, default_value = "auto")]
    dtype: DtypeChoice,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
}

/// Runs the cases; exits non-zero when a bound fails.
pub fn run(args: ConformanceArgs) -> Result<()> {
    let (device, dtype) = crate::runtime::resolve(args.device, args.dtype)?;
    let loaded =
        load(&ModelSource::Embedded, device, dtype).context("loading the embedded model")?;
    let report = crate::conformance::run(&loaded).map_err(anyhow::Error::msg)?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "conformance of the embedded SmolLM2-135M-Instruct with HF transformers (f32 reference), {} {}",
            report.device, report.dtype
        );
        println!(
            "{:<5} {:>6} {:>6} {:>8} {:>10} {:>10} {:>10} {:>10} {:>7} {:>6}",
            "case",
            "ids",
            "top1",
            "top10",
            "logit Δ",
            "L2 rel",
            "TF sum Δ",
            "TF lp Δ",
            "greedy",
            "batch"
        );
        for (i, c) in report.cases.iter().enumerate() {
            println!(
                "{:<5} {:>6} {:>6} {:>8} {:>10.2e} {:>10.2e} {:>10.2e} {:>10.2e} {:>7} {:>6}",
                i,
                c.prompt_ids_equal,
                c.top1_equal,
                format!("{}/10", c.top10_overlap),
                c.logit_abs,
                c.logit_l2_rel,
                c.logprob_sum_abs,
                c.logprob_abs,
                format!("{}/{}", c.greedy_prefix, c.greedy_reference_len),
                c.batching_consistent
            );
        }
        let t = &report.tolerances;
        println!(
            "bounds: top-10 overlap ≥ {}, logit Δ ≤ {:.0e}, L2 rel ≤ {:.0e}, TF sum Δ ≤ {:.0e}, TF lp Δ ≤ {:.0e}, greedy ≥ {} (or all), batching {}",
            t.top10_overlap,
            t.logit_abs,
            t.logit_l2_rel,
            t.logprob_sum_abs,
            t.logprob_abs,
            t.greedy_prefix,
            if t.batching_exact { "exact" } else { "reported" }
        );
    }
    if !report.passed {
        bail!("conformance failed:\n  {}", report.failures.join("\n  "));
    }
    if !args.json {
        println!("passed");
    }
    Ok(())
}
