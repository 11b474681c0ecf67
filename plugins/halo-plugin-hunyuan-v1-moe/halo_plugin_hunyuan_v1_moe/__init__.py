"""Hunyuan-A13B (``hunyuan_v1_moe``): how it differs from the common case.

- Router: child ``gate`` (``HunYuanMoEV1Gate``: a linear ``wg``, softmax, top-k from ``moe_topk``, which
  may differ per layer).
- Shared expert: ``mlp.shared_mlp``, dense, kept whole on every rank.
- Attention with per-head query/key layer norms (``query_layernorm``, ``key_layernorm``). The config carries
  no attention TP plan, so the plugin gives one, with those norms replicated and their gradients summed over
  the TP group: each rank normalises only its own heads (without the sum, the kit's replica check fails).
"""

from halo_core import ATTENTION_TP_PLAN, Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="hunyuan-v1-moe",
        model_types=("hunyuan_v1_moe",),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep", "cp", "tp", "etp"}),
        moe_block="model.layers.*.mlp",
        router="gate",
        experts="experts",
        attention="model.layers.*.self_attn",
        tp_plan={
            **ATTENTION_TP_PLAN,
            # Per-head norms, replicated: each TP rank sees its own heads, so their gradients are summed.
            "model.layers.*.self_attn.query_layernorm": "replicated_with_grad_allreduce",
            "model.layers.*.self_attn.key_layernorm": "replicated_with_grad_allreduce",
        },
    )
