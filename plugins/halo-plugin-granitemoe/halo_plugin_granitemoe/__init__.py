"""IBM Granite MoE (``granitemoe``): how it differs from the common case.

- MoE block at ``block_sparse_moe`` with children ``router`` (a linear layer, top-k then softmax over
  the k logits) and ``experts`` (fused ``input_linear``/``output_linear`` weights, transformers' experts
  interface).
- Logits, embeddings, residuals and attention are scaled by the config's multipliers; nothing in the splits
  depends on them.
- The config's ``base_model_tp_plan`` names only the experts, so the plugin gives the attention plan.
"""

from halo_core import ATTENTION_TP_PLAN, Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="granitemoe",
        model_types=("granitemoe",),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep", "cp", "tp", "etp"}),
        moe_block="model.layers.*.block_sparse_moe",
        router="router",
        experts="experts",
        attention="model.layers.*.self_attn",
        tp_plan=ATTENTION_TP_PLAN,
    )
