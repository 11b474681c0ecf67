"""Conformance checks a family plugin runs in its own tests: ``check_family("my-family")``.

Today the kit proves what a plugin can get wrong at degree 1: it is discovered through
its entry point with status ok, its declared paths match every claimed model type's
real module tree (MoE blocks with router and experts, attention), and running its hooks
leaves the model's logits unchanged. Multi-process equivalence of each declared split
is added to the same call as the split engines land, so plugin tests need no change.
"""

from __future__ import annotations

import torch

from halo_core.adapt import adapt_model
from halo_core.context import ParallelContext
from halo_core.layout import find_attention, find_moe_blocks
from halo_core.registry import discover
from halo_core.tiny import tiny_model


def check_family(name: str, *, seed: int = 0) -> None:
    """Raise ``AssertionError`` naming the first way family ``name`` fails the contract."""
    registry = discover(strict=False)
    record = registry.by_name(name)
    assert record.ok, f"family {name!r} ({record.distribution}) is broken: {'; '.join(record.errors)}"
    family = record.family
    for model_type in family.model_types:
        assert registry.family_record(model_type) is record, f"model type {model_type!r} does not resolve to {name!r}"
        model = tiny_model(model_type, family.tiny_config, seed=seed)
        blocks = find_moe_blocks(model, family)
        assert blocks, (
            f"{model_type}: no module matches moe_block={family.moe_block} with children "
            f"{family.router!r} and {family.experts!r}; module names start {[n for n, _ in model.named_modules()][:8]}"
        )
        assert find_attention(model, family), f"{model_type}: no module matches attention={family.attention}"
        _check_identity_at_degree_one(registry, record, model_type, model, seed)


def _check_identity_at_degree_one(registry, record, model_type, model, seed) -> None:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, model.config.vocab_size, (2, 7), generator=generator)
    with torch.no_grad():
        before = model(input_ids=input_ids).logits
        context = ParallelContext(family=record.family, model_type=model_type, model_config=model.config)
        adapted = adapt_model(model, registry, record, context)
        after = adapted(input_ids=input_ids).logits
    torch.testing.assert_close(after, before, rtol=0, atol=0, msg=lambda m: f"{model_type}: hooks at degree 1 changed the logits: {m}")
