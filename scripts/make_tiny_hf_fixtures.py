#!/usr/bin/env python3
"""Writes tests/fixtures/tiny-{llama,qwen2,qwen3}/: a tiny random HF checkpoint of each family
(config.json + model.safetensors, seeded) and `expected.json` with HF transformers' float32
logits for fixed input ids. Run once with transformers in the venv (`make bench-deps`); the
outputs are committed so tests need no transformers."""
import json
from pathlib import Path

import torch
from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)

COMMON = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              rms_norm_eps=1e-6, rope_theta=50000.0)
FAMILIES = {
    "llama": (LlamaConfig, LlamaForCausalLM, dict(tie_word_embeddings=True)),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, dict(tie_word_embeddings=False)),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, dict(tie_word_embeddings=False, head_dim=16)),
}
INPUT_IDS = [[1, 5, 9, 17, 33, 2, 64, 80, 11, 3], [7, 7, 40, 95, 0, 12, 13, 14, 60, 61]]

root = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
for name, (config_cls, model_cls, extra) in FAMILIES.items():
    torch.manual_seed(0)
    config = config_cls(**COMMON, **extra)
    model = model_cls(config).eval()
    with torch.no_grad():
        for p in model.parameters():  # non-trivial norms and biases
            p.add_(torch.randn_like(p) * 0.05)
        logits = model(torch.tensor(INPUT_IDS)).logits
    out = root / f"tiny-{name}"
    model.save_pretrained(out, safe_serialization=True)
    for extra_file in ("generation_config.json",):
        (out / extra_file).unlink(missing_ok=True)
    (out / "expected.json").write_text(json.dumps({
        "input_ids": INPUT_IDS,
        "logits": [[[round(v, 6) for v in row] for row in seq] for seq in logits.tolist()],
    }))
    print(name, sum(p.numel() for p in model.parameters()), "parameters ->", out)
