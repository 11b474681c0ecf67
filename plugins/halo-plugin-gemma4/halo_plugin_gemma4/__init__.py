"""Gemma 4 MoE (``gemma4_text``, the text part of ``gemma4`` with ``enable_moe_block``).

- The MoE block is the decoder layer itself: ``router`` and ``experts`` are its children,
  beside a dense ``mlp`` that every token also passes through.
- Router: ``router.proj`` is the ``[E, hidden]`` projection, after a norm and a learned
  scale; top-k is ``top_k_experts``; per-expert output scales stay in the router.
- Per-layer input embeddings (``vocab_size_per_layer_input``) are shrunk in tiny models.
"""

from halo_core import Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="gemma4",
        model_types=("gemma4_text",),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep"}),
        moe_block="model.layers.*",
        router="router",
        experts="experts",
        attention="model.layers.*.self_attn",
        tiny_config={
            "enable_moe_block": True,
            "num_experts": 8,
            "top_k_experts": 2,
            "moe_intermediate_size": 16,
            "layer_types": ["sliding_attention", "full_attention"],
            "vocab_size_per_layer_input": 128,
            "hidden_size_per_layer_input": 8,
        },
    )
