"""The console's log line (``parts/console.py``): GRPO's and SDPG's logs ran past 1,200 characters on one line."""

from __future__ import annotations

import ast
from types import SimpleNamespace

from transformers.trainer_callback import DefaultFlowCallback, PrinterCallback, ProgressCallback

from halo_core.trainers.parts import console

#: The keys a GRPO log holds with two reward functions (TRL's names), the MoE load and the throughput Halo adds.
GRPO_KEYS = ["loss", "grad_norm", "learning_rate", "tokens_per_second_per_device", "moe/load_max", "moe/load_cv", "moe/dead_experts",
             "num_tokens", "completions/mean_length", "completions/min_length", "completions/max_length", "completions/clipped_ratio",
             "completions/mean_terminated_length", "completions/min_terminated_length", "completions/max_terminated_length",
             "rewards/brevity/mean", "rewards/brevity/std", "rewards/number_format/mean", "rewards/number_format/std", "reward",
             "reward_std", "frac_reward_zero_std", "entropy", "clip_ratio/low_mean", "clip_ratio/low_min", "clip_ratio/high_mean",
             "clip_ratio/high_max", "clip_ratio/region_mean", "epoch", "total_flos"]


def test_a_grpo_log_wraps_into_short_lines_and_keeps_every_entry():
    logs = {key: 0.123456789 * (i + 1) for i, key in enumerate(GRPO_KEYS)}
    text = console.console_text(logs)
    lines = text.splitlines()
    assert len(lines) > 4 and max(map(len, lines)) <= console.WIDTH, lines  # one line of about 900 characters before
    shown = ast.literal_eval(text.replace("\n", ""))  # still the dict transformers prints, values as it formats them
    assert shown == {k: f"{v:.4g}" for k, v in logs.items() if k != "total_flos"}
    assert list(logs) == GRPO_KEYS  # the logs themselves are not touched


def test_short_logs_stay_on_one_line():
    assert console.console_text({"loss": 0.5, "epoch": 1}) == "{'loss': '0.5', 'epoch': 1}"


def test_the_stock_printing_callbacks_are_replaced_in_place():
    trainer = SimpleNamespace(callback_handler=SimpleNamespace(callbacks=[DefaultFlowCallback(), ProgressCallback(max_str_len=7), PrinterCallback()]))
    console.install(trainer)
    kinds = [type(c) for c in trainer.callback_handler.callbacks]
    assert kinds == [DefaultFlowCallback, console.WrappedProgress, console.WrappedPrinter]
    assert trainer.callback_handler.callbacks[1].max_str_len == 7
