"""GPT-OSS (``gpt_oss``): how it differs from the common case.

- Router: child ``router`` (not ``gate``); top-k first, then softmax over the k logits;
  the router has a bias.
- Experts: child ``experts``, fused but transposed (``gate_up_proj [E, H, 2I]`` with gate
  and up interleaved on the last axis, ``down_proj [E, I, H]``), per-expert biases and a
  clamped SwiGLU (``swiglu_alpha``, ``swiglu_limit``). transformers' experts interface
  declares this layout, so the core handles it without a custom hook.
- Attention: ``model.layers.N.self_attn`` with learned attention sinks and alternating
  sliding/full layers; transformers has no SDPA path for it, hence eager attention in
  tiny test models. Its config carries no ``base_model_tp_plan``, so the plugin gives one
  (the sinks are split with the heads by the core).
"""

from halo_core import ATTENTION_TP_PLAN, Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="gpt-oss",
        model_types=("gpt_oss",),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep", "cp", "tp", "etp"}),
        moe_block="model.layers.*.mlp",
        router="router",
        experts="experts",
        attention="model.layers.*.self_attn",
        tiny_config={"attn_implementation": "eager", "sliding_window": 4},
        tp_plan=ATTENTION_TP_PLAN,
    )
