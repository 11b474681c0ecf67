"""Per-layer fields cut to a few layers that keep one of each layer kind, layer periods and sliding windows."""

from __future__ import annotations

import importlib
import re
from typing import Any, Mapping

from halo_core.tiny.sizes import TINY_SIZES, _layer_keyed, _sizes


#: The most layers a tiny model gets when its layer pattern has that many kinds to keep.
MAX_TINY_LAYERS = 6


def _is_layer_index_list(values) -> bool:
    """A per-layer list of earlier layers' indices (mistral_large4's ``kv_source_layers``), not of flags or kinds."""
    return all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= i for i, v in enumerate(values)) and max(values) > 1


def _is_layer_set(key: str, values, count: int) -> bool:
    """A list naming some of the layers by index (Kolibri's ``mlp_only_layers`` and ``index_layers``): each kept
    layer keeps its membership, so two dense leading layers of fifty do not make both tiny layers dense."""
    return (key.endswith("_layers") and isinstance(values, (list, tuple)) and bool(values) and list(values) == sorted(set(values))
            and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < count for v in values))


def _layer_indices(kinds: dict[str, list], count: int, target: int) -> list[int]:
    """Which of ``count`` layers a tiny model keeps: the first and the last, and the first layer of every kind not yet
    kept in any per-layer field (so a hybrid model keeps an attention and a linear-attention layer, a dense and a
    sparse MLP), at least ``target`` layers and at most ``MAX_TINY_LAYERS``."""
    chosen = {0, count - 1}
    seen = {(name, repr(values[i])) for name, values in kinds.items() for i in chosen}
    for i in range(count):
        new = {(name, repr(values[i])) for name, values in kinds.items()} - seen
        if new and len(chosen) < MAX_TINY_LAYERS:
            chosen.add(i)
            seen |= new
    for i in range(count):
        if len(chosen) >= target:
            break
        chosen.add(i)
    return sorted(chosen)


def _named_kinds(config_class, field: str) -> list[str]:
    """Layer kinds the modeling code compares ``field`` entries against, for a per-layer field the default leaves ``None``."""
    from transformers.configuration_utils import ALLOWED_ATTN_LAYER_TYPES, ALLOWED_MLP_LAYER_TYPES

    if field.startswith("mlp"):
        return list(ALLOWED_MLP_LAYER_TYPES)[::-1]  # dense first, as dense leading layers sit
    try:
        modeling = importlib.import_module(config_class.__module__.replace(".configuration_", ".modeling_"))
        source = open(modeling.__file__).read()
    except (ImportError, OSError, TypeError):
        return []
    found = re.findall(rf"{field}\[[^\]]*\]\s*[!=]=\s*[\"'](\w+)[\"']", source)
    kinds = [k for k in dict.fromkeys(found) if k in ALLOWED_ATTN_LAYER_TYPES and k != "full_attention"]
    return kinds + ["full_attention"] if kinds else []


