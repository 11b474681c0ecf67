"""Optimizer state saved on one layout loads on another: saving it again there gives back the same files."""

import json

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from halo_core import ParallelConfig, from_pretrained
from halo_core.parallel.loading import CheckpointError
from halo_core.parallel.optimizer_state import load_optimizer, save_optimizer
from halo_core.testing.spawn import spawn
from halo_core.tiny import tiny_model

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

SAVED_WITH = {"ep": 2}  # on two ranks: experts split, everything else FSDP-sharded


def adamw(model, no_decay_first=False):
    """Two groups told apart by name (biases and norms undecayed), in either order."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1, "lr": 1e-2}, {"params": other, "weight_decay": 0.0, "lr": 2e-2}]
    return torch.optim.AdamW(groups[::-1] if no_decay_first else groups)


def train_steps(model, optimizer, seed, steps=2):
    ids = torch.randint(0, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(seed))
    for _ in range(steps):
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def _save_on_one_layout_then_resave_on_another(rank, world, folder, other):
    reference = tiny_model("qwen3_moe", seed=5)
    if rank == 0:
        reference.save_pretrained(f"{folder}/model")
    dist.barrier()
    model = from_pretrained(f"{folder}/model", ParallelConfig(**SAVED_WITH))
    optimizer = adamw(model)
    train_steps(model, optimizer, seed=rank)
    save_optimizer(model, optimizer, f"{folder}/saved")
    dist.barrier()
    model = from_pretrained(f"{folder}/model", ParallelConfig(**other))
    optimizer = adamw(model, no_decay_first=True)
    load_optimizer(model, optimizer, f"{folder}/saved")
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.0, 0.1] and optimizer.param_groups[0]["lr"] == 2e-2
    save_optimizer(model, optimizer, f"{folder}/again")


def assert_same_files(saved, again):
    assert json.loads((saved / "optimizer.json").read_text())["scalars"] == json.loads((again / "optimizer.json").read_text())["scalars"]
    for path in sorted(saved.glob("*.safetensors")):
        expected, actual = load_file(path), load_file(again / path.name)
        assert sorted(actual) == sorted(expected), path.name
        for name, tensor in expected.items():
            assert actual[name].dtype == tensor.dtype and torch.equal(actual[name], tensor), f"{path.stem} of {name}"
    assert {p.name for p in saved.glob("*.safetensors")} == {"exp_avg.safetensors", "exp_avg_sq.safetensors", "step.safetensors"}


@pytest.mark.parametrize("other", [{"etp": 2}, {"tp": 2}], ids=["etp", "tp"])
def test_state_saved_at_ep2_loads_at_another_two_rank_layout(tmp_path, other):
    spawn(_save_on_one_layout_then_resave_on_another, 2, str(tmp_path), other)
    assert_same_files(tmp_path / "saved", tmp_path / "again")


def test_state_saved_at_ep2_loads_in_one_process(tmp_path):
    spawn(_save_on_one_layout_then_resave_on_another, 2, str(tmp_path), {"ep": 2})
    model = from_pretrained(tmp_path / "model", ParallelConfig())
    optimizer = adamw(model)
    load_optimizer(model, optimizer, tmp_path / "saved")
    save_optimizer(model, optimizer, tmp_path / "single")
    assert_same_files(tmp_path / "saved", tmp_path / "single")


def test_a_parameter_the_checkpoint_does_not_hold_is_named(tmp_path):
    model = from_pretrained_tiny(tmp_path)
    optimizer = adamw(model)
    train_steps(model, optimizer, seed=0, steps=1)
    save_optimizer(model, optimizer, tmp_path / "saved")
    manifest = json.loads((tmp_path / "saved" / "optimizer.json").read_text())
    manifest["param_groups"][1]["params"].remove("model.norm.weight")
    (tmp_path / "saved" / "optimizer.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="model.norm.weight is not in the stored optimizer"):
        load_optimizer(model, adamw(model), tmp_path / "saved")


def from_pretrained_tiny(tmp_path):
    tiny_model("qwen3_moe", seed=5).save_pretrained(tmp_path / "model")
    return from_pretrained(tmp_path / "model", ParallelConfig())
