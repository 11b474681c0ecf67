"""Generic rules of ``halo_core.tiny`` that types with no family overrides need (found by the new-family sweep)."""

import torch

from halo_core.tiny import tiny_config, tiny_model


def test_layer_periods_are_cut_so_the_tiny_stack_has_attention_and_experts():
    config = tiny_config("jamba")  # attention every 8th layer from the 4th by default: none in two layers
    kinds = ["attention" if i % config.attn_layer_period == config.attn_layer_offset else "mamba" for i in range(config.num_hidden_layers)]
    experts = [i % config.expert_layer_period == config.expert_layer_offset for i in range(config.num_hidden_layers)]
    assert "attention" in kinds and any(experts), (kinds, experts)


def test_a_sliding_window_the_default_sizes_but_leaves_unset_is_given_one():
    model = tiny_model("step3p7", model_class="Step3p7ForConditionalGeneration")
    assert model.config.get_text_config().sliding_window
    ids = torch.randint(0, 100, (2, 7))
    assert torch.isfinite(model(input_ids=ids, labels=ids).loss)


def test_rotary_sections_the_modeling_pairs_stay_equal():
    section = tiny_config("ernie4_5_vl_moe").get_text_config().rope_parameters["mrope_section"]
    assert section[0] == section[1], section  # the two spatial sections are interleaved


def test_a_size_a_validator_wants_a_multiple_of_is_rounded_up_to_it():
    from transformers import AutoConfig

    from halo_core.tiny.agreement import _agreeing

    message = "NVFP4 rounding of keys and values needs a `head_dim` that is a multiple of 16."  # Kolibri 1.1's validator
    assert _agreeing(AutoConfig.for_model("qwen3_moe"), {"head_dim": 8}, message) == {"head_dim": 16}
    assert _agreeing(AutoConfig.for_model("qwen3_moe"), {"head_dim": 32}, message) is None  # already one: no loop


def test_an_optional_sub_config_the_default_leaves_unset_is_built_tiny_where_asked_for():
    """Gemma 4's vision tower is unset by default (text-only checkpoints): a dict asks for one, shrunk like any part."""
    assert tiny_config("gemma4").vision_config is None  # not asked for: left out, as the default leaves it
    vision = tiny_config("gemma4", {"vision_config": {"patch_size": 4}}).vision_config
    assert vision.hidden_size == 32 and vision.num_hidden_layers == 2 and vision.patch_size == 4
    assert not hasattr(tiny_config("gemma4_text", {"vision_config": {}}), "vision_config")  # a type without it ignores it


def test_lists_naming_layers_keep_each_kept_layers_membership():
    """Kolibri 1.1 names its two dense leading layers and its indexer layers by index among fifty: cut to the kept
    layers and renumbered, the tiny stack keeps a dense layer, a sparse one and an indexer (both dense before)."""
    from halo_core.layout import infer_layout

    config = tiny_config("kolibri1_1")
    layers = range(config.num_hidden_layers)
    assert set(config.mlp_only_layers) < set(layers) and config.mlp_only_layers
    assert config.index_layers and all(config.layer_types[i] == "indexed_attention" for i in config.index_layers)
    model = tiny_model("kolibri1_1")
    assert infer_layout(model)["moe_block"]
    ids = torch.randint(0, 100, (2, 7))
    assert torch.isfinite(model(input_ids=ids, labels=ids).loss)
