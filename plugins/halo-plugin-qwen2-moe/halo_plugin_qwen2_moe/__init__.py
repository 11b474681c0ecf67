"""Qwen1.5-MoE / Qwen2-MoE (``qwen2_moe``): how it differs from the common case.

- Router: child ``gate``, softmax over all experts, top-k, renormalised only with ``norm_topk_prob``.
- Shared expert: ``mlp.shared_expert`` with its own sigmoid gate ``mlp.shared_expert_gate``; dense,
  kept whole on every EP rank (TP leaves it replicated; the config's plan splits only attention).
- ``mlp_only_layers`` / ``decoder_sparse_step`` may make some layers dense; the core finds MoE blocks by
  their router and experts children, so those layers are skipped.
"""

from halo_core import Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="qwen2-moe",
        model_types=("qwen2_moe",),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep", "cp", "tp", "etp"}),
        moe_block="model.layers.*.mlp",
        router="gate",
        experts="experts",
        attention="model.layers.*.self_attn",
    )
