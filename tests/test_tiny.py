"""halo_core.tiny: the generic shrinking that lets a new family's tiny model build with no overrides (issue 28).

Each case is a transformers default that the plain "set TINY_SIZES, 2 layers" shrinking broke; all build on the
meta device, so the file takes seconds.
"""

import pytest

from halo_core.hf_config import language_model_class, text_config
from halo_core.tiny import tiny_config, tiny_model


def _per_layer(config) -> dict:
    fields = config.to_dict()
    return {k: v for k, v in fields.items() if isinstance(v, list) and len(v) == fields["num_hidden_layers"]}


@pytest.mark.parametrize(
    ("model_type", "field", "kinds"),
    [
        ("qwen3_next", "layer_types", {"linear_attention", "full_attention"}),  # 3 linear : 1 full, derived from an interval
        ("cohere2_moe", "layer_types", {"sliding_attention", "full_attention"}),
        ("dots3_note", "mlp_layer_types", {"dense", "sparse"}),  # a default list, one entry per layer, with dense leading layers
        ("inkling2_text", "layer_types", {"hybrid_sliding", "hybrid"}),
        ("lfm2_moe", "layer_types", {"conv", "full_attention"}),  # the default leaves layer_types None: kinds read off the modeling code
        ("granitemoehybrid", "layer_types", {"linear_attention", "full_attention"}),  # all-Mamba default: one attention layer kept
    ],
)
def test_a_hybrid_tiny_config_keeps_one_layer_of_each_kind(model_type, field, kinds):
    config = text_config(tiny_config(model_type))
    per_layer = _per_layer(config)
    assert set(per_layer[field]) == kinds and config.num_hidden_layers <= 6, per_layer


def test_per_layer_index_lists_and_per_layer_configs_follow_the_kept_layers():
    # mistral_large4: kv_source_layers holds earlier layers' indices; dots3_note: per_layer_config is keyed by layer index
    large = text_config(tiny_config("mistral_large4"))
    assert large.kv_source_layers == list(range(large.num_hidden_layers))
    note = tiny_config("dots3_note").vision_config
    assert note.num_hidden_layers < 42 and set(note.mlp_layer_types) == {"dense", "sparse"}


def test_a_family_override_of_the_layer_pattern_wins_and_sets_the_layer_count():
    config = tiny_config("kimi_linear", {"layer_types": ["linear_attention", "full_attention"], "mlp_layer_types": ["sparse", "sparse"]})
    assert config.num_hidden_layers == 2 and config.mlp_layer_types == ["sparse", "sparse"]


def test_sizes_that_the_plain_shrinking_got_wrong():
    assert tiny_config("zaya").num_experts_per_tok == 1  # top-1 architecture: its validator refuses more
    mistral4 = tiny_config("mistral4")  # head_dim = qk_nope + qk_rope, as the default has it
    assert mistral4.head_dim == mistral4.qk_nope_head_dim + mistral4.qk_rope_head_dim
    assert tiny_config("glm5_next").text_config.qk_rope_head_dim == 0  # NoPE stays NoPE
    assert tiny_config("dots1").n_routed_experts == 8  # a None expert count is unset, not "off"
    inkling = tiny_config("inkling2")  # validator: vision_config.text_hidden_size must match text_config.hidden_size
    assert inkling.vision_config.text_hidden_size == inkling.text_config.hidden_size == 32
    assert tiny_config("gemma4_text").enable_moe_block  # a MoE type's MoE switch is on
    kimi = tiny_config("kimi_k25").text_config  # grouped routing: groups of four experts, not eight groups of one
    assert (kimi.n_group, kimi.topk_group) == (2, 1)


def test_a_multimodal_rotary_is_rescaled_to_the_tiny_head_even_where_only_the_modeling_code_sets_it():
    # glm4v_moe: mrope_section [8, 12, 12] is the modeling code's fallback, for a rotary half of 32; the tiny head
    # (partial_rotary_factor 0.5) grows to 16 so each of the three sections keeps a frequency
    text = tiny_config("glm4v_moe").text_config
    head = text.hidden_size // text.num_attention_heads
    assert sum(text.rope_parameters["mrope_section"]) == head * text.rope_parameters["partial_rotary_factor"] // 2 == 4
    hy = tiny_config("hy_v4_vl").text_config  # the config's own sections, on latent attention's rotary part
    assert sum(hy.rope_parameters["mrope_section"]) == hy.qk_rope_head_dim // 2


@pytest.mark.parametrize(
    "model_type",
    ["dbrx", "dots1", "hunyuan_v1_moe", "lfm2_moe", "dots3_note", "ernie4_5_vl_moe", "granitemoehybrid", "glm5_next",
     "hy_v4_vl", "inkling2", "muse_spark", "nemo_speechlm", "nemotron_h_omni", "qwen3_omni_moe", "zaya", "mistral_large4",
     "deepseek_ocr2", "qwen4_exp", "qwen3_vl_moe", "switch_transformers", "glm4v_moe", "kimi_k25"],
)
def test_the_default_of_a_formerly_failing_type_builds_tiny(model_type):
    # Qwen3-Omni's composite only generates (no language-model class to train), but its tiny config must still build
    built = language_model_class(model_type).name or {"qwen3_omni_moe": "Qwen3OmniMoeForConditionalGeneration"}.get(model_type)
    model = tiny_model(model_type, device="meta", model_class=built)
    assert sum(p.numel() for p in model.parameters()) < 2e8
