"""Checkpoint writes are atomic: a save killed half-way never leaves a folder a loader would take for a model."""

import os

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.trainer_utils import get_last_checkpoint

from halo_core import ParallelConfig, parallelize
from halo_core.parallel.loading import CheckpointError
from halo_core.trainers.parts import checkpoint
from halo_core.tiny import tiny_model


def laid_out():
    return parallelize(tiny_model("qwen3_moe"), ParallelConfig())


def test_a_complete_save_loads(tmp_path):
    model = laid_out()
    checkpoint.save_model(model, tmp_path / "out")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_save_that_dies_while_writing_leaves_no_model(tmp_path, monkeypatch):
    model = laid_out()
    real = type(model).save_pretrained

    def dies_after_weights(self, folder, **kwargs):
        real(self, folder, **kwargs)
        os.remove(os.path.join(folder, "config.json"))  # as if killed before the config was written
        raise KeyboardInterrupt

    monkeypatch.setattr(type(model), "save_pretrained", dies_after_weights)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_model(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_publishing_moves_the_config_last(tmp_path, monkeypatch):
    model = laid_out()
    staging = tmp_path / "staging"
    model.save_pretrained(staging)
    moved = []
    real_replace = os.replace

    def replace_then_die(src, dst):
        moved.append(os.path.basename(src))
        if len(moved) == 2:
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_then_die)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.publish(staging, tmp_path / "out")
    assert "config.json" not in moved
    with pytest.raises((OSError, ValueError), match="config|model_type"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "out")


def test_a_staged_checkpoint_is_invisible_to_resume(tmp_path):
    root = checkpoint.staged_checkpoint_root(str(tmp_path))
    os.makedirs(os.path.join(root, "checkpoint-7"))
    assert get_last_checkpoint(str(tmp_path)) is None
    final = checkpoint.promote_checkpoint(str(tmp_path), "checkpoint-7")
    assert get_last_checkpoint(str(tmp_path)) == final and not os.path.exists(root)


class _MakesMarker:
    """Unpickling this creates the folder ``marker``: what a shared checkpoint could do to the one who loads it."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def plant_pickle(path, marker) -> None:
    torch.save({"state": _MakesMarker(marker)}, path)


def test_a_scheduler_file_that_would_run_code_is_refused(tmp_path):
    scheduler = torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), lambda step: 1.0)
    plant_pickle(tmp_path / "scheduler.pt", tmp_path / "marker")
    with pytest.raises(CheckpointError, match=r"scheduler.pt holds objects that only a full unpickle could build"):
        checkpoint.load_scheduler(scheduler, tmp_path)
    assert not (tmp_path / "marker").exists()


def test_an_older_halos_pickled_optimizer_shards_are_refused(tmp_path):
    model = laid_out()
    plant_pickle(tmp_path / "optimizer.rank0.pt", tmp_path / "marker")
    with pytest.raises(CheckpointError, match="holds its optimizer state as pickles"):
        checkpoint.load_optimizer(model, torch.optim.AdamW(model.parameters()), tmp_path)
    assert not (tmp_path / "marker").exists()


def test_promoting_a_checkpoint_keeps_save_total_limit_of_the_newest_and_the_best(tmp_path):
    for step in (1, 2, 3):
        os.makedirs(tmp_path / f"checkpoint-{step}")
    os.makedirs(os.path.join(checkpoint.staged_checkpoint_root(str(tmp_path)), "checkpoint-4"))
    checkpoint.promote_checkpoint(str(tmp_path), "checkpoint-4", save_total_limit=2, best_model_checkpoint=str(tmp_path / "checkpoint-1"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1", "checkpoint-4"]
    os.makedirs(os.path.join(checkpoint.staged_checkpoint_root(str(tmp_path)), "checkpoint-5"))
    checkpoint.promote_checkpoint(str(tmp_path), "checkpoint-5", save_total_limit=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-5"]
