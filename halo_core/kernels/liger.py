"""Liger kernels on a Halo layout, through the hooks transformers and TRL already have.

``use_liger_kernel: true`` (TRL's own field) makes the stock trainer patch the model with
Liger's RoPE, RMSNorm and fused linear cross-entropy. Its SwiGLU patch would rebind the
experts module's ``forward`` and so bypass transformers' experts interface, where expert
parallelism lives; Halo turns that patch off and offers Liger's fused MoE instead as an
experts implementation, ``liger_moe`` in ``ALL_EXPERTS_FUNCTIONS``, which the model (or,
under EP, ``halo_ep`` on each rank's block) runs when ``experts_implementation: liger_moe``.
"""

from __future__ import annotations

import torch
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

from halo_core.errors import ConfigError

EXPERTS_IMPLEMENTATION = "liger_moe"


def liger_moe_experts(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' experts signature on Liger's fused MoE (gate/up concatenated, SiLU, no bias, not transposed)."""
    from liger_kernel.ops.fused_moe import LigerFusedMoEFunction

    return LigerFusedMoEFunction.apply(hidden_states, self.gate_up_proj, self.down_proj, top_k_index.to(torch.int32), top_k_weights.to(hidden_states.dtype))


def register() -> None:
    ALL_EXPERTS_FUNCTIONS.register(EXPERTS_IMPLEMENTATION, liger_moe_experts)


def unavailable_reason() -> str | None:
    """Why ``liger_moe`` cannot run here, or ``None``."""
    if not torch.cuda.is_available():
        return "it needs a CUDA GPU"
    try:
        import liger_kernel.ops.fused_moe  # noqa: F401
    except ImportError as exc:
        return f"liger-kernel is not importable ({exc}); pip install 'halo-core[gpu]'"
    return None


def check_experts(model) -> None:
    """Refuse experts whose layout Liger's fused MoE does not compute."""
    for name, module in model.named_modules():
        if hasattr(module, "is_transposed") and hasattr(module, "gate_up_proj"):
            if module.is_transposed or module.has_bias or not module.is_concatenated or getattr(module, "act_fn", None).__class__.__name__ not in ("SiLU", "SiLUActivation"):
                raise ConfigError(
                    f"experts_implementation: {EXPERTS_IMPLEMENTATION} computes concatenated gate/up SiLU experts without bias; "
                    f"{name} ({type(module).__name__}) is not that; use grouped_mm"
                )


def keep_experts_interface(args) -> None:
    """Before the stock trainer applies Liger: leave the experts' forward to transformers' interface."""
    if getattr(args, "use_liger_kernel", False):
        config = dict(getattr(args, "liger_kernel_config", None) or {})
        config["swiglu"] = False
        args.liger_kernel_config = config
