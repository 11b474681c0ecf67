"""The plugin contract: every hook a Halo family plugin can implement.

A family plugin is a module (named by an entry point in the group ``halo.families``)
with functions decorated by ``@halo_core.hookimpl``. Only ``halo_family`` is required;
for every other hook the core ships a default implementation (the common case,
called last), so a plugin implements a hook only where its family differs.

Dispatch is by model type: for a given model the core calls only the plugin whose
declaration claims ``model.config.model_type`` (plus the core's defaults). A hook
implementation may accept any subset of the arguments named below, so new
arguments can be added later without breaking plugins.

Calling order, on every rank, when the core lays a model out (``halo_core.adapt``):

1. ``supported_splits`` -- checked against the requested degrees before anything moves.
2. ``wrap_moe_block`` -- once per MoE block, in ``named_modules()`` order.
3. ``wrap_attention`` -- once per attention module, in ``named_modules()`` order.
4. ``shard_tp`` -- once, on the whole model, after the wrappers are in place.
5. FSDP2 over the data-parallel ranks (core, not a hook).

The hooks in 1-4 are ``firstresult``: the first implementation that returns
something other than ``None`` wins, so returning ``None`` hands the case to the
core's default.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from torch import nn

    from halo_core.context import ParallelContext
    from halo_core.family import Family

PROJECT = "halo"

hookspec = pluggy.HookspecMarker(PROJECT)
#: Decorate a plugin's hook implementations with this marker.
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def halo_family() -> Family:
    """Declare the family: return a :class:`halo_core.Family`. Required; the core has no default.

    Called once per plugin at discovery. The declaration names the family, the
    transformers ``model_type`` values it claims, the plugin's version, the plugin-API
    version it was written for (``halo_core.PLUGIN_API_VERSION`` at the time of
    writing, as a literal), the splits it supports, and where its MoE blocks, router,
    experts and attention live. A plugin whose declaration fails to build, or whose
    ``api_version`` has another major than the core's or a newer minor, is listed as broken
    and never called again; an older minor of the same major loads with a FutureWarning.
    """


@hookspec(firstresult=True)
def supported_splits(family: Family, model_type: str) -> frozenset[str] | None:
    """Return the subset of ``{"ep", "cp", "tp", "etp"}`` this family supports for ``model_type``.

    Called before anything moves. ``family`` is the plugin's own :class:`Family`. The
    default returns ``family.splits``; implement this only when support differs between
    the model types a family claims. A layout asking for a split outside this set is
    refused before any weight moves.
    """


@hookspec(firstresult=True)
def wrap_moe_block(module: nn.Module, context: ParallelContext) -> nn.Module | None:
    """Adapt one MoE block to the parallel layout; return the module to put in its place.

    Called once per MoE block. ``module`` is an unmodified transformers module matched by
    ``family.moe_block`` that has the children ``family.router`` and ``family.experts``.
    Return ``module`` itself when it was adapted in place, a new module to replace it, or
    ``None`` to let the core's default do the common case: expert (and expert-tensor)
    parallelism at transformers' experts interface, the router left as transformers
    computes it (``halo_core.defaults.wrap_moe_block``).

    A module of your own must still register its experts with the layout: FSDP2,
    gradient sync, state dicts and sliced loading learn which expert weights a rank holds
    only from there, and treat every other weight as one all ranks hold alike. So call
    ``halo_core.parallel.expert_parallel.shard_experts`` (the helper that builds an
    ``ExpertShard``) on each experts module split over EP or ETP ranks, with the
    arguments the default passes. It takes a transformers experts-interface module
    (``@use_experts_implementation``, fused parameters with the expert on the first
    dimension, named as in the checkpoint), and your module must call that module's
    forward, which then runs Halo's exchange. The default also takes, with no hook, an
    experts module called with the interface's arguments but not decorated (DBRX's, its
    weights stacking the experts along dim 0, ``[E * I, H]``; Ergo's, adding to the
    interface's forward): its own forward runs on each rank's experts. A block that routes
    some other way (JetMoE's, two ``[E, ...]`` children) passes ``shard_experts`` its expert
    weights (``parameters=``, names under the module) and the arithmetic on a rank's
    experts (``compute=``), and calls ``expert_parallel.distributed_experts`` with each
    token's experts and weights (``halo-plugin-jetmoe``). With ``ep`` or ``etp`` above one
    and no experts module registered, the layout is refused.
    """


@hookspec(firstresult=True)
def wrap_attention(module: nn.Module, context: ParallelContext) -> nn.Module | None:
    """Adapt one attention module (matched by ``family.attention``) to the layout.

    Called once per attention module; same return convention as :func:`wrap_moe_block`.
    The default plugs context parallelism (Ulysses or ring, ``context.cp_attention``) into
    transformers' attention-function registry and, under TP, hands the inner
    implementation this rank's heads; the module itself is kept.

    A module of your own that still runs transformers' attention interface must register
    itself the same way: call ``halo_core.parallel.context_parallel.shard_attention`` on it
    with the arguments the default passes (``halo_core.defaults.wrap_attention``), so the
    ``halo_attention`` implementation finds its group, rank and inner implementation. With
    ``cp`` or ``tp`` above one and no attention module registered, the layout is refused.
    """


@hookspec(firstresult=True)
def shard_tp(model: nn.Module, context: ParallelContext) -> nn.Module | None:
    """Apply tensor parallelism to the whole model; return the model.

    Called once, after the wrappers. Return ``None`` for the core's default: DTensor
    ``parallelize_module`` with ``Family.tp_plan``, else the config's
    ``base_model_tp_plan`` (``colwise``, ``rowwise``, ``replicated_with_grad_allreduce``).
    """
