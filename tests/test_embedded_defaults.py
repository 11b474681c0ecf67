"""The bundled configs train the tiny model over two processes (EP2) with their metric moving the right way:
a few steps here, of one method per head (the causal LM's DPO, the score head's reward) and offline GRPO's
learned hedge (each start costs about 13 s of the suite's budget), and the GRPO default's reward rising over its
first 40 steps (about 30 s; SDPG's default poses the same task, checked without a launch). Every bundled config's keys and layout are checked before start in
test_run_checks.test_the_bundled_configs_pass, and each method's trainer runs in its launcher tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_halo
from launch_kit import noise_in

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

CONFIGS = Path(__file__).resolve().parents[1] / "templates" / "configs"
#: method -> (its bundled config, the logged metric, whether it must rise)
METRICS = {"dpo": ("tiny-qwen3-moe-dpo.yaml", "rewards/margins", True), "reward": ("tiny-qwen3-moe-reward.yaml", "accuracy", True),
           "offline-grpo": ("tiny-offline-grpo.yaml", "logps/margin", True)}


@pytest.mark.parametrize("method", sorted(METRICS))
def test_the_embedded_default_moves_its_metric(method, tmp_path):
    out = tmp_path / "run"
    config, key, rises = METRICS[method]
    result = run_halo("launch", method, str(CONFIGS / config), "--nproc", "2", "--", f"--output_dir={out}",
                      "--max_steps=8", "--logging_steps=4", "--save_steps=8", "--warmup_steps=1", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert not noise_in(result.stdout + result.stderr)  # DPO's default printed eight checkpointing FutureWarnings
    state = json.loads((out / "checkpoint-8" / "trainer_state.json").read_text())
    values = [e[key] for e in state["log_history"] if key in e and "train_runtime" not in e]
    assert len(values) == 2 and (values[1] > values[0] if rises else values[1] < values[0]), values
    # every method logs the MoE load of its model at each logging step (``parts/moe_load.py``)
    training = [e for e in state["log_history"] if "loss" in e]
    assert len(training) == 2 and all(0 <= e["moe/dead_experts"] <= 1 and e["moe/load_max"] >= 1 and "moe/load_cv" in e for e in training)
    assert len((out / "moe_load.jsonl").read_text().splitlines()) == 2
    assert (out / "model.safetensors").exists() or any(out.glob("model-*.safetensors"))
    if method == "dpo":  # TRL's card, its base sentence saying what the random-init run started from (not "[None]")
        assert "trained from a random initialisation of the configuration in" in (out / "README.md").read_text()


def test_the_grpo_default_learns_its_reward(tmp_path):
    """The GRPO default must show a user learning, not noise: over its first 40 steps (a third of the default's, where
    `brevity` is learned) the mean reward of the last quarter of logged steps beats the first quarter's by 0.4 (about
    0.2 against 0.9 measured; the full run ends near 2.0)."""
    out = tmp_path / "run"
    result = run_halo("launch", "grpo", str(CONFIGS / "tiny-grpo.yaml"), "--nproc", "2", "--", f"--output_dir={out}",
                      "--max_steps=40", "--logging_steps=5", "--save_steps=40", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert not noise_in(result.stdout + result.stderr)
    state = json.loads((out / "checkpoint-40" / "trainer_state.json").read_text())
    rewards = [e["reward"] for e in state["log_history"] if "reward" in e]
    assert len(rewards) == 8, rewards
    first, last = sum(rewards[:2]) / 2, sum(rewards[-2:]) / 2
    assert last > first + 0.4, rewards


def test_the_sdpg_default_poses_the_grpo_defaults_task():
    """SDPG's default learns as GRPO's does (reward about 0.2 to 2.0 measured, its distillation term small from random
    weights) because it poses the same task with the same sampling and optimiser: held here, so the suite spends one
    launch on the rise, not two."""
    import yaml

    grpo, sdpg = (yaml.safe_load((CONFIGS / name).read_text()) for name in ("tiny-grpo.yaml", "tiny-sdpg.yaml"))
    shared = ["model_name_or_path", "random_init", "dataset", "expert_parallel_size", "reward_funcs", "rollout_engine",
              "num_generations", "max_completion_length", "temperature", "loss_type", "beta", "per_device_train_batch_size",
              "learning_rate", "lr_scheduler_type", "seed"]
    assert {k: sdpg.get(k) for k in shared} == {k: grpo.get(k) for k in shared}
