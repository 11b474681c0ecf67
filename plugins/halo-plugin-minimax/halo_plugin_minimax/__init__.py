"""MiniMax-Text-01 (``minimax``): how it differs from the common case.

- Router: child ``gate``, softmax top-k (Mixtral-like), fused experts.
- Most layers are lightning (linear) attention (``layer_types`` "linear_attention", module ``self_attn`` of
  another class); softmax attention only where the type is "full_attention". Tiny test models get one of each.
- No CP: the linear-attention layers carry a decaying state along the whole sequence, which Halo's CP
  (all-to-all or ring over softmax attention) does not pass between sequence chunks; the kit fails there.
"""

from halo_core import Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="minimax",
        model_types=("minimax",),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep", "tp", "etp"}),
        moe_block="model.layers.*.mlp",
        router="gate",
        experts="experts",
        attention="model.layers.*.self_attn",
    )
