"""The model card of a run that started from random weights or a local folder (TRL has no hub id for either): it said
"a fine-tuned version of [None](https://huggingface.co/None)" (issue 45)."""

from __future__ import annotations

from types import SimpleNamespace

from halo_core.trainers.parts import model_card

#: The opening of TRL's card (``trl/templates/lm_model_card.md``) without a hub id for the base.
TRL_CARD = "# Model Card for run\n\nThis model is a fine-tuned version of [None](https://huggingface.co/None).\nIt has been trained using [TRL](https://github.com/huggingface/trl).\n"


def _model(path: str) -> SimpleNamespace:
    return SimpleNamespace(config=SimpleNamespace(_name_or_path=path))


def test_a_random_init_card_says_so_and_names_the_config(tmp_path):
    card = tmp_path / "README.md"
    card.write_text(TRL_CARD)
    model = _model("/runs/tiny/model")
    model_card.mark_random_init(model)
    model_card.rewrite(str(card), model)
    text = card.read_text()
    assert "[None]" not in text
    assert "This model was trained from a random initialisation of the configuration in `/runs/tiny/model`.\n" in text
    assert "It has been trained using [TRL]" in text  # the rest of TRL's card is kept


def test_a_local_folder_card_names_the_folder_and_a_hub_card_is_left_alone(tmp_path):
    card = tmp_path / "README.md"
    card.write_text(TRL_CARD)
    model_card.rewrite(str(card), _model("/models/base"))
    assert "This model is a fine-tuned version of the model in `/models/base`." in card.read_text()
    hub = TRL_CARD.replace("[None](https://huggingface.co/None)", "[Qwen/Qwen3-0.6B](https://huggingface.co/Qwen/Qwen3-0.6B)")
    card.write_text(hub)
    model_card.rewrite(str(card), _model("Qwen/Qwen3-0.6B"))
    assert card.read_text() == hub
