"""The model card TRL writes (``README.md`` in the output folder) names the base model as a hub link; for a model
built from its config's random initialisation, or read from a local folder, TRL has no hub id and the card said
"a fine-tuned version of [None](https://huggingface.co/None)". The sentence is rewritten to say what the run
started from; every other line of the card is TRL's."""

from __future__ import annotations

import os
import re

#: TRL's sentence when it has no hub id for the base (``trl/templates/*_model_card.md``).
NO_BASE = re.compile(r"This model is a fine-tuned version of \[None\]\(https://huggingface\.co/None\)")
_MARK = "_halo_random_init"


def mark_random_init(model) -> None:
    """Remember on the model object that its weights are its config's random initialisation (not saved anywhere)."""
    object.__setattr__(model, _MARK, True)


def started_from(model) -> str:
    """The card's opening words for ``model``'s start: random initialisation of its config, or the folder it was read from."""
    path = getattr(model.config, "_name_or_path", "") or "its config"
    if getattr(model, _MARK, False):
        return f"This model was trained from a random initialisation of the configuration in `{path}`"
    return f"This model is a fine-tuned version of the model in `{path}`"


def rewrite(card_path: str, model) -> None:
    """Put ``started_from`` in place of TRL's "[None]" sentence in the card at ``card_path``, if it holds one."""
    if not os.path.isfile(card_path):
        return
    with open(card_path, encoding="utf-8") as f:
        text = f.read()
    fixed = NO_BASE.sub(lambda _: started_from(model), text)
    if fixed != text:
        with open(card_path, "w", encoding="utf-8") as f:
            f.write(fixed)
