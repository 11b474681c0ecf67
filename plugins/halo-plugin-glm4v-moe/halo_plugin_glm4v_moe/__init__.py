"""GLM-4.5V / GLM-4.6V (``glm4v_moe``): a vision tower in front of a GLM-4-MoE language model.

What differs from the common case:
- Composite model, built with ``Glm4vMoeForConditionalGeneration`` (``AutoModelForCausalLM`` does not
  map the config). The language model sits under ``model.language_model``: MoE blocks
  ``model.language_model.layers.*.mlp``, attention ``model.language_model.layers.*.self_attn``.
- The text MoE is GLM-4-MoE's: sigmoid router ``gate`` with an ``e_score_correction_bias`` and
  group-limited top-k, a dense ``shared_experts`` MLP every rank keeps whole, and a dense MLP at the
  same path in the first ``first_k_dense_replace`` layers (not a MoE block). Only ``experts`` is split.
- The vision tower (``model.visual``) has no experts: FSDP2 shards it, one unit per
  ``Glm4vMoeVisionBlock`` (the model's ``_no_split_modules``), embeddings, patch embedding,
  downsample and merger in the root unit. Image features replace the ``image_token_id`` embeddings.
- Image inputs need ``mm_token_type_ids`` (1 on image tokens) for the 3-D (M-RoPE) positions.

``tiny_config`` (only what the generic shrinking gets wrong for image inputs): the special token ids
(151339-151364 by default) are moved inside the tiny vocabulary of 128.
"""

from halo_core import Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="glm4v-moe",
        model_types=("glm4v_moe",),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep"}),
        moe_block="model.language_model.layers.*.mlp",
        router="gate",
        experts="experts",
        attention="model.language_model.layers.*.self_attn",
        model_class="Glm4vMoeForConditionalGeneration",
        tiny_config={
            "image_start_token_id": 122,
            "image_end_token_id": 123,
            "video_start_token_id": 124,
            "video_end_token_id": 125,
            "image_token_id": 126,
            "video_token_id": 127,
        },
    )
