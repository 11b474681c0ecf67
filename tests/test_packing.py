"""Packed (padding-free) batches on a Halo layout: documents never attend across each other."""

import pytest
import torch
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from halo_core import ParallelConfig, parallelize
from halo_core.testing.compare import assert_close
from halo_core.tiny import tiny_model


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_documents_do_not_leak_attention(attention):
    model = parallelize(tiny_model("qwen3_moe", {"attn_implementation": attention}, seed=4), ParallelConfig())
    generator = torch.Generator().manual_seed(9)
    docs = [torch.randint(3, model.config.vocab_size, (n,), generator=generator).tolist() for n in (7, 3, 5)]
    packed = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)([{"input_ids": d} for d in docs])
    assert packed["position_ids"].tolist() == [list(range(7)) + list(range(3)) + list(range(5))]
    with torch.no_grad():
        # use_cache=False as in training (TRL sets it): transformers derives the per-document mask from
        # position_ids only when there is no cache.
        together = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"], use_cache=False).logits[0]
        start = 0
        for doc in docs:
            alone = model(input_ids=torch.tensor([doc])).logits[0]
            assert_close(together[start : start + len(doc)], alone, f"{attention}: document of {len(doc)} tokens inside the pack")
            start += len(doc)
        # The same pack without per-document positions is a different computation: the check above can fail.
        leaking = model(input_ids=packed["input_ids"], use_cache=False).logits[0]
        assert not torch.allclose(leaking[7:10], together[7:10])
