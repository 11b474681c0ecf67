"""A model's (or an optimizer's) tensors written by every rank at once, each its own part, as Hugging Face files.

``model_job`` writes what ``save_pretrained`` writes for the unwrapped model (its conversion mapping reverted group
by group: ``conversion_save``; weights tied to others and ``_keys_to_ignore_on_save`` left out), ``tensors_job``
tensors under their own names (optimizer state). A job is planned on every rank alike (the files' headers come from
the tensors' whole shapes), then each rank produces its parts one group at a time (``held.part``: its shard, its
block of experts, or a tensor it was given to write) and writes them where they belong (``safetensors_parallel``).
Nothing is gathered but what cannot be written in parts (``held``), one tensor at a time.

``Job.parts()`` runs the collectives (ETP joins, the rare gathers), so every rank walks it in the same order and in
the main thread; ``snapshot=True`` copies each part to host memory as it goes (what an asynchronous save writes
later, while training changes the live tensors), otherwise parts are written as they come and dropped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from halo_core.parallel import held
from halo_core.parallel.conversion_save import SavedGroup, revert, saved_groups, saved_layout
from halo_core.parallel.safetensors_parallel import MAX_FILE_BYTES, FileLayout, nbytes, plan_files, write_part


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


@dataclass
class Write:
    """One part to write: tensor ``key`` of ``file`` from ``offset``, its data on the host."""

    file: str
    key: str
    offset: tuple[int, ...]
    tensor: torch.Tensor


@dataclass
class Job:
    """The files of one save, and this rank's parts of them (a generator: walk it once, on every rank alike)."""

    files: list[FileLayout]
    parts: Callable[[], Iterator[Write]]
    #: Where ``files`` go, relative to the save's folder (``optimizer/`` for optimizer state).
    subfolder: str = ""
    #: Files written whole by rank 0 beside the tensors (an index), name -> bytes.
    extra: dict[str, bytes] = field(default_factory=dict)


