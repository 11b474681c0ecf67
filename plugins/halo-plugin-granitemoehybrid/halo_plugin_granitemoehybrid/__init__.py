"""IBM Granite 4.0 hybrid (``granitemoehybrid``): how it differs from the common case.

- Mamba-2 layers and softmax-attention layers (``layer_types`` "linear_attention"/"full_attention"),
  each with the Granite MoE block ``block_sparse_moe`` (router ``router``, fused experts) and a dense
  ``shared_mlp``. The default config is Mamba only; the core's tiny model keeps one attention layer.
- Attention at ``self_attn`` in the attention layers only; the config's TP plan names only the experts, so
  the plugin gives the attention plan (the Mamba mixers stay replicated under TP).
- No CP: a Mamba layer's state runs along the whole sequence, which Halo's CP does not pass between chunks.
"""

from halo_core import ATTENTION_TP_PLAN, Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="granitemoehybrid",
        model_types=("granitemoehybrid",),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep", "tp", "etp"}),
        moe_block="model.layers.*.block_sparse_moe",
        router="router",
        experts="experts",
        attention="model.layers.*.self_attn",
        tp_plan=ATTENTION_TP_PLAN,
    )
