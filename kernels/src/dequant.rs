//! Dequantisation of GGML tensor data to `f32`.
//!
//! Supported GGML types (id in parentheses): F32 (0), F16 (1), Q4_0 (2), Q4_1 (3), Q8_0 (8) and
//! BF16 (30). All data is little-endian. The block-quantised types pack 32 consecutive
//! elements per block:
//!
//! * Q4_0, 18 bytes: `f16 d`, `[u8; 16] qs`; `x[j] = ((qs[j] & 0xF) - 8) * d` and
//!   `x[j + 16] = ((qs[j] >> 4) - 8) * d` for `j < 16`;
//! * Q4_1, 20 bytes: `f16 d`, `f16 m`, `[u8; 16] qs`; same nibble layout, `x = q * d + m`;
//! * Q8_0, 34 bytes: `f16 d`, `[i8; 32] qs`; `x[j] = qs[j] * d`.
use half::{bf16, f16};

use crate::error::{Error, Result};

/// GGML type id of `f32` data.
pub const GGML_TYPE_F32: u32 = 0;
/// GGML type id of IEEE half-precision data.
pub const GGML_TYPE_F16: u32 = 1;
/// GGML type id of 4-bit blocks with one scale.
pub const GGML_TYPE_Q4_0: u32 = 2;
/// GGML type id of 4-bit blocks with a scale and a minimum.
pub const GGML_TYPE_Q4_1: u32 = 3;
/// GGML type id of 8-bit blocks with one scale.
pub const GGML_TYPE_Q8_0: u32 = 8;
/// GGML type id of bfloat16 data.
pub const GGML_TYPE_BF16: u32 = 30;

/// Elements per block of the block-quantised types.
const QK: usize = 32;

/// Names of the GGML type ids, indexed by id (`""` marks ids ggml has retired).
const TYPE_NAMES: [&str; 40] = [
    "F32",
    "F16",
    "Q4_0",
    "Q4_1",
    "Q4_2",
    "Q4_3",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "Q8_1",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
    "Q8_K",
    "IQ2_XXS",
    "IQ2_XS",
    "IQ3_XXS",
    "IQ1_S",
    "IQ4_NL",
    "IQ3_S",
    "IQ2_S",
    "IQ4_XS",
    "I8",
    "I16",
    "I32",
    "I64",
    "F64",
    "IQ1_M",
    "BF16",
    "Q4_0_4_4",
    "Q4_0_4_8",
    "Q4_0_8_8",
    "TQ1_0",
    "TQ2_0",
    "IQ4_NL_4_4",
    "IQ4_NL_4_8",
    "IQ4_NL_8_8",
    "MXFP4",
];

/// Human-readable name of a GGML type id with the id itself, e.g. `"Q5_K (13)"`, or
/// `"unknown (99)"` for an id this crate does not know.
pub fn type_name(kind: u32) -> String {
    let name = usize::try_from(kind)
        .ok()
        .and_then(|i| TYPE_NAMES.get(i))
        .copied()
        .unwrap_or("unknown");
    format!("{name} ({kind})")
}

/// Block geometry of a supported GGML type: `(elements per block, bytes per block)`.
///
/// Returns `None` for types [`dequantize`] does not support.
pub fn block_layout(kind: u32) -> Option<(usize, usize)> {
    match kind {
        GGML_TYPE_F32 => Some((1, 4)),
        GGML_TYPE_F16 | GGML_TYPE_BF16 => Some((1, 2)),
        GGML_TYPE_Q4_0 => Some((QK, 2 + QK / 2)),
        GGML_TYPE_Q4_1 => Some((QK, 4 + QK / 2)),
        GGML_TYPE_Q8_0 => Some((QK, 2 + QK)),
        _ => None,
    }
}

/// Size in bytes of `n_elements` elements of a supported GGML type.
///
/// Returns `None` when the type is unsupported, `n_elements` is not a whole number of blocks,
/// or the size overflows `usize`.
pub fn byte_size(kind: u32, n_elements: usize) -> Option<usize> {
    let (block_elems, block_bytes) = block_layout(kind)?;
    if !n_elements.is_multiple_of(block_elems) {
        return None;
    }
    (n_elements / block_elems).checked_mul(block_bytes)
}

