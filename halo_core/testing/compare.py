"""Relative comparison with messages that say what, where and by how much."""

from __future__ import annotations

import torch

RTOL = 1e-5


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected| (0 when both are zero)."""
    actual, expected = actual.detach().double(), expected.detach().double()
    if actual.shape != expected.shape:
        return float("inf")
    scale = expected.abs().max().item() if expected.numel() else 0.0
    diff = (actual - expected).abs().max().item() if expected.numel() else 0.0
    return diff / scale if scale > 0 else diff


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str, rtol: float = RTOL) -> None:
    error = relative_error(actual, expected)
    if not error <= rtol:
        shapes = f" (shapes {tuple(actual.shape)} vs {tuple(expected.shape)})" if actual.shape != expected.shape else ""
        raise AssertionError(f"{what}: relative error {error:.3e} > {rtol:.0e}{shapes}")
