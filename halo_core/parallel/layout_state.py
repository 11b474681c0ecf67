"""The layout ``parallelize`` gives a model, and the shards its modules hold, kept by the layout.

FSDP, gradients, state dicts and loading go by the names the ``ModelLayout`` (``layout_of(model)``) gives each
sharded module. Forwards reach their own module's shard with ``shard_of(module)``: transformers' experts and attention
interfaces hand the implementation only the module. Both live on the module itself, in one private slot (``_Held``),
so they go where the module goes: a ``copy.deepcopy`` of a laid-out model is laid out the same way (its shards and
layout copied with it, sharing this process's groups), and pickling it is refused in one line rather than losing
the layout. A table keyed by the module's identity lost both on a copy.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch.distributed as dist
from torch import nn

from halo_core.parallel.config import ParallelDims

_SLOT = "_halo_layout_state"
_PLAIN = (str, bytes, int, float, bool, complex, type(None))


def _share_links(value: Any, memo: dict) -> None:
    """Mark in a deepcopy's ``memo`` what ties ``value`` to this process (process groups, meshes, dispatchers, the
    implementations a shard wraps: anything but dataclasses, containers and plain values), so the copy shares them:
    a process group does not copy, and the copy runs on the same ranks. Everything else (names, rows, LoRA scalings,
    what a load read) is copied, so changing the copy's shards leaves the original's alone."""
    if isinstance(value, _PLAIN) or id(value) in memo:
        return
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            _share_links(getattr(value, f.name), memo)
    elif isinstance(value, Mapping):
        for item in value.values():
            _share_links(item, memo)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            _share_links(item, memo)
    else:
        memo[id(value)] = value


class _Held:
    """What the layout keeps on one module: its ``ModelLayout`` (the model), its shard (an experts or attention
    module), or the laid-out model it runs (a wrapper, ``wrap``)."""

    def __init__(self, layout: Any = None, shard: Any = None, wraps: nn.Module | None = None):
        self.layout, self.shard, self.wraps = layout, shard, wraps

    def __deepcopy__(self, memo: dict) -> "_Held":
        _share_links(self.layout, memo)
        _share_links(self.shard, memo)
        return _Held(copy.deepcopy(self.layout, memo), copy.deepcopy(self.shard, memo), copy.deepcopy(self.wraps, memo))

    def __reduce_ex__(self, protocol):
        raise TypeError("a model laid out by halo_core.parallelize() does not pickle (its layout holds this process's "
                        "process groups); copy.deepcopy it, or save full_state_dict(model) (halo_core.parallel.state_dict) "
                        "and parallelize() a freshly loaded model")


def _held(module: nn.Module) -> _Held:
    """The module's slot, made on first use; set in ``__dict__`` directly, as ``nn.Module.__setattr__`` would register a
    wrapped model as a submodule (and so under a second name in ``state_dict``)."""
    held = module.__dict__.get(_SLOT)
    if held is None:
        held = module.__dict__[_SLOT] = _Held()
    return held


def register_shard(module: nn.Module, shard: Any) -> None:
    """Record what ``module`` holds of a split (an ``ExpertShard``, a ``ContextShard``); the family hooks'
    ``shard_experts`` and ``shard_attention`` call it, and ``parallelize`` files it in the layout by name."""
    _held(module).shard = shard


def shard_of(module: nn.Module, kind: type | None = None) -> Any:
    """The shard ``module`` holds (of type ``kind`` when given), or ``None``."""
    held = getattr(module, _SLOT, None)
    shard = None if held is None else held.shard
    return shard if kind is None or isinstance(shard, kind) else None


@dataclass(frozen=True)
class ModelLayout:
    dims: ParallelDims
    mesh: Any
    #: Names (as in ``named_parameters``) of parameters sharded along the expert dimension.
    expert_params: frozenset[str]
    #: Whether FSDP2 shards the parameters (then gradients are reduced by its backward hooks).
    fsdp: bool = False
    #: Expert parameters every ETP rank holds whole, each with part of the gradient (a down-projection bias).
    etp_whole: frozenset[str] = frozenset()
    #: Parameters kept whole under TP whose gradient each TP rank holds a part of (Qwen3's q/k norms).
    tp_partial: frozenset[str] = frozenset()
    #: Module name -> ``ExpertShard`` of every experts module split over EP/ETP ranks.
    experts: Mapping[str, Any] = field(default_factory=dict)
    #: Module name -> ``ContextShard`` of every attention module run by ``halo_attention``.
    attention: Mapping[str, Any] = field(default_factory=dict)
    #: Trainable parameters FSDP2 does not manage (adapters added after it): their gradients are summed by
    #: ``sync_gradients`` as without FSDP.
    outside_fsdp: frozenset[str] = frozenset()
    #: The LoRA adapters on the model (``halo_core.lora.inject.Adapters``), or ``None``.
    adapters: Any = None
    #: What the last ``load_into`` read on this rank: checkpoint key -> rows along dim 0 (``None``: whole).
    reads: dict = field(default_factory=dict)

    def expert_shard(self, parameter: str):
        """The ``ExpertShard`` of the module holding expert parameter ``parameter`` (a ``named_parameters`` name)."""
        return self.experts[self._experts_module(parameter)]

    def expert_rows(self, parameter: str) -> tuple[int, int]:
        """The rows along dim 0 of the whole parameter that this rank's experts hold (``rows`` per expert)."""
        module = self._experts_module(parameter)
        shard = self.experts[module]
        per_expert = shard.rows.get(parameter[len(module) + 1 :], 1)
        return shard.first * per_expert, (shard.first + shard.count) * per_expert

    def _experts_module(self, parameter: str) -> str:
        """The experts module ``parameter`` is under: its own (``...experts.gate_up_proj``) or an ancestor
        (DBRX's ``...experts.mlp.w1``, JetMoE's ``...mlp.input_linear.weight``)."""
        module = parameter.rsplit(".", 1)[0]
        while module not in self.experts:
            if "." not in module:
                raise KeyError(f"{parameter} is under no experts module of the layout")
            module = module.rsplit(".", 1)[0]
        return module

    def group(self, dim: str):
        """Process group of a mesh dimension, or of a named set of them:

        ``"dp"``: the ranks holding different data (all but ``tp``); ``"expert_replicas"``: the
        ranks holding the same experts; ``"expert_whole"``: those plus the ETP group (for expert
        parameters ETP keeps whole); ``"sample"``: the ranks sharing one sample (``cp`` x ``tp``).
        """
        if self.mesh is None:
            return None
        from halo_core.parallel.mesh import DATA_DIMS, flat_group

        named = {"dp": DATA_DIMS, "expert_replicas": ("ep_replica", "cp"), "sample": ("cp", "tp"), "expert_whole": ("ep_replica", "cp", "etp")}
        return flat_group(self.mesh, named[dim]) if dim in named else self.mesh.get_group(dim)

    def coordinates(self) -> dict[str, int]:
        """This rank's position on each axis (all zero in a single process)."""
        return self.dims.coordinates(dist.get_rank() if self.is_distributed else 0)

    @property
    def is_distributed(self) -> bool:
        return self.mesh is not None