def _layers(default, fields: Mapping[str, Any], aliases: Mapping[str, str], target: int | None,
            overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Per-layer fields (lists of one entry per layer, mappings keyed by layer index) cut to the kept layers.

    Where ``overrides`` (a family's ``tiny_config``) set a per-layer field or the layer count, the family chose the
    layers: the count follows its list and nothing is sampled."""
    layers_key = aliases.get("num_hidden_layers", "num_hidden_layers")
    count = fields.get(layers_key)
    if not isinstance(count, int) or target is None:
        return {}
    lists = {k: v for k, v in fields.items() if isinstance(v, (list, tuple)) and len(v) == count and count > target}
    keyed = {k: m for k, v in fields.items()
             if "layer" in k and (m := _layer_keyed(v)) is not None and all(0 <= i < count for i in m) and count > target}
    unset = {k: kinds for k, v in fields.items() if v is None and k.endswith("layer_types") and (kinds := _named_kinds(type(default), k))}
    sets = {k: v for k, v in fields.items() if k not in lists and _is_layer_set(k, v, count) and count > target}
    chosen = [k for k in (*lists, *keyed, *unset, *sets) if aliases.get(k, k) in {aliases.get(o, o) for o in overrides}]
    if layers_key in overrides or chosen:
        given = next((overrides[k] for k in chosen if isinstance(overrides[k], (list, tuple))), None)
        return {} if layers_key in overrides or given is None else {layers_key: len(given)}
    kwargs: dict[str, Any] = {}
    if unset and not lists:  # nothing to sample from: one layer of each kind the modeling names
        target = max(target, *(len(v) for v in unset.values()))
        kwargs = {k: (kinds * target)[:target] for k, kinds in unset.items()}
        kwargs[layers_key] = target
        return kwargs
    if not lists and not keyed and not sets:
        return {}
    kinds = {**lists, **{k: [m.get(i) for i in range(count)] for k, m in keyed.items()}, **{k: [i in v for i in range(count)] for k, v in sets.items()}}
    kinds = {k: v for k, v in kinds.items() if not _size_per_layer(k) and not (k in lists and _is_layer_index_list(v))}
    kept = _layer_indices(kinds, count, target)
    kwargs[layers_key] = len(kept)
    for key, values in lists.items():
        if (size := _size_per_layer(key)) is not None:  # laguna's num_attention_heads_per_layer: the tiny size each
            kwargs[key] = [TINY_SIZES[size]] * len(kept)
        elif _is_layer_index_list(values):  # renumber; a layer whose source was dropped becomes its own source
            kwargs[key] = [kept.index(values[i]) if values[i] in kept else new for new, i in enumerate(kept)]
        else:
            kwargs[key] = [values[i] for i in kept]
        if key.endswith("layer_types") and set(values) <= _NO_ATTENTION:  # granitemoehybrid's all-Mamba default
            kwargs[key][-1] = "full_attention"  # a tiny model keeps one attention layer, so attention is declared and checked
    for key, mapping in keyed.items():
        kwargs[key] = {new: _shrunk_values(mapping[old], aliases) for new, old in enumerate(kept) if old in mapping}
    for key, values in sets.items():  # renumbered: the kept layers it named
        kwargs[key] = [new for new, old in enumerate(kept) if old in values]
    for key, kinds_ in unset.items():
        kwargs[key] = (kinds_ * len(kept))[: len(kept)]
    return kwargs


#: Layer kinds with no attention module: a default pattern of these alone has no attention to declare.
_NO_ATTENTION = frozenset({"linear_attention", "conv"})


def _size_per_layer(key: str) -> str | None:
    """The ``TINY_SIZES`` key a per-layer list of sizes is named after (``num_attention_heads_per_layer``), or ``None``."""
    return next((size for size in TINY_SIZES if key.startswith(size + "_") and "layer" in key[len(size):]), None)


def _shrunk_values(value, aliases):
    """One layer's overrides (``per_layer_config`` entries) at tiny sizes."""
    return {**value, **_sizes(value, aliases)} if isinstance(value, dict) else value


#: A tiny stack's layer period: every second layer (Jamba's attention every 8th from the 4th keeps none of 2 layers).
TINY_PERIOD = 2
#: The window of a tiny model whose layer pattern has sliding-window layers but whose default leaves the window unset.
TINY_SLIDING_WINDOW = 4


def _layer_periods(fields: Mapping[str, Any]) -> dict[str, Any]:
    """``X_layer_period`` / ``X_layer_offset`` pairs cut to a period of ``TINY_PERIOD``, so that each kind of layer
    they place (attention, experts) is in the tiny stack."""
    out = {}
    for key, period in fields.items():
        if key.endswith("_layer_period") and isinstance(period, int) and period > TINY_PERIOD:
            out[key] = TINY_PERIOD
            offset = key.removesuffix("period") + "offset"
            if isinstance(fields.get(offset), int):
                out[offset] = fields[offset] % TINY_PERIOD
    return out


def _sliding_window(fields: Mapping[str, Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """A window for sliding-window attention the default places (its layer pattern) or sizes (Step3p7's
    ``num_sliding_attention_heads``, whose model builds a sliding mask whatever the pattern) but leaves the window
    of unset, which the mask builder refuses; where the default sets one, it is kept."""
    kinds = kwargs.get("layer_types", fields.get("layer_types")) or ()
    sliding = any(isinstance(kind, str) and "sliding" in kind for kind in kinds)
    sliding = sliding or any("sliding" in key and key != "sliding_window" and value not in (None, False, 0) for key, value in fields.items())
    return {"sliding_window": TINY_SLIDING_WINDOW} if sliding and "sliding_window" in fields and fields["sliding_window"] is None else {}
