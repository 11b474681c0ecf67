"""Qwen3.5 / Qwen3.6 MoE (``qwen3_5_moe``, text part ``qwen3_5_moe_text``) and Qwen3-Next (``qwen3_next``).

- Shared expert: ``mlp.shared_expert`` with its own sigmoid gate ``mlp.shared_expert_gate``;
  dense, kept whole on every rank. Routed experts and router (``gate``) are the common case.
- Three of every four layers are linear attention (``linear_attn``, Gated DeltaNet);
  ``self_attn`` exists only in the full-attention layers. Tiny test models get one of each.
"""

from halo_core import Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="qwen3-5-moe",
        model_types=("qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next"),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep"}),
        moe_block="model.layers.*.mlp",
        router="gate",
        experts="experts",
        attention="model.layers.*.self_attn",
    )