def attach(model: nn.Module, layout: ModelLayout) -> None:
    _held(model).layout = layout


def wrap(wrapper: nn.Module, model: nn.Module) -> None:
    """Record that ``wrapper`` (a ``SentenceTransformer``, say) runs the laid-out ``model`` inside it: ``layout_of`` and
    ``laid_out`` of the wrapper then answer for ``model``, whose parameter names the layout keeps."""
    _held(wrapper).wraps = model


def laid_out(model: nn.Module) -> nn.Module:
    """The module the layout describes: ``model`` itself, or the laid-out model a wrapper holds (``wrap``)."""
    held = getattr(model, _SLOT, None)
    return model if held is None or held.wraps is None else held.wraps


def is_laid_out(model: nn.Module) -> bool:
    """Whether ``parallelize`` laid ``model`` out (or the model a wrapper holds, ``wrap``), asked without catching
    ``layout_of``'s error: a caller that lays out only what is not laid out yet (``parts/layout.lay_out``)."""
    held = getattr(laid_out(model), _SLOT, None)
    return held is not None and held.layout is not None


def layout_of(model: nn.Module) -> ModelLayout:
    held = getattr(laid_out(model), _SLOT, None)
    if held is None or held.layout is None:
        raise RuntimeError("this model was not laid out by halo_core.parallelize(); call it first on every rank")
    return held.layout
