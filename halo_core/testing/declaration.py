"""``check_family``: the one call a family plugin's tests make.

First what a plugin can get wrong at degree 1: it is discovered through its entry point
with status ok, its declared paths match every claimed model type's real module tree
(MoE blocks with router and experts, attention), running its hooks leaves the
logits unchanged, and its routers are as replayable as it declares. Then every kit
layout of the declared splits against the single-process reference in spawned gloo
processes (``equivalence``).
"""

from __future__ import annotations

import random

import torch

from halo_core.adapt import adapt_model
from halo_core.context import ParallelContext
from halo_core.hf_config import text_config
from halo_core.layout import find_attention, find_moe_blocks
from halo_core.parallel.config import ParallelConfig
from halo_core.registry import discover
from halo_core.rl.routing import silent_routers
from halo_core.testing.equivalence import run_layouts, seeded_forward
from halo_core.tiny import tiny_family_model


#: Layouts the kit checks, by world size; a family gets those whose splits it all declares.
#: Data parallelism fills the rest of the world, so a degree-2 split at world 4 also runs
#: beside a second data-parallel replica (a superset of the same split at world 2, which
#: ``halo launch`` tests cover); one spawn per model type keeps the kit fast.
KIT_LAYOUTS = {
    4: [
        ParallelConfig(ep=2), ParallelConfig(ep=4), ParallelConfig(cp=2), ParallelConfig(tp=2), ParallelConfig(etp=2),
        ParallelConfig(ep=2, cp=2), ParallelConfig(ep=2, tp=2), ParallelConfig(ep=2, etp=2), ParallelConfig(cp=2, tp=2),
        ParallelConfig(cp=4, cp_attention="ring"), ParallelConfig(ep=2, cp=2, cp_attention="ring"),
    ],
}


def kit_layouts(supported: frozenset[str]) -> dict[int, list[ParallelConfig]]:
    chosen = {}
    for world, layouts in KIT_LAYOUTS.items():
        mine = [c for c in layouts if {s for s in ("ep", "cp", "tp", "etp") if getattr(c, s) > 1} <= supported]
        if mine:
            chosen[world] = mine
    return chosen


def check_family(name: str, *, seed: int | None = None) -> None:
    """Raise ``AssertionError`` naming the first way family ``name`` fails the contract.

    Inputs are drawn fresh each call; a failure names the seed, and ``seed=`` replays it.
    """
    seed = random.SystemRandom().randrange(2**31) if seed is None else seed
    registry = discover(strict=False)
    record = registry.by_name(name)
    assert record.ok, f"family {name!r} ({record.distribution}) is broken: {'; '.join(record.errors)}"
    family = record.family
    for model_type in family.model_types:
        assert registry.family_record(model_type) is record, f"model type {model_type!r} does not resolve to {name!r}"
        model = tiny_family_model(family, model_type, seed=seed)
        blocks = find_moe_blocks(model, family)
        assert blocks, (
            f"{model_type}: no module matches moe_block={family.moe_block} with children "
            f"{family.router!r} and {family.experts!r}; module names start {[n for n, _ in model.named_modules()][:8]}"
        )
        assert find_attention(model, family), f"{model_type}: no module matches attention={family.attention}"
        _check_identity_at_degree_one(registry, record, model_type, model, seed)
        _check_routing_replay(family, model_type, model, seed)
        for world, layouts in kit_layouts(registry.supported_splits(record, model_type)).items():
            run_layouts(name, model_type, world, layouts, seed)


def _check_identity_at_degree_one(registry, record, model_type, model, seed) -> None:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, text_config(model.config).vocab_size, (2, 7), generator=generator)
    with torch.no_grad():  # each forward from the same random state: a model that draws noise (a diffusion LM) draws it alike
        before = seeded_forward(model, {"input_ids": input_ids}, 0, seed).logits
        context = ParallelContext(family=record.family, model_type=model_type, model_config=model.config)
        adapted = adapt_model(model, registry, record, context)
        after = seeded_forward(adapted, {"input_ids": input_ids}, 0, seed).logits
    torch.testing.assert_close(after, before, rtol=0, atol=0, msg=lambda m: f"{model_type}: hooks at degree 1 changed the logits: {m}")


def _check_routing_replay(family, model_type, model, seed) -> None:
    """``Family.routing_replay`` says what one forward shows: whether every router picks its experts by ``torch.topk``."""
    generator = torch.Generator().manual_seed(seed)
    silent = silent_routers(model, family, input_ids=torch.randint(0, text_config(model.config).vocab_size, (2, 7), generator=generator))
    if family.routing_replay:
        assert not silent, (f"{model_type}: router {silent[0]} calls no torch.topk, so GRPO's routing replay cannot reach it; "
                            f"declare routing_replay=False")
    else:
        assert silent, f"{model_type}: declares routing_replay=False, but every router picks its experts by torch.topk; drop the declaration"
