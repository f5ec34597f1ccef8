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

/// Parameter and activation dtype (`model.dtype`: `auto`, `f32` or `bf16`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DtypeChoice {
    /// f32 on CPU, bf16 on CUDA.
    #[default]
    Auto,
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
            "f32" | "float32" => Ok(Self::F32),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            other => Err(format!("unknown dtype {other:?} (auto, f32, bf16)")),
        }
    }
}

impl fmt::Display for DtypeChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
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
    let kind = match (dtype, device) {
        (DtypeChoice::F32, _) | (DtypeChoice::Auto, Device::Cpu) => Kind::Float,
        _ => Kind::BFloat16,
    };
    Ok((device, kind))
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
