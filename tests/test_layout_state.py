"""The layout and shards ``parallelize`` records go where the module goes: a deepcopy keeps them, pickling refuses."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.distributed as dist

from halo_core.parallel.config import ParallelConfig
from halo_core.parallel.layout_state import is_laid_out, laid_out, layout_of, register_shard, shard_of, wrap
from halo_core.parallel.parallelize import parallelize
from halo_core.tiny import tiny_model


def _lora_model():
    """A one-process tiny Qwen3-MoE with LoRA on its fused experts: each experts module then runs ``halo_ep`` through a
    one-rank shard, so a forward needs ``shard_of`` on every experts module (nonzero ``B`` so the adapters count)."""
    from peft import LoraConfig

    from halo_core.lora.inject import add_adapters

    torch.manual_seed(0)
    model = parallelize(tiny_model("qwen3_moe", {"num_hidden_layers": 2}), ParallelConfig())
    add_adapters(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_parameters=["experts.gate_up_proj", "experts.down_proj"]), seed=3)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.05)
    return model.eval()


def test_a_deepcopy_of_a_laid_out_model_keeps_its_layout_and_shards_and_runs_the_same_forward():
    model = _lora_model()
    ids = torch.randint(3, 120, (2, 9))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        copied = copy.deepcopy(model)
        got = copied(input_ids=ids).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    layout = layout_of(copied)
    assert layout.adapters is not None and layout.expert_params == layout_of(model).expert_params
    experts = "model.layers.0.mlp.experts"
    shard = shard_of(copied.get_submodule(experts))
    assert shard is layout.experts[experts] and shard is not shard_of(model.get_submodule(experts))
    shard.lora.clear()  # the copy's shards are its own: changing them leaves the original's adapters applied
    assert shard_of(model.get_submodule(experts)).lora


def test_a_wrapper_copied_answers_for_its_own_copy_of_the_model():
    model = _lora_model()
    wrapper = torch.nn.Sequential(model)
    wrap(wrapper, model)
    copied = copy.deepcopy(wrapper)
    assert laid_out(copied) is copied[0] and layout_of(copied) is layout_of(copied[0])
    assert list(copied.state_dict()) == list(wrapper.state_dict())  # the record adds no second name for the model


def test_is_laid_out_answers_for_the_model_and_its_wrapper_and_lay_out_leaves_a_laid_out_model_as_it_is():
    """A module holding only a shard is not laid out; the model is once ``parallelize`` ran, and so is a
    wrapper of it. ``lay_out`` asks this (it caught ``layout_of``'s error before) and parallelizes only what is not."""
    from halo_core.trainers.parts.layout import lay_out

    plain = tiny_model("qwen3_moe", {"num_hidden_layers": 2})
    assert not is_laid_out(plain) and not is_laid_out(torch.nn.Sequential(plain))
    model = lay_out(plain, ParallelConfig())
    holder = torch.nn.Linear(2, 2)
    register_shard(holder, object())
    assert not is_laid_out(holder)  # Halo's record on it, but no layout in it
    assert is_laid_out(model) and lay_out(model, ParallelConfig(ep=2)) is model and layout_of(model).dims.ep == 1
    wrapper = torch.nn.Sequential(model)
    wrap(wrapper, model)
    assert is_laid_out(wrapper)


def test_a_deepcopy_shares_the_process_groups_and_pickling_refuses_in_one_line():
    """Under EP the shards hold process groups, which do not copy: the copy shares them (it runs on the same ranks)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    try:
        model = parallelize(tiny_model("qwen3_moe", {"num_hidden_layers": 2}), ParallelConfig(ep=2, fsdp=False))
        copied = copy.deepcopy(model)
        name = "model.layers.1.mlp.experts"
        original, shard = layout_of(model).experts[name], shard_of(copied.get_submodule(name))
        assert shard is layout_of(copied).experts[name] and shard is not original
        assert shard.dispatcher is original.dispatcher and layout_of(copied).mesh is layout_of(model).mesh
        with pytest.raises(TypeError) as refused:
            pickle.dumps(model)
        assert "does not pickle" in str(refused.value) and "\n" not in str(refused.value)
    finally:
        dist.destroy_process_group()
