"""LiquidAI LFM2 / LFM2.5 MoE (``lfm2_moe``): how it differs from the common case.

- The MoE block sits at ``feed_forward`` (not ``mlp``); the first ``num_dense_layers`` hold
  a dense feed-forward there instead.
- Router: child ``gate``, sigmoid scores plus a learned expert bias (``use_expert_bias``).
- Most layers are short convolutions (``layer_types`` "conv"); attention only where the
  type is "full_attention", at ``self_attn``.
"""

from halo_core import Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="lfm2-moe",
        model_types=("lfm2_moe",),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep"}),
        moe_block="model.layers.*.feed_forward",
        router="gate",
        experts="experts",
        attention="model.layers.*.self_attn",
    )
