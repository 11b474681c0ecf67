"""AI21 Jamba (``jamba``): how it differs from the common case.

- Mamba and attention layers interleaved by ``attn_layer_period``/``attn_layer_offset``, MoE feed-forwards
  (``feed_forward``, router ``router``, fused experts) every ``expert_layer_period`` layers and dense
  ones between. The default pattern puts no attention layer in a two-layer model, so the tiny test model
  sets one Mamba and one attention layer, both MoE.
- Attention at ``self_attn`` in the attention layers only; the config has no TP plan for it, so the plugin
  gives one (the Mamba mixers stay replicated under TP).
- No CP: a Mamba layer's state runs along the whole sequence, which Halo's CP does not pass between chunks.
"""

from halo_core import ATTENTION_TP_PLAN, Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="jamba",
        model_types=("jamba",),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep", "tp", "etp"}),
        moe_block="model.layers.*.feed_forward",
        router="router",
        experts="experts",
        attention="model.layers.*.self_attn",
        tiny_config={"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 1, "expert_layer_offset": 0},  # one Mamba and one attention layer, both MoE
        tp_plan=ATTENTION_TP_PLAN,
    )
