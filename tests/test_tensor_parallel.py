"""Tensor and expert-tensor parallelism's own refusals and slicing (their equivalence is the kit's, via the plugins)."""

import dataclasses

import pytest
import torch

from halo_core.errors import LayoutError
from halo_core.parallel.config import ParallelConfig
from halo_core.parallel.expert_tensor_parallel import intermediate_splits, intermediate_widths, join_slices, take_slice
from halo_core.parallel.plan import LayoutPlan
from halo_core.parallel.tensor_parallel import check_heads, partial_gradient_parameters, resolve_plan
from halo_core.registry import discover
from halo_core.tiny import tiny_config, tiny_model

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)


def _family(name):
    return discover(strict=False).by_name(name).family


def test_head_counts_must_divide_by_tp_times_cp():
    config = tiny_config("qwen3_moe")  # 4 query heads, 2 key/value heads
    check_heads(config, 2, 1)
    with pytest.raises(LayoutError, match="num_key_value_heads=2 is not divisible by tensor_parallel_size tp=2 times context_parallel_size cp=2"):
        check_heads(config, 2, 2)


def test_the_plan_comes_from_the_config_and_marks_per_head_norms():
    model = tiny_model("qwen3_moe", device="meta")
    plan = resolve_plan(model, _family("qwen3-moe"))
    assert plan["model.layers.0.self_attn.q_proj"] == "colwise" and plan["model.layers.1.self_attn.o_proj"] == "rowwise"
    assert not any("experts" in name or name.endswith("mlp.gate") for name in plan)  # experts are EP/ETP's, the router stays whole
    assert "model.layers.0.self_attn.q_norm.weight" in partial_gradient_parameters(model, _family("qwen3-moe"))


def test_a_family_without_any_plan_is_refused():
    family = dataclasses.replace(_family("gpt-oss"), tp_plan={})
    with pytest.raises(LayoutError, match="declares tp, but neither Family.tp_plan nor the config's base_model_tp_plan"):
        resolve_plan(tiny_model("gpt_oss", {"attn_implementation": "eager"}, device="meta"), family)


def test_a_plan_style_halo_does_not_implement_is_refused():
    with pytest.raises(LayoutError, match="kv_a_proj_with_mqa as 'mla_kv_a_proj', which Halo's tensor parallelism does not implement"):
        resolve_plan(tiny_model("glm4_moe_lite", device="meta"), _family("glm4-moe"))
    family = dataclasses.replace(_family("gpt-oss"), tp_plan={"model.layers.*.self_attn.q_proj": "sideways"})
    with pytest.raises(LayoutError, match="'sideways'; use one of"):
        resolve_plan(tiny_model("gpt_oss", {"attn_implementation": "eager"}, device="meta"), family)


@pytest.mark.parametrize("model_type", ["qwen3_moe", "gpt_oss"])
def test_expert_slices_join_back_to_the_whole(model_type):
    experts = tiny_model(model_type, {"attn_implementation": "eager"}).model.layers[0].mlp.experts
    splits, whole = intermediate_splits(experts)
    assert whole == (["down_proj_bias"] if model_type == "gpt_oss" else [])
    for name, split in splits.items():
        full = getattr(experts, name).detach()
        pieces = [take_slice(full, split, rank, 4) for rank in range(4)]
        torch.testing.assert_close(join_slices(pieces, split), full, rtol=0, atol=0)
        assert all(p.numel() * 4 == full.numel() for p in pieces)


def test_concatenated_gate_and_up_are_sliced_half_by_half():
    experts = tiny_model("qwen3_moe").model.layers[0].mlp.experts
    split = intermediate_splits(experts)[0]["gate_up_proj"]
    full = experts.gate_up_proj.detach()  # [E, 2I, H]: gate rows then up rows
    half = full.shape[1] // 2
    mine = take_slice(full, split, 1, 2)
    torch.testing.assert_close(mine[:, : half // 2], full[:, half // 2 : half], rtol=0, atol=0)
    torch.testing.assert_close(mine[:, half // 2 :], full[:, half + half // 2 :], rtol=0, atol=0)


def test_etp_must_divide_the_intermediate_size():
    experts = tiny_model("qwen3_moe").model.layers[0].mlp.experts
    with pytest.raises(LayoutError, match="intermediate size 16 is not divisible by expert_tensor_parallel_size etp=3"):
        plan = LayoutPlan(ParallelConfig(etp=3), ParallelConfig(etp=3).resolve(3), "qwen3_moe")
        plan.check_expert_width("model.layers.0.mlp.experts.gate_up_proj", intermediate_widths(experts)["gate_up_proj"], 4, grouped_mm=True)


def _load_into_layouts(rank, world, folder, model_type, overrides):
    import torch.distributed as dist

    from halo_core import ParallelConfig, from_pretrained, full_state_dict
    from halo_core.testing.compare import assert_close

    reference = tiny_model(model_type, overrides, seed=5)
    if rank == 0:
        reference.save_pretrained(folder)
    dist.barrier()
    ids = torch.randint(0, reference.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(0))  # the same on TP peers
    for layout in ({"ep": 2, "tp": 2}, {"ep": 2, "etp": 2}):
        model = from_pretrained(folder, ParallelConfig(**layout))
        assert_close(model(input_ids=ids).logits, reference(input_ids=ids).logits, f"rank {rank}: logits after loading into {layout}")
        state = full_state_dict(model)
        if rank == 0:
            for name, tensor in reference.state_dict().items():
                assert_close(state[name], tensor, f"{name} after loading into {layout} and gathering")


@pytest.mark.parametrize("model_type, overrides", [("qwen3_moe", {}), ("gpt_oss", {"attn_implementation": "eager"})], ids=["per-expert-tensors", "fused-experts"])
def test_a_checkpoint_loads_into_tp_and_etp_layouts_and_gathers_back(tmp_path, model_type, overrides):
    from halo_core.testing.spawn import spawn

    spawn(_load_into_layouts, 4, str(tmp_path), model_type, overrides)
