"""The conformance kit's own judgement: when a gradient counts as equal to the single-process one."""

import pytest
import torch

from halo_core.testing.equivalence import LR, _check_gradient, _check_step


def _off(truth: torch.Tensor, relative: float, direction: torch.Tensor) -> torch.Tensor:
    return truth + direction * relative * truth.norm() / direction.norm()


def test_two_float32_results_on_either_side_of_the_truth_are_equal():
    truth, direction = torch.randn(64, generator=torch.Generator().manual_seed(0)), torch.randn(64, generator=torch.Generator().manual_seed(1))
    # 5.2e-6 and 6.0e-6 from the truth on opposite sides: 1.1e-5 apart, float32 noise of a cancelling sum
    _check_gradient(_off(truth, 6.0e-6, -direction), _off(truth, 5.2e-6, direction), truth, 0.0, "dt_bias")


@pytest.mark.parametrize("reference_error, ours", [(5.2e-6, 1e-3), (1e-7, 2e-5)], ids=["far-from-the-truth", "precise-reference"])
def test_a_gradient_farther_from_the_truth_than_float32_noise_is_refused(reference_error, ours):
    truth, direction = torch.randn(64, generator=torch.Generator().manual_seed(0)), torch.randn(64, generator=torch.Generator().manual_seed(1))
    with pytest.raises(AssertionError, match="relative error"):
        _check_gradient(_off(truth, ours, -direction), _off(truth, reference_error, direction), truth, 0.0, "w")


def test_a_gradient_float32_cannot_resolve_is_held_to_what_it_can():
    """Seen: a linear-attention dt_bias 1.7e-5 from one process, with the single process 5.9e-10 from the
    float64 truth (by luck), and its gradient moving 2.2e-5 when the weights moved by one ulp."""
    truth, direction = torch.randn(64, generator=torch.Generator().manual_seed(0)), torch.randn(64, generator=torch.Generator().manual_seed(1))
    reference = _off(truth, 5.9e-10, direction)
    _check_gradient(_off(reference, 1.7e-5, -direction), reference, truth, 2.2e-5, "dt_bias")
    with pytest.raises(AssertionError, match="float32 resolves this gradient to 1.000e-06"):
        _check_gradient(_off(reference, 1.7e-5, -direction), reference, truth, 1e-6, "dt_bias")


def test_the_resolution_allowance_is_capped():
    """A one-ulp move that flips a router's choice moves every gradient far; a real mistake must still fail."""
    truth, direction = torch.randn(64, generator=torch.Generator().manual_seed(0)), torch.randn(64, generator=torch.Generator().manual_seed(1))
    with pytest.raises(AssertionError, match="relative error"):
        _check_gradient(_off(truth, 1e-3, -direction), truth, truth, 0.5, "w")


def test_a_weight_near_zero_is_held_to_this_layouts_own_step_and_a_wrong_step_is_refused():
    """DeepSeek-V4's hyper-connection ``base`` moves by about itself in one step: a gradient difference float32
    allows then shows as 1e-5 of the weight. The step from the layout's own (checked) gradient passes; another fails."""
    before = torch.full((4,), 1e-3)
    grad = torch.full((4,), 5e-4 / LR)
    expected = before - LR * grad * (1 + 1e-4)  # one process's gradient, 1e-4 away
    _check_step(before - LR * grad, expected, before, grad, "w")
    with pytest.raises(AssertionError, match="against this layout's own SGD step"):
        _check_step(before - 2 * LR * grad, expected, before, grad, "w")
    with pytest.raises(AssertionError):  # no gradient to explain the difference: held to one process plainly
        _check_step(before - LR * grad, expected, None, None, "w")
