"""Non-finite values stop the run: a step's loss or gradient norm, a checkpoint about to be written, a checkpoint resumed.

Without this a NaN trained on silently: transformers' ``logging_nan_inf_filter`` logs the running mean in its place,
the optimizer writes NaN into every weight, and ``save_total_limit`` rotates the good checkpoints away.

- Each step: every rank folds its loss into a device-side code (which rank, NaN or inf) as the micro-batches come;
  at the optimizer step the code is reduced over the ranks (the loss differs per rank; one small all-reduce, no host
  wait) and stored beside the gradient norm (the global one, the same on every rank). By default (stop,
  ``max_nonfinite_skips: 0``) the pair is copied to the host without waiting and read at the next step's optimizer
  step, when it has long been computed, so the host never waits for the GPU there: the host runs ahead of the GPU as
  before. The bad step's update has happened by then, so every checkpoint and the final save read it first
  (``settle``), and a run stopped this way writes nothing after the bad step.
- ``max_nonfinite_skips: N``: the pair is read before the optimizer step (one host read-back a step: the host waits
  for backward and the norm before it may issue the optimizer step, the cost ``parts.nan_filter`` describes), and a
  non-finite step drops its gradients (no update; the scheduler and the step count move on), up to N times a launch.
- The gradient norm is computed whatever ``max_grad_norm`` says (Halo logs it; ``max_grad_norm: 0`` only skips the
  clipping), so it is checked with clipping off too.
- Before a checkpoint is written and after one is read, every rank checks its own shards of the weights and the
  optimizer state (a local max-abs per tensor, fused, one read-back), and the verdict is reduced: a non-finite
  checkpoint is never written, so never promoted, and rotation never deletes the last finite one (it runs only when a
  new checkpoint is promoted, and keeps the newest).
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from halo_core.parallel.dtensor import local
from halo_core.trainers.parts.stopping import RunStopped

FIELD = "max_nonfinite_skips"


def _world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def _flag_device(like: torch.Tensor) -> torch.device:
    """Where the default group's collectives take tensors (NCCL: the GPU; gloo: the host)."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return like.device if like.device.type == "cpu" else torch.device("cpu")


def _kind(value: float) -> str:
    return "nan" if value != value else "inf" if value > 0 else "-inf"


