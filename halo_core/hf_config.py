"""Reading Hugging Face configs the same way everywhere."""

from __future__ import annotations


def text_config(config):
    """The language model's config: a composite (vision-language) config's text part, else the config itself."""
    getter = getattr(config, "get_text_config", None)
    return getter() if getter else config
