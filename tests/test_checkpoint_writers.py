"""Every rank writes its own part of a checkpoint: nothing is gathered whole onto one rank, the files hold what one
process writes, an asynchronous save writes what the tensors held at the save, and ``checkpoint-N`` appears only
when complete (and is never half deleted)."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from halo_core import ParallelConfig, from_pretrained, parallelize
from halo_core.parallel import manifest
from halo_core.testing.spawn import spawn
from halo_core.tiny import tiny_model
from halo_core.trainers.parts import checkpoint

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

LAYOUTS = {"ep2": {"ep": 2}, "tp2": {"tp": 2}, "etp2": {"etp": 2}, "cp2": {"cp": 2}}


def _adamw_steps(model):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(0, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(dist.get_rank() if dist.is_initialized() else 0))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    return optimizer


def _save_without_gathering(rank, world, folder, layout):
    from torch.distributed.tensor import DTensor

    from halo_core.parallel import held, state_dict

    def refuse(*args, **kwargs):
        raise AssertionError("a whole tensor was gathered for the save")

    model = from_pretrained(f"{folder}/model", ParallelConfig(**layout))
    optimizer = _adamw_steps(model)
    DTensor.full_tensor = state_dict.gather_full = held.gather_full = refuse  # in this rank's process, for the save alone
    checkpoint.save_model(model, Path(folder, "saved"))
    checkpoint.write_jobs(checkpoint.optimizer_jobs(model, optimizer, Path(folder, "state")), Path(folder, "state"))


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_each_rank_writes_its_part_and_nothing_is_gathered(tmp_path, name):
    """At ep=2, tp=2, etp=2 and cp=2 (the rest FSDP2-sharded): the model's files are transformers' own save of the
    same weights (gathered here afterwards, for the comparison only), and both ranks wrote parts of them."""
    tiny_model("qwen3_moe", seed=5).save_pretrained(tmp_path / "model")
    spawn(_save_without_gathering, 2, str(tmp_path), LAYOUTS[name])
    assert load_file(tmp_path / "saved" / "model.safetensors").keys() == load_file(tmp_path / "model" / "model.safetensors").keys()
    reloaded = from_pretrained(tmp_path / "saved", ParallelConfig())
    transformers_save = tmp_path / "transformers"
    reloaded.save_pretrained(transformers_save)
    assert_same_file(transformers_save / "model.safetensors", tmp_path / "saved" / "model.safetensors")
    for folder, prefix in ((tmp_path / "saved", "model"), (tmp_path / "state", "optimizer/")):
        files = manifest.read(folder)["files"]
        writers = {p[3] for f, e in files.items() for parts in e.get("tensors", {}).values() for p in parts}
        assert writers == {0, 1}, f"{folder}: written by {writers}"


def assert_same_file(expected: Path, actual: Path) -> None:
    want, got = load_file(expected), load_file(actual)
    assert want.keys() == got.keys()
    for key, tensor in want.items():
        assert got[key].dtype == tensor.dtype and torch.equal(got[key], tensor), key


def test_an_asynchronous_checkpoint_holds_the_tensors_of_its_step_and_appears_complete(tmp_path, monkeypatch):
    """The thread writes from host copies taken at the save (training changes the live weights meanwhile), and the
    run folder shows ``checkpoint-2`` only once its files and manifest are all written."""
    from halo_core.parallel import sharded_save

    model = parallelize(tiny_model("qwen3_moe", seed=1), ParallelConfig())
    optimizer = _adamw_steps(model)
    run = tmp_path / "run"
    staged = Path(checkpoint.staged_checkpoint_root(str(run)), "checkpoint-2")
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    release, real_write = threading.Event(), sharded_save.write_part
    monkeypatch.setattr(sharded_save, "write_part", lambda *a: release.wait() and real_write(*a))
    jobs = checkpoint.model_jobs(model, staged, snapshot=True) + checkpoint.optimizer_jobs(model, optimizer, staged, snapshot=True)
    pending = checkpoint.write_checkpoint(str(run), "checkpoint-2", jobs, asynchronous=True, step=2)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)  # the next step, while the checkpoint is written
    assert not (run / "checkpoint-2").exists()
    release.set()
    pending.wait()
    reference = tmp_path / "reference"
    model.load_state_dict(expected)
    model.save_pretrained(reference)
    assert_same_file(reference / "model.safetensors", run / "checkpoint-2" / "model.safetensors")
    assert manifest.check(run / "checkpoint-2")["step"] == 2 and "optimizer" in manifest.read(run / "checkpoint-2")["holds"]


def test_a_step_saved_again_replaces_its_checkpoint_whole(tmp_path, monkeypatch):
    """The old ``checkpoint-N`` is swapped out in one step; a save killed while deleting it leaves the new one whole
    (before, the old one was deleted first, and a kill then left ``checkpoint-N`` half deleted)."""
    run = tmp_path / "run"
    (run / "checkpoint-3").mkdir(parents=True)
    for name in ("a", "b"):
        (run / "checkpoint-3" / name).write_text("old")
    staged = Path(checkpoint.staged_checkpoint_root(str(run)), "checkpoint-3")
    staged.mkdir(parents=True)
    for name in ("a", "b"):
        (staged / name).write_text("new")

    def killed_while_deleting(path, *args, **kwargs):
        os.remove(Path(path) / "a")
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "rmtree", killed_while_deleting)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.promote_checkpoint(str(run), "checkpoint-3")
    assert sorted(p.name for p in (run / "checkpoint-3").iterdir()) == ["a", "b"]
    assert {(run / "checkpoint-3" / n).read_text() for n in ("a", "b")} == {"new"}
