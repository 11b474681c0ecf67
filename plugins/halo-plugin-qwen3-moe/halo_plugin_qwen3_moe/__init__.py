"""Qwen3-MoE (``qwen3_moe``): the common case, and the reference every other family is compared with.

- MoE block: ``model.layers.N.mlp`` (``Qwen3MoeSparseMoeBlock``); layers listed in
  ``mlp_only_layers`` hold a dense MLP at the same path and are not MoE blocks.
- Router: child ``gate``, softmax over experts then top-k, renormalised when
  ``norm_topk_prob``.
- Experts: child ``experts``, fused ``gate_up_proj [E, 2I, H]`` and ``down_proj [E, H, I]``.
- Attention: ``model.layers.N.self_attn`` with per-head q/k RMSNorm.

Nothing differs from the common case, so no hook beyond the declaration is needed.
"""

from halo_core import Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="qwen3-moe",
        model_types=("qwen3_moe",),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep", "cp", "tp", "etp"}),
        moe_block="model.layers.*.mlp",
        router="gate",
        experts="experts",
        attention="model.layers.*.self_attn",
    )
