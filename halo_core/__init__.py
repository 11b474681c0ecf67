"""Halo core: parallel layouts for unmodified Hugging Face models, extended by family plugins.

The model-level contract (every rank): ``model = parallelize(model, ParallelConfig(ep=...))``;
forward/backward on the rank's data-parallel batch; ``sync_gradients(model)``;
``clip_grad_norm_(model, max_norm)``; a plain ``torch.optim`` step; ``full_state_dict(model)``.

Importing this package is cheap (no torch): the engine loads on first use of its names,
so the CLI lists plugins without importing a model stack.
"""

from importlib import import_module

from halo_core.family import ATTENTION_TP_PLAN, PLUGIN_API_VERSION, SPLITS, Family
from halo_core.hookspecs import hookimpl

__version__ = "0.1.0"

_ENGINE = {
    "ParallelConfig": "halo_core.parallel.config",
    "plan_layout": "halo_core.parallel.plan",
    "parallelize": "halo_core.parallel.parallelize",
    "sync_gradients": "halo_core.parallel.grads",
    "clip_grad_norm_": "halo_core.parallel.grads",
    "full_state_dict": "halo_core.parallel.state_dict",
    "full_gradients": "halo_core.parallel.state_dict",
    "from_pretrained": "halo_core.parallel.loading",
}

__all__ = ["ATTENTION_TP_PLAN", "PLUGIN_API_VERSION", "SPLITS", "Family", "hookimpl", "__version__", *_ENGINE]


def __getattr__(name: str):
    if name in _ENGINE:
        return getattr(import_module(_ENGINE[name]), name)
    raise AttributeError(f"module 'halo_core' has no attribute {name!r}")
