"""The tiny sizes: which config fields shrink to what, at the top of a config or in one layer's overrides."""

from __future__ import annotations

from typing import Any, Mapping


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


def _layer_keyed(value) -> dict[int, Any] | None:
    """A per-layer mapping keyed by layer index (``per_layer_config``), as ints, or ``None``."""
    if not isinstance(value, dict) or not value:
        return None
    try:
        return {int(k): v for k, v in value.items()}
    except (TypeError, ValueError):
        return None
