"""Non-finite values stop the run (issue 43, item 4): a step's loss or gradient norm, a checkpoint about to be written,
a checkpoint resumed. Real `halo launch` runs on gloo; the faults are injected by honest means where there are any: a
learning rate that overflows float32 (the loss at step 2; or the weights themselves at step 1), NaN written into a real
checkpoint's `exp_avg_sq`. Skipping needs a loss that is non-finite at some steps only, on one rank only, with finite
gradients, which no data does: a test-only method (an `halo.methods` plugin) poisons the loss's value on rank 1."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import PluginSite, run_halo
from halo_core.trainers.parts import nonfinite
from halo_core.trainers.parts.stopping import RunStopped

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

TINY = Path(__file__).resolve().parents[1] / "templates" / "configs" / "tiny-qwen3-moe.yaml"
#: A few steps of the embedded default, a checkpoint at each, none rotated away.
STEPS = ["--per_device_train_batch_size=4", "--logging_steps=1", "--warmup_steps=0", "--lr_scheduler_type=constant",
         "--save_strategy=steps", "--save_steps=1", "--save_total_limit=10"]


def last_line(result) -> str:
    return result.stderr.strip().splitlines()[-1]


def checkpoints(out: Path) -> list[str]:
    return sorted(p.name for p in out.glob("checkpoint-*"))


def finite(folder: Path) -> bool:
    tensors = {**load_file(folder / "model.safetensors"), **load_file(folder / "optimizer" / "exp_avg_sq.safetensors")}
    return all(torch.isfinite(t).all() for t in tensors.values())


# -- a step's loss and gradient norm ---------------------------------------------------------------


def test_a_loss_that_overflows_stops_the_run_at_its_step_with_nothing_of_it_written(tmp_path):
    """Learning rate 1e30: step 1 trains (finite loss, weights near 1e30), step 2's forward overflows. Today the run
    trains on, logging loss 0, and saves NaN checkpoints."""
    out = tmp_path / "run"
    result = run_halo("launch", "sft", str(TINY), "--nproc", "2", "--", f"--output_dir={out}", *STEPS, "--max_steps=4",
                      "--learning_rate=1e30", cwd=tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    line = last_line(result)
    assert line.startswith("error: step 2: the loss was nan on rank 0 and the gradient norm was nan; the run stopped"), line
    assert f"the last checkpoint, {out / 'checkpoint-1'}, holds finite values" in line
    assert checkpoints(out) == ["checkpoint-1"] and finite(out / "checkpoint-1")
    assert not (out / "config.json").exists() and not list(out.glob(".tmp*"))  # no final model, nothing staged


def test_non_finite_weights_are_never_written_as_a_checkpoint(tmp_path):
    """Learning rate 1e39 (inf in float32): step 1's loss and gradient norm are finite, its update makes the weights
    non-finite. One process: the launcher runs the trainer itself and prints the same one line."""
    out = tmp_path / "run"
    result = run_halo("launch", "sft", str(TINY), "--nproc", "1", "--", f"--output_dir={out}", *STEPS, "--max_steps=2",
                      "--learning_rate=1e39", "--expert_parallel_size=1", cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    line = last_line(result)
    assert line.startswith("error: step 1: model.embed_tokens.weight holds a non-finite value (rank 0), so checkpoint-1 was not written"), line
    assert checkpoints(out) == [] and not list(out.glob(".tmp*")) and not (out / "config.json").exists()


def trainer(step: int, output_dir: Path):
    model = torch.nn.Linear(2, 2)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    return SimpleNamespace(state=SimpleNamespace(global_step=step), args=SimpleNamespace(output_dir=str(output_dir)), model=model)


def test_stopping_reads_a_step_at_the_next_one_and_before_anything_is_written(tmp_path):
    """Stop mode leaves a step's flags unread (no host wait) until the next step's optimizer step or a save."""
    guard = nonfinite.StepGuard()
    guard.see_loss(torch.tensor(float("inf")))
    guard.see_step(trainer(4, tmp_path), torch.tensor(1.0))  # step 5: not read yet
    with pytest.raises(RunStopped, match=r"^step 5: the loss was inf on rank 0; the run stopped \(max_nonfinite_skips: 0"):
        guard.see_step(trainer(5, tmp_path), torch.tensor(1.0))
    guard.see_loss(torch.tensor(2.0))
    guard.see_step(trainer(7, tmp_path), torch.tensor(float("nan")))
    with pytest.raises(RunStopped, match=r"^step 8: the gradient norm was nan; .* holds no checkpoint yet$"):
        guard.settle(trainer(8, tmp_path))  # what a save calls first


def test_a_checkpoints_first_non_finite_tensor_is_named():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    assert nonfinite.first_nonfinite(model, optimizer) is None
    optimizer.state[model[1].bias]["exp_avg_sq"][0] = float("inf")
    assert nonfinite.first_nonfinite(model, optimizer) == "exp_avg_sq of 1.bias"
    with torch.no_grad():
        model[1].weight[0, 0] = float("nan")
    assert nonfinite.first_nonfinite(model, optimizer) == "1.weight"


# -- skipping (max_nonfinite_skips), and a resume from a checkpoint holding NaN ----------------------------------------

POISONED_METHOD = """
import dataclasses

