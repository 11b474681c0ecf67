"""bench/new_family_sweep.py: which model types it sweeps, and one quick row (scaffold, layout read) each way."""

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "new_family_sweep.py"


@pytest.fixture(scope="module")
def sweep():
    spec = importlib.util.spec_from_file_location("new_family_sweep", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["new_family_sweep"] = module
    spec.loader.exec_module(module)
    return module


def test_it_sweeps_the_moe_types_and_not_the_dense_ones(sweep):
    types = sweep.moe_types()
    assert {"qwen3_moe", "mixtral", "dbrx", "qwen2_moe", "jetmoe", "granitemoe"} <= set(types)
    assert not {"llama", "qwen3", "gpt2"} & set(types)


def test_a_quick_row_replaces_the_bundled_plugin_and_reports_the_layout_read(sweep, tmp_path):
    row = sweep.sweep_one("qwen3_moe", tmp_path, quick=True, timeout=60)
    assert row["passed"] and row["read_layout"] and row["replaces"] == "halo-plugin-qwen3-moe", row
    assert (tmp_path / "halo-plugin-sweep-qwen3-moe" / "pyproject.toml").exists()
