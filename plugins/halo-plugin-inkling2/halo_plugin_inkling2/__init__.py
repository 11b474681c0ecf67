"""Thinking Machines Inkling (``inkling2_text``, the language model of ``inkling2``).

- ``Inkling2ForCausalLM`` is built from the text config (``inkling2_text``); the multimodal
  ``inkling2`` wrapper is not claimed, so its vision tower trains only on the plain route.
- The shared-experts class lacks transformers' experts-implementation decorator; it is a
  dense module every rank keeps whole, so only the routed ``experts`` are distributed.
"""

from halo_core import Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="inkling2",
        model_types=("inkling2_text",),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep"}),
        moe_block="model.layers.*.mlp",
        router="gate",
        experts="experts",
        attention="model.layers.*.self_attn",
    )
