"""Tiny random-initialised models of any transformers model type, for tests and `halo families show`.

No downloads: the config comes from transformers' defaults for the model type, shrunk
field by field; a family adds overrides where its config needs them.

The shrinking is generic, so that a new family (``halo new-family``) gets a tiny model with no
overrides: sizes from ``TINY_SIZES`` on every config of a composite (text, vision, audio ...),
per-layer fields cut down to a few layers that keep one of each layer kind, rotary sections
rescaled to the tiny head size, and a retry where a config's own validator names two fields
that must agree. One concern per module: ``sizes``, ``layers``, ``rotary``, ``composite``
(sub-configs and overrides), ``agreement`` (the validator retry), ``top_k``, ``config``
(``tiny_config``, where they meet) and ``models``; what callers use is imported here.
"""

from halo_core.tiny.config import DEFAULT_GAPS, tiny_config
from halo_core.tiny.layers import MAX_TINY_LAYERS, TINY_PERIOD, TINY_SLIDING_WINDOW
from halo_core.tiny.models import tiny_family_model, tiny_model
from halo_core.tiny.sizes import TINY_SIZES
from halo_core.tiny.top_k import TOP_K_KEYS, config_top_k, top_k_key, top_k_override

__all__ = ["DEFAULT_GAPS", "MAX_TINY_LAYERS", "TINY_PERIOD", "TINY_SIZES", "TINY_SLIDING_WINDOW", "TOP_K_KEYS", "config_top_k",
           "tiny_config", "tiny_family_model", "tiny_model", "top_k_key", "top_k_override"]
