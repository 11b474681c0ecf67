"""Refusals of the preference methods' own, before any process starts: one line naming the field, the value
and the fix, checked in process (the exit path, one line and exit 2 under --dry-run, is test_classify's CLI test).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from halo_core.errors import ConfigError
from halo_core.trainers.method import get_method
from halo_core.trainers.run_checks import check_run
from halo_core.trainers.run_config import load_run_config, parse_overrides

CONFIGS = Path(__file__).resolve().parents[1] / "templates" / "configs"


def _check(method: str, overrides: list[str], config: Path | None = None) -> None:
    path = config or CONFIGS / f"tiny-qwen3-moe-{method}.yaml"
    check_run(load_run_config(method, get_method(method).config_class, path, parse_overrides(overrides)))


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
def test_an_impossible_value_is_refused_with_its_field(method, overrides, says):
    with pytest.raises(ConfigError) as caught:
        _check(method, overrides)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def _without_pairs(method: str, folder: Path) -> Path:
    config = (CONFIGS / f"tiny-qwen3-moe-{method}.yaml").read_text().replace("../tiny/", f"{CONFIGS.parent / 'tiny'}/")
    (folder / "run.yaml").write_text(config.replace("preference.jsonl", "arithmetic.jsonl"))
    return folder / "run.yaml"


@pytest.mark.parametrize("method", ["dpo", "smpo"])
def test_data_without_the_methods_columns_is_refused(method, tmp_path):
    with pytest.raises(ConfigError) as caught:
        _check(method, [], _without_pairs(method, tmp_path))
    line = str(caught.value)
    assert "arithmetic.jsonl' lacks 'chosen', 'rejected', which method" in line and "['completion', 'prompt']" in line and "columns: {old: new}" in line


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["--lora_r=0"], "lora_r=0 must be a positive integer"),
        (["--lora_dropout=1.5"], "lora_dropout=1.5 must be in [0, 1)"),
        (["--lora_target_modules=[nothing_here]"], "lora_target_modules=['nothing_here']: Target modules {'nothing_here'} not found"),
        (["--lora_target_modules=[gate_up_proj]"], "lora_target_modules: 'gate_up_proj' is a fused expert parameter, not a module; list it under lora_target_parameters"),
        (["--lora_target_parameters=[mlp.experts.up]"], "lora_target_parameters: 'mlp.experts.up' matches no parameter"),
        (["--lora_target_modules=[lm_head]"], "'lm_head' cannot take an adapter"),
        (["--load_in_4bit=true"], "load_in_4bit: true"),  # no GPU: needs one; on a GPU: QLoRA is not supported yet
        (["--use_dora=true"], "use_dora: true (DoRA) is not supported"),
        (["--experts_implementation=eager"], "experts_implementation='eager': LoRA on fused experts runs in the grouped GEMM"),
        (["--lora_r=3"], "grouped_mm needs rows of a multiple of 16 bytes; choose lora_r a multiple of 4"),
    ],
)
def test_a_lora_run_that_cannot_work_is_refused_with_its_key(overrides, says):
    """TRL's LoRA keys on the embedded LoRA default, checked before any process starts."""
    with pytest.raises(ConfigError) as caught:
        _check("sft", overrides, CONFIGS / "tiny-qwen3-moe-lora.yaml")
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_merge_adapter_without_an_adapter_is_refused():
    with pytest.raises(ConfigError) as caught:
        _check("sft", ["--merge_adapter=true"], CONFIGS / "tiny-qwen3-moe.yaml")
    assert "merge_adapter: true merges a LoRA adapter" in str(caught.value) and "use_peft: true" in str(caught.value)


def test_one_module_name_is_a_name_not_a_regular_expression():
    """TRL's ModelConfig makes ``[q_proj]`` the string ``q_proj``, which PEFT would match as a whole-name regex."""
    from halo_core.lora.settings import lora_config

    assert list(lora_config({"use_peft": True, "lora_target_modules": ["q_proj"]}).target_modules) == ["q_proj"]
    assert lora_config({"use_peft": True, "lora_target_modules": ["all-linear"]}).target_modules == "all-linear"
    _check("sft", ["--lora_target_modules=[q_proj]"], CONFIGS / "tiny-qwen3-moe-lora.yaml")


def test_the_lora_keys_of_a_score_head_method_are_matched_against_its_head():
    """reward's model has a score head, no lm_head: modules_to_save naming it is accepted, as PEFT's SEQ_CLS."""
    _check("reward", ["--use_peft=true", "--lora_target_modules=all-linear", "--lora_modules_to_save=[score]"])
