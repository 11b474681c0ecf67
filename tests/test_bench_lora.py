"""bench/lora_vs_trl.py on the CPU: its rows, the YAML of a LoRA row, its log parsing and figures, and its check (no timing)."""

import importlib
import json
import math
import sys
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
TINY = ROOT / "templates" / "tiny" / "model" / "config.json"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))  # the harness imports its sibling modules by name, as when run as a script
    try:
        yield importlib.import_module("lora_vs_trl")
    finally:
        sys.path.remove(str(BENCH))


def test_rows_are_checked_before_anything_runs(bench):
    args = bench.parse_args([])
    assert [kind for _, kind, _, _ in args.plan] == ["halo-full", "trl-peft", "halo-lora", "trl-peft", "trl-peft"]
    assert [variant for _, _, variant, _ in args.plan][:3] == ["halo-ep1+compile+nockpt+ab50", "trl-bf16+nockpt", "halo-ep1+compile+nockpt+ab50"]
    assert args.plan[-1][3]["checkpointing"]  # the bare trl-peft row keeps TRL's default checkpointing
    assert (args.seq, args.steps, args.batch, args.halo_log_every) == (4096, 25, 1, 5)
    for rows in (["lora"], ["trl-peft+compile"], ["halo-lora+liger-moe"], ["trl-peft+fsdp"], ["halo-full+compiled"], ["trl-peft+tf-ep"]):
        with pytest.raises(SystemExit):
            bench.parse_args(["--rows", *rows])


def test_a_lora_row_is_a_full_row_plus_trls_lora_keys_which_halo_accepts(bench, tmp_path):
    from sft_halo_row import halo_command
    from sft_workload import prepare
    from trl import SFTConfig

    from halo_core.lora.settings import lora_config
    from halo_core.trainers.run_config import load_run_config

    prepare(tmp_path, TINY, 16, 2, None)
    args = bench.parse_args(["--workdir", str(tmp_path)])
    runs = {}
    for row, kind, _, spec in args.plan[:3:2]:  # halo-full, halo-lora
        command = halo_command(row, spec, args, tmp_path, "sft", bench.lora_fields(kind))
        runs[kind] = yaml.safe_load(Path(command[command.index("sft") + 1]).read_text())
        config = load_run_config("sft", SFTConfig, command[command.index("sft") + 1])  # the launcher's own check of every key
        assert config.halo.compile_layers and config.halo.activation_memory_budget == 0.5
        assert config.trainer["logging_first_step"] and not config.trainer["gradient_checkpointing"]
    attention_only = yaml.safe_load(Path(halo_command("attn", args.plan[0][3], args, tmp_path, "sft", bench.lora_fields("halo-lora-attn"))[-3]).read_text())
    assert "lora_target_parameters" not in attention_only and attention_only["lora_target_modules"] == bench.LORA["lora_target_modules"]
    lora, full = runs["halo-lora"], runs["halo-full"]
    assert {k: v for k, v in lora.items() if k not in bench.LORA} == {**full, "output_dir": lora["output_dir"]}
    assert {k: lora[k] for k in bench.LORA} == bench.LORA
    peft = lora_config(load_run_config("sft", SFTConfig, tmp_path / "halo-lora+compile+nockpt+ab50.yaml").peft)
    assert (peft.r, peft.lora_alpha, sorted(peft.target_modules)) == (16, 32, ["k_proj", "o_proj", "q_proj", "v_proj"])
    assert sorted(peft.target_parameters) == ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"]


def logs(steps, every, first=True):
    """Trainer output as the PrinterCallback writes it: a dict a log, with logging_first_step."""
    logged = sorted({*range(every, steps + 1, every), *([1] if first else [])})
    return "\n".join(["some banner"] + [str({"loss": 10.0 + s, "tokens_per_second_per_device": 1000.0 * s, "peak_memory_gib_per_device": 2.0,
                                             "epoch": 0.1}) for s in logged])


