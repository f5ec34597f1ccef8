//! How far a measured rate is from the machine's limit: the model's FLOPs per token and this
//! machine's GEMM rate, measured in the same process and dtype.
//!
//! FLOPs count multiply-adds as two, the convention of the PaLM appendix B MFU formula: a
//! forward costs `2·P` per token for the `P` weights of the matmuls it runs, plus `4·d·c` per
//! token and layer for attention over `c` keys (`QKᵀ` and `AV`, `d` = heads × head dim); a
//! training step (forward and backward) costs three forwards. Norms, RoPE, SiLU and softmax are
//! not counted, so utilisation is slightly understated.

use std::time::Instant;

use tch::{Device, Kind, Tensor};

use crate::config::ModelConfig;
use crate::error::Result;

/// FLOPs of one token through the model, from its hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenFlops {
    /// `2 · (q, k, v, o, gate, up, down weights of every layer)`: the decoder layers' matmuls.
    pub layers: f64,
    /// `2 · vocab · hidden`: the vocabulary projection, for a token whose logits are computed.
    pub logits: f64,
    /// `4 · layers · heads · head_dim`: attention per key attended to.
    pub attention_per_key: f64,
}

impl TokenFlops {
    /// The counts of `config`'s model.
    pub fn of(config: &ModelConfig) -> Self {
        let (h, f) = (config.hidden_size as f64, config.intermediate_size as f64);
        let d = (config.num_attention_heads * config.head_dim) as f64;
        let kv = (config.num_key_value_heads * config.head_dim) as f64;
        let layers = config.num_hidden_layers as f64;
        let per_layer = h * (d + 2.0 * kv) + d * h + 3.0 * h * f;
        Self {
            layers: 2.0 * layers * per_layer,
            logits: 2.0 * (config.vocab_size * config.hidden_size) as f64,
            attention_per_key: 4.0 * layers * d,
        }
    }

    /// Forward FLOPs of one token that attends to `keys` keys, with its logits when `logits`.
    pub fn forward(&self, keys: f64, logits: bool) -> f64 {
        self.layers + self.attention_per_key * keys + if logits { self.logits } else { 0.0 }
    }

    /// FLOPs of a causal sequence of `len` tokens, the last `scored` of which get logits:
    /// token `i` attends to `i + 1` keys. Times 3 for training (forward and backward).
    pub fn causal_sequence(&self, len: usize, scored: usize) -> f64 {
        let n = len as f64;
        self.layers * n
            + self.attention_per_key * n * (n + 1.0) / 2.0
            + self.logits * scored.min(len) as f64
    }
}

/// The best GEMM rate of this machine in `dtype` on `device`, FLOP/s: the model's own
/// projection shapes (`[m, hidden] × [hidden, q+k+v]`, `[m, hidden] × [hidden, 2·ffn]`,
/// `[m, ffn] × [ffn, hidden]`, `m` = 2 048 rows) and a square 2 048³ product (8 192³ on
/// CUDA, whose peak small products do not reach), each timed `repeats` times after one
/// warm-up over enough products to take about 50 ms; the fastest of all. About a second on
/// the 2-core CPU machine in f32.
///
/// # Errors
/// [`crate::Error::Torch`] when the tensors cannot be allocated.
pub fn gemm_peak(config: &ModelConfig, device: Device, dtype: Kind, repeats: usize) -> Result<f64> {
    let _guard = tch::no_grad_guard();
    let (h, f) = (config.hidden_size as i64, config.intermediate_size as i64);
    let qkv =
        ((config.num_attention_heads + 2 * config.num_key_value_heads) * config.head_dim) as i64;
    let (m, square) = (2048, if device.is_cuda() { 8192 } else { 2048 });
    let shapes = [
        (m, h, qkv),
        (m, h, 2 * f),
        (m, f, h),
        (square, square, square),
    ];
    let mut best = 0f64;
    for (m, k, n) in shapes {
        // The values do not change a GEMM's speed (none is denormal); ones draw nothing from
        // libtorch's shared random generator.
        let a = Tensor::f_full([m, k], 0.5, (dtype, device))?;
        let b = Tensor::f_full([k, n], 0.5, (dtype, device))?;
        let flops = 2.0 * (m * k * n) as f64;
        let time = |reps: usize| -> Result<f64> {
            sync(device);
            let start = Instant::now();
            for _ in 0..reps {
                let _ = a.f_matmul(&b)?;
            }
            sync(device);
            Ok(start.elapsed().as_secs_f64().max(1e-9))
        };
        // One untimed product (allocation, cuBLAS handles), then one timed to size `reps`.
        time(1)?;
        let once = time(1)?;
        let reps = ((0.05 / once).ceil() as usize).clamp(1, 10_000);
        for _ in 0..repeats.max(1) {
            best = best.max(flops * reps as f64 / time(reps)?);
        }
    }
    Ok(best)
}

fn sync(device: Device) {
    if let Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smollm2_counts_match_its_parameter_count() {
        // SmolLM2-135M: 30 layers, hidden 576, 9 heads of 64, 3 KV heads, ffn 1536, vocab
        // 49 152, tied: 134.5 M parameters, of which 28.3 M embedding and 0.03 M norms.
        let c = ModelConfig {
            architecture: crate::Architecture::Llama,
            vocab_size: 49_152,
            hidden_size: 576,
            intermediate_size: 1536,
            num_hidden_layers: 30,
            num_attention_heads: 9,
            num_key_value_heads: 3,
            head_dim: 64,
            rope_theta: 100_000.0,
            rms_norm_eps: 1e-5,
            tie_word_embeddings: true,
            max_position_embeddings: 8192,
            attention_bias: false,
            qk_norm: false,
        };
        let t = TokenFlops::of(&c);
        // Per layer: q 576·576, k and v 576·192 each, o 576·576, gate/up/down 576·1536 each.
        let per_layer = 576.0 * 576.0 * 2.0 + 576.0 * 192.0 * 2.0 + 3.0 * 576.0 * 1536.0;
        assert_eq!(t.layers, 2.0 * 30.0 * per_layer);
        assert_eq!(t.layers / 2.0, 106_168_320.0, "layer matmul weights");
        assert_eq!(t.logits, 2.0 * 49_152.0 * 576.0);
        assert_eq!(t.attention_per_key, 4.0 * 30.0 * 576.0);
        // A 3-token causal row with 2 scored tokens: 3 layer passes, 1 + 2 + 3 keys, 2 logits.
        assert_eq!(
            t.causal_sequence(3, 2),
            3.0 * t.layers + 6.0 * t.attention_per_key + 2.0 * t.logits
        );
        assert_eq!(
            t.forward(10.0, false),
            t.layers + 10.0 * t.attention_per_key
        );
    }

    #[test]
    fn the_gemm_peak_is_a_plausible_rate() {
        let c = ModelConfig::tiny();
        let peak = gemm_peak(&c, Device::Cpu, Kind::Float, 1).unwrap();
        // Any CPU of this decade does more than 1 GFLOP/s and less than 100 TFLOP/s.
        assert!((1e9..1e14).contains(&peak), "{peak}");
    }
}
