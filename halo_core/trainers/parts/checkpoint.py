"""Checkpoints that stay plain Hugging Face whatever the layout, written atomically, with sharded optimizer state.

- Model: ``full_state_dict`` (every rank joins) and ``save_pretrained`` on rank 0 into a
  staging folder, then moved into place; ``config.json`` moves last, so a loader never
  finds a model folder whose weights are half written.
- ``checkpoint-N``: the whole folder (model, optimizer shards, scheduler, RNG, trainer
  state) is written as ``tmp-checkpoint-N`` and renamed when complete. Neither
  transformers' ``get_last_checkpoint`` nor checkpoint rotation matches that name.
- Optimizer: one file per rank (``optimizer.rank{R}.pt``) holding its local shards.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from halo_core.parallel.state_dict import full_state_dict

STAGING_PREFIX = "tmp-"


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def save_model(model, folder: str | Path, processing_class=None) -> None:
    """Every rank calls this; rank 0 writes ``folder`` so that it loads with ``from_pretrained``."""
    state = full_state_dict(model)
    folder = Path(folder)
    if rank() == 0:
        staging = folder.parent / f".{folder.name}.{STAGING_PREFIX}{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        model.save_pretrained(staging, state_dict=state)
        if processing_class is not None:
            processing_class.save_pretrained(staging)
        publish(staging, folder)
    barrier()


def publish(staging: Path, folder: Path) -> None:
    """Move the staged files into ``folder`` (kept if it exists, e.g. a run folder with checkpoints), config last."""
    folder.mkdir(parents=True, exist_ok=True)
    files = sorted(staging.iterdir(), key=lambda p: p.name == "config.json")
    for path in files:
        os.replace(path, folder / path.name)
    staging.rmdir()


def _local(value):
    return value.to_local() if isinstance(value, DTensor) else value


def save_optimizer_shard(optimizer: torch.optim.Optimizer, folder: str | Path) -> None:
    state = optimizer.state_dict()
    state["state"] = {i: {k: _local(v) for k, v in s.items()} for i, s in state["state"].items()}
    torch.save(state, Path(folder) / f"optimizer.rank{rank()}.pt")


def load_optimizer_shard(optimizer: torch.optim.Optimizer, folder: str | Path) -> None:
    path = Path(folder) / f"optimizer.rank{rank()}.pt"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: resume with the same number of processes and layout that wrote {folder}")
    state = torch.load(path, map_location="cpu", weights_only=False)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for index, entries in state["state"].items():
        param = params[index]
        for key, value in entries.items():
            if isinstance(param, DTensor) and torch.is_tensor(value) and value.dim() > 0:
                entries[key] = DTensor.from_local(value.to(param.device), param.device_mesh, param.placements)
    optimizer.load_state_dict(state)


def staged_checkpoint_root(run_dir: str) -> str:
    """Where ``checkpoint-N`` is assembled before its rename: a sibling folder ``tmp-checkpoint-N`` lives in it."""
    return os.path.join(run_dir, f".{STAGING_PREFIX}checkpoints")


def promote_checkpoint(run_dir: str, name: str) -> str:
    """Rename the assembled ``checkpoint-N`` into the run folder (rank 0), after every rank finished writing."""
    barrier()
    staged = os.path.join(staged_checkpoint_root(run_dir), name)
    final = os.path.join(run_dir, name)
    if rank() == 0:
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(staged, final)
        shutil.rmtree(staged_checkpoint_root(run_dir), ignore_errors=True)
    barrier()
    return final
