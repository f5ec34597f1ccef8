//! Device and dtype selection: CUDA when present, else CPU; f32 on CPU, bf16 on CUDA.
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use tch::{Device, Kind};

use crate::kernels::{Error, Result};

/// Where the model runs (`model.device`: `auto`, `cpu` or `cuda`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceChoice {
    /// CUDA device 0 when libtorch sees one, else the CPU.
    #[default]
    Auto,
    Cpu,
    Cuda,
}

/// Parameter and activation dtype (`model.dtype`: `auto`, `fast`, `f32` or `bf16`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DtypeChoice {
    /// f32 on CPU, bf16 on CUDA.
    #[default]
    Auto,
    /// bf16 where the device computes it natively — CUDA, or a CPU with AVX512-BF16 or
    /// AMX-BF16 (x86) or BF16 (Arm) — and f32 elsewhere: the presets' choice, for speed. A CPU
    /// without native bf16 emulates it; torch's bf16 GEMM ran at 1/37 of f32's on such a
    /// machine (an AVX2-only AMD EPYC: 1.2 against 44 GFLOP/s at `[512, 576] × [576, 1536]`).
    Fast,
    #[serde(alias = "float32")]
    F32,
    #[serde(alias = "bfloat16")]
    Bf16,
}

impl FromStr for DeviceChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda),
            other => Err(format!("unknown device {other:?} (auto, cpu, cuda)")),
        }
    }
}

impl FromStr for DtypeChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "fast" => Ok(Self::Fast),
            "f32" | "float32" => Ok(Self::F32),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            other => Err(format!("unknown dtype {other:?} (auto, fast, f32, bf16)")),
        }
    }
}

impl fmt::Display for DtypeChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Fast => "fast",
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
        })
    }
}

/// Resolves the choices against this machine.
///
/// # Errors
/// [`Error::Device`] when CUDA is requested but libtorch sees no CUDA device.
pub fn resolve(device: DeviceChoice, dtype: DtypeChoice) -> Result<(Device, Kind)> {
    let device = match device {
        DeviceChoice::Auto => Device::cuda_if_available(),
        DeviceChoice::Cpu => Device::Cpu,
        DeviceChoice::Cuda if tch::Cuda::is_available() => Device::Cuda(0),
        DeviceChoice::Cuda => {
            return Err(Error::Device(
                "--device cuda: libtorch sees no CUDA device".into(),
            ))
        }
    };
    let native_bf16 = device != Device::Cpu || cpu_has_native_bf16();
    let kind = match (dtype, device) {
        (DtypeChoice::F32, _) | (DtypeChoice::Auto, Device::Cpu) => Kind::Float,
        (DtypeChoice::Fast, _) if !native_bf16 => Kind::Float,
        _ => Kind::BFloat16,
    };
    if kind == Kind::BFloat16 && !native_bf16 {
        tracing::warn!(
            "bf16 on a CPU without native bf16 (no AVX512-BF16, AMX-BF16 or Arm BF16): torch \
             emulates it, tens of times slower than f32; `--dtype fast` picks f32 here"
        );
    }
    Ok((device, kind))
}

/// Whether this machine's CPU computes bf16 natively (Linux: `/proc/cpuinfo`; elsewhere
/// `false`, so `fast` falls back to f32).
pub fn cpu_has_native_bf16() -> bool {
    std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|text| cpuinfo_has_native_bf16(&text))
}

/// Whether a `/proc/cpuinfo` text names a native bf16 unit: the x86 flags `avx512_bf16` or
/// `amx_bf16`, or the Arm feature `bf16`.
pub fn cpuinfo_has_native_bf16(cpuinfo: &str) -> bool {
    cpuinfo
        .lines()
        .filter_map(|line| line.split_once(':'))
        .filter(|(key, _)| matches!(key.trim(), "flags" | "Features"))
        .any(|(_, values)| {
            values
                .split_whitespace()
                .any(|f| matches!(f, "avx512_bf16" | "amx_bf16" | "bf16"))
        })
}

