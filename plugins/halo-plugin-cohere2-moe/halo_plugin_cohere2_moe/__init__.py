"""Cohere Command A+ (``cohere2_moe``): the common case.

- Router ``gate`` and fused ``experts`` at ``model.layers.N.mlp``; attention at ``self_attn``
  with Cohere's parallel attention/MLP residual, which the core does not touch.
"""

from halo_core import Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="cohere2-moe",
        model_types=("cohere2_moe",),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep"}),
        moe_block="model.layers.*.mlp",
        router="gate",
        experts="experts",
        attention="model.layers.*.self_attn",
    )
