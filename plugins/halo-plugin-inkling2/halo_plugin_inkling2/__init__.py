"""Thinking Machines Inkling: the composite ``inkling2`` (vision tower and language model) and its text part
``inkling2_text``.

- ``inkling2`` is built with ``Inkling2ForConditionalGeneration`` (``AutoModelForCausalLM`` does not map it),
  ``inkling2_text`` with ``Inkling2ForCausalLM`` as before; the composite's language model sits under
  ``model.language_model``, so the blocks and attention are declared at both paths.
- The shared-experts class lacks transformers' experts-implementation decorator; it is a
  dense module every rank keeps whole, so only the routed ``experts`` are distributed.
- The vision tower (``model.vision_tower``) has no experts: FSDP2 shards it, one unit per
  ``Inkling2VisionEncoderLayer`` (the model's ``_no_split_modules``). Images come as one pixel square of
  ``patch_size * spatial_merge_size`` per language-model token, with a grid counted in tokens.

``tiny_config`` for the composite only: the image token id (200054 by default) inside the tiny vocabulary of
128, and the vision projection's hidden size (4096 by default, which the generic shrinking leaves) at 64.
"""

from halo_core import Family, hookimpl

__version__ = "0.2.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="inkling2",
        model_types=("inkling2_text", "inkling2"),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep"}),
        moe_block=("model.layers.*.mlp", "model.language_model.layers.*.mlp"),
        router="gate",
        experts="experts",
        attention=("model.layers.*.self_attn", "model.language_model.layers.*.self_attn"),
        model_class={"inkling2": "Inkling2ForConditionalGeneration"},
        tiny_config={"image_token_id": 127, "vision_config": {"projection_hidden_dim": 64}},
    )
