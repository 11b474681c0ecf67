"""InclusionAI Ling (``bailing_hybrid``): how it differs from the common case.

- Router: child ``gate``, bias-corrected group-limited scores (``num_expert_group``,
  ``topk_group``); top-k is ``num_experts_per_token``. Shared experts are dense.
- Layers mix linear and full attention (``layer_types``) and dense and sparse MLPs
  (``mlp_layer_types``); tiny test models get one linear and one full-attention layer,
  both sparse.
"""

from halo_core import Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="ling",
        model_types=("bailing_hybrid",),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep"}),
        moe_block="model.layers.*.mlp",
        router="gate",
        experts="experts",
        attention="model.layers.*.self_attn",
        tiny_config={
            "layer_types": ["linear_attention", "full_attention"],
            "mlp_layer_types": ["sparse", "sparse"],
            "layer_group_size": 2,
            "num_expert_group": 2,
            "topk_group": 1,
        },
    )
