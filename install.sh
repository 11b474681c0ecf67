#!/usr/bin/env bash
# Sets up .venv with halo-core, every bundled family plugin (editable) and the test tools.
# Safe to re-run. PYTHON picks the interpreter (3.11+); HALO_TORCH_INDEX an index for torch's CPU wheels.
set -euo pipefail
cd "$(dirname "$0")"
[ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
pip() { .venv/bin/python -m pip "$@"; }
pip install -q --upgrade pip setuptools
# Without an NVIDIA GPU, pin torch's CPU build first so nothing later pulls the multi-GB CUDA build.
if ! command -v nvidia-smi >/dev/null 2>&1; then
  pip install -q "torch==2.13.0" ${HALO_TORCH_INDEX:+--index-url "$HALO_TORCH_INDEX"}
fi
plugins=()
for plugin in plugins/*/; do plugins+=(-e "$plugin"); done
pip install -q --no-build-isolation -e ".[test]" "${plugins[@]}"
