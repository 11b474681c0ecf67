"""Moonshot Kimi Linear (``kimi_linear``): how it differs from the common case.

- Router: child ``gate``, sigmoid scores with a correction bias; top-k is
  ``num_experts_per_token``. Shared experts are dense, kept whole.
- Most layers are linear attention (Kimi Delta Attention); full attention (MLA) only
  where ``layer_types`` says so. Dense or sparse MLP per ``mlp_layer_types``.
"""

from halo_core import Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="kimi-linear",
        model_types=("kimi_linear",),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep"}),
        moe_block="model.layers.*.mlp",
        router="gate",
        experts="experts",
        attention="model.layers.*.self_attn",
        tiny_config={"layer_types": ["linear_attention", "full_attention"], "mlp_layer_types": ["sparse", "sparse"]},
    )
