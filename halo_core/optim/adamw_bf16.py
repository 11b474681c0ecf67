"""AdamW for bf16 training: parameters and both moments stored in bf16, the update computed in fp32.

Storing the moments in bf16 halves the optimizer state of fp32 AdamW (4 bytes a parameter
instead of 8), and bf16 parameters need no fp32 master copy. Plain round-to-nearest would
lose every update smaller than half a bf16 ulp of the weight (training stalls); here each
stored value is rounded stochastically, so updates survive in expectation. The random
bits are a hash of (seed, step, parameter, element): replicas stay identical and a resumed
run continues exactly. ``kahan=True`` instead keeps a bf16 compensation buffer with the
rounding error of each parameter (2 more bytes a parameter) for fp32-like accuracy.

On CUDA tensors the fused Triton kernel (``adamw_bf16_triton``) runs the same arithmetic
with the same random bits; elsewhere this file's PyTorch implementation does.

``scale_next_gradients`` lets gradient clipping hand its factor to the next step instead of
multiplying every gradient in place: the kernel reads the gradient anyway, so clipping then
costs one read of the gradients (the norm) rather than three.
"""

from __future__ import annotations

import math

import torch

from halo_core.optim.rounding import stochastic_round, stream_key
from halo_core.parallel.dtensor import local

_PARAM, _EXP_AVG, _EXP_AVG_SQ = 0, 1, 2


class AdamWBF16(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01, *, kahan: bool = False, seed: int = 0, use_triton: bool | None = None):
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"AdamWBF16: invalid hyper-parameters lr={lr}, betas={betas}, eps={eps}, weight_decay={weight_decay}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, kahan=kahan))
        self.seed = seed
        self.use_triton = use_triton
        self._gradient_scale: torch.Tensor | None = None
        #: ``parts.overlap.OverlappedStep``: step on its side stream, part by part in forward order (CUDA only).
        self.overlap = None

    def scale_next_gradients(self, scale: torch.Tensor) -> None:
        """Multiply every gradient by ``scale`` (a one-element tensor, left on its device) in the next ``step`` only.

        The ``.grad`` tensors themselves are not changed.
        """
        self._gradient_scale = scale.reshape(()).float()

    def _state(self, param: torch.Tensor, kahan: bool) -> dict:
        state = self.state[param]
        if not state:
            state["step"] = 0
            moment_dtype = torch.bfloat16 if param.dtype == torch.bfloat16 else torch.float32
            state["exp_avg"] = torch.zeros_like(param, dtype=moment_dtype)
            state["exp_avg_sq"] = torch.zeros_like(param, dtype=moment_dtype)
            if kahan and param.dtype == torch.bfloat16:
                state["compensation"] = torch.zeros_like(param)
        return state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        scale, self._gradient_scale = self._gradient_scale, None
        # Each parameter keeps its index in the groups (its random bits), whatever order the updates run in.
        params = [(index, group, param) for index, (group, param) in
                  enumerate(((g, p) for g in self.param_groups for p in g["params"]), start=1)]
        if self.overlap is None:
            for index, group, param in params:
                self._step_one(index, group, param, scale)
            return loss
        overlap = self.overlap
        overlap.begin()
        ordered = overlap.order([(i, p) for i, _, p in params])
        groups = {id(p): g for _, g, p in params}
        with torch.cuda.stream(overlap.stream):
            for position, (index, param) in enumerate(ordered):
                self._step_one(index, groups[id(param)], param, scale)
                if param.grad is not None:
                    local(param.grad).record_stream(overlap.stream)  # zero_grad frees it while this stream reads it
                part = overlap.part_of.get(param, 0)
                if position + 1 == len(ordered) or overlap.part_of.get(ordered[position + 1][1], 0) != part:
                    overlap.end_part(part)
            if scale is not None:
                scale.record_stream(overlap.stream)
        return loss

    def _step_one(self, index: int, group: dict, param: torch.Tensor, scale: torch.Tensor | None) -> None:
        beta1, beta2 = group["betas"]
        if param.grad is None:
            return
        state = self._state(param, group["kahan"])
        state["step"] += 1
        step = state["step"]
        keys = [stream_key(self.seed, step, index, t) for t in (_PARAM, _EXP_AVG, _EXP_AVG_SQ)]
        # Scalars are computed once here, in double, so both implementations round them alike.
        hyper = dict(
            beta1=beta1,
            one_minus_beta1=1 - beta1,
            beta2=beta2,
            one_minus_beta2=1 - beta2,
            eps=group["eps"],
            decay=1 - group["lr"] * group["weight_decay"],
            step_size=group["lr"] / (1 - beta1**step),
            bias_correction2_sqrt=math.sqrt(1 - beta2**step),
        )
        tensors = [local(param), local(param.grad), local(state["exp_avg"]), local(state["exp_avg_sq"])]
        compensation = local(state["compensation"]) if "compensation" in state else None
        gradient_scale = None if scale is None else scale.to(tensors[0].device)
        self._update(tensors, compensation, gradient_scale, keys, hyper)

    def _update(self, tensors, compensation, gradient_scale, keys, hyper) -> None:
        use_triton = self.use_triton if self.use_triton is not None else tensors[0].is_cuda
        if use_triton:
            from halo_core.optim.adamw_bf16_triton import fused_update

            fused_update(*tensors, compensation, gradient_scale, keys, **hyper)
        else:
            reference_update(*tensors, compensation, gradient_scale, keys, **hyper)


def _store(target: torch.Tensor, value: torch.Tensor, key: int) -> None:
    target.copy_(stochastic_round(value, key) if target.dtype == torch.bfloat16 else value)


def reference_update(param, grad, exp_avg, exp_avg_sq, compensation, gradient_scale, keys, *, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay, step_size, bias_correction2_sqrt) -> None:
    """One AdamW step on one tensor in fp32 (decoupled weight decay), stored back with stochastic rounding."""
    p = param.float()
    if compensation is not None:
        p = p + compensation.float()
    g = grad.float() if gradient_scale is None else grad.float() * gradient_scale
    m = exp_avg.float() * beta1 + g * one_minus_beta1
    v = exp_avg_sq.float() * beta2 + g * g * one_minus_beta2
    p = p * decay
    p = p - step_size * m / (v.sqrt() / bias_correction2_sqrt + eps)
    if compensation is not None:
        param.copy_(p)  # round to nearest; the error goes to the compensation buffer
        compensation.copy_(p - param.float())
    else:
        _store(param, p, keys[_PARAM])
    _store(exp_avg, m, keys[_EXP_AVG])
    _store(exp_avg_sq, v, keys[_EXP_AVG_SQ])
