"""One launch's plan, built once by the launcher (``halo launch``, ``halo plan``) and shipped to the workers as JSON.

Every check before start needs some of: the method's config dataclass, the model's transformers config, the resolved
layout. The plan holds each, read or built once on first use (so a check that refuses first never pays for the rest),
instead of each check building its own. The workers get ``to_json()``: the run's fields, the world size, the precision
and the layout, plain JSON; the method config and the model's config stay here (each worker builds its own on its
device, ``runtime._train``).
"""

from __future__ import annotations

import os
from typing import Any

from halo_core.errors import ConfigError
from halo_core.parallel.config import ParallelDims
from halo_core.trainers.run_config import RunConfig, method_config, model_config_of

#: A model config not read yet (``None`` is a read result: a hub id).
_UNREAD = object()


class RunPlan:
    """The run, the launch's world size, and what the checks resolve from them (each once)."""

    def __init__(self, run: RunConfig, world: int = 1, model_config: Any = _UNREAD, layout: dict | None = None,
                 bf16: bool | None = None):
        self.run = run
        self.world = world
        #: ``check_layout``'s result: ``{"dims": ParallelDims, "model_type": str, "family": str | None}``.
        self.layout = layout
        self._model_config = model_config
        self._args = None
        self._bf16 = bf16  # shipped to a worker, which builds no method config here

    @property
    def args(self):
        """The method's config dataclass, built as each worker builds it (``run_config.method_config``), once."""
        if self._args is None:
            self._args = method_config(self.run, self.world)
        return self._args

    def rebuild_args(self):
        """The method config again, after a check changed ``run.trainer`` (``parts/global_batch.keep``)."""
        self._args = None
        return self.args

    @property
    def model_config(self):
        """The model's transformers config (``None`` for a hub id), read once."""
        if self._model_config is _UNREAD:
            self._model_config = model_config_of(self.run)
        return self._model_config

    @property
    def bf16(self) -> bool:
        """Whether the worker builds bf16 weights: the method config's ``bf16`` (TRL's default unless ``fp16``)."""
        return self._bf16 if self._bf16 is not None else bool(self.args.bf16)

    def to_json(self) -> dict:
        """What a worker needs of the plan, as plain JSON (torchrun pickles it to each worker)."""
        layout = None
        if self.layout is not None:
            dims = self.layout["dims"]
            layout = {"dims": {k: getattr(dims, k) for k in ("world", "dp", "ep", "etp", "tp", "cp")},
                      "model_type": self.layout["model_type"], "family": self.layout["family"]}
        return {"run": self.run.to_json(), "world": self.world, "bf16": self.bf16, "layout": layout}

    @classmethod
    def from_json(cls, data: dict) -> "RunPlan":
        layout = data.get("layout")
        if layout is not None:
            layout = {**layout, "dims": ParallelDims(**layout["dims"])}
        return cls(RunConfig.from_json(data["run"]), data["world"], layout=layout, bf16=data.get("bf16"))

    def check_world(self, environ=os.environ) -> None:
        """A worker's world (torchrun's ``WORLD_SIZE``) is the one the launcher checked the run for."""
        got = int(environ.get("WORLD_SIZE", "1"))
        if got != self.world:
            raise ConfigError(f"{self.run.source}: the run was checked for {self.world} process(es) and this worker is one of "
                              f"WORLD_SIZE={got}; start it with `halo launch --nproc N --nnodes M`, which checks and starts the same world")
