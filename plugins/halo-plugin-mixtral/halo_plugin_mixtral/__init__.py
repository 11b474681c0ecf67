"""Mixtral (``mixtral``): the classic softmax top-k case.

- Router ``gate`` (softmax, top-k, renormalised) and fused ``experts`` at ``model.layers.N.mlp``.
  Checkpoints name the block ``block_sparse_moe`` and the experts ``w1/w2/w3``; transformers'
  conversion mapping renames them on load, and ``halo_core.from_pretrained`` uses it.
"""

from halo_core import Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="mixtral",
        model_types=("mixtral",),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep"}),
        moe_block="model.layers.*.mlp",
        router="gate",
        experts="experts",
        attention="model.layers.*.self_attn",
    )
