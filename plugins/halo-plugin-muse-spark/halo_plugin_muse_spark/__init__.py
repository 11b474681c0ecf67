"""MuseSpark (``muse_spark``): a vision tower in front of a MoE language model, trained whole.

- Composite, built with ``MuseSparkForConditionalGeneration`` (``AutoModelForCausalLM`` does not map the config):
  the language model sits under ``model.language_model``, its MoE blocks ``model.language_model.layers.*.mlp`` with
  router ``gate`` (sigmoid scores, a score-correction bias for the choice) and fused ``experts``.
- Experts: at transformers" experts interface with a norm after each expert (``post_expert_norm``) whose weight
  every expert shares. The core"s default distributes them; that shared weight stays outside the experts" FSDP unit
  and its gradient is summed over every data-parallel rank (each rank"s part comes from the rows its experts ran).
- Not declared: ``cp``, ``tp``, ``etp`` (not tried).

Written by ``halo new-family muse-spark --model-type muse_spark`` with no edits but this docstring.
"""

from halo_core import Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="muse-spark",
        model_types=("muse_spark",),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep"}),
        moe_block="model.language_model.layers.*.mlp",
        router="gate",
        experts="experts",
        attention="model.language_model.layers.*.self_attn",
        model_class="MuseSparkForConditionalGeneration",
    )
