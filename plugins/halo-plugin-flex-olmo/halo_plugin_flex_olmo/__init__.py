"""FlexOlmo (``flex_olmo``): how it differs from the common case.

- Router: child ``gate``, softmax top-k, fused experts (OLMoE-like).
- Attention: q/k RMSNorm over all heads" projections at once (``q_norm`` of width heads x head_dim), so a
  tensor-parallel split needs the projection gathered before the norm (the config's plan says
  ``colwise_gather_output``); Halo's TP implements colwise/rowwise only, so no TP or ETP here.
"""

from halo_core import Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="flex-olmo",
        model_types=("flex_olmo",),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep", "cp"}),
        moe_block="model.layers.*.mlp",
        router="gate",
        experts="experts",
        attention="model.layers.*.self_attn",
    )
