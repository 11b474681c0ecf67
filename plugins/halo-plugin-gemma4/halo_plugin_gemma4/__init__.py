"""Gemma 4 MoE: the composite ``gemma4`` (vision tower and language model) and its text part ``gemma4_text``,
both with ``enable_moe_block``.

- The MoE block is the decoder layer itself: ``router`` and ``experts`` are its children,
  beside a dense ``mlp`` that every token also passes through.
- Router: ``router.proj`` is the ``[E, hidden]`` projection, after a norm and a learned
  scale; top-k is ``top_k_experts``; per-expert output scales stay in the router.
- Per-layer input embeddings (``vocab_size_per_layer_input``) are shrunk in tiny models.
- ``gemma4`` is built with ``Gemma4ForConditionalGeneration`` (``AutoModelForCausalLM`` maps it so, no
  ``model_class``): its language model sits under ``model.language_model``, so the blocks and attention are
  declared at both paths. The vision tower (``model.vision_tower``) and ``model.embed_vision`` have no experts:
  FSDP2 shards them (one unit per ``Gemma4VisionEncoderLayer``, the model's ``_no_split_modules``). Images come
  as patches with (column, row) positions, pooled ``pooling_kernel_size``² to a token.

``tiny_config`` for the composite only: its vision tower (``vision_config`` is unset by default, as in the
text-only checkpoints; a dict makes the tiny model build one, and types without it ignore it) with a small
position table; its special token ids (255999-258884 by default) inside the tiny vocabulary of 128; and
``use_bidirectional_attention="vision"`` (image tokens attend to each other both ways, read off
``mm_token_type_ids``), so image batches run that mask too.
"""

from halo_core import Family, hookimpl

__version__ = "0.2.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="gemma4",
        model_types=("gemma4_text", "gemma4"),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep"}),
        moe_block=("model.layers.*", "model.language_model.layers.*"),
        router="router",
        experts="experts",
        attention=("model.layers.*.self_attn", "model.language_model.layers.*.self_attn"),
        tiny_config={
            "enable_moe_block": True,
            "num_experts": 8,
            "top_k_experts": 2,
            "moe_intermediate_size": 16,
            "layer_types": ["sliding_attention", "full_attention"],
            "vocab_size_per_layer_input": 128,
            "hidden_size_per_layer_input": 8,
            "vision_config": {"position_embedding_size": 16},
            "text_config": {"use_bidirectional_attention": "vision"},
            "boi_token_id": 121, "boa_token_id": 122, "image_token_id": 123, "audio_token_id": 124,
            "eoi_token_id": 125, "eoa_token_index": 126, "video_token_id": 127,
        },
    )
