"""Optimizer state stored whole under the parameters' Hugging Face names, so a checkpoint resumes on any layout.

Not ``torch.distributed.checkpoint``: it reshards DTensors, but under EP a rank's expert
parameters are plain local tensors (or FSDP DTensors over the expert-replica mesh only),
each holding one block of experts under the same name on every EP rank, so DCP cannot
tell where a block belongs. Instead every per-parameter state tensor (``exp_avg``,
``momentum_buffer``, AdamWBF16's buffers, ...) is written at its whole shape, each rank writing
the part it holds exactly as for the weights (``sharded_save``: no state key is ever whole on
one rank), and read back with the weights' slicing (``loading.place``): whatever layout can load
the weights can load their state.

A folder of it holds ``<state key>.safetensors`` (one tensor per parameter name, in the
dtype the optimizer keeps) and ``optimizer.json``: each param group's hyper-parameters with
its parameters' names, so groups are matched by name, not position, and the state that is
not a tensor (AdamWBF16's integer ``step``). Nothing is pickled: reading it runs no code.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from halo_core.parallel.loading import CheckpointError, expert_rows, place

MANIFEST = "optimizer.json"
FORMAT = "halo-optimizer-1"


def _inner(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    return getattr(optimizer, "optimizer", optimizer)  # under Accelerate's AcceleratedOptimizer


def _param_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[int, str]:
    by_id = {id(p): n for n, p in model.named_parameters()}
    names = {}
    for group in optimizer.param_groups:
        for param in group["params"]:
            if id(param) not in by_id:
                raise CheckpointError("the optimizer holds a tensor that is not one of the model's parameters; build it from model.parameters()")
            names[id(param)] = by_id[id(param)]
    return names


def _to_json(value: Any, what: str) -> Any:
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_to_json(v, what) for v in value]
    if torch.is_tensor(value) and value.numel() == 1:
        return value.item()
    raise CheckpointError(f"{what} = {value!r} cannot be stored as JSON; Halo's checkpoints keep tensors and plain numbers only")


def _from_json(value: Any, like: Any) -> Any:
    """The stored value in the type the live optimizer uses for the field (a tuple for betas, a tensor lr)."""
    if isinstance(like, tuple) and isinstance(value, list):
        return tuple(value)
    if torch.is_tensor(like) and not torch.is_tensor(value):
        return torch.tensor(value, dtype=like.dtype, device=like.device)
    return value


def _same_on_every_rank(listing: list) -> None:
    """Every rank must join the same tensors in the same order (each join is a collective)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, listing)
    for rank, other in enumerate(everyone):
        if other != listing:
            extra = sorted(set(map(tuple, other)) ^ set(map(tuple, listing)))[:3]
            raise CheckpointError(f"optimizer state differs between ranks (rank {rank} vs this one: {extra}); it cannot be joined")


def optimizer_jobs(model: nn.Module, optimizer: torch.optim.Optimizer, folder: str | Path, *, snapshot: bool = False) -> list:
    """Every rank calls this: rank 0 writes ``folder/optimizer.json`` now; returns the jobs that write each state key's
    file, every rank its own part (``sharded_save``: no state key is ever whole on one rank)."""
    from halo_core.parallel.sharded_save import tensors_job

    optimizer = _inner(optimizer)
    names = _param_names(model, optimizer)
    tensors: dict[str, list[tuple[str, torch.Tensor]]] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for group in optimizer.param_groups:
        for param in group["params"]:
            name = names[id(param)]
            for key, value in optimizer.state.get(param, {}).items():
                if not torch.is_tensor(value):
                    scalars.setdefault(name, {})[key] = _to_json(value, f"optimizer state {key} of {name}")
                elif value.dim() > 0 and value.shape != param.shape:
                    raise CheckpointError(
                        f"optimizer state {key} of {name} has shape {tuple(value.shape)}, not the parameter's {tuple(param.shape)}; "
                        f"Halo stores element-wise optimizer state only (AdamW, SGD, AdamWBF16)"
                    )
                else:
                    tensors.setdefault(key, []).append((name, value))
    _same_on_every_rank(sorted([key, name] for key, entries in tensors.items() for name, _ in entries))
    folder = Path(folder)
    if not dist.is_initialized() or dist.get_rank() == 0:
        folder.mkdir(parents=True, exist_ok=True)
        groups = [
            {**{k: _to_json(v, f"param group field {k}") for k, v in group.items() if k != "params"}, "params": [names[id(p)] for p in group["params"]]}
            for group in optimizer.param_groups
        ]
        manifest = {"format": FORMAT, "tensors": sorted(tensors), "scalars": scalars, "param_groups": groups}
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))
    jobs = []
    for key in sorted(tensors):
        job = tensors_job(model, tensors[key], f"{key}.safetensors", snapshot=snapshot)
        job.subfolder = folder.name
        jobs.append(job)
    return jobs


