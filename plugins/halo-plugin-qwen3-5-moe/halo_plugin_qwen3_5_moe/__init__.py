"""Qwen3.5 / Qwen3.6 MoE (the composite ``qwen3_5_moe``, its text part ``qwen3_5_moe_text``) and Qwen3-Next (``qwen3_next``).

- Shared expert: ``mlp.shared_expert`` with its own sigmoid gate ``mlp.shared_expert_gate``;
  dense, kept whole on every rank. Routed experts and router (``gate``) are the common case.
- Three of every four layers are linear attention (``linear_attn``, Gated DeltaNet);
  ``self_attn`` exists only in the full-attention layers. Tiny test models get one of each.
- ``qwen3_5_moe`` is built whole with ``Qwen3_5MoeForConditionalGeneration`` (``AutoModelForCausalLM`` would build
  the text-only ``Qwen3_5MoeForCausalLM`` and drop the vision tower); its language model sits under
  ``model.language_model``, so the blocks and attention are declared at both paths. The text types keep
  ``AutoModelForCausalLM``. The vision tower (``model.visual``) has no experts: FSDP2 shards it, one unit per
  ``Qwen3_5MoeVisionBlock``. Images come as Qwen-VL's flattened patches with ``image_grid_thw``, and
  ``mm_token_type_ids`` for the 3-D (M-RoPE) positions.

``tiny_config`` for the composite only: the special token ids (248053-248057 by default) inside the tiny vocabulary of 128.
"""

from halo_core import Family, hookimpl

__version__ = "0.2.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="qwen3-5-moe",
        model_types=("qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next"),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep"}),
        moe_block=("model.layers.*.mlp", "model.language_model.layers.*.mlp"),
        router="gate",
        experts="experts",
        attention=("model.layers.*.self_attn", "model.language_model.layers.*.self_attn"),
        model_class={"qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration"},
        tiny_config={"vision_start_token_id": 124, "vision_end_token_id": 125, "image_token_id": 126, "video_token_id": 127},
    )
