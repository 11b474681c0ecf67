"""Poolside Laguna (``laguna``): how it differs from the common case.

- Router: child ``gate``, sigmoid top-k with a score-correction bias; one shared expert,
  dense, kept whole on every rank.
- Attention alternates sliding-window and full layers; both are ``self_attn``.
"""

from halo_core import Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="laguna",
        model_types=("laguna",),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep"}),
        moe_block="model.layers.*.mlp",
        router="gate",
        experts="experts",
        attention="model.layers.*.self_attn",
    )
