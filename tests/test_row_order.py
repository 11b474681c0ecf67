"""The EP path's reorderings and the receiver's experts, against autograd and transformers on the CPU.

The layouts' end-to-end equivalence runs in test_expert_parallel and the family kits; these pin
each piece alone, so a wrong inverse or a skipped permutation names itself."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

from halo_core.parallel import grouped_experts
from halo_core.parallel.row_order import ExpandToPairs, PermuteRows, inverse_permutation
from halo_core.tiny import tiny_model


def test_inverse_permutation_undoes_the_order():
    order = torch.randperm(37)
    inverse = inverse_permutation(order)
    assert torch.equal(order[inverse], torch.arange(37)) and torch.equal(inverse[order], torch.arange(37))


def test_permute_rows_matches_autograd_indexing():
    rows = torch.randn(23, 5, dtype=torch.float64, requires_grad=True)
    order = torch.randperm(23)
    inverse = inverse_permutation(order)
    grad = torch.randn(23, 5, dtype=torch.float64)
    out = PermuteRows.apply(rows, order, inverse)
    assert torch.equal(out, rows[order])
    (mine,) = torch.autograd.grad(out, rows, grad)
    (reference,) = torch.autograd.grad(rows[order], rows, grad)
    assert torch.equal(mine, reference)
    torch.autograd.gradcheck(lambda x: PermuteRows.apply(x, order, inverse), (rows,))


@pytest.mark.parametrize("top_k", [1, 3])
def test_expand_to_pairs_matches_autograd_indexing(top_k):
    tokens = 11
    hidden = torch.randn(tokens, 4, dtype=torch.float64, requires_grad=True)
    order = torch.randperm(tokens * top_k)
    inverse = inverse_permutation(order)
    grad = torch.randn(tokens * top_k, 4, dtype=torch.float64)
    out = ExpandToPairs.apply(hidden, order, inverse, top_k)
    reference = hidden[order // top_k]
    assert torch.equal(out, reference)
    (mine,) = torch.autograd.grad(out, hidden, grad)
    (expected,) = torch.autograd.grad(reference, hidden, grad)
    torch.testing.assert_close(mine, expected, rtol=1e-12, atol=1e-12)
    torch.autograd.gradcheck(lambda x: ExpandToPairs.apply(x, order, inverse, top_k), (hidden,))


def _experts(model_type: str, overrides: dict):
    model = tiny_model(model_type, {"num_hidden_layers": 1, **overrides}, seed=3)
    return model.model.layers[0].mlp.experts


@pytest.mark.parametrize(
    ("model_type", "overrides"),
    [("qwen3_moe", {}), ("gpt_oss", {"attn_implementation": "eager", "sliding_window": 4})],  # gated, no bias; biased, transposed, own gate
)
@pytest.mark.parametrize("sources", [1, 3])
def test_received_rows_match_transformers_grouped_mm(model_type, overrides, sources):
    """Rows grouped by (source, expert), some blocks empty: each row through its expert, as transformers'
    ``grouped_mm`` computes it with one pair per row and unit weights, forward and backward."""
    experts = _experts(model_type, overrides)
    generator = torch.Generator().manual_seed(5)
    counts = torch.randint(0, 4, (sources, experts.num_experts), generator=generator)
    counts[0, 1] = 0  # an expert that one source sends nothing
    counts[-1] = 0 if sources > 1 else counts[-1]  # a source that sends nothing at all
    ids = torch.arange(experts.num_experts).repeat(sources).repeat_interleave(counts.reshape(-1))
    rows = torch.randn(ids.numel(), experts.config.hidden_size, generator=generator, requires_grad=True)
    grad = torch.randn(rows.shape, generator=generator)

    mine = grouped_experts.grouped_mm_received(experts, rows, ids, counts)
    (mine_rows, *mine_params) = torch.autograd.grad(mine, [rows, *experts.parameters()], grad)
    ones = torch.ones(ids.numel(), 1)
    reference = ALL_EXPERTS_FUNCTIONS["grouped_mm"](experts, rows, ids.unsqueeze(1), ones)
    (ref_rows, *ref_params) = torch.autograd.grad(reference, [rows, *experts.parameters()], grad)

    torch.testing.assert_close(mine, reference, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mine_rows, ref_rows, rtol=1e-5, atol=1e-6)
    for got, expected in zip(mine_params, ref_params):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_only_transformers_grouped_mm_is_replaced():
    experts = _experts("qwen3_moe", {})
    assert grouped_experts.handles(experts, ALL_EXPERTS_FUNCTIONS["grouped_mm"])
    assert not grouped_experts.handles(experts, ALL_EXPERTS_FUNCTIONS["batched_mm"])
    # A module without transformers' experts attributes (an older transformers): its own implementation runs.
    assert not grouped_experts.handles(torch.nn.Module(), ALL_EXPERTS_FUNCTIONS["grouped_mm"])
