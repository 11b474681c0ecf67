"""Tiny random-initialised models of any transformers model type, for tests and `halo families show`.

No downloads: the config comes from transformers' defaults for the model type, shrunk
field by field; a family adds overrides where its config needs them.

The shrinking is generic, so that a new family (``halo new-family``) gets a tiny model with no
overrides: sizes from ``TINY_SIZES`` on every config of a composite (text, vision, audio ...),
per-layer fields cut down to a few layers that keep one of each layer kind, rotary sections
rescaled to the tiny head size, and a retry where a config's own validator names two fields
that must agree.
"""

from __future__ import annotations

import ast
import importlib
import re
from typing import Any, Mapping

import torch
from halo_core.hf_config import text_config

#: Sizes that make a model build and run in milliseconds on a CPU. Applied only to fields the
#: config actually has, so a family's config never grows unknown attributes.
TINY_SIZES: dict[str, Any] = {
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "num_experts": 8,
    "num_local_experts": 8,
    "n_routed_experts": 8,
    "moe_num_experts": 8,
    "num_experts_per_tok": 2,
    "num_experts_per_token": 2,
    "top_k_experts": 2,
    "moe_k": 2,
    "moe_top_k": 2,
    "kv_lora_rank": 16,
    "q_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 8,
    "linear_num_heads": 4,
    "linear_head_dim": 8,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
    # Mamba-2 / SSM layers: heads x head size = expand (2) x hidden_size, groups divide heads.
    "mamba_n_heads": 4,
    "mamba_num_heads": 4,
    "mamba_d_head": 16,
    "mamba_head_dim": 16,
    "mamba_d_state": 16,
    "ssm_state_size": 16,
    "n_groups": 2,
    "index_n_heads": 4,
    "index_num_heads": 2,
    "zero_expert_num": 2,
    "d_ff": 64,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "vocab_size_per_layer_input": 128,
    "hidden_size_per_layer_input": 8,
    "first_k_dense_replace": 1,
    "num_dense_layers": 1,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

#: Sizes that also name prefixed fields (``swa_head_dim``, ``moe_shared_expert_intermediate_size``, ``out_hidden_size``,
#: ``unpadded_vocab_size``): a prefixed field takes the tiny size too (a shared expert's width where ``shared`` says so).
PREFIXED_SIZES = ("hidden_size", "intermediate_size", "head_dim", "num_attention_heads", "num_key_value_heads", "vocab_size")
#: Prefixed names that are derived sums, not sizes of their own (MLA's ``qk_head_dim`` = nope + rope).
NOT_PREFIXED = frozenset({"qk_head_dim"})

#: Names transformers configs use for the number of experts per token.
TOP_K_KEYS = ("num_experts_per_tok", "num_experts_per_token", "top_k_experts", "moe_topk", "moe_k", "moe_top_k")

#: Sizes set even where the default config leaves them ``None``: the modeling reads them regardless (dots1's
#: expert counts, hunyuan_v1_moe's ``head_dim``), so ``None`` there is an unset value, not a switch. Elsewhere
#: ``None`` (a LoRA rank, say) and ``0`` (glm5_next's NoPE ``qk_rope_head_dim``) mean "feature off" and stay.
SET_WHEN_UNSET = frozenset({"num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "moe_intermediate_size",
                            "head_dim", *TOP_K_KEYS})
#: Layer counts that a zero does not switch off (the tiny model keeps one dense leading layer).
ZERO_RAISED = frozenset({"first_k_dense_replace", "num_dense_layers"})

#: Expert-group counts of grouped routing: a group's score sums its two best experts, so a tiny group needs at least
#: two (eight experts in eight groups index past a group), and one group of four holds the kit's three per token.
GROUP_KEYS = ("n_group", "num_expert_group")

#: Switches that turn a MoE type's experts on (gemma4 and doge default to dense MLPs): on in a tiny model.
MOE_SWITCHES = ("enable_moe_block", "is_moe", "use_moe")

#: The most layers a tiny model gets when its layer pattern has that many kinds to keep.
MAX_TINY_LAYERS = 6

#: Per-type gaps in transformers' own defaults that no rule can infer; each says why.
DEFAULT_GAPS: dict[str, dict[str, Any]] = {
    # DbrxAttention reads attn_config.rope_theta, which DbrxAttentionConfig does not declare, and clamps q/k/v to
    # clip_qkv, whose default None torch.clamp refuses (released checkpoints carry both; DBRX's clip_qkv is 8).
    "dbrx": {"attn_config": {"rope_theta": 10000.0, "clip_qkv": 8.0}},
    # The default layer_types include indexed (QSA) layers but leave the indexer's sizes unset (real checkpoints set them).
    "qwen4_exp_text": (_qsa := {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 8, "indexer_budget": 4, "indexer_compress_ratio": 2}),
    "qwen4_exp": {"text_config": _qsa},
    # The talker reads shared_expert_intermediate_size and spatial_merge_size, which its configs do not declare.
    "qwen3_omni_moe": {"talker_config": {"spatial_merge_size": 2, "text_config": {"shared_expert_intermediate_size": 32}}},
}


def _top_k_place(model_type: str) -> tuple[str | None, str] | None:
    """Where ``model_type``'s (text) config holds experts-per-token: (sub-config key or ``None``, field)."""
    from transformers import AutoConfig

    config = text_config(AutoConfig.for_model(model_type))
    fields = config.to_dict()
    places = [(None, fields)] + [(sub, fields[sub]) for sub in getattr(config, "sub_configs", {}) if isinstance(fields.get(sub), dict)]
    return next(((sub, k) for sub, found in places for k in TOP_K_KEYS if k in found), None)


def top_k_key(model_type: str) -> str | None:
    """The field holding experts-per-token in ``model_type``'s (text) config, or in one of its sub-configs
    (DBRX's ``ffn_config.moe_top_k``)."""
    place = _top_k_place(model_type)
    return place[1] if place else None


def top_k_override(model_type: str, top_k: int) -> dict[str, Any]:
    """The ``tiny_model`` overrides that set experts-per-token to ``top_k`` (nested for a sub-config's field)."""
    place = _top_k_place(model_type)
    if place is None:
        return {}
    sub, key = place
    return {key: top_k} if sub is None else {sub: {key: top_k}}


def config_top_k(config) -> int:
    config = text_config(config)
    subs = [getattr(config, sub, None) for sub in getattr(config, "sub_configs", {})]
    return next(getattr(c, k) for c in (config, *subs) if c is not None for k in TOP_K_KEYS if getattr(c, k, None))


def _sizes(fields: Mapping[str, Any], aliases: Mapping[str, str]) -> dict[str, Any]:
    """``TINY_SIZES`` for the fields present in ``fields`` (a config's ``to_dict``, or one layer's overrides)."""
    kwargs = {}
    for key, tiny in TINY_SIZES.items():
        key = aliases.get(key, key)
        if key not in fields:
            continue
        value = fields[key]
        if value is None and key not in SET_WHEN_UNSET:
            continue  # a None rank means "feature off"
        if value == 0 and key not in ZERO_RAISED and not key.endswith("token_id"):
            continue  # as does a zero size (NoPE rotary dims)
        if isinstance(value, list) and value and not key.endswith("token_id"):
            kwargs[key] = [tiny] * len(value)  # one size per modality or per layer (ernie4_5_vl_moe's expert sizes)
        elif key in TOP_K_KEYS and isinstance(value, int) and value >= 1:
            kwargs[key] = min(tiny, value)  # top-1 architectures (zaya, switch) refuse more experts per token
        else:
            kwargs[key] = tiny
    for key, value in fields.items():
        size = next((p for p in PREFIXED_SIZES if key.endswith("_" + p)), None)
        if size and key not in kwargs and key not in NOT_PREFIXED and type(value) is int and value > 0:
            kwargs[key] = TINY_SIZES["shared_expert_intermediate_size"] if "shared" in key else TINY_SIZES[size]
    kwargs.update({key: True for key in MOE_SWITCHES if fields.get(key) is False})
    for key in GROUP_KEYS:  # grouped routing (DeepSeek-V3's): two groups of four experts, the best group's experts chosen
        if isinstance(fields.get(key), int) and fields[key] > 1:
            kwargs[key] = 2
            if isinstance(fields.get("topk_group"), int):
                kwargs["topk_group"] = 1
    if "n_shared_experts" in fields and fields["n_shared_experts"] is None and any(k in kwargs for k in TOP_K_KEYS):
        kwargs["n_shared_experts"] = 1  # dots1 multiplies by it: unset like its expert counts
    if "head_dim" in kwargs and _head_is_nope_plus_rope(fields):
        kwargs["head_dim"] = kwargs.get("qk_nope_head_dim", 0) + kwargs.get("qk_rope_head_dim", 0)
    if fields.get("kv_lora_rank") and "num_key_value_heads" in kwargs:
        kwargs["num_key_value_heads"] = kwargs.get("num_attention_heads", TINY_SIZES["num_attention_heads"])  # latent attention (MLA) has one KV head per head
    return kwargs


def _head_is_nope_plus_rope(fields: Mapping[str, Any]) -> bool:
    """Whether ``head_dim`` is the latent-attention query size ``qk_nope_head_dim + qk_rope_head_dim``, at the top
    or in a layer's overrides (dots3_note's sliding layers, mistral4): its validators check the sum, so the tiny
    ``head_dim`` is the tiny sum."""
    head = fields.get("head_dim")
    layers = [fields, *(v for v in (_layer_keyed(fields.get("per_layer_config")) or {}).values() if isinstance(v, dict))]
    return bool(head) and "qk_rope_head_dim" in fields and any(
        {**fields, **layer}.get("qk_nope_head_dim", 0) + fields["qk_rope_head_dim"] == head for layer in layers)


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


def _layer_keyed(value) -> dict[int, Any] | None:
    """A per-layer mapping keyed by layer index (``per_layer_config``), as ints, or ``None``."""
    if not isinstance(value, dict) or not value:
        return None
    try:
        return {int(k): v for k, v in value.items()}
    except (TypeError, ValueError):
        return None


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


def _sub_config_base(sub) -> dict[str, Any]:
    """What a composite's defaults set on a sub-config beyond the sub-config class's own defaults (nemotron_h_omni's
    ``vision_config.video_temporal_patch_size``), so a rebuilt sub-config keeps it."""
    try:
        own = type(sub)().to_dict()
    except Exception:
        return {}
    skip = {"transformers_version", "architectures", "_name_or_path"}
    return {k: v for k, v in sub.to_dict().items() if k not in skip and k in own and own[k] != v and not isinstance(v, dict)}


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


def _tiny_kwargs(default, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The tiny sizes of ``default`` and its sub-configs; ``overrides`` only steer which layers are kept."""
    overrides = overrides or {}
    fields = default.to_dict()
    aliases = getattr(default, "attribute_map", {})  # e.g. num_experts -> num_local_experts
    kwargs = _sizes(fields, aliases)
    kwargs.update(_layers(default, fields, aliases, kwargs.get(aliases.get("num_hidden_layers", "num_hidden_layers")), overrides))
    kwargs.update(_rotary(default, fields, kwargs))
    kwargs.update(_layer_periods(fields))
    kwargs.update(_sliding_window(fields, kwargs))
    text = text_config(default)
    for name in getattr(default, "sub_configs", None) or {}:  # composite models: shrink the text (and other) parts too
        sub = getattr(default, name, None)
        if sub is None and isinstance(overrides.get(name), dict):
            sub = _unset_sub_config(default, name)
        if sub is not None and hasattr(sub, "to_dict"):
            # the text part also gets the top-level overrides its composite lacks (as ``_merge`` routes them)
            routed = {k: v for k, v in overrides.items() if k not in fields} if sub is text else {}
            given = overrides.get(name) if isinstance(overrides.get(name), dict) else {}
            kwargs[name] = {**_sub_config_base(sub), "model_type": sub.model_type, **_tiny_kwargs(sub, {**routed, **given})}
    return kwargs


def _unset_sub_config(default, name: str):
    """The default of an optional sub-config that ``default`` leaves unset (Gemma 4's ``vision_config`` and
    ``audio_config`` are ``None``: the text-only checkpoints have no towers), built where overrides ask for it by giving
    a dict, so that it is shrunk like any other part instead of built at full size; ``None`` if it cannot be built."""
    spec = (getattr(default, "sub_configs", None) or {}).get(name)
    spec = getattr(spec, "config_class", spec)
    try:
        return spec() if isinstance(spec, type) else None
    except Exception:
        return None


def _merge(kwargs: dict, overrides: Mapping[str, Any], default) -> dict:
    """``overrides`` over ``kwargs``: a sub-config field by field; a field only the text sub-config has goes there
    (so the kit's ``num_experts_per_tok`` reaches a vision-language model's language model)."""
    kwargs = dict(kwargs)
    aliases = getattr(default, "attribute_map", {})
    sub_configs = set(getattr(default, "sub_configs", None) or {})
    fields = default.to_dict()
    text = text_config(default)
    text_name = next((n for n in sub_configs if getattr(default, n, None) is text), None) if text is not default else None
    for key, value in overrides.items():
        key = aliases.get(key, key)
        if isinstance(value, dict) and key.endswith("_config") and key not in sub_configs:
            continue  # a sub-config override applies to the model types that have that sub-config
        if text_name and key not in fields and not hasattr(default, key) and key in text.to_dict():
            kwargs[text_name] = {**kwargs.get(text_name, {}), key: value}
            continue
        kwargs[key] = _deep_merge(kwargs[key], value) if isinstance(kwargs.get(key), dict) else value  # a sub-config: field by field
    return kwargs


def _deep_merge(base: dict, value):
    if not isinstance(value, dict):
        return value
    return {**base, **{k: _deep_merge(base[k], v) if isinstance(base.get(k), dict) else v for k, v in value.items()}}


#: "`a` (x) must be below `b` (y)": a token id past the tiny vocabulary.
_MULTIPLE_OF = re.compile(r"`(\w+)`[^`]*?\bmultiple of (\d+)")
_MUST_BE_BELOW = re.compile(r"`(\w+)` \((\d+)\) must be (?:a class |an id )?below `(\w+)` \((\d+)\)")

_MUST_AGREE = (
    re.compile(r"`([\w.]+)` \(([^()]*)\) must (?:match|equal|be equal to) `([\w.]+)` \(([^()]*)\)"),
    re.compile(r"`([\w.]+)` \(([^()]*)\) and `([\w.]+)` \(([^()]*)\) must (?:be equal|match)"),
)


def _agreeing(default, kwargs: dict, message: str) -> dict | None:
    """``kwargs`` with the first field a "`a` (x) must match `b` (y)" validator message names set to y (or, for "must be
    below", to y - 1; for "`a` ... a multiple of N", up to the next multiple: Kolibri's NVFP4 ``head_dim``), or ``None``."""
    multiple = _MULTIPLE_OF.search(message)
    if multiple:
        field, factor = multiple.group(1), int(multiple.group(2))
        patched = _copy(kwargs)
        node = next((n for c, n in _nodes(default, patched) if isinstance(n.get(field), int)), None)
        if node is None or node[field] % factor == 0:
            return None
        node[field] = -(-node[field] // factor) * factor
        return patched
    below = _MUST_BE_BELOW.search(message)
    if below:
        field, _, bound_field, bound = below.groups()
        patched = _copy(kwargs)
        node = next((n for c, n in _nodes(default, patched) if n.get(bound_field) == int(bound) and hasattr(c, field)), None)
        if node is None or node.get(field) == int(bound) - 1:
            return None
        node[field] = int(bound) - 1
        return patched
    for pattern in _MUST_AGREE:
        found = pattern.search(message)
        if not found:
            continue
        left, left_value, right, right_value = found.groups()
        try:
            value = ast.literal_eval(right_value)
        except (ValueError, SyntaxError):
            return None
        if value is None:  # set the unset one to the other's value
            left, value = right, ast.literal_eval(left_value)
        *path, leaf = left.split(".")
        heads = {p.split(".")[0] for p in (left, right) if "." in p}
        patched = _copy(kwargs)
        node = _node_with(patched, heads) if heads else patched
        if node is None:
            return None
        for part in path:
            node[part] = dict(node.get(part) or {})
            node = node[part]
        if node.get(leaf, object()) == value:
            return None
        node[leaf] = value
        return patched
    return None


def _copy(tree):
    return {k: _copy(v) if isinstance(v, dict) else v for k, v in tree.items()}


def _node_with(tree: dict, keys: set[str]) -> dict | None:
    """The shallowest sub-config (dict) of ``tree`` holding all ``keys``: the config whose validator named them."""
    queue = [tree]
    while queue:
        node = queue.pop(0)
        if keys <= node.keys():
            return node
        queue += [v for v in node.values() if isinstance(v, dict)]
    return None


#: Fields that carry another config's hidden size across a composite (an adapter's in/out width, a projector's,
#: ``vision_config.text_hidden_size``): where the default equals a config's default ``hidden_size`` they follow it.
_LINKED_SIZE = re.compile(r"(hidden|_dim$|_in_|_out_|input|output)")


def _nodes(config, node: dict) -> list[tuple[Any, dict]]:
    """(default config, its kwargs) for a config and every sub-config below it, outermost first."""
    found = [(config, node)]
    for name in getattr(config, "sub_configs", None) or {}:
        sub = getattr(config, name, None)
        if sub is None and isinstance(node.get(name), dict):
            sub = _unset_sub_config(config, name)
        if hasattr(sub, "to_dict") and isinstance(node.get(name), dict):
            found += _nodes(sub, node[name])
    return found


def _linked_sizes(default, kwargs: dict) -> None:
    """Shrink, in place, the fields ``_LINKED_SIZE`` names whose default is some config's default hidden size."""
    nodes = _nodes(default, kwargs)
    hidden = {}
    for config, node in nodes:
        key = getattr(config, "attribute_map", {}).get("hidden_size", "hidden_size")
        if isinstance(config.to_dict().get(key), int) and isinstance(node.get(key), int):
            hidden[config.to_dict()[key]] = node[key]
    for config, node in nodes:
        for key, value in config.to_dict().items():
            if (key not in node and type(value) is int and value in hidden and _LINKED_SIZE.search(key)
                    and "head" not in key and "intermediate" not in key and "position" not in key):
                node[key] = hidden[value]


def tiny_config(model_type: str, overrides: Mapping[str, Any] | None = None):
    """A transformers config of ``model_type`` at toy size (``overrides`` win)."""
    from transformers import AutoConfig

    default = AutoConfig.for_model(model_type)
    kwargs = _tiny_kwargs(default, {**DEFAULT_GAPS.get(model_type, {}), **(overrides or {})})
    _linked_sizes(default, kwargs)
    kwargs = _merge(kwargs, DEFAULT_GAPS.get(model_type, {}), default)
    kwargs = _merge(kwargs, overrides or {}, default)
    # Rebuilding (rather than setting attributes) lets __init__ derive dependent fields such as layer_types.
    for _ in range(4):
        try:
            return AutoConfig.for_model(model_type, **kwargs)
        except Exception as exc:  # a validator that names two fields which must agree: make them agree, once each
            patched = _agreeing(default, kwargs, str(exc))
            if patched is None:
                raise
            kwargs = patched
    return AutoConfig.for_model(model_type, **kwargs)


def tiny_model(model_type: str, overrides: Mapping[str, Any] | None = None, *, seed: int = 0, device: str | torch.device = "cpu", model_class: str | None = None):
    """A float32 causal-LM of ``model_type`` with random weights drawn from ``seed``.

    ``model_class`` names the transformers class where ``AutoModelForCausalLM`` does not map the config.
    """
    import transformers

    config = tiny_config(model_type, overrides)
    torch.manual_seed(seed)
    with torch.device(device):
        if model_class:
            model = getattr(transformers, model_class)._from_config(config, dtype=torch.float32)
        else:
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval()


def tiny_family_model(family, model_type: str, overrides: Mapping[str, Any] | None = None, **kwargs):
    """``tiny_model`` with the family's own tiny-config overrides (``overrides`` win) and its class for ``model_type``."""
    return tiny_model(model_type, {**family.tiny_config, **(overrides or {})}, model_class=family.class_for(model_type), **kwargs)
