"""bench/new_family_sweep.py: which model types it sweeps, and one quick row (scaffold, layout read) each way."""

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "new_family_sweep.py"


@pytest.fixture(scope="module")
def sweep():
    spec = importlib.util.spec_from_file_location("new_family_sweep", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["new_family_sweep"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # scaffolds and checks a tiny model of every MoE type
def test_it_sweeps_the_moe_types_and_not_the_dense_ones(sweep):
    types = sweep.moe_types()
    assert {"qwen3_moe", "mixtral", "dbrx", "qwen2_moe", "jetmoe", "granitemoe"} <= set(types)
    assert not {"llama", "qwen3", "gpt2"} & set(types)


def test_a_quick_row_replaces_the_bundled_plugin_and_reports_the_layout_read(sweep, tmp_path):
    row = sweep.sweep_one("qwen3_moe", tmp_path, quick=True, timeout=60)
    assert row["passed"] and row["read_layout"] and row["replaces"] == "halo-plugin-qwen3-moe", row
    assert (tmp_path / "halo-plugin-sweep-qwen3-moe" / "pyproject.toml").exists()


def test_a_vision_language_type_scaffolds_with_its_class_and_only_the_language_models_attention(sweep, tmp_path):
    row = sweep.sweep_one("qwen3_vl_moe", tmp_path, quick=True, timeout=60)
    assert row["passed"] and row["found_moe"] and row["model_class"] == "Qwen3VLMoeForConditionalGeneration", row
    source = (tmp_path / "halo-plugin-sweep-qwen3-vl-moe" / "halo_plugin_sweep_qwen3_vl_moe" / "__init__.py").read_text()
    assert "moe_block='model.language_model.layers.*.mlp'" in source
    assert "attention='model.language_model.layers.*.self_attn'" in source  # not the vision tower's


def test_a_text_part_with_no_head_of_its_own_scaffolds_its_composite(sweep, tmp_path):
    row = sweep.sweep_one("qwen3_vl_moe_text", tmp_path, quick=True, timeout=60)
    assert row["passed"] and row["found_moe"] and row["claims"] == "qwen3_vl_moe", row
    assert row["replaces"] == "halo-plugin-qwen3-vl-moe" and row["model_class"] == "Qwen3VLMoeForConditionalGeneration", row
    source = (tmp_path / "halo-plugin-sweep-qwen3-vl-moe-text" / "halo_plugin_sweep_qwen3_vl_moe_text" / "__init__.py").read_text()
    assert "model_types=('qwen3_vl_moe',)" in source and "`qwen3_vl_moe_text` is the text part of `qwen3_vl_moe`" in source


def test_a_type_with_no_language_model_head_is_marked_in_the_plugin_and_its_test(sweep, tmp_path):
    from halo_cli.scaffold import CANNOT_TRAIN_MARK

    row = sweep.sweep_one("vitpose_backbone", tmp_path, quick=True, timeout=60)
    assert not row["passed"] and row["trainable"] is False, row
    project = tmp_path / "halo-plugin-sweep-vitpose-backbone"
    source = (project / "halo_plugin_sweep_vitpose_backbone" / "__init__.py").read_text()
    assert CANNOT_TRAIN_MARK in source and "VitPoseBackbone" in source
    test = next((project / "tests").glob("test_*.py")).read_text()
    assert "pytest.fail(" in test and CANNOT_TRAIN_MARK in test


def test_a_type_whose_experts_are_not_at_the_interface_is_marked_with_what_looks_like_experts(sweep, tmp_path):
    from halo_cli.scaffold import NO_MOE_MARK

    row = sweep.sweep_one("switch_transformers", tmp_path, quick=True, timeout=60)
    assert not row["passed"] and row["marked"].startswith(NO_MOE_MARK), row
    assert ".mlp.experts" in row["marked"], row  # where its experts are, each an MLP of its own
    project = tmp_path / "halo-plugin-sweep-switch-transformers"
    test = next((project / "tests").glob("test_*.py")).read_text()
    assert "pytest.fail(" in test and NO_MOE_MARK in test


def test_fused_experts_the_core_cannot_call_are_marked_not_left_to_fail_at_the_first_layout():
    """Fused weights behind a forward that takes neither the interface's arguments nor expert-major rows alone: the
    core's EP would refuse them at the first layout, so the scaffold marks the plugin instead."""
    import torch
    from torch import nn

    from halo_cli.scaffold import NO_MOE_MARK, _experts_the_core_cannot_call

    class MaskedExperts(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_up_proj = nn.Parameter(torch.zeros(4, 8, 16))
            self.down_proj = nn.Parameter(torch.zeros(4, 8, 8))

        def forward(self, hidden_states, expert_mask):
            return hidden_states

    block = nn.Module()
    block.router, block.experts = nn.Linear(8, 4), MaskedExperts()
    model = nn.Module()
    model.layers = nn.ModuleList([block])
    marked = _experts_the_core_cannot_call(model, {"moe_block": ("layers.*",), "router": "router", "experts": "experts"})
    assert marked.startswith(NO_MOE_MARK) and "takes (hidden_states, expert_mask)" in marked, marked


def test_llama4s_expert_major_experts_scaffold_with_no_mark_and_its_composite_replaces_the_bundled_plugin(sweep, tmp_path):
    text = sweep.sweep_one("llama4_text", tmp_path, quick=True, timeout=60)  # every token for every expert
    assert text["passed"] and text["found_moe"] and text["replaces"] == "halo-plugin-llama4", text
    # the composite's causal-LM class builds on llama4_text, which the bundled plugin claims: --replace names that one
    composite = sweep.sweep_one("llama4", tmp_path, quick=True, timeout=60)
    assert composite["passed"] and composite["replaces"] == "halo-plugin-llama4", composite
    # Kimi-K2.5's text config is deepseek_v3 (bundled), but its class builds on its own config: nothing to replace
    kimi = sweep.sweep_one("kimi_k25", tmp_path, quick=True, timeout=60)
    assert kimi["passed"] and kimi["replaces"] is None, kimi


@pytest.mark.slow  # a sweep row of its own: as slow as the sweep above
def test_a_router_with_more_rows_than_experts_is_read_as_the_router(sweep, tmp_path):
    row = sweep.sweep_one("longcat_flash", tmp_path, quick=True, timeout=60)  # its zero experts are scored too
    assert row["passed"] and row["found_moe"], row
    source = (tmp_path / "halo-plugin-sweep-longcat-flash" / "halo_plugin_sweep_longcat_flash" / "__init__.py").read_text()
    assert "router='router'" in source and "experts='experts'" in source


def test_a_composite_whose_causal_lm_class_builds_on_its_text_part_claims_that_type_too(sweep, tmp_path):
    row = sweep.sweep_one("qwen4_exp", tmp_path, quick=True, timeout=60)  # AutoModelForCausalLM: Qwen4ExpForCausalLM
    assert row["passed"] and row["found_moe"], row
    source = (tmp_path / "halo-plugin-sweep-qwen4-exp" / "halo_plugin_sweep_qwen4_exp" / "__init__.py").read_text()
    assert "model_types=('qwen4_exp', 'qwen4_exp_text')" in source


def test_routers_that_choose_experts_without_topk_are_declared_unreplayable(sweep, tmp_path):
    """PhiMoE's sparsemixer samples its experts by max over masked scores: the scaffold runs one forward and writes
    ``routing_replay=False`` (the kit then holds the plugin to it); a top-k router keeps the default."""
    for model_type, declared in (("phimoe", True), ("olmoe", False)):
        row = sweep.sweep_one(model_type, tmp_path, quick=True, timeout=60)
        assert row["passed"] and row["found_moe"], row
        package = f"halo_plugin_sweep_{model_type}"
        source = (tmp_path / f"halo-plugin-sweep-{model_type}" / package / "__init__.py").read_text()
        assert ("routing_replay=False" in source) == declared, source


@pytest.mark.parametrize("model_type, says", [
    ("diffusion_gemma", "`DiffusionGemmaForBlockDiffusion.forward` takes no labels"),  # block diffusion: no LM loss
    ("qwen3_omni_moe", "has no forward (it only generates); scaffold the part that trains (qwen3_omni_moe_thinker)"),
])
def test_a_class_that_cannot_train_on_labels_is_marked_with_why(sweep, tmp_path, model_type, says):
    from halo_cli.scaffold import CANNOT_TRAIN_MARK

    row = sweep.sweep_one(model_type, tmp_path, quick=True, timeout=60)
    assert not row["passed"] and not row["trainable"] and row["marked"].startswith(CANNOT_TRAIN_MARK) and says in row["marked"], row
