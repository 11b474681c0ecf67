"""The grouped LoRA on experts stored transposed with biases (GPT-OSS), beside Qwen3-MoE's layout: under EP2 and
ETP2 every adapter gradient of one step equals one process's (real gloo ranks)."""

from __future__ import annotations

import pytest
import torch

from halo_core.testing.compare import assert_close
from halo_core.testing.spawn import spawn
from lora_gradients import gradients, random_adapter

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)


@pytest.mark.parametrize("layout", [{"ep": 2}, {"etp": 2}], ids=["ep2", "etp2"])
def test_transposed_experts_adapter_gradients_match_one_process(layout, tmp_path):
    adapter = random_adapter("gpt_oss", tmp_path)
    gradients(0, 1, "gpt_oss", {}, adapter, str(tmp_path / "one.pt"))
    spawn(gradients, 2, "gpt_oss", layout, adapter, str(tmp_path / "two.pt"), what=f"gpt_oss LoRA at {layout}")
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert sorted(one) == sorted(two) and any("experts" in k for k in one)
    for name, grad in one.items():
        assert grad.abs().max() > 0, name
        assert_close(two[name], grad, f"{name}'s gradient at {layout}", rtol=1e-5)
