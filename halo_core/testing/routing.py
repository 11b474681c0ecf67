"""Making routing uneven on purpose, by choosing router weights (the model stays the real one).

``starve_experts`` makes a MoE block's router never pick some experts: the rows of its
``[E, hidden]`` projection (its own weight or a child's) for those experts are zeroed (logit 0) and the remaining rows come in ``(w, -w)`` pairs, so for any input
at least one expert of every pair scores above 0. With at least ``top_k`` pairs the
starved experts never reach the top-k. Router biases of shape ``[E]`` (GPT-OSS's bias,
score-correction buffers; ``[E+1]`` where a router has a skip class) get a large negative
value on the starved experts, which is enough on its own for routers whose scores come
from an MLP (Zaya).
"""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def starve_experts(router: nn.Module, num_experts: int, starved: list[int], top_k: int) -> None:
    from halo_core.layout import router_weight

    weight = router_weight(router, num_experts, extra_classes=True)
    biases = [t for n, t in [*router.named_parameters(), *router.named_buffers()] if t.dim() == 1 and t.shape[0] in (num_experts, num_experts + 1) and "bias" in n]
    if weight is None and not biases:
        raise ValueError(f"{type(router).__name__} has neither a [{num_experts}, hidden] projection nor a per-expert bias to set")
    if weight is not None:
        others = [e for e in range(num_experts) if e not in starved]
        if len(others) // 2 < top_k:
            raise ValueError(f"starving {starved} leaves {len(others)} experts, fewer than 2*top_k={2 * top_k}")
        weight[starved] = 0.0
        for first, second in zip(others[0::2], others[1::2]):
            weight[second] = -weight[first]
    for bias in biases:  # selection biases (GPT-OSS's router bias, score corrections, Zaya's balancing biases)
        bias[starved] = -1.0e4
