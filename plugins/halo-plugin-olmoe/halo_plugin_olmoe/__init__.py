"""OLMoE (``olmoe``): the classic softmax top-k case, with q/k norms in attention.

- Router ``gate`` and fused ``experts`` at ``model.layers.N.mlp``; attention at ``self_attn``.
"""

from halo_core import Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="olmoe",
        model_types=("olmoe",),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep"}),
        moe_block="model.layers.*.mlp",
        router="gate",
        experts="experts",
        attention="model.layers.*.self_attn",
    )