/// Dequantises `n_elements` elements of GGML type `kind` from the raw little-endian bytes
/// `data` to `f32`, in storage order.
///
/// `tensor` names the tensor in error messages only.
///
/// # Errors
/// * [`Error::UnsupportedTensorType`] when `kind` is not F32, F16, BF16, Q4_0, Q4_1 or Q8_0
///   (the message names the type, e.g. `Q5_K (13)`);
/// * [`Error::ShapeMismatch`] (shapes given as element counts) when `n_elements` is not a
///   multiple of the block size or `data` does not hold exactly `n_elements` elements.
pub fn dequantize(tensor: &str, kind: u32, data: &[u8], n_elements: usize) -> Result<Vec<f32>> {
    let Some((block_elems, block_bytes)) = block_layout(kind) else {
        return Err(Error::UnsupportedTensorType {
            tensor: tensor.to_string(),
            kind: type_name(kind),
        });
    };
    let held = data.len() / block_bytes * block_elems;
    if byte_size(kind, n_elements) != Some(data.len()) {
        return Err(Error::ShapeMismatch {
            name: format!(
                "{tensor} ({} data of {} bytes)",
                type_name(kind),
                data.len()
            ),
            expected: vec![i64::try_from(n_elements).unwrap_or(i64::MAX)],
            found: vec![i64::try_from(held).unwrap_or(i64::MAX)],
        });
    }
    let mut out = vec![0f32; n_elements];
    match kind {
        GGML_TYPE_F32 => {
            for (o, b) in out.iter_mut().zip(data.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GGML_TYPE_F16 => {
            for (o, b) in out.iter_mut().zip(data.chunks_exact(2)) {
                *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        GGML_TYPE_BF16 => {
            for (o, b) in out.iter_mut().zip(data.chunks_exact(2)) {
                *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        GGML_TYPE_Q4_0 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(data.chunks_exact(block_bytes)) {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                let (lo, hi) = o.split_at_mut(QK / 2);
                for (j, &q) in b[2..].iter().enumerate() {
                    lo[j] = (i32::from(q & 0xF) - 8) as f32 * d;
                    hi[j] = (i32::from(q >> 4) - 8) as f32 * d;
                }
            }
        }
        GGML_TYPE_Q4_1 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(data.chunks_exact(block_bytes)) {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                let m = f16::from_le_bytes([b[2], b[3]]).to_f32();
                let (lo, hi) = o.split_at_mut(QK / 2);
                for (j, &q) in b[4..].iter().enumerate() {
                    lo[j] = f32::from(q & 0xF) * d + m;
                    hi[j] = f32::from(q >> 4) * d + m;
                }
            }
        }
        GGML_TYPE_Q8_0 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(data.chunks_exact(block_bytes)) {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                for (x, &q) in o.iter_mut().zip(&b[2..]) {
                    *x = f32::from(q as i8) * d;
                }
            }
        }
        // `block_layout` returned `Some`, so `kind` is one of the arms above.
        _ => {
            return Err(Error::UnsupportedTensorType {
                tensor: tensor.to_string(),
                kind: type_name(kind),
            })
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_bytes(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    #[test]
    fn f32_values() {
        let vals = [1.5f32, -2.25, 0.0, 3.0e-5];
        let data: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(dequantize("t", 0, &data, 4).unwrap(), vals);
    }

    #[test]
    fn f16_values() {
        // 0x3C00 = 1.0, 0xC000 = -2.0, 0x3555 ≈ 0.333_251_95, 0x7BFF = 65504 (max).
        let data = [0x00, 0x3C, 0x00, 0xC0, 0x55, 0x35, 0xFF, 0x7B];
        let out = dequantize("t", 1, &data, 4).unwrap();
        assert_eq!(out, [1.0, -2.0, 0.333_251_95, 65504.0]);
    }

    #[test]
    fn bf16_values() {
        // bf16 is the top half of an f32: 0x3FC0 = 1.5, 0xC080 = -4.0, 0x3DCD ≈ 0.100_097_656.
        let data = [0xC0, 0x3F, 0x80, 0xC0, 0xCD, 0x3D];
        let out = dequantize("t", 30, &data, 3).unwrap();
        assert_eq!(out, [1.5, -4.0, 0.100_097_656]);
    }

    #[test]
    fn q4_0_block() {
        // d = 0.5; byte j holds low nibble j and high nibble 15 - j.
        let mut block = f16_bytes(0.5).to_vec();
        block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let out = dequantize("t", 2, &block, 32).unwrap();
        for j in 0..16 {
            assert_eq!(out[j], (j as f32 - 8.0) * 0.5, "low nibble {j}");
            assert_eq!(
                out[j + 16],
                ((15 - j) as f32 - 8.0) * 0.5,
                "high nibble {j}"
            );
        }
        assert_eq!(out[0], -4.0);
        assert_eq!(out[15], 3.5);
        assert_eq!(out[16], 3.5);
        assert_eq!(out[31], -4.0);
    }

    #[test]
    fn q4_1_block() {
        // d = 0.25, m = -1.0; byte j = 0x3j: low nibble j, high nibble 3.
        let mut block = f16_bytes(0.25).to_vec();
        block.extend(f16_bytes(-1.0));
        block.extend((0..16u8).map(|j| j | 0x30));
        let out = dequantize("t", 3, &block, 32).unwrap();
        for j in 0..16 {
            assert_eq!(out[j], j as f32 * 0.25 - 1.0);
            assert_eq!(out[j + 16], 3.0 * 0.25 - 1.0);
        }
        assert_eq!(out[0], -1.0);
        assert_eq!(out[15], 2.75);
        assert_eq!(out[16], -0.25);
    }

    #[test]
    fn q8_0_two_blocks() {
        let mut data = Vec::new();
        for (d, sign) in [(0.125f32, 1i32), (2.0, -1)] {
            data.extend(f16_bytes(d));
            data.extend((0..32i32).map(|j| ((j - 16) * sign) as i8 as u8));
        }
        let out = dequantize("t", 8, &data, 64).unwrap();
        assert_eq!(out[0], -2.0); // -16 * 0.125
        assert_eq!(out[31], 1.875); // 15 * 0.125
        assert_eq!(out[32], 32.0); // 16 * 2
        assert_eq!(out[63], -30.0); // -15 * 2
    }

    #[test]
    fn unsupported_type_is_named() {
        let err = dequantize("blk.0.ffn_up.weight", 13, &[0; 176], 256).unwrap_err();
        match &err {
            Error::UnsupportedTensorType { tensor, kind } => {
                assert_eq!(tensor, "blk.0.ffn_up.weight");
                assert_eq!(kind, "Q5_K (13)");
            }
            other => panic!("unexpected error {other:?}"),
        }
        assert!(err.to_string().contains("Q5_K (13)"));
        assert_eq!(type_name(99), "unknown (99)");
    }

    #[test]
    fn wrong_lengths_are_errors() {
        // Too few bytes for one Q8_0 block.
        assert!(matches!(
            dequantize("t", 8, &[0; 33], 32),
            Err(Error::ShapeMismatch { .. })
        ));
        // Element count not a multiple of the block size.
        assert!(matches!(
            dequantize("t", 2, &[0; 18], 31),
            Err(Error::ShapeMismatch { .. })
        ));
        assert_eq!(byte_size(3, 64), Some(40));
        assert_eq!(byte_size(3, 65), None);
        assert_eq!(byte_size(13, 256), None);
    }

    #[test]
    fn large_tensor_is_fast() {
        let n = 30 * 1024 * 1024;
        let data = vec![0x11u8; byte_size(3, n).unwrap()];
        let start = std::time::Instant::now();
        let out = dequantize("t", 3, &data, n).unwrap();
        let elapsed = start.elapsed();
        assert_eq!(out.len(), n);
        println!("Q4_1 dequantisation of {n} elements: {elapsed:?}");
        // Generous bound so that debug builds pass; release takes a few tens of milliseconds.
        assert!(elapsed.as_secs_f64() < 5.0, "took {elapsed:?}");
    }
}