def _local_storage(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.untyped_storage().data_ptr()


def _left_out(model: nn.Module, state: dict[str, torch.Tensor]) -> set[str]:
    """What ``save_pretrained`` leaves out: a weight tied to another (one storage, named in ``_tied_weights_keys``),
    and ``_keys_to_ignore_on_save``."""
    tied = getattr(model, "_tied_weights_keys", None) or {}
    out = set(getattr(model, "_keys_to_ignore_on_save", None) or ())
    if isinstance(tied, dict):
        out |= {t for t, s in tied.items() if t in state and s in state and _local_storage(state[t]) == _local_storage(state[s])}
    return out


def model_job(model: nn.Module, state: dict[str, torch.Tensor] | None = None, *, rename: Callable[[str], str] = lambda n: n,
              snapshot: bool = False, max_file_bytes: int = MAX_FILE_BYTES) -> Job:
    """The save of ``state`` (the model's state dict, or a part of it: a LoRA run's base) under the names
    ``save_pretrained`` writes; ``rename`` maps a state name to the unwrapped model's (PEFT's ``base_layer`` out)."""
    state = dict(model.state_dict() if state is None else state)
    for name in _left_out(model, state):
        state.pop(name)
    original = {rename(n): n for n in state}
    groups = saved_groups(model, list(original))
    shapes = {n: held.whole_shape(model, original[n], state[original[n]]) for n in original}
    dtypes = {n: state[original[n]].dtype for n in original}
    layout = saved_layout(model, groups, shapes, dtypes)
    files = plan_files(layout, "model", max_file_bytes)
    file_of = {key: f.name for f in files for key in f.tensors}
    sizes = {g.first: sum(nbytes(shapes[n], dtypes[n]) for n in g.names) for g in groups}
    owner = held.owners(sizes, _world())
    extra = index_file(files)

    def parts() -> Iterator[Write]:
        for group in groups:
            for key, offset, tensor in _group_parts(model, group, state, original, owner[group.first], snapshot):
                yield Write(file_of[key], key, offset, tensor)

    return Job(files, parts, extra=extra)


def index_file(files: list[FileLayout]) -> dict[str, bytes]:
    """``model.safetensors.index.json`` as ``save_pretrained`` writes it where the weights span several files."""
    if len(files) < 2:
        return {}
    import json

    index = {"metadata": {"total_size": sum(f.size - len(f.header) for f in files)},
             "weight_map": {key: f.name for f in files for key in f.tensors}}
    return {"model.safetensors.index.json": (json.dumps(index, indent=2, sort_keys=True) + "\n").encode()}


def _same_layout(model: nn.Module, names: list[str], state: dict) -> bool:
    """Whether ``names`` are split alike (one block of the same rows on each rank), so a group of them converts in blocks."""
    from halo_core.parallel.layout_state import layout_of

    experts = {n in layout_of(model).expert_params for n in names}
    kinds = {(type(state[n]).__name__, tuple(map(repr, state[n].placements)) if isinstance(state[n], DTensor) else ()) for n in names}
    return len(experts) == 1 and len(kinds) == 1


def _group_parts(model, group: SavedGroup, state, original, owner: int, snapshot: bool):
    """(saved key, offset, host tensor) of each part of ``group``'s outputs this rank writes."""
    sources = [original[n] for n in group.names]

    def host(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to("cpu", copy=True) if snapshot or tensor.device.type != "cpu" else tensor

    if group.converter is None and held.chunked(model, sources[0], state[sources[0]]):
        part = held.part(model, sources[0], state[sources[0]], owner)
        if part is not None:
            yield group.first, part.offset, host(part.tensor)
        return
    if group.converter is not None and group.per_expert and all(held.in_rows(model, n, state[n]) for n in sources) and _same_layout(model, sources, state):
        parts = {n: held.part(model, o, state[o], owner) for n, o in zip(group.names, sources)}
        if any(p is None for p in parts.values()):
            return
        first = {p.offset[0] for p in parts.values()}
        if len(first) != 1 or len({p.tensor.shape[0] for p in parts.values()}) != 1:
            raise RuntimeError(f"{group.names}: their blocks of rows differ on rank {_rank()}; they cannot be converted together")
        row = first.pop()
        for key, tensor in revert(group, {n: host(p.tensor) for n, p in parts.items()}, model, first_row=row).items():
            yield key, (0,) * tensor.dim() if group.splits_experts else (row,) + (0,) * (tensor.dim() - 1), tensor
        return
    from halo_core.parallel.state_dict import gather_full  # the rest: whole on the owner, one tensor at a time

    whole = {n: gather_full(model, [(o, state[o])], device="cpu", keep_on=owner).get(o) for n, o in zip(group.names, sources)}
    if _rank() == owner:
        for key, tensor in revert(group, whole, model).items():
            yield key, (0,) * tensor.dim(), tensor


def tensors_job(model: nn.Module, named: list[tuple[str, torch.Tensor]], file: str, *, snapshot: bool = False) -> Job:
    """``named`` (each shaped and sharded like the parameter of its name: optimizer state) into one file under those
    names; a 0-dim entry is the same on every rank and written by rank 0."""
    shapes = {n: held.whole_shape(model, n, t) if t.dim() else () for n, t in named}
    layout = {n: (shapes[n], t.dtype) for n, t in named}
    files = plan_files(layout, single=file, max_bytes=2**63)
    sizes = {n: nbytes(shapes[n], t.dtype) for n, t in named}
    owner = held.owners(sizes, _world())

    def parts() -> Iterator[Write]:
        for name, tensor in named:
            if not tensor.dim():
                part = held.Part((), tensor.detach()) if _rank() == 0 else None
            else:
                part = held.part(model, name, tensor, owner[name])
            if part is not None:
                data = part.tensor.to("cpu", copy=True) if snapshot or part.tensor.device.type != "cpu" else part.tensor
                yield Write(file, name, part.offset, data)

    return Job(files, parts)


def write(job: Job, folder: Path, writes: Iterator[Write] | list[Write] | None = None) -> list[list]:
    """Write ``job``'s files into ``folder`` (every rank: its headers, a share of the files, and its parts); returns
    the records of the parts written (``[file, key, offset, shape, crc, rank]``). ``writes``: parts already taken
    (a snapshot), else the job's generator is walked here."""
    base = Path(folder) / job.subfolder
    base.mkdir(parents=True, exist_ok=True)
    by_name = {f.name: f for f in job.files}
    rank, world = _rank(), _world()
    handles: dict[str, int] = {}

    def handle(name: str) -> int:
        if name not in handles:
            handles[name] = os.open(base / name, os.O_WRONLY | os.O_CREAT, 0o644)
        return handles[name]

    records = []
    try:
        for index, file in enumerate(job.files):
            if index % world == rank:
                os.pwrite(handle(file.name), file.header, 0)
        for write_ in (job.parts() if writes is None else writes):
            crc = write_part(handle(write_.file), by_name[write_.file], write_.key, write_.offset, write_.tensor.contiguous())
            records.append([os.path.join(job.subfolder, write_.file), write_.key, list(write_.offset), list(write_.tensor.shape), crc, rank])
        for fd in handles.values():
            os.fsync(fd)
    finally:
        for fd in handles.values():
            os.close(fd)
    if rank == 0:
        for name, data in job.extra.items():
            (base / name).write_bytes(data)
    return records
