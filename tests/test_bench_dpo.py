"""bench/dpo_vs_trl.py on the CPU: its command line, the rows it builds and the pairs it trains on (no timing)."""

import importlib
import sys
from pathlib import Path

import pytest
import yaml

BENCH = Path(__file__).resolve().parents[1] / "bench"
TOKENIZER = Path(__file__).resolve().parents[1] / "templates" / "tiny" / "model"


@pytest.fixture(scope="module")
def dpo():
    sys.path.insert(0, str(BENCH))  # the harness imports its sibling modules by name, as when run as a script
    try:
        yield importlib.import_module("dpo_vs_trl")
    finally:
        sys.path.remove(str(BENCH))


def test_precompute_is_a_dpo_option_only(dpo):
    assert dpo.parse("halo-ep1+compile+nockpt+precompute", "dpo")["precompute"]
    assert not dpo.parse("trl-bf16+nockpt", "dpo")["precompute"]
    with pytest.raises(SystemExit, match="unknown variant"):
        dpo.parse("halo-ep1+precompute")  # the SFT harness's rows have no reference


def test_variants_are_checked_before_anything_runs(dpo):
    args = dpo.parse_args(["--variants", "trl-bf16+nockpt", "halo-ep1+compile+nockpt+ab50+precompute", "--repeats", "2"])
    assert (args.seq, args.prompt, args.batch, args.halo_log_every, args.packing) == (4096, 1024, 1, 5, False)
    for argv in (["--variants", "halo-ep1+precomputed"], ["--variants", "trl-bf16+tf-ep"], ["--prompt", "4096"],
                 ["--variants", "halo-ep1+tree.other"]):
        with pytest.raises(SystemExit):
            dpo.parse_args(argv)


def test_a_halo_row_launches_dpo_with_the_rows_settings(dpo, tmp_path):
    from sft_halo_row import halo_command

    args = dpo.parse_args(["--workdir", str(tmp_path)])
    variant = "halo-ep1+compile+nockpt+precompute"
    command = halo_command(variant, dpo.parse(variant, "dpo"), args, tmp_path, "dpo")
    assert command[command.index("launch") + 1] == "dpo"
    run = yaml.safe_load(Path(command[command.index("dpo") + 1]).read_text())
    assert run["precompute_ref_log_probs"] and run["compile_layers"] and not run["gradient_checkpointing"]
    assert (run["max_length"], run["per_device_train_batch_size"], run["logging_steps"]) == (4096, 1, 5)
    from trl import DPOConfig  # every field the harness writes is one DPOConfig takes

    run.pop("compile_layers"), run.pop("expert_parallel_size"), run.pop("random_init"), run.pop("dataset"), run.pop("model_name_or_path")
    assert DPOConfig(**{**run, "use_cpu": True}).precompute_ref_log_probs


def test_every_sequence_is_cut_at_exactly_seq_tokens(dpo, tmp_path):
    data = tmp_path / "pairs.jsonl"
    dpo.write_pairs(data, rows=3, prompt=100, seq=400)
    shape = dpo.check_pairs(data, TOKENIZER, 400)
    assert 80 <= shape["prompt_tokens_min"] <= shape["prompt_tokens_max"] < 400
    dpo.write_pairs(data, rows=1, prompt=100, seq=200)
    with pytest.raises(SystemExit, match="not every sequence"):
        dpo.check_pairs(data, TOKENIZER, 400)


def test_each_row_is_compared_with_the_fastest_stock_row_of_its_reference_mode(dpo):
    rows = [{"variant": v, "tokens_per_s": t} for v, t in (("trl-bf16", 10), ("trl-bf16+nockpt", 20), ("halo-ep1+compile", 30),
                                                            ("trl-bf16+precompute", 40), ("halo-ep1+precompute", 60))]
    rows.append({"variant": "halo-ep1", "error": "out of memory"})
    assert dpo.ratios_to_stock(rows) == {0: 0.5, 1: 1.0, 2: 1.5, 3: 1.0, 4: 1.5}
