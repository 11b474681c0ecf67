"""FSDP2 units of a model whose ``_no_split_modules`` nest (Qwen3-Omni's audio encoder and its layers)."""

from halo_core.parallel.fsdp import _named_decoder_layers, _units, decoder_layers
from halo_core.tiny import tiny_model


def _thinker():
    return tiny_model("qwen3_omni_moe_thinker", device="meta", model_class="Qwen3OmniMoeThinkerForConditionalGeneration")


def test_a_unit_comes_after_the_units_inside_it_and_siblings_keep_their_order():
    names = [name for name, _ in _named_decoder_layers(_thinker())]
    assert names.index("model.audio_tower.layers.0") < names.index("model.audio_tower.layers.1") < names.index("model.audio_tower")
    assert names.index("model.visual.blocks.1") < names.index("model.visual")
    assert names.index("model.language_model.layers.0") < names.index("model.language_model.layers.1")


def test_grouped_units_never_span_two_stacks():
    model = _thinker()
    names = {id(module): name for name, module in model.named_modules()}
    units = _units(model, unit_layers=2)
    assert sum(len(u) for u in units) == len(decoder_layers(model))
    for unit in units:
        parents = {names[id(layer)].rpartition(".")[0] for layer in unit}
        assert len(parents) == 1, [names[id(layer)] for layer in unit]
    assert [names[id(layer)] for layer in units[0]] == ["model.audio_tower.layers.0", "model.audio_tower.layers.1"]
