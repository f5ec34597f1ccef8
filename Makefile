# The two commands a new user needs: `make demo` (the main job) and `make test`.
# Both run the idempotent set-up first (scripts/setup.sh).
SHELL := /bin/bash
VENV := $(CURDIR)/.venv
# torch-sys locates libtorch through the venv's python (LIBTORCH_USE_PYTORCH=1).
export PATH := $(VENV)/bin:$(PATH)
export VIRTUAL_ENV := $(VENV)
export LIBTORCH_USE_PYTORCH := 1
CARGO ?= cargo
ENVACE := target/release/envace

.PHONY: setup build demo test lint bench bench-deps gpu-bundle distclean

setup:
	@scripts/setup.sh

build: setup
	$(CARGO) build --release

# The main job: collect -> eval(base) -> sft -> eval -> train -> eval on BFCL multi_turn_base
# with the embedded SmolLM2-135M, from a fresh run folder; DEMO_ARGS raises budgets, e.g.
# DEMO_ARGS="--scale 4".
DEMO_OUT ?= runs/demo
demo: build
	$(ENVACE) demo --preset smollm2 --out $(DEMO_OUT) --fresh $(DEMO_ARGS)

# One test at a time: each libtorch test already uses both cores.
test: setup
	$(CARGO) test --release --workspace -- --test-threads=1

lint: setup
	$(CARGO) fmt --all --check
	$(CARGO) clippy --release --workspace --all-targets -- -D warnings

# HF transformers + gguf in the same venv, for the peer numbers in `envace bench generate`.
bench-deps: setup
	@python -c "import transformers, gguf, accelerate" 2>/dev/null || pip install --disable-pip-version-check -q "transformers==5.24.0" gguf accelerate

bench: build bench-deps
	$(ENVACE) bench generate

# dist/gpu: envace built against the GPU machines' torch 2.11.0 (a venv of its own, .venv-gpu),
# scripts/gpu-smoke.sh and the assets it needs; run there as `dist/gpu/gpu-smoke.sh OUTDIR`.
gpu-bundle: setup
	@scripts/gpu-bundle.sh

# Removes everything `make setup` installed.
distclean:
	rm -rf assets .venv .venv-gpu dist
