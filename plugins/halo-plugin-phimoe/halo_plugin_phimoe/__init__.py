"""PhiMoE (``phimoe``): how it differs from the common case.

- Router: child ``router`` (``PhimoeTopKRouter``, an ``nn.Linear``) returns (logits, weights, index) itself. In
  training it *samples* its two experts per token (sparsemixer: Gumbel draws among the experts near the best score,
  and a random Heun step in the routing gradient); in eval it takes the best two. Under EP every rank draws for its
  own tokens before the exchange, so the routes are as random as on one process, each token's independent of where
  it trains. The kit proves the layout by starting each data-parallel batch's forward from the same random state on
  one process and on its rank; a layout that splits a sequence (CP) draws other samples, so CP is not declared.
- No routing replay (``routing_replay=False``): sparsemixer picks experts by ``max`` over masked scores, not
  ``torch.topk``, where GRPO's replay hooks in; GRPO trains it without replay.
- Experts: ``PhimoeExperts``, fused 3-D weights at transformers' experts interface: the core's default.
- Not declared: ``cp`` (above), ``tp`` and ``etp`` (not tried).

Written by ``halo new-family phimoe --model-type phimoe`` with no edits but this docstring.
"""

from halo_core import Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="phimoe",
        model_types=("phimoe",),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep"}),
        moe_block="model.layers.*.mlp",
        router="router",
        experts="experts",
        attention="model.layers.*.self_attn",
        routing_replay=False,
    )