class StepGuard:
    """Watches each optimizer step's loss and gradient norm (one per trainer)."""

    def __init__(self, max_skips: int = 0):
        self.max_skips = max_skips
        self.skipped = 0
        self._loss_code: torch.Tensor | None = None  # max over micro-batches of 2 * (world - rank) + isnan, 0 if finite
        self._pending = None  # (step, device flags, host copy, event) of the last step not yet read (stop mode)
        self._host: torch.Tensor | None = None

    @property
    def skipping(self) -> bool:
        return self.max_skips > 0

    def see_loss(self, loss: torch.Tensor) -> None:
        """Fold one micro-batch's loss in, on its device (no host read)."""
        if not isinstance(loss, torch.Tensor):
            return
        rank, world = _world()
        loss = loss.detach().reshape(())
        bad = ~torch.isfinite(loss)
        code = bad.to(torch.int64) * (2 * (world - rank)) + (bad & torch.isnan(loss)).to(torch.int64)
        self._loss_code = code if self._loss_code is None else torch.maximum(self._loss_code, code)

    def see_step(self, trainer, grad_norm) -> None:
        """At the optimizer step, before it runs: read the previous step's flags (stop), reduce this step's, and either
        leave them to be read later (stop) or decide now (skip)."""
        step = trainer.state.global_step + 1
        self.settle(trainer)
        norm = torch.as_tensor(grad_norm if grad_norm is not None else 0.0).detach().reshape(())
        code = self._loss_code if self._loss_code is not None else torch.zeros((), dtype=torch.int64, device=norm.device)
        self._loss_code = None
        if dist.is_initialized() and dist.get_world_size() > 1:
            device = _flag_device(code)
            code = code.to(device)
            dist.all_reduce(code, op=dist.ReduceOp.MAX)
        flags = torch.stack([code.to(torch.float64), norm.to(code.device, torch.float64)])
        if self.skipping:
            self._decide(trainer, step, flags.tolist())  # the per-step host read skip mode pays
            return
        if flags.device.type == "cuda":
            if self._host is None:
                self._host = torch.empty(2, dtype=torch.float64, pin_memory=True)
            self._host.copy_(flags, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._pending = (step, self._host, event)
        else:
            self._pending = (step, flags, None)

    def settle(self, trainer) -> None:
        """Read the last step's flags if still unread, and stop if they were non-finite (before any checkpoint is
        written, before the final save, and at the next optimizer step)."""
        if self._pending is None:
            return
        step, flags, event = self._pending
        self._pending = None
        if event is not None:
            event.synchronize()  # long done by the next step; before a save, the save waits anyway
        self._decide(trainer, step, flags.tolist())

    def _decide(self, trainer, step: int, flags: list[float]) -> None:
        what = _what(flags)
        if what is None:
            return
        if self.skipped < self.max_skips:
            self.skipped += 1
            trainer.model.zero_grad(set_to_none=True)  # the optimizer skips parameters without gradients: no update
            if _world()[0] == 0:
                print(f"step {step}: {what}; skipped it (no update: {self.skipped} of {FIELD}={self.max_skips})", file=sys.stderr, flush=True)
            return
        limit = (f"the {_ordinal(self.skipped + 1)} non-finite step, after {self.skipped} skipped ({FIELD}={self.max_skips})"
                 if self.skipping else f"{FIELD}: 0 stops at the first one")
        raise RunStopped(f"step {step}: {what}; the run stopped ({limit}) without writing this step or any later; "
                         f"{_last_checkpoint(trainer)}")


def _what(flags: list[float]) -> str | None:
    """'the loss was nan on rank 1 and the gradient norm was nan', or ``None`` if both were finite."""
    code, norm = flags
    _, world = _world()
    parts = []
    if code:
        code = int(code)
        parts.append(f"the loss was {'nan' if code % 2 else 'inf'} on rank {world - code // 2}")  # the lowest such rank
    if norm != norm or abs(norm) == float("inf"):
        parts.append(f"the gradient norm was {_kind(norm)}")
    return " and ".join(parts) or None


def _ordinal(n: int) -> str:
    return {1: "first", 2: "second", 3: "third"}.get(n, f"{n}th")


def _last_checkpoint(trainer) -> str:
    """Where the user can go back to: the latest checkpoint in output_dir (every one Halo promotes is finite)."""
    import os

    from transformers.trainer_utils import get_last_checkpoint

    folder = trainer.args.output_dir
    latest = get_last_checkpoint(folder) if folder and os.path.isdir(folder) else None
    if latest is None:
        return f"output_dir {folder} holds no checkpoint yet"
    return f"the last checkpoint, {latest}, holds finite values: resume from it (resume_from_checkpoint) with a lower learning_rate or other data"


# -- checkpoints --------------------------------------------------------------------------------


def _named_tensors(model, optimizer):
    """(name, this rank's part) of every weight and optimizer-state tensor, floating point and not empty."""
    names = {}
    for name, param in model.named_parameters():
        names[id(param)] = name
        yield name, local(param.detach())
    inner = getattr(optimizer, "optimizer", optimizer)  # under Accelerate's AcceleratedOptimizer
    for param, state in getattr(inner, "state", {}).items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                yield f"{key} of {names.get(id(param), 'a parameter')}", local(value.detach())


@torch.no_grad()
def first_nonfinite(model, optimizer=None) -> str | None:
    """The name of this rank's first weight or optimizer-state tensor holding a non-finite value, or ``None``.

    The max-abs of each tensor, fused per dtype (NaN and inf survive it): a few launches and one read-back, not one a
    tensor."""
    entries = [(n, t) for n, t in _named_tensors(model, optimizer) if t.is_floating_point() and t.numel()]
    groups: dict[tuple, list[int]] = {}
    for index, (_, tensor) in enumerate(entries):
        groups.setdefault((tensor.device, tensor.dtype), []).append(index)
    bad: list[int] = []
    for indices in groups.values():
        flags = ~torch.isfinite(torch.stack(torch._foreach_norm([entries[i][1] for i in indices], float("inf"))))
        if flags.any():
            bad += [indices[int(i)] for i in flags.nonzero().flatten().tolist()]
    return entries[min(bad)][0] if bad else None


def agree(found: str | None, like: torch.Tensor) -> tuple[int, str] | None:
    """Every rank's ``found`` reduced: the lowest rank that found something and its name, the same on every rank."""
    rank, world = _world()
    if world == 1:
        return (0, found) if found else None
    code = torch.tensor([world - rank if found else 0], device=_flag_device(like))
    dist.all_reduce(code, op=dist.ReduceOp.MAX)
    first = int(code.item())
    if not first:
        return None
    box = [found]
    dist.broadcast_object_list(box, src=world - first)
    return world - first, box[0]


def _any_tensor(model) -> torch.Tensor:
    return next(model.parameters(), torch.zeros(()))


def check_before_checkpoint(trainer, model, optimizer) -> None:
    """Before ``checkpoint-N`` is written: the last step's flags read, and every rank's shards finite."""
    trainer._halo_steps.settle(trainer)
    step = trainer.state.global_step
    found = agree(first_nonfinite(model, optimizer), _any_tensor(model))
    if found is not None:
        rank, name = found
        raise RunStopped(f"step {step}: {name} holds a non-finite value (rank {rank}), so checkpoint-{step} was not written "
                         f"and the run stopped; {_last_checkpoint(trainer)}")


def check_resumed(model, optimizer, folder: str) -> None:
    """After a checkpoint's weights and optimizer state are read, before the first step: every rank's shards finite."""
    found = agree(first_nonfinite(model, optimizer), _any_tensor(model))
    if found is not None:
        rank, name = found
        earlier = _earlier_checkpoint(folder)
        back = f"resume from an earlier checkpoint ({earlier})" if earlier else "start afresh (no earlier checkpoint is beside it)"
        raise RunStopped(f"resume_from_checkpoint {folder}: {name} holds a non-finite value (read by rank {rank}); refusing to "
                         f"train from it; {back}")


def _earlier_checkpoint(folder: str) -> str | None:
    """The newest ``checkpoint-N`` beside ``folder`` with a smaller N."""
    import re
    from pathlib import Path

    path = Path(folder)
    own = re.fullmatch(r"checkpoint-(\d+)", path.name)
    steps = [(int(m[1]), p) for p in path.parent.glob("checkpoint-*") if (m := re.fullmatch(r"checkpoint-(\d+)", p.name)) and p.is_dir()]
    earlier = [(step, p) for step, p in steps if own is None or step < int(own[1])]
    return str(max(earlier)[1]) if earlier else None


def check_key(run) -> None:
    """Before start: a count of steps to skip cannot be negative."""
    from halo_core.errors import ConfigError

    if run.halo.max_nonfinite_skips < 0:
        raise ConfigError(f"{run.source}: {FIELD}={run.halo.max_nonfinite_skips} must be 0 or above (0 stops the run at the first "
                          f"non-finite loss or gradient norm; N skips up to N such steps)")
