#!/usr/bin/env bash
# Sets up .venv with halo-core, every bundled family plugin (editable) and the test tools.
# Safe to re-run. PYTHON picks the interpreter (3.11+); HALO_TORCH_INDEX an index for torch's CPU wheels.
set -euo pipefail
pip() { "${HALO_VENV_PYTHON:-.venv/bin/python}" -m pip "$@"; }
# Editable installs, quietly. setuptools puts a package whose folder is not a plain `src/` layout (halo-core maps
# templates/ into halo_cli; each plugin names its package) behind an import finder, and says so for each of them in an
# "Editable installation" box (its InformationOnly class, not a deprecation: "folders in your working directory with
# the same name as your package ... may take precedence"). Here those folders are the installed sources themselves,
# so the box tells nothing and would repeat 35 times; the filter drops that message only, any other warning shows.
editable() { PYTHONWARNINGS="ignore:Editable installation" pip install -q --no-build-isolation "$@"; }
! (return 0 2>/dev/null) || return 0  # sourced (tests/test_install.py): the two functions only
cd "$(dirname "$0")"
[ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
pip install -q --upgrade pip setuptools
# Without an NVIDIA GPU, pin torch's CPU build first so nothing later pulls the multi-GB CUDA build.
if ! command -v nvidia-smi >/dev/null 2>&1; then
  pip install -q "torch==2.13.0" ${HALO_TORCH_INDEX:+--index-url "$HALO_TORCH_INDEX"}
fi
plugins=()
for plugin in plugins/*/; do plugins+=(-e "$plugin"); done
editable -e ".[test]" "${plugins[@]}"
