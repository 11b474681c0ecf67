"""dots.llm1 (``dots1``): how it differs from the common case.

- Router: DeepSeek-V3 style: sigmoid scores plus ``e_score_correction_bias`` for the choice,
  ``routed_scaling_factor`` on the weights.
- Shared experts: ``mlp.shared_experts`` (one MLP of ``n_shared_experts`` widths), dense: kept whole on
  every EP rank, split by the config's TP plan with the attention.
- The first ``first_k_dense_replace`` layers hold a dense MLP at ``mlp``: no router there, so no MoE block.
"""

from halo_core import Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="dots1",
        model_types=("dots1",),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep", "cp", "tp", "etp"}),
        moe_block="model.layers.*.mlp",
        router="gate",
        experts="experts",
        attention="model.layers.*.self_attn",
    )
