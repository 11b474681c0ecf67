"""ERNIE 4.5 MoE (``ernie4_5_moe``): how it differs from the common case.

- Router: child ``gate``, softmax; the expert-choice bias (``gate.moe_statics.e_score_correction_bias``) is
  kept in float32 by the model's own ``_keep_in_fp32_modules_strict``.
- Shared experts: ``mlp.shared_experts`` (``moe_num_shared_experts`` widths), dense: kept whole on every
  EP rank, split by the config's TP plan with the attention.
- Layers before ``moe_layer_start_index`` (and off ``moe_layer_interval``) are dense MLPs, skipped.
"""

from halo_core import Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="ernie4-5-moe",
        model_types=("ernie4_5_moe",),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep", "cp", "tp", "etp"}),
        moe_block="model.layers.*.mlp",
        router="gate",
        experts="experts",
        attention="model.layers.*.self_attn",
    )
