"""Checkpoints that stay plain Hugging Face whatever the layout, written by every rank at once, resumable on any layout.

- Weights: the files ``save_pretrained`` writes for the unwrapped model (its conversion mapping reverted, tied
  weights left out), each rank writing the part it holds (``sharded_save``): nothing is gathered onto one rank and
  the ranks write in parallel. Rank 0 writes the config and the processor. A model folder is written as a staging
  folder beside it and moved in when complete, ``config.json`` last, so a loader never finds a model folder whose
  weights are half written.
- ``checkpoint-N``: the whole folder (model, optimizer state, scheduler, RNG, trainer state) is written as
  ``.tmp-checkpoints/checkpoint-N`` in the run folder and renamed when complete. Neither transformers'
  ``get_last_checkpoint`` nor checkpoint rotation looks there. ``halo-manifest.json`` (``parallel.manifest``: every
  file's size, each written part's CRC-32) is written last, once every rank's parts are there.
- Asynchronous (``async_save``): every rank copies its parts to host memory at the save and a thread writes them
  while training goes on; rank 0's thread writes the manifest and renames the checkpoint once every rank's parts
  are written (``AsyncSave``). The next save, and the end of training, wait for it.
- Optimizer: ``optimizer/``, each state tensor at its whole shape under its parameter's name
  (``halo_core.parallel.optimizer_state``), so a run resumes on another layout.
- Resuming reads nothing that can run code: tensors through safetensors, the rest as JSON
  or ``torch.load(weights_only=True)``.
- ``save_total_limit``: transformers' own rotation, run on the run folder once the new
  checkpoint is in place there (in the staging folder it would see one checkpoint only);
  it never deletes the newest, so a complete checkpoint always remains.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import shutil
import threading
from pathlib import Path

import torch
import torch.distributed as dist
from transformers.trainer_utils import rotate_checkpoints

from halo_core.parallel import manifest, optimizer_state
from halo_core.parallel.conversion import original_classes
from halo_core.parallel.layout_state import layout_of
from halo_core.parallel.loading import CheckpointError
from halo_core.parallel.sharded_save import Job, model_job, write

STAGING_PREFIX = "tmp-"
OPTIMIZER_FOLDER = "optimizer"
SCHEDULER = "scheduler.pt"
#: The weights' files save_pretrained may leave from an earlier save into the same folder.
_WEIGHTS = re.compile(r"model(-\d{5}-of-\d{5})?\.safetensors(\.index\.json)?")


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def model_jobs(model, folder: str | Path, processing_class=None, *, base: bool = False, snapshot: bool = False) -> list[Job]:
    """Every rank calls this. Rank 0 writes what goes beside the weights into ``folder`` now (the config, the
    processor; a LoRA run's adapter files whole, as they are small); returns the weights' jobs, which every rank then
    writes (``sharded_save.write``). ``base``: a LoRA model's frozen base, under the names the model has without
    its adapters. ``snapshot``: the jobs take host copies (an asynchronous save)."""
    from halo_core.lora import peft_format

    folder = Path(folder)
    adapters = layout_of(model).adapters
    if adapters is not None and not base:
        state = peft_format.adapter_state(model)
        if rank() == 0:
            folder.mkdir(parents=True, exist_ok=True)
            peft_format.write_adapter(model, state, folder)
            if processing_class is not None:
                processing_class.save_pretrained(folder)
        barrier()
        return []
    if rank() == 0:
        folder.mkdir(parents=True, exist_ok=True)
        with original_classes(model):  # transformers' config, generation config, architectures, custom code
            model.save_pretrained(folder, state_dict={})
        for path in folder.iterdir():
            if _WEIGHTS.fullmatch(path.name):
                path.unlink()  # an empty weights file: the jobs write the weights
        if processing_class is not None:
            processing_class.save_pretrained(folder)
    barrier()  # every rank writes the weights' files only once rank 0 has left the folder to them
    if adapters is not None:
        state = {n: t for n, t in model.state_dict().items() if not peft_format.is_adapter(n, model)}
        return [model_job(model, state, rename=lambda n: n.replace(".base_layer.", "."), snapshot=snapshot)]
    return [model_job(model, snapshot=snapshot)]


def write_jobs(jobs: list[Job], folder: str | Path, **info) -> None:
    """Every rank writes its parts of ``jobs`` into ``folder``; rank 0 then writes the folder's manifest."""
    records = [record for job in jobs for record in write(job, Path(folder))]
    manifest.leave_parts(folder, rank(), records)
    barrier()
    if rank() == 0:
        manifest.write(folder, manifest.take_parts(folder, world()), **info)
    barrier()


def save_model(model, folder: str | Path, processing_class=None, *, base: bool = False) -> None:
    """Every rank calls this; ``folder`` then loads with ``from_pretrained``, or, for a model with LoRA adapters, with
    ``PeftModel.from_pretrained`` over its base (``base=True``: the frozen base itself)."""
    folder = Path(folder)
    staging = folder.parent / f".{folder.name}.{STAGING_PREFIX}save"
    if rank() == 0:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    barrier()
    write_jobs(model_jobs(model, staging, processing_class, base=base), staging)
    if rank() == 0:
        publish(staging, folder)
    barrier()


def publish(staging: Path, folder: Path) -> None:
    """Move the staged files into ``folder`` (kept if it exists, e.g. a run folder with checkpoints), the manifest
    and then the config last; weights files of an earlier save the new one does not have are removed first."""
    folder.mkdir(parents=True, exist_ok=True)
    new = {p.name for p in staging.iterdir()}
    for path in folder.iterdir():
        if _WEIGHTS.fullmatch(path.name) and path.name not in new:
            path.unlink()
    last = ("config.json", "adapter_config.json")
    for path in sorted(staging.iterdir(), key=lambda p: 2 if p.name in last else 1 if p.name == manifest.MANIFEST else 0):
        os.replace(path, folder / path.name)
    staging.rmdir()


def optimizer_jobs(model, optimizer: torch.optim.Optimizer, folder: str | Path, *, snapshot: bool = False) -> list[Job]:
    """Every rank calls this; rank 0 writes ``folder/optimizer/optimizer.json`` now; returns the state files' jobs."""
    return optimizer_state.optimizer_jobs(model, optimizer, Path(folder) / OPTIMIZER_FOLDER, snapshot=snapshot)


def load_optimizer(model, optimizer: torch.optim.Optimizer, folder: str | Path) -> list[int] | None:
    """Every rank takes its part of ``folder/optimizer/``; a checkpoint without one (``save_only_model``) leaves the optimizer fresh.

    Returns the stored group each of the optimizer's groups comes from (``None`` if nothing was loaded).
    """
    stored = Path(folder) / OPTIMIZER_FOLDER
    if optimizer_state.written(stored):
        return optimizer_state.load_optimizer(model, optimizer, stored)
    if pickled_optimizer(folder):
        raise CheckpointError(PICKLED.format(folder=folder))
    return None


def pickled_optimizer(folder: str | Path) -> bool:
    """Whether ``folder`` holds only an older Halo's optimizer shards (pickles, which Halo no longer reads)."""
    return not optimizer_state.written(Path(folder) / OPTIMIZER_FOLDER) and any(Path(folder).glob("optimizer.rank*.pt"))


PICKLED = ("{folder} holds its optimizer state as pickles (optimizer.rank*.pt, an older Halo); Halo does not unpickle "
           "checkpoints (a pickle can run code); start from its weights instead (model_name_or_path: {folder})")


@contextlib.contextmanager
def no_code_from(path: str | Path):
    """Turn torch's refusal to unpickle anything but plain data (``weights_only=True``) into one line naming the file."""
    try:
        yield
    except pickle.UnpicklingError:
        raise CheckpointError(
            f"{path} holds objects that only a full unpickle could build (and a pickle can run code); Halo refuses it; "
            f"delete that file to resume without it"
        ) from None


def save_scheduler(scheduler, folder: str | Path) -> None:
    torch.save(scheduler.state_dict(), Path(folder) / SCHEDULER)


def load_scheduler(scheduler, folder: str | Path, groups: list[int] | None = None) -> None:
    """``groups``: the stored param group each current one comes from (``load_optimizer``). A scheduler keeps
    lists with one entry per param group (``base_lrs``, ``_last_lr``), and another layout may group differently."""
    path = Path(folder) / SCHEDULER
    if not path.exists():
        return
    with no_code_from(path):
        state = torch.load(path, weights_only=True)
    stored = len(state.get("base_lrs", ()))
    if groups is not None and stored:
        state = {k: [v[i] for i in groups] if isinstance(v, list) and len(v) == stored else v for k, v in state.items()}
    scheduler.load_state_dict(state)


def staged_checkpoint_root(run_dir: str) -> str:
    """Where ``checkpoint-N`` is assembled before its rename (a hidden folder of the run folder)."""
    return os.path.join(run_dir, f".{STAGING_PREFIX}checkpoints")


def write_checkpoint(run_dir: str, name: str, jobs: list[Job], save_total_limit: int | None = None,
                     best_model_checkpoint: str | None = None, *, asynchronous: bool = False, **info) -> "AsyncSave | None":
    """Every rank calls this once transformers has written the small files of ``.tmp-checkpoints/<name>``: the jobs'
    parts are written (now, or by a thread from the host copies the jobs took), then the manifest, then the
    checkpoint is renamed into ``run_dir`` and the oldest beyond ``save_total_limit`` rotated away."""
    staged = os.path.join(staged_checkpoint_root(run_dir), name)
    if not asynchronous:
        write_jobs(jobs, staged, **info)
        promote_checkpoint(run_dir, name, save_total_limit, best_model_checkpoint)
        return None
    snapshot = [(job, list(job.parts())) for job in jobs]  # the collectives, in this thread; parts copied to the host
    return AsyncSave(run_dir, name, staged, snapshot, save_total_limit, best_model_checkpoint, info)


class AsyncSave:
    """A checkpoint written by a thread of each rank from host copies; rank 0's renames it once all are written."""

    def __init__(self, run_dir, name, staged, snapshot, save_total_limit, best_model_checkpoint, info):
        self.name, self.error = name, None
        self._rank, self._world = rank(), world()
        args = (run_dir, name, staged, snapshot, save_total_limit, best_model_checkpoint, info)
        self._thread = threading.Thread(target=self._write, args=args, name=f"halo-save-{name}", daemon=True)
        self._thread.start()

    def _write(self, run_dir, name, staged, snapshot, save_total_limit, best_model_checkpoint, info):
        try:
            records = [record for job, writes in snapshot for record in write(job, Path(staged), writes)]
            snapshot.clear()  # the host copies go as soon as they are written
            manifest.leave_parts(staged, self._rank, records)
            if self._rank == 0:
                manifest.write(staged, manifest.take_parts(staged, self._world), **info)
                _promote(run_dir, name, save_total_limit, best_model_checkpoint)
        except BaseException as exc:  # the next wait() raises it in the training thread
            self.error = exc
            manifest.leave_parts(staged, self._rank, None, error=f"{type(exc).__name__}: {exc}")

    def wait(self) -> None:
        """Every rank calls this (the next save, the end of training): returns once the checkpoint is in place."""
        self._thread.join()
        barrier()
        if self.error is not None:
            raise CheckpointError(f"writing {self.name} in the background failed: {type(self.error).__name__}: {self.error}") from self.error


def promote_checkpoint(run_dir: str, name: str, save_total_limit: int | None = None, best_model_checkpoint: str | None = None) -> str:
    """Rename the assembled ``checkpoint-N`` into the run folder (rank 0), after every rank finished writing;
    then delete the oldest beyond ``save_total_limit``, keeping the newest and the best as transformers does."""
    barrier()
    if rank() == 0:
        _promote(run_dir, name, save_total_limit, best_model_checkpoint)
    barrier()
    return os.path.join(run_dir, name)


def _promote(run_dir: str, name: str, save_total_limit: int | None, best_model_checkpoint: str | None) -> None:
    """A checkpoint of the same name already there (the same step saved again) is swapped with the new one in one
    step (``exchange``), so ``checkpoint-N`` is always one whole checkpoint, old or new; the old is removed after."""
    root = staged_checkpoint_root(run_dir)
    staged, final = os.path.join(root, name), os.path.join(run_dir, name)
    if os.path.exists(final):
        exchange(staged, final)
        shutil.rmtree(staged, ignore_errors=True)  # now the old checkpoint
    else:
        os.replace(staged, final)
    with contextlib.suppress(OSError):
        os.rmdir(root)  # gone once empty (an older Halo's leftovers stay hidden there)
    rotate_checkpoints(run_dir, save_total_limit=save_total_limit, best_model_checkpoint=best_model_checkpoint, use_mtime=True)


def exchange(a: str, b: str) -> None:
    """Swap two folders atomically (Linux ``renameat2(RENAME_EXCHANGE)``); where the system has none, ``b`` is moved
    aside whole first (then, for a moment, there is no ``b``, but never a half-deleted one)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None:
        at_fdcwd, rename_exchange = -100, 2
        if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
            return
    aside = f"{a}.aside"
    os.replace(b, aside)
    os.replace(a, b)
    os.replace(aside, a)
