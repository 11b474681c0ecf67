"""``HALO_TENSOR_BYTES=FOLDER``: each rank writes its actual parameter, gradient and optimizer-state bytes after the
first optimizer step to ``FOLDER/rank-R.json``, the figures ``halo plan`` is held to (``tests/test_launch_layouts.py``),
and on a GPU its ``torch.cuda.max_memory_allocated`` at the end of training to ``FOLDER/rank-R-peak.json``
(``bench/plan_vs_peak.py``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from transformers import TrainerCallback

ENV = "HALO_TENSOR_BYTES"


class Report(TrainerCallback):
    """After the first optimizer step (gradients still held, state created), before the trainer zeroes them."""

    def __init__(self, folder: str, trainer) -> None:
        self.folder, self.trainer, self.done = Path(folder), trainer, False

    def on_optimizer_step(self, args, state, control, **kwargs):
        if self.done:
            return
        from halo_core.memory_plan import tensor_bytes
        from halo_core.trainers.parts.checkpoint import rank

        optimizer = getattr(self.trainer.optimizer, "optimizer", self.trainer.optimizer)
        report = tensor_bytes(self.trainer._halo_laid_out, optimizer)
        teacher = getattr(self.trainer, "teacher_model", None)  # distill's frozen teacher, under its own layout
        if isinstance(teacher, torch.nn.Module):
            report["teacher"] = tensor_bytes(teacher)["parameters"]
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f"rank-{rank()}.json").write_text(json.dumps(report))
        self.done = True

    def on_train_end(self, args, state, control, **kwargs):
        import torch

        from halo_core.trainers.parts.checkpoint import rank

        if torch.cuda.is_available():
            peak = {"max_memory_allocated": torch.cuda.max_memory_allocated(), "max_memory_reserved": torch.cuda.max_memory_reserved()}
            (self.folder / f"rank-{rank()}-peak.json").write_text(json.dumps(peak))


def attach(trainer) -> None:
    folder = os.environ.get(ENV)
    if folder:
        trainer.add_callback(Report(folder, trainer))
