"""Deterministic stochastic rounding from float32 to bfloat16.

The random bits come from a counter-based hash of (key, element index), not from a
generator's state: the same step on the same parameter draws the same bits on every
replica and after a resume, and the Triton kernel reproduces them exactly (the hash is
plain 32-bit integer arithmetic, written here with int64 tensors masked to 32 bits).
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF


def hash32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 (Wellons): a well-mixed 32-bit integer hash; ``x`` is int64 holding values below 2**32."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & MASK32
    return x ^ (x >> 16)


def hash32_int(x: int) -> int:
    """The same hash on a Python int (host-side key derivation)."""
    x &= MASK32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & MASK32
    x ^= x >> 15
    x = (x * 0x846CA68B) & MASK32
    return x ^ (x >> 16)


def stream_key(seed: int, step: int, param_index: int, tensor_id: int) -> int:
    """A 31-bit key per (seed, step, parameter, which stored tensor)."""
    key = hash32_int(seed)
    for part in (step, param_index, tensor_id):
        key = hash32_int(key ^ hash32_int(part + 0x9E3779B9))
    return key & 0x7FFFFFFF  # 31 bits: one integer type for the Triton kernel's argument, whatever the key


def random_bits16(key: int, numel: int, device: torch.device) -> torch.Tensor:
    index = torch.arange(numel, device=device, dtype=torch.int64)
    return hash32(index ^ key) & 0xFFFF


def stochastic_round(x: torch.Tensor, key: int) -> torch.Tensor:
    """Round float32 ``x`` to bfloat16, up with probability equal to the discarded fraction (unbiased)."""
    bits = x.contiguous().view(torch.int32).to(torch.int64)
    noise = random_bits16(key, x.numel(), x.device).view(x.shape)
    rounded = ((bits + noise) & ~0xFFFF).to(torch.int32)  # int32 wraps like the kernel's uint32
    finite = torch.isfinite(x)
    out = torch.where(finite, rounded.view(torch.float32), x)
    return out.to(torch.bfloat16)
