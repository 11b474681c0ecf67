"""The conformance kit's own judgement: when a gradient counts as equal to the single-process one."""

import pytest
import torch

from halo_core.testing.equivalence import _check_gradient


def _off(truth: torch.Tensor, relative: float, direction: torch.Tensor) -> torch.Tensor:
    return truth + direction * relative * truth.norm() / direction.norm()


def test_two_float32_results_on_either_side_of_the_truth_are_equal():
    truth, direction = torch.randn(64, generator=torch.Generator().manual_seed(0)), torch.randn(64, generator=torch.Generator().manual_seed(1))
    # 5.2e-6 and 6.0e-6 from the truth on opposite sides: 1.1e-5 apart, float32 noise of a cancelling sum
    _check_gradient(_off(truth, 6.0e-6, -direction), _off(truth, 5.2e-6, direction), truth, "dt_bias")


@pytest.mark.parametrize("reference_error, ours", [(5.2e-6, 1e-3), (1e-7, 2e-5)], ids=["far-from-the-truth", "precise-reference"])
def test_a_gradient_farther_from_the_truth_than_float32_noise_is_refused(reference_error, ours):
    truth, direction = torch.randn(64, generator=torch.Generator().manual_seed(0)), torch.randn(64, generator=torch.Generator().manual_seed(1))
    with pytest.raises(AssertionError, match="relative error"):
        _check_gradient(_off(truth, ours, -direction), _off(truth, reference_error, direction), truth, "w")
