"""GLM-4 MoE (``glm4_moe``) and GLM-4.7-Flash (``glm4_moe_lite``): how they differ from the common case.

- Router: child ``gate``, sigmoid scores; an ``e_score_correction_bias`` buffer shifts which
  experts are picked but not their weights; group-limited top-k (``n_group``/``topk_group``)
  and ``routed_scaling_factor``. All of it stays transformers' own: the core distributes
  only the experts.
- Shared experts: ``mlp.shared_experts``, a dense MLP every rank keeps whole.
- The first ``first_k_dense_replace`` layers hold a dense MLP at the same path: not MoE blocks.
- GLM-4.7-Flash uses latent attention (MLA: ``kv_lora_rank``, ``q_lora_rank``), whose shared
  rotary key feeds every head: tensor parallelism needs a plan the core does not have, so
  ``glm4_moe_lite`` does not declare ``tp``.
"""

from halo_core import Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="glm4-moe",
        model_types=("glm4_moe", "glm4_moe_lite"),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep", "cp", "tp", "etp"}),
        moe_block="model.layers.*.mlp",
        router="gate",
        experts="experts",
        attention="model.layers.*.self_attn",
    )


@hookimpl
def supported_splits(family: Family, model_type: str) -> frozenset[str]:
    return family.splits - {"tp"} if model_type == "glm4_moe_lite" else family.splits
