"""DBRX (``dbrx``): written by ``halo new-family`` with no edits but this docstring.

- MoE block ``transformer.blocks.*.ffn`` (``DbrxFFN``): router ``router`` (``DbrxRouter``, logits only; softmax,
  top-k and the p-norm of the chosen weights are taken in the block, so routing replay cannot reach them:
  ``routing_replay=False``), experts ``experts`` (``DbrxExperts``).
- ``DbrxExperts`` takes the experts interface's forward arguments but is not decorated, and stacks its experts
  along dim 0 of 2-D weights in a child, ``mlp.w1``/``mlp.v1``/``mlp.w2``, each ``[E * ffn_hidden_size, hidden]``.
  The core splits those rows by whole experts under their own names and runs DBRX's own forward on each rank's
  experts (``halo_core.parallel.expert_parallel``).
- The expert count and top-k sit in the ``ffn_config`` sub-config; tiny models need ``attn_config.clip_qkv``
  set (its default ``None`` fails in ``torch.clamp``), which the core's tiny rules give.
- Not declared: ``etp`` (not at the interface), ``tp`` (``Wqkv`` fuses q, k and v) and ``cp`` (its heads sit in
  ``attn_config``, which the kit's head split does not reach).
"""

from halo_core import Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name='dbrx',
        model_types=('dbrx',),
        version=__version__,
        api_version=1,
        splits=frozenset({'ep'}),
        moe_block='transformer.blocks.*.ffn',
        router='router',
        experts='experts',
        attention='transformer.blocks.*.norm_attn_norm.attn',
        routing_replay=False,
    )
