"""Qwen3-VL-MoE (``qwen3_vl_moe``): a vision tower in front of a Qwen3-MoE language model.

What differs from the common case:
- Composite model, built with ``Qwen3VLMoeForConditionalGeneration`` (``AutoModelForCausalLM`` does not
  map the config). The language model sits under ``model.language_model``, so the MoE blocks are
  ``model.language_model.layers.*.mlp`` and attention ``model.language_model.layers.*.self_attn``;
  router (``gate``) and fused experts (``experts``) are the common case.
- The vision tower (``model.visual``) has no experts: EP leaves it alone and FSDP2 shards it, one
  unit per ``Qwen3VLMoeVisionBlock`` (the model's ``_no_split_modules``), its patch embedding, position
  table and mergers in the root unit. Image features replace the ``image_token_id`` embeddings, and the
  ``deepstack`` mergers add features of chosen vision layers to the first text layers' hidden states.
- Image inputs need ``mm_token_type_ids`` (1 on image tokens) for the 3-D (M-RoPE) positions.

``tiny_config`` (only what the generic shrinking gets wrong for image inputs): the special token ids
(151652-151656 by default) are moved inside the tiny vocabulary of 128, and ``deepstack_visual_indexes``
(8, 16, 24 by default) to a layer of the two-block tiny vision tower, so the deepstack path runs.
"""

from halo_core import Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="qwen3-vl-moe",
        model_types=("qwen3_vl_moe",),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep"}),
        moe_block="model.language_model.layers.*.mlp",
        router="gate",
        experts="experts",
        attention="model.language_model.layers.*.self_attn",
        model_class="Qwen3VLMoeForConditionalGeneration",
        tiny_config={
            "vision_start_token_id": 124,
            "vision_end_token_id": 125,
            "image_token_id": 126,
            "video_token_id": 127,
            "vision_config": {"deepstack_visual_indexes": [0]},
        },
    )
