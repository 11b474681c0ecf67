"""Context parallelism's own refusals and input split, and packed documents in every layout (the rest of its
equivalence is the conformance kit's, via the plugins)."""

import pytest
import torch

from halo_core.errors import LayoutError
from halo_core.parallel.context_parallel import check_heads, context_parallel_inputs
from halo_core.tiny import tiny_config

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)


def test_head_counts_must_divide_by_cp():
    config = tiny_config("qwen3_moe")  # 4 query heads, 2 key/value heads
    check_heads(config, 2)
    with pytest.raises(LayoutError, match="num_key_value_heads=2 is not divisible by context parallel size cp=4"):
        check_heads(config, 4)


def test_chunks_keep_every_label_and_global_positions():
    ids = torch.arange(12).view(2, 6)
    parts = [context_parallel_inputs(ids, rank, 3) for rank in range(3)]
    assert [p["input_ids"].tolist()[0] for p in parts] == [[0, 1], [2, 3], [4, 5]]
    assert [p["position_ids"].tolist()[0] for p in parts] == [[0, 1], [2, 3], [4, 5]]
    # the token after each chunk's last one is its label, also across chunk boundaries; the sequence's last has none
    assert [p["shift_labels"].tolist()[0] for p in parts] == [[1, 2], [3, 4], [5, -100]]
    assert all(p["num_items_in_batch"] == 10 for p in parts)


def test_a_sequence_must_divide_by_cp():
    with pytest.raises(LayoutError, match="sequence length 7 is not divisible by context parallel size cp=2"):
        context_parallel_inputs(torch.zeros(1, 7, dtype=torch.long), 0, 2)


@pytest.mark.parametrize("family, model_type", [("qwen3-moe", "qwen3_moe"), ("glm4-moe", "glm4_moe_lite")])
def test_packed_documents_stay_apart_in_every_layout(family, model_type):
    """One row of several documents per rank (position ids restarting at 0): CP (Ulysses and ring), TP and EP
    give the single process's result, which keeps the documents apart (GPT-OSS's own forward does not: see
    agent-docs/troubleshooting.md)."""
    import random

    from halo_core.parallel.config import ParallelConfig
    from halo_core.testing.equivalence import run_layouts

    layouts = [ParallelConfig(cp=2), ParallelConfig(cp=4, cp_attention="ring"), ParallelConfig(ep=2, cp=2, cp_attention="ring")]
    if model_type == "qwen3_moe":
        layouts += [ParallelConfig(cp=2, tp=2), ParallelConfig(ep=2, tp=2)]
    run_layouts(family, model_type, 4, layouts, random.SystemRandom().randrange(2**31), packed=True)
