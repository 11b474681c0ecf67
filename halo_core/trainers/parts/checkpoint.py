"""Checkpoints that stay plain Hugging Face whatever the layout, written atomically, resumable on any layout.

- Model: ``full_state_dict`` (every rank joins) and ``save_pretrained`` on rank 0 into a
  staging folder, then moved into place; ``config.json`` moves last, so a loader never
  finds a model folder whose weights are half written.
- ``checkpoint-N``: the whole folder (model, optimizer state, scheduler, RNG, trainer
  state) is written as ``.tmp-checkpoints/checkpoint-N`` in the run folder and renamed when
  complete. Neither transformers' ``get_last_checkpoint`` nor checkpoint rotation looks there.
- Optimizer: ``optimizer/``, each state tensor whole under its parameter's name
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
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from transformers.trainer_utils import rotate_checkpoints

from halo_core.parallel import optimizer_state
from halo_core.parallel.conversion import original_classes
from halo_core.parallel.layout_state import layout_of
from halo_core.parallel.loading import CheckpointError
from halo_core.parallel.state_dict import full_state_dict

STAGING_PREFIX = "tmp-"
OPTIMIZER_FOLDER = "optimizer"
SCHEDULER = "scheduler.pt"


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def save_model(model, folder: str | Path, processing_class=None, *, base: bool = False) -> None:
    """Every rank calls this; rank 0 writes ``folder`` so that it loads with ``from_pretrained``, or, for a model
    with LoRA adapters, with ``PeftModel.from_pretrained`` over its base (``base=True``: the frozen base itself)."""
    from halo_core.lora import peft_format

    adapters = layout_of(model).adapters
    if adapters is None:
        state = full_state_dict(model)
    else:
        state = peft_format.base_state(model) if base else peft_format.adapter_state(model)
    folder = Path(folder)
    if rank() == 0:
        staging = folder.parent / f".{folder.name}.{STAGING_PREFIX}{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        if adapters is not None and not base:
            peft_format.write_adapter(model, state, staging)
        else:
            state = without_tied_copies(model, state)
            with whole_shapes(model, state), original_classes(model):  # the mapping reverted as for the model unwrapped
                model.save_pretrained(staging, state_dict=state)
        if processing_class is not None:
            processing_class.save_pretrained(staging)
        publish(staging, folder)
    barrier()


def without_tied_copies(model, state: dict) -> dict:
    """``state`` without the weights the model ties to others (``lm_head.weight`` where the embeddings are tied), as
    transformers leaves them out: gathered into tensors of their own, transformers could no longer tell they are one."""
    tied = getattr(model, "_tied_weights_keys", None) or {}
    if not isinstance(tied, dict) or not getattr(model.config.get_text_config(), "tie_word_embeddings", False):
        return state
    copies = {target for target, source in tied.items() if target in state and source in state and torch.equal(state[target], state[source])}
    return {name: tensor for name, tensor in state.items() if name not in copies}


@contextlib.contextmanager
def whole_shapes(model, state: dict):
    """``model.get_parameter`` answers with the whole tensor of ``state`` while transformers saves it.

    ``save_pretrained`` reverts the model type's load-time conversions, and a ``Transpose(check_dims=True)``
    (qwen3_vl_moe's experts) transposes a tensor whose shape differs from the live parameter's. Under EP the live
    parameter is this rank's block of experts, so every expert weight was written transposed, and a square one
    (gate_up_proj with 2 x moe_intermediate_size = hidden_size) loaded back transposed. Seen against the whole
    tensor, the check writes what one process writes.
    """
    own = model.get_parameter

    def get_parameter(name: str):
        return state[name] if name in state else own(name)

    model.get_parameter = get_parameter  # an instance attribute over the class's method, removed after
    try:
        yield
    finally:
        del model.get_parameter


def publish(staging: Path, folder: Path) -> None:
    """Move the staged files into ``folder`` (kept if it exists, e.g. a run folder with checkpoints), config last."""
    folder.mkdir(parents=True, exist_ok=True)
    files = sorted(staging.iterdir(), key=lambda p: p.name in ("config.json", "adapter_config.json"))
    for path in files:
        os.replace(path, folder / path.name)
    staging.rmdir()


def save_optimizer(model, optimizer: torch.optim.Optimizer, folder: str | Path) -> None:
    """Every rank calls this; rank 0 writes ``folder/optimizer/`` whole, so it resumes on any layout."""
    optimizer_state.save_optimizer(model, optimizer, Path(folder) / OPTIMIZER_FOLDER)


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


def promote_checkpoint(run_dir: str, name: str, save_total_limit: int | None = None, best_model_checkpoint: str | None = None) -> str:
    """Rename the assembled ``checkpoint-N`` into the run folder (rank 0), after every rank finished writing;
    then delete the oldest beyond ``save_total_limit``, keeping the newest and the best as transformers does."""
    barrier()
    staged = os.path.join(staged_checkpoint_root(run_dir), name)
    final = os.path.join(run_dir, name)
    if rank() == 0:
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(staged, final)
        shutil.rmtree(staged_checkpoint_root(run_dir), ignore_errors=True)
        rotate_checkpoints(run_dir, save_total_limit=save_total_limit, best_model_checkpoint=best_model_checkpoint, use_mtime=True)
    barrier()
    return final