/// Human name of a device, for logs and reports.
pub fn device_name(device: Device) -> String {
    match device {
        Device::Cuda(i) => format!("cuda:{i}"),
        _ => "cpu".to_string(),
    }
}

/// What glibc's allocator is tuned for ([`tune_allocator`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocatorTuning {
    /// Freed blocks stay in the heap for the next step to reuse: the mmap threshold at its
    /// 32 MiB maximum, the heap never trimmed. Without it each activation block of tens of MB
    /// is a fresh `mmap` that the kernel zeroes page by page (10–15 % of a training step
    /// here). The heap keeps every step's high-water mark and fragments: at 4k-token packs
    /// with activation checkpointing, 1.3 GB more peak RSS than the tensors need.
    Speed,
    /// Blocks of 1 MiB and more are mapped and handed back to the kernel when freed, so the
    /// resident set follows the live tensors (peak 2.98 GB against 4.30 GB for one
    /// checkpointed step on a 3.8k-token pack), at the cost of the kernel zeroing them.
    /// What `learner.checkpoint_activations` asks for: memory before time.
    Memory,
}

impl AllocatorTuning {
    /// [`AllocatorTuning::Memory`] when either learner checkpoints activations, else
    /// [`AllocatorTuning::Speed`].
    pub fn for_config(cfg: &crate::config::RunConfig) -> Self {
        if cfg.sft.learner.checkpoint_activations || cfg.train.learner.checkpoint_activations {
            Self::Memory
        } else {
            Self::Speed
        }
    }
}

/// Tunes glibc's allocator for tensor work ([`AllocatorTuning`]); call at start-up, before
/// libtorch or the async runtime start threads (`mallopt` must not race other allocator
/// calls). A later call replaces an earlier one's settings. No effect on other C libraries.
pub fn tune_allocator(tuning: AllocatorTuning) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; called before any other thread runs.
    unsafe {
        match tuning {
            AllocatorTuning::Speed => {
                libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
                libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
            }
            AllocatorTuning::Memory => {
                libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
                // glibc's default: trim the heap's top once 128 KiB of it are free.
                libc::mallopt(libc::M_TRIM_THRESHOLD, 128 << 10);
            }
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = tuning;
}

/// Returns the allocator's free memory to the system (`malloc_trim`), for the end of a stage.
///
/// [`tune_allocator`] keeps freed blocks in the heap so a stage's steps reuse them, but then
/// a stage's peak stays resident after it: the warm-up's activations (GBs at 4k-token packs)
/// would sit in the learner thread's arena while the next evaluation's generation grows in
/// the others. No effect on other C libraries.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns unused pages of the allocator's arenas to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_bf16_is_read_from_the_cpu_flags() {
        let avx2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n";
        let spr = "processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16 amx_tile amx_bf16\n";
        let arm = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n";
        assert!(!cpuinfo_has_native_bf16(avx2));
        assert!(cpuinfo_has_native_bf16(spr));
        assert!(cpuinfo_has_native_bf16(arm));
        // A flag's name elsewhere (the model name) does not count.
        assert!(!cpuinfo_has_native_bf16(
            "model name\t: bf16 box\nflags\t: avx2\n"
        ));
        assert!(!cpuinfo_has_native_bf16(""));
    }

    #[test]
    fn fast_is_bf16_only_where_the_cpu_computes_it() {
        let (_, fast) = resolve(DeviceChoice::Cpu, DtypeChoice::Fast).expect("cpu");
        let native = cpu_has_native_bf16();
        assert_eq!(fast == Kind::BFloat16, native);
        let (_, auto) = resolve(DeviceChoice::Cpu, DtypeChoice::Auto).expect("cpu");
        assert_eq!(auto, Kind::Float);
        let (_, bf16) = resolve(DeviceChoice::Cpu, DtypeChoice::Bf16).expect("cpu");
        assert_eq!(
            bf16,
            Kind::BFloat16,
            "an explicit bf16 is kept, with a warning"
        );
        assert_eq!("fast".parse::<DtypeChoice>(), Ok(DtypeChoice::Fast));
    }
}