@torch.no_grad()
def save_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, folder: str | Path) -> list[list]:
    """Every rank calls this and writes its part of ``folder``; returns the records of the parts it wrote."""
    from halo_core.parallel.sharded_save import write

    folder = Path(folder)
    jobs = optimizer_jobs(model, optimizer, folder)
    return [record for job in jobs for record in write(job, folder.parent)]


def _read(model: nn.Module, name: str, param: torch.Tensor, handle, parts: list | None, path: Path) -> torch.Tensor:
    """This rank's part of the stored state of ``name``, laid out like ``param``, in the stored dtype; checked against
    the CRC-32 of each part written (``parts``, from the checkpoint's manifest) where there is one."""
    from halo_core.parallel.safetensors_parallel import CorruptTensor, verify

    piece = handle.get_slice(name)
    rows = expert_rows(model, name) if piece.get_shape() else None
    try:
        if parts is None:
            block = piece[rows[0] : rows[1]] if rows else handle.get_tensor(name)
        else:
            block = verify(name, parts, lambda span: piece[span[0] : span[1]] if span else handle.get_tensor(name), rows)
    except CorruptTensor as exc:
        raise CheckpointError(f"{path}: {exc}; the file is damaged (resume from another checkpoint)") from None
    return place(model, name, param, block) if piece.get_shape() else block


@torch.no_grad()
def load_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, folder: str | Path) -> list[int]:
    """Fill ``optimizer`` (built for the current layout) from ``folder``, whatever layout wrote it; every rank calls this.

    Which parameter belongs to which group comes from ``optimizer`` (layouts may group them
    differently); each group's stored hyper-parameters are found through its parameters' names.
    Returns, for each of ``optimizer``'s groups, the stored group it took them from (for
    per-group lists kept elsewhere, such as a scheduler's ``base_lrs``).
    """
    from halo_core.parallel import manifest as checkpoint_manifest

    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except ValueError as exc:
        raise CheckpointError(f"{folder / MANIFEST} is damaged: not valid JSON ({exc})") from None
    recorded = checkpoint_manifest.read(folder.parent)  # the checkpoint's: each part's CRC-32
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{folder / MANIFEST} is not in the format {FORMAT!r} this Halo reads (it says {manifest.get('format')!r})")
    inner = _inner(optimizer)
    names = _param_names(model, inner)
    stored_group = {name: i for i, group in enumerate(manifest["param_groups"]) for name in group["params"]}
    state, groups, sources, index = {}, [], [], 0
    with contextlib.ExitStack() as stack:
        handles = {}
        for key in manifest["tensors"]:
            try:
                handles[key] = stack.enter_context(safe_open(folder / f"{key}.safetensors", "pt"))
            except Exception as exc:  # safetensors' own error names no file
                raise CheckpointError(f"{folder / key}.safetensors cannot be read ({type(exc).__name__}: {exc}); it is missing, truncated or damaged") from None
        parts = {key: checkpoint_manifest.parts_of(recorded, f"{folder.name}/{key}.safetensors") or {} for key in handles}
        keys = {key: set(handle.keys()) for key, handle in handles.items()}
        for group in inner.param_groups:
            group_names = [names[id(p)] for p in group["params"]]
            lost = next((n for n in group_names if n not in stored_group), None)
            if lost is not None:
                raise CheckpointError(
                    f"{folder}: parameter {lost} is not in the stored optimizer; the checkpoint belongs to another model or setup"
                )
            # Groups may be cut otherwise on this layout (transformers gives each device mesh its own group):
            # what matters is that this group's parameters were stored with one set of hyper-parameters.
            origins = {stored_group[n] for n in group_names}
            if not origins:  # an empty group (transformers' no-decay group when only adapters train): a stored empty one
                empty = [i for i, g in enumerate(manifest["param_groups"]) if not g["params"] and i not in sources]
                origins = {empty[0] if empty else 0}
            stored_hypers = {i: {k: v for k, v in manifest["param_groups"][i].items() if k != "params"} for i in origins}
            stored = next(iter(stored_hypers.values()))
            if any(h != stored for h in stored_hypers.values()):
                raise CheckpointError(
                    f"{folder}: parameters {group_names[0]} and others share a param group here but were stored with different "
                    f"hyper-parameters ({list(stored_hypers.values())[:2]}); build the optimizer with the grouping the run was saved with"
                )
            hyper = {k: _from_json(v, group.get(k)) for k, v in stored.items()}
            sources.append(min(stored_hypers))
            ids = []
            for param, name in zip(group["params"], group_names):
                entry = {key: _read(model, name, param, handles[key], parts[key].get(name) if recorded else None, folder / f"{key}.safetensors")
                         for key in handles if name in keys[key]}
                entry.update(manifest["scalars"].get(name, {}))
                if entry:
                    state[index] = entry
                ids.append(index)
                index += 1
            groups.append({**{k: v for k, v in group.items() if k != "params"}, **hyper, "params": ids})
        optimizer.load_state_dict({"state": state, "param_groups": groups})
    return sources


def written(folder: str | Path) -> bool:
    return (Path(folder) / MANIFEST).is_file()

