"""Refusals of the preference methods' own, before any process starts: one line, exit 2, under --dry-run."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_halo

CONFIGS = Path(__file__).resolve().parents[1] / "templates" / "configs"


@pytest.mark.parametrize(
    "method, overrides, says",
    [
        ("dpo", ["--beta=0"], "beta=0 must be above 0"),
        ("dpo", ["--beta=-0.5"], "beta=-0.5 must be above 0"),
        ("smpo", ["--beta=0"], "beta=0 must be above 0"),
        ("smpo", ["--loss_type=softplus"], "loss_type=['softplus'] is refused by SMPOConfig: loss_type must be one of"),
        ("smpo", ["--chosen_sft_ratio=1.5"], "chosen_sft_ratio=1.5 is refused by SMPOConfig"),
    ],
)
def test_an_impossible_value_is_one_line_before_start(method, overrides, says):
    result = run_halo("launch", method, str(CONFIGS / f"tiny-qwen3-moe-{method}.yaml"), "--nproc", "2", "--dry-run", "--", *overrides)
    assert result.returncode == 2, result.stdout + result.stderr
    assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("method", ["dpo", "smpo"])
def test_data_without_the_methods_columns_is_refused_before_start(method, tmp_path):
    config = (CONFIGS / f"tiny-qwen3-moe-{method}.yaml").read_text().replace("../tiny/", f"{CONFIGS.parent / 'tiny'}/")
    (tmp_path / "run.yaml").write_text(config.replace("preference.jsonl", "arithmetic.jsonl"))
    result = run_halo("launch", method, str(tmp_path / "run.yaml"), "--nproc", "2", "--dry-run")
    assert result.returncode == 2, result.stdout + result.stderr
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1
    assert "arithmetic.jsonl' lacks 'chosen', 'rejected', which method" in line and "['completion', 'prompt']" in line and "columns: {old: new}" in line
