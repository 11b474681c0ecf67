"""IBM Granite MoE with a shared expert (``granitemoeshared``): how it differs from the common case.

- As ``granitemoe`` (MoE block ``block_sparse_moe``, router ``router``, fused experts), plus a dense
  ``shared_mlp`` beside the block, kept whole on every rank. Its width ``shared_intermediate_size``
  defaults to 0 (no shared MLP), so the tiny test model sets it.
- The config's ``base_model_tp_plan`` names only the experts, so the plugin gives the attention plan.
"""

from halo_core import ATTENTION_TP_PLAN, Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="granitemoeshared",
        model_types=("granitemoeshared",),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep", "cp", "tp", "etp"}),
        moe_block="model.layers.*.block_sparse_moe",
        router="router",
        experts="experts",
        attention="model.layers.*.self_attn",
        tp_plan=ATTENTION_TP_PLAN,
        tiny_config={"shared_intermediate_size": 32},  # the default 0 builds no shared MLP, which the kit must cover
    )
