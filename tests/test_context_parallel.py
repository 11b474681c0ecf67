"""Context parallelism's own refusals and input split (its equivalence is the conformance kit's, via the plugins)."""

import pytest
import torch

from halo_core.errors import LayoutError
from halo_core.parallel.context_parallel import check_heads, context_parallel_inputs
from halo_core.tiny import tiny_config


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