def test_the_first_step_log_gives_the_step_1_loss_and_stays_out_of_the_timing(bench):
    five = bench.halo_logs_result(logs(25, 5), seq=100, batch=1, every=5)
    assert five["losses"] == [11.0, 15.0, 20.0, 25.0, 30.0, 35.0]
    assert five["window_rates"] == [10000, 15000, 20000, 25000]
    assert five["steps_timed"] == 20 and five["tokens_per_s"] == 17500  # windows 6-10 .. 21-25: the median of 10k, 15k, 20k, 25k
    one = bench.halo_logs_result(logs(8, 1), seq=100, batch=1, every=1)
    assert one["losses"][0] == 11.0 and one["steps_timed"] == 3  # steps 6-8
    with pytest.raises(RuntimeError):
        bench.halo_logs_result("no logs", 100, 1, 5)


def test_the_verdict_sets_each_lora_row_against_the_fastest_full_and_stock_rows(bench):
    rows = [{"kind": k, "variant": v, "repeat": r, "tokens_per_s": t, "peak_gib": p, "losses": [11.9301 + d, 11.0]} for k, v, r, t, p, d in (
        ("halo-full", "halo-full+compile", 0, 50_000, 24.0, 0.0), ("halo-lora", "halo-lora+compile", 0, 70_000, 10.0, 1e-4),
        ("halo-lora", "halo-lora+compile", 1, 64_000, 10.5, 0.0), ("trl-peft", "trl-peft+nockpt", 0, 30_000, 40.0, 0.0),
        ("trl-peft", "trl-peft", 0, 20_000, 12.0, 0.0), ("halo-lora", "halo-lora+nockpt", 0, 40_000, 13.0, 0.0))]
    rows.append({"kind": "trl-peft", "variant": "trl-peft+nockpt+liger", "repeat": 0, "error": "timed out"})
    verdict = bench.verdict(rows)
    assert (verdict["full_row"], verdict["stock_row"], verdict["headline"]) == ("halo-full+compile", "trl-peft+nockpt", "halo-lora+compile")
    best, slow = verdict["lora_rows"]["halo-lora+compile"], verdict["lora_rows"]["halo-lora+nockpt"]
    assert best["lora_over_full_speed"] == pytest.approx(67_000 / 50_000) and best["lora_over_full_speed_met"]
    assert best["lora_over_full_memory"] == pytest.approx(10.5 / 24.0) and best["lora_over_full_memory_met"]  # the larger peak of its repeats
    assert best["lora_over_stock_speed"] == pytest.approx(67_000 / 30_000) and best["lora_over_stock_speed_met"]
    assert best["lora_over_each_stock"]["trl-peft"] == pytest.approx(3.35)
    assert not (slow["lora_over_full_speed_met"] or slow["lora_over_full_memory_met"] or slow["lora_over_stock_speed_met"])
    assert verdict["step1_spread"] == pytest.approx(1e-4 / 11.9301) and verdict["losses_finite"]
    rows[0]["losses"] = [math.nan]
    assert not bench.verdict(rows)["losses_finite"]


def test_lora_mfu_counts_no_weight_gradients(bench):
    config = json.loads((BENCH / "configs" / "qwen3-moe-3b.config.json").read_text())
    full, lora = (bench.flops_per_trained_token(kind, config, 4096) for kind in ("halo-full", "halo-lora"))
    attention = full - bench.flops_per_token(config, 0)
    assert (lora - attention) / (full - attention) == pytest.approx(4 / 6)


def test_the_grouped_lora_computes_what_stock_peft_does(bench):
    check = bench.check_lora_against_peft(TINY, "cpu", torch.float32)["lora_vs_peft"]
    assert check["agree"] and check["initial_max_abs_diff"] == 0.0
    assert check["adapters"] == 12  # q, k, v, o (A and B each) and the two fused expert weights of the one layer
    assert check["loss"] < 1e-6 < 1e-3 < check["adapters_shift_loss"] and check["its_error"] < 1e-5
