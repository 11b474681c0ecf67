"""Ergo (``ergo``): written by ``halo new-family`` with no edits but this docstring and ``cp`` added to its splits
(its kit passes it).

- MoE block ``model.layers.*.mlp``: router ``gate`` (sigmoid scores, a correction bias in the top-k, scaled
  weights), experts ``experts`` (``ErgoExperts``), a dense shared expert every rank keeps whole.
- ``ErgoExperts`` subclasses the experts-interface module ``ErgoExpertProjections`` and adds a per-expert RMSNorm
  (``post_expert_norm.weight``, ``[E, hidden]``) after it, so its own forward is not the interface's. The core
  switches that forward to the EP path and, on each rank's experts, runs it whole: the projections through the
  model's own experts implementation, then the norm's rows of those experts; the norm's weight is split with the
  projections.
- Not declared: ``etp`` (the norm sits outside the interface the ETP slices follow) and ``tp`` (no TP plan).
"""

from halo_core import Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name='ergo',
        model_types=('ergo',),
        version=__version__,
        api_version=1,
        splits=frozenset({'ep', 'cp'}),
        moe_block='model.layers.*.mlp',
        router='gate',
        experts='experts',
        attention='model.layers.*.self_attn',
    )
