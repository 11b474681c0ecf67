"""Tokens per second per device and peak memory per device, added to the trainer's logged metrics.

Tokens are counted on the device and read back only when the trainer logs: reading a count
every step would stall the host until the GPU finished the previous step.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import torch


class ThroughputMeter:
    def __init__(self) -> None:
        self.tokens: torch.Tensor | int = 0
        self.since = time.perf_counter()

    def count(self, inputs) -> None:
        # A processor's batch is a BatchFeature (a Mapping, not a dict); raw rows are a list (GRPO builds its batch
        # later and counts it there).
        if not isinstance(inputs, Mapping):
            return
        mask = inputs.get("attention_mask")
        ids = inputs.get("input_ids")
        if mask is not None:
            self.tokens = self.tokens + mask.sum()
        elif ids is not None:
            self.tokens = self.tokens + ids.numel()

    def drain(self, device: torch.device) -> dict[str, float]:
        """Metrics since the last call, then reset."""
        tokens = int(self.tokens)
        now = time.perf_counter()
        metrics = {"tokens_per_second_per_device": round(tokens / max(now - self.since, 1e-9), 1)}
        if device.type == "cuda":
            metrics["peak_memory_gib_per_device"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 3)
        self.tokens, self.since = 0, now
        return metrics