import torch
import torch.distributed as dist
from trl import SFTConfig

from halo_core.methods.sft import METHOD as SFT, HaloSFTTrainer

#: The steps whose loss is NaN on rank 1 (its value only: the gradients stay finite, so only the loss flag says so).
POISONED = {2, 4}


class PoisonedTrainer(HaloSFTTrainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
        if model.training and self.state.global_step + 1 in POISONED and dist.get_rank() == 1:
            loss = loss + (torch.tensor(float("nan")) - loss.detach())
        return loss


def run(run):
    from halo_core.trainers.runtime import train

    train(run, PoisonedTrainer, SFTConfig)


METHOD = dataclasses.replace(SFT, name="sft-poisoned", run=run, trainer=PoisonedTrainer)
"""


@pytest.fixture(scope="module")
def skipped_run(tmp_path_factory):
    """`max_nonfinite_skips: 1` over a loss that is NaN on rank 1 at steps 2 and 4: step 2 skipped, step 4 stops."""
    root = tmp_path_factory.mktemp("skips")
    site = root / "site"
    site.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        PluginSite(site, patch).add("halo-test-poisoned", textwrap.dedent(POISONED_METHOD), entry="sft-poisoned",
                                    group="halo.methods", attr="METHOD")
        out = root / "run"
        result = run_halo("launch", "sft-poisoned", str(TINY), "--nproc", "2", "--", f"--output_dir={out}", *STEPS,
                          "--max_steps=6", "--learning_rate=3e-3", "--max_nonfinite_skips=1", cwd=root)
    return result, out


def test_a_skipped_step_updates_nothing_and_the_run_stops_past_the_limit(skipped_run):
    result, out = skipped_run
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "step 2: the loss was nan on rank 1; skipped it (no update: 1 of max_nonfinite_skips=1)" in result.stderr
    line = last_line(result)
    assert line.startswith("error: step 4: the loss was nan on rank 1; the run stopped (the second non-finite step, after 1 "
                           "skipped (max_nonfinite_skips=1))"), line
    assert checkpoints(out) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"] and not (out / "config.json").exists()
    one, two, three = (load_file(out / f"checkpoint-{n}" / "model.safetensors") for n in (1, 2, 3))
    assert all(torch.equal(two[name], one[name]) for name in one)  # the skipped step moved no weight, on either rank
    assert any(not torch.equal(three[name], two[name]) for name in two)  # and training went on
    moments = [load_file(out / f"checkpoint-{n}" / "optimizer" / "exp_avg.safetensors") for n in (1, 2)]
    assert all(torch.equal(moments[1][name], moments[0][name]) for name in moments[0])
    history = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())["log_history"]
    assert [entry.get("nonfinite_skips") for entry in history] == [None, 1, 1]
    assert all(entry["loss"] == entry["loss"] for entry in history)  # the skipped step's NaN is not in the logged loss


def test_a_checkpoint_holding_nan_is_refused_before_the_first_step_and_nothing_is_rotated(skipped_run, tmp_path):
    """64 NaN in one expert's `exp_avg_sq` (held by rank 1 alone under ep=2), resumed with `save_total_limit: 2`: today
    the run trains on, every weight turns NaN, and the finite checkpoints are rotated away."""
    out = tmp_path / "run"
    shutil.copytree(skipped_run[1], out)
    path = out / "checkpoint-3" / "optimizer" / "exp_avg_sq.safetensors"
    state = load_file(path)
    state["model.layers.1.mlp.experts.down_proj"][5, 0, :64] = float("nan")
    save_file(state, path)
    (out / "checkpoint-3" / "halo-manifest.json").unlink()  # as an older Halo wrote it (else the changed size is refused first)
    result = run_halo("launch", "sft", str(TINY), "--nproc", "2", "--", f"--output_dir={out}", *STEPS, "--max_steps=6",
                      "--save_total_limit=2", "--resume_from_checkpoint=true", cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert last_line(result) == (f"error: resume_from_checkpoint {out / 'checkpoint-3'}: exp_avg_sq of model.layers.1.mlp.experts.down_proj "
                                 f"holds a non-finite value (read by rank 1); refusing to train from it; resume from an earlier "
                                 f"checkpoint ({out / 'checkpoint-2'})")
    assert checkpoints(out) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"] and not (out / "config.json").exists()
    assert f"resuming from {out / 'checkpoint-3'} (the latest checkpoint in output_dir)" in result.stdout.splitlines()
