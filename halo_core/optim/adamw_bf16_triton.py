"""The fused Triton kernel of ``AdamWBF16``: one pass over parameter, gradient and both moments.

Same arithmetic and the same random bits as ``adamw_bf16.reference_update``. The reference
hashes in 64-bit integers masked to 32 bits (``rounding.hash32``); below 2**32 elements a tensor's
indices fit in 32 bits, where that hash is exactly 32-bit arithmetic with wrap-around, so the
kernel hashes in ``uint32``: 64-bit multiplies are several instructions each on the GPU, and three
hashes an element made the kernel instruction-bound rather than bandwidth-bound. Larger
tensors keep the 64-bit hash. The compiler may contract a
multiply and an add into one fused operation where PyTorch rounds twice, so results can
differ from the reference in the last bit of fp32 before rounding; ``bench/adamw_bf16.py``
measures how often that changes a stored bf16 value.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _hash32(x):
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


@triton.jit
def _stochastic_round(value, offsets, key, WIDE_INDEX: tl.constexpr):
    # In uint32, bits + noise cannot wrap for a finite value (at most 0xFF7FFFFF + 0xFFFF);
    # non-finite values are passed through below.
    if WIDE_INDEX:
        bits = value.to(tl.uint32, bitcast=True).to(tl.uint64)
        noise = _hash32(offsets.to(tl.uint64) ^ key) & 0xFFFF
    else:
        bits = value.to(tl.uint32, bitcast=True)
        noise = _hash32(offsets.to(tl.uint32) ^ key) & 0xFFFF
    rounded = ((bits + noise) & 0xFFFF0000).to(tl.uint32).to(tl.float32, bitcast=True)
    finite = (bits & 0x7F800000) != 0x7F800000
    return tl.where(finite, rounded, value).to(tl.bfloat16)


# The random keys change every step and are not specialised on (each new combination would compile
# again). The size is: Triton then knows whether it divides by 16 and loads 16 bytes at a time; without
# that the kernel ran at half the bandwidth (two variants at most, compiled in the first step).
@triton.jit(do_not_specialize=["key_p", "key_m", "key_v"])
def _adamw_bf16_kernel(
    p_ptr, g_ptr, m_ptr, v_ptr, c_ptr, scale_ptr, n,
    beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay, step_size, bias_correction2_sqrt,
    key_p, key_m, key_v,
    HAS_COMPENSATION: tl.constexpr, HAS_SCALE: tl.constexpr, P_BF16: tl.constexpr, M_BF16: tl.constexpr, WIDE_INDEX: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    p = tl.load(p_ptr + offsets, mask=mask).to(tl.float32)
    if HAS_COMPENSATION:
        p = p + tl.load(c_ptr + offsets, mask=mask).to(tl.float32)
    g = tl.load(g_ptr + offsets, mask=mask).to(tl.float32)
    if HAS_SCALE:
        g = g * tl.load(scale_ptr)
    m = tl.load(m_ptr + offsets, mask=mask).to(tl.float32) * beta1 + g * one_minus_beta1
    v = tl.load(v_ptr + offsets, mask=mask).to(tl.float32) * beta2 + g * g * one_minus_beta2
    p = p * decay
    p = p - tl.div_rn(step_size * m, tl.div_rn(tl.sqrt_rn(v), bias_correction2_sqrt) + eps)
    if HAS_COMPENSATION:
        stored = p.to(tl.bfloat16)
        tl.store(p_ptr + offsets, stored, mask=mask)
        tl.store(c_ptr + offsets, (p - stored.to(tl.float32)).to(tl.bfloat16), mask=mask)
    elif P_BF16:
        tl.store(p_ptr + offsets, _stochastic_round(p, offsets, key_p, WIDE_INDEX), mask=mask)
    else:
        tl.store(p_ptr + offsets, p, mask=mask)
    if M_BF16:
        tl.store(m_ptr + offsets, _stochastic_round(m, offsets, key_m, WIDE_INDEX), mask=mask)
        tl.store(v_ptr + offsets, _stochastic_round(v, offsets, key_v, WIDE_INDEX), mask=mask)
    else:
        tl.store(m_ptr + offsets, m, mask=mask)
        tl.store(v_ptr + offsets, v, mask=mask)


def fused_update(param, grad, exp_avg, exp_avg_sq, compensation, gradient_scale, keys, **hyper) -> None:
    for tensor in (param, grad, exp_avg, exp_avg_sq):
        if not tensor.is_contiguous():
            raise ValueError("AdamWBF16's Triton kernel needs contiguous parameters, gradients and states")
    n = param.numel()
    _adamw_bf16_kernel[(triton.cdiv(n, BLOCK),)](
        param, grad, exp_avg, exp_avg_sq, compensation if compensation is not None else param,
        gradient_scale if gradient_scale is not None else param, n,
        hyper["beta1"], hyper["one_minus_beta1"], hyper["beta2"], hyper["one_minus_beta2"], hyper["eps"],
        hyper["decay"], hyper["step_size"], hyper["bias_correction2_sqrt"], *keys,
        HAS_COMPENSATION=compensation is not None, HAS_SCALE=gradient_scale is not None, P_BF16=param.dtype == torch.bfloat16,
        M_BF16=exp_avg.dtype == torch.bfloat16, WIDE_INDEX=n > 2**32, BLOCK=BLOCK,
    )
