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

The hooks in 2-4 are ``firstresult``: the first implementation that returns
something other than ``None`` wins, so returning ``None`` hands the case to the
core's default.
"""

from __future__ import annotations

import pluggy

PROJECT = "halo"

hookspec = pluggy.HookspecMarker(PROJECT)
#: Decorate a plugin's hook implementations with this marker.
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def halo_family():
    """Declare the family: return a :class:`halo_core.Family`.

    Called once per plugin at discovery. The declaration names the family, the
    transformers ``model_type`` values it claims, the plugin's version, the plugin-API
    version it was written for (``halo_core.PLUGIN_API_VERSION`` at the time of
    writing, as a literal), the splits it supports, and where its MoE blocks, router,
    experts and attention live. A plugin whose declaration fails to build, or whose
    ``api_version`` differs from the core's, is listed as broken and never called again.
    """


@hookspec(firstresult=True)
def supported_splits(family, model_type):
    """Return the subset of ``{"ep", "cp", "tp", "etp"}`` this family supports for ``model_type``.

    ``family`` is the plugin's own :class:`Family`. The default returns
    ``family.splits``; implement this only when support differs between the model
    types a family claims. A layout asking for a split outside this set is refused
    before any weight moves.
    """


@hookspec(firstresult=True)
def wrap_moe_block(module, context):
    """Adapt one MoE block to the parallel layout; return the module to put in its place.

    ``module`` is an unmodified transformers module matched by ``family.moe_block``
    that has the children ``family.router`` and ``family.experts``. ``context`` is a
    :class:`halo_core.context.ParallelContext` (degrees, process groups, the model
    config, the family). Return ``module`` itself when it was adapted in place, a new
    module to replace it, or ``None`` to let the core's default do the common case
    (experts distributed at the experts interface, the router left as transformers
    computes it).
    """


@hookspec(firstresult=True)
def wrap_attention(module, context):
    """Adapt one attention module (matched by ``family.attention``) to the layout.

    Same return convention as :func:`wrap_moe_block`. The default leaves attention to
    transformers' attention-function registry, which context parallelism plugs into.
    """


@hookspec(firstresult=True)
def shard_tp(model, context):
    """Apply tensor parallelism to the whole model; return the model.

    Called once after the wrappers. Return ``None`` for the core's default plan (the
    config's ``base_model_tp_plan`` where it is right).
    """
