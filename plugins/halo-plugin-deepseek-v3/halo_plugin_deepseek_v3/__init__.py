"""DeepSeek-V3 (``deepseek_v3``): how it differs from the common case.

- Router: child ``gate``, sigmoid scores with an ``e_score_correction_bias`` buffer,
  group-limited top-k (``n_group`` groups, the best ``topk_group`` of them) and
  ``routed_scaling_factor``; the core leaves all of it to transformers.
- Shared experts: ``mlp.shared_experts``, dense, kept whole on every rank.
- The first ``first_k_dense_replace`` layers are dense MLPs at the same path.
- Attention is latent (MLA). Tiny test models need ``n_group`` to divide their 8 experts.
"""

from halo_core import Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="deepseek-v3",
        model_types=("deepseek_v3",),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep"}),
        moe_block="model.layers.*.mlp",
        router="gate",
        experts="experts",
        attention="model.layers.*.self_attn",
        tiny_config={"n_group": 2, "topk_group": 1},
    )
