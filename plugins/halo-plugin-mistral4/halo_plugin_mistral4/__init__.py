"""Mistral 4 MoE (``mistral4``): how it differs from the common case.

- ``AutoModelForCausalLM`` does not map the config: the family names ``Mistral4ForCausalLM``.
- Router: child ``gate`` (softmax top-k); shared experts at ``mlp.shared_experts``, dense.
- Attention is latent (MLA).
"""

from halo_core import Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="mistral4",
        model_types=("mistral4",),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep"}),
        moe_block="model.layers.*.mlp",
        router="gate",
        experts="experts",
        attention="model.layers.*.self_attn",
        model_class="Mistral4ForCausalLM",
    )
