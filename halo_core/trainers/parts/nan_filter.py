"""transformers' ``logging_nan_inf_filter`` on the device: the same logged loss, without a host read-back each step.

transformers' training loop asks ``torch.isnan(loss) or torch.isinf(loss)`` of every step's loss, on the host: the host
waits there for backward to finish before it may issue the clipping and optimizer kernels, and the GPU idles while it
does. Here the trainer's own flag is off during training and the step's loss comes back already filtered, with the
loop's own replacement (the mean of the losses accumulated since the last log) chosen on the device:
``tr_loss + where(finite, loss, tr_loss / (1 + steps since the last log))`` is what the loop would have added.
Evaluation and the saved ``training_args.bin`` see the user's flag.
"""

from __future__ import annotations

import contextlib

import torch


def filtered(trainer, loss: torch.Tensor, wanted: bool) -> torch.Tensor:
    """``loss`` as the training loop would add it to its running sum with the filter on (``wanted``)."""
    running = getattr(trainer, "_tr_loss", None)
    if not wanted or running is None or not isinstance(loss, torch.Tensor) or loss.device != running.device:
        return loss
    since = 1 + trainer.state.global_step - trainer._globalstep_last_logged
    return torch.where(torch.isfinite(loss), loss, running / since)


@contextlib.contextmanager
def users_flag(args, wanted: bool):
    """The user's ``logging_nan_inf_filter`` back for the duration (evaluation, a checkpoint's saved arguments)."""
    args.logging_nan_inf_filter = wanted
    try:
        yield
    finally:
        args.logging_nan_inf_filter = False
