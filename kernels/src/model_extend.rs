//! Prefill that extends a cache slot already holding a prefix (prefix-cache hits).

use tch::{Kind, Tensor};

use crate::kv_cache::KvCache;
use crate::model::Model;

impl Model {
    /// Prefills `input_ids: [1, t]` i64 at positions `start..start + t` of cache slot `slot`,
    /// whose positions `0..start` already hold the KV of the preceding tokens (copied from the
    /// prefix cache). Writes every layer's k/v at `start..start + t`; query `j` attends to the
    /// slot's keys `0..=start + j` (causal). Returns the next-token logits of the last token,
    /// `[1, vocab]` f32.
    ///
    /// With `start = 0` this equals [`Model::prefill`] of the same tokens.
    pub fn prefill_extend(
        &self,
        input_ids: &Tensor,
        start: i64,
        slot: i64,
        cache: &mut KvCache,
    ) -> Tensor {
        let t = input_ids.size2().map_or(1, |(_, t)| t);
        let device = self.device();
        let query_pos = Tensor::arange_start(start, start + t, (Kind::Int64, device));
        let (cos, sin) = self.rope.tables(&query_pos.unsqueeze(0));
        let keys = start + t;
        let mask = Tensor::arange(keys, (Kind::Int64, device))
            .view([1, keys])
            .le_tensor(&query_pos.view([t, 1]))
            .view([1, 1, t, keys]);
        let mut x = Tensor::embedding(&self.embed, input_ids, -1, false, false);
        for (i, layer) in self.layers.iter().enumerate() {
            let (q, k, v) = self.attention_inputs(layer, &x, &cos, &sin);
            cache.write_at(i, slot, start, &k, &v);
            let (k_all, v_all) = cache.slot_prefix(i, slot, keys);
            // In the cache's dtype ([`Model::kv_dtype`]).
            let attn = Tensor::scaled_dot_product_attention(
                &q.to_kind(k_all.kind()),
                &k_all,
                &v_all,
                Some(&mask),
                0.0,
                false,
                None,
                true,
            )
            .to_kind(q.kind());
            x = self.layer_output(layer, &x, &attn);
        }
        let last = x.narrow(1, t - 1, 1).squeeze_dim(1);
        self.logits(&self.final_norm(&last))
    }
}

#[cfg(test)]
mod tests {
    use tch::{Device, Kind, Tensor};

    use crate::config::ModelConfig;
    use crate::kv_cache::KvCache;
    use crate::model::Model;

    fn ids(v: &[i64]) -> Tensor {
        Tensor::from_slice(v).view([1, v.len() as i64])
    }

    #[test]
    fn extend_after_a_copied_prefix_matches_a_full_prefill() {
        let _grad = tch::no_grad_guard();
        let config = ModelConfig::tiny();
        let model = Model::random(&config, 7, Device::Cpu, Kind::Float).unwrap();
        let prompt: Vec<i64> = (0..40)
            .map(|i| (i * 37 + 11) % config.vocab_size as i64)
            .collect();
        let n = prompt.len() as i64;
        let zero = Tensor::from_slice(&[0i64]);

        // Reference: one fresh prefill of the whole prompt into slot 0.
        let mut full = KvCache::new(&config, 1, 64, Device::Cpu, Kind::Float);
        let expected = model.prefill(
            &ids(&prompt),
            &zero,
            &Tensor::from_slice(&[n - 1]),
            &mut full,
        );

        // A prefill of the first 25 tokens, copied out and into slot 1 of another cache,
        // then extended by the remaining 15 in two chunks.
        let mut first = KvCache::new(&config, 1, 64, Device::Cpu, Kind::Float);
        let _ = model.prefill(
            &ids(&prompt[..25]),
            &zero,
            &Tensor::from_slice(&[24i64]),
            &mut first,
        );
        let (k, v) = first.read_slot(0, 25);
        assert_eq!(
            k[0].size(),
            vec![
                config.num_key_value_heads as i64,
                25,
                config.head_dim as i64
            ]
        );
        let mut cache = KvCache::new(&config, 2, 64, Device::Cpu, Kind::Float);
        cache.load_slot(1, &k, &v, 20);
        let _ = model.prefill_extend(&ids(&prompt[20..31]), 20, 1, &mut cache);
        let got = model.prefill_extend(&ids(&prompt[31..]), 31, 1, &mut cache);

        assert_eq!(got.size(), vec![1, config.vocab_size as i64]);
        assert_eq!(got.kind(), Kind::Float);
        let diff = (&got - &expected).abs().max().double_value(&[]);
        assert!(diff < 1e-4, "max |Δlogit| = {diff}");
        // The slot's KV equals the fresh prefill's at every position.
        let (k_full, _) = full.read_slot(0, 40);
        let (k_ext, _) = cache.read_slot(1, 40);
        for (a, b) in k_full.iter().zip(&k_ext) {
            let d = (a - b).abs().max().double_value(&[]);
            assert!(d < 1e-4, "max |Δk| = {d}");
        }
        // From position 0 it is a plain prefill.
        let mut fresh = KvCache::new(&config, 1, 64, Device::Cpu, Kind::Float);
        let from_zero = model.prefill_extend(&ids(&prompt), 0, 0, &mut fresh);
        let diff = (&from_zero - &expected).abs().max().double_value(&[]);
        assert!(diff < 1e-4, "max |Δlogit| from 0 = {diff}");
    }
}
