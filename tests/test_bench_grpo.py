"""bench/grpo_vs_trl.py on the CPU: its variants, the prompts it trains on, the run it hands Halo, the update's figures."""

import importlib
import sys
from pathlib import Path

import pytest
import yaml

BENCH = Path(__file__).resolve().parents[1] / "bench"
TOKENIZER = Path(__file__).resolve().parents[1] / "templates" / "tiny" / "model"


@pytest.fixture(scope="module")
def grpo():
    sys.path.insert(0, str(BENCH))  # the harness imports its sibling modules by name, as when run as a script
    try:
        yield importlib.import_module("grpo_vs_trl")
    finally:
        sys.path.remove(str(BENCH))


def test_variants_are_checked_before_anything_runs(grpo):
    assert not grpo.parse_variant("halo-ep1+compile+nockpt+noreplay")["replay"]
    assert grpo.parse_variant("trl-bf16+nockpt+liger")["liger"]
    for argv in (["--variants", "trl-bf16+noreplay"], ["--variants", "halo-ep1+liger"], ["--variants", "halo-ep2"],
                 ["--batch", "12", "--generations", "8"], ["--steps", "3", "--warmup", "3"]):
        with pytest.raises(SystemExit):
            grpo.parse_args(argv)
    args = grpo.parse_args(["--tiny"])
    assert (args.prompt, args.completion, args.generations, args.seq) == (16, 8, 2, 24)


def test_every_prompt_is_exactly_the_asked_tokens(grpo, tmp_path):
    data = tmp_path / "prompts.jsonl"
    grpo.write_prompts(data, rows=40, tokens=128)
    grpo.check_prompts(data, TOKENIZER, 128)  # the tiny tokenizer's merges (a-t, i-s) never fire
    data.write_text('{"prompt": "what is this"}\n')
    with pytest.raises(SystemExit, match="not 11"):
        grpo.check_prompts(data, TOKENIZER, 11)


def test_a_halo_row_is_a_grpo_run_halo_launch_takes(grpo, tmp_path):
    from sft_halo_row import halo_command

    from halo_core.methods.grpo import HaloGRPOConfig
    from halo_core.trainers.run_config import load_run_config

    args = grpo.parse_args(["--workdir", str(tmp_path)])
    variant = "halo-ep1+compile+nockpt+noreplay"
    spec = grpo.parse_variant(variant)
    fields = {**grpo.grpo_fields(args), "max_length": None, "reward_funcs": [grpo.REWARD], "routing_replay": spec["replay"]}
    grpo.write_prompts(tmp_path / "data.jsonl", rows=2, tokens=8)
    command = halo_command(variant, spec, args, tmp_path, "grpo", fields)
    path = Path(command[command.index("grpo") + 1])
    assert "max_length" not in yaml.safe_load(path.read_text())
    run = load_run_config("grpo", HaloGRPOConfig, path)
    assert run.halo.compile_layers and run.trainer["generation_kwargs"] == {"min_new_tokens": 256}
    assert (run.trainer["routing_replay"], run.trainer["loss_type"], run.trainer["beta"]) == (False, "dapo", 0.0)


def test_the_update_is_each_step_less_its_generation(grpo):
    steps, generation, tokens = [9.0, 3.0, 2.0, 2.5, 2.0], [5.0, 1.0, 1.0, 1.5, 1.5], [60, 60, 60, 60, 60]
    row = grpo.summarise(steps, generation, tokens, warmup=2)
    assert row["steps_timed"] == 3 and row["update_s"] == 1.0 and row["generation_s"] == 1.5
    assert row["update_tokens_per_s"] == 60 and row["tokens_per_step"] == [60]  # median of 60, 60, 120
    with pytest.raises(RuntimeError, match="generations"):
        grpo.summarise(steps, generation[:-1], tokens, warmup=2)


def test_the_reward_differs_within_a_group(grpo):
    assert grpo.reward(None, None, [[2, 4, 5], [1, 3, 5], []]) == [2 / 3, 0.0, 0.0]
