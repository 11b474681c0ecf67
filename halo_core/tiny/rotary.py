"""A multimodal rotary's sections rescaled to the tiny head size."""

from __future__ import annotations

import ast
import importlib
import re
from typing import Any, Mapping


def _modeling_default(config_class, key: str) -> list[int] | None:
    """A list the modeling code falls back to where the config lacks ``key`` (``rope_parameters.get("mrope_section",
    [8, 12, 12])`` in glm4v_moe and ernie4_5_vl_moe), sized for the real model."""
    try:
        modeling = importlib.import_module(config_class.__module__.replace(".configuration_", ".modeling_"))
        source = open(modeling.__file__).read()
    except (ImportError, OSError, TypeError):
        return None
    found = re.search(rf"\.get\(\s*[\"']{key}[\"']\s*,\s*(\[[\d,\s]+\])\s*\)", source)
    return ast.literal_eval(found.group(1)) if found else None


def _rotary(default, fields: Mapping[str, Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """A multimodal rotary's ``mrope_section`` (the config's, else the modeling code's fallback) rescaled to half the
    tiny rotary size (its validators and its split want that sum), with a head large enough for one frequency per
    section."""
    rope = fields.get("rope_parameters")
    if not isinstance(rope, dict):
        return {}
    section = rope.get("mrope_section")
    if section is None and "mrope_section" in (getattr(type(default), "ignore_keys_at_rope_validation", None) or ()):
        section = _modeling_default(type(default), "mrope_section")  # only a config that takes sections (not a vision tower's)
    if not isinstance(section, list) or not section:
        return {}
    factor = float(rope.get("partial_rotary_factor", 1.0) or 1.0)
    heads_key = getattr(default, "attribute_map", {}).get("num_attention_heads", "num_attention_heads")
    hidden, heads = kwargs.get("hidden_size"), kwargs.get(heads_key)
    if fields.get("qk_rope_head_dim") and sum(section) * 2 == fields["qk_rope_head_dim"]:
        key = "qk_rope_head_dim"  # latent attention: the rotary part is a head size of its own
    elif fields.get("head_dim"):
        key = "head_dim"
    elif hidden and heads:
        key = None  # the head size is hidden_size // num_attention_heads
    else:
        return {}
    head = kwargs.get(key) if key else hidden // heads
    if not head:
        return {}
    extra: dict[str, Any] = {}
    needed = 1 << max(0, int(-(-2 * len(section) // factor) - 1).bit_length())  # a power of two holding one frequency per section
    if head * factor // 2 < len(section):
        head = needed
        if key:
            extra[key] = head
        else:  # fewer, larger heads
            extra[heads_key] = max(1, hidden // head)
            for kv in ("num_key_value_heads",):
                if kv in kwargs:
                    extra[kv] = min(kwargs[kv], extra[heads_key])
    half = int(head * factor) // 2
    new = [max(1, s * half // sum(section)) for s in section]
    # The rounding's remainder goes to a section no other equals, so sections the modeling pairs stay equal
    # (Ernie-4.5-VL interleaves its two spatial sections, [22, 22, 20] by default).
    single = [i for i, s in enumerate(section) if section.count(s) == 1]
    new[single[-1] if single and section[0] in section[1:] else 0] += half - sum(new)
    return {**extra, "rope_parameters": {**rope, "mrope_section": new}}
