"""Zyphra Zaya (``zaya``): how it differs from the common case.

- Exactly one expert per token (the config refuses ``num_experts_per_tok`` other than 1).
- Router: child ``gate`` (``ZayaRouter``) holds its projection in a child module; experts
  are the common fused ``ZayaExperts``.
- Attention is compressed cross-attention-style projection (``qkv_proj``), still at ``self_attn``;
  residual streams are scaled by learned ``*_residual_scale`` modules.
"""

from halo_core import Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="zaya",
        model_types=("zaya",),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep"}),
        moe_block="model.layers.*.mlp",
        router="gate",
        experts="experts",
        attention="model.layers.*.self_attn",
        tiny_config={"num_experts_per_tok": 1},
    )
