#!/usr/bin/env python3
"""Peer numbers for `envace bench generate`: HF transformers `generate` and PyTorch eager
fwd+bwd on the same GGUF, batches, lengths and prompt ids. Prints one JSON line on stdout:
{"decode_tok_s": {B: tok/s}, "prefill_tok_s": ..., "train_tok_s": ..., "peak_rss_mb": ...}.
Needs transformers and gguf in the venv (`make bench-deps`)."""
import argparse
import json
import resource
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM


def prompt_ids(row, length):
    # Same formula as prompt_ids() in src/cli/bench.rs.
    return [100 + ((row * 7919 + t * 104729) % 40000) for t in range(length)]


def log(msg):
    print(f"[bench_hf] {msg}", file=sys.stderr, flush=True)


def generate_seconds(model, batch, prompt_len, new_tokens):
    ids = torch.tensor([prompt_ids(r, prompt_len) for r in range(batch)])
    mask = torch.ones_like(ids)
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=2,
        )
    seconds = time.perf_counter() - start
    assert out.shape[1] == prompt_len + new_tokens, out.shape
    return seconds


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gguf", required=True)
    p.add_argument("--batch-sizes", default="1,8,32")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--train-batch", type=int, default=8)
    p.add_argument("--train-len", type=int, default=256)
    p.add_argument("--train-steps", type=int, default=3)
    a = p.parse_args()

    gguf = Path(a.gguf)
    log(f"loading {gguf.name} with transformers (float32, eager)")
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    generate_seconds(model, 2, 16, 4)  # warm-up

    res = {"decode_tok_s": {}, "prefill_tok_s": 0.0}
    for b in [int(x) for x in a.batch_sizes.split(",")]:
        log(f"batch {b}, prompt {a.prompt_len}, {a.new_tokens} new tokens")
        prefill = generate_seconds(model, b, a.prompt_len, 1)
        total = generate_seconds(model, b, a.prompt_len, a.new_tokens)
        res["decode_tok_s"][b] = b * (a.new_tokens - 1) / max(total - prefill, 1e-9)
        if b == 8 or res["prefill_tok_s"] == 0.0:
            res["prefill_tok_s"] = b * a.prompt_len / prefill

    log(f"training fwd+bwd {a.train_batch}x{a.train_len}")
    model.train()
    x = torch.tensor([prompt_ids(r, a.train_len) for r in range(a.train_batch)])

    def step():
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        model.zero_grad(set_to_none=True)

    step()
    start = time.perf_counter()
    for _ in range(a.train_steps):
        step()
    res["train_tok_s"] = a.train_batch * a.train_len * a.train_steps / (time.perf_counter() - start)
    res["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps(res))


if __name__ == "__main__":
    main()
