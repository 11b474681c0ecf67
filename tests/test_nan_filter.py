"""``parts.nan_filter``: the training loop's ``logging_nan_inf_filter``, chosen on the device, adds to the running
loss exactly what transformers' host-side filter adds (a finite loss itself; otherwise the mean since the last log)."""

from types import SimpleNamespace

import pytest
import torch

from halo_core.trainers.parts.nan_filter import filtered, users_flag


def transformers_adds(running: float, loss: float, global_step: int, last_logged: int) -> float:
    """transformers' ``_inner_training_loop``, the lines this replaces, on plain numbers."""
    if torch.isnan(torch.tensor(loss)) or torch.isinf(torch.tensor(loss)):
        return running + running / (1 + global_step - last_logged)
    return running + loss


@pytest.mark.parametrize("loss", [0.75, float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("global_step, last_logged", [(0, 0), (3, 1), (10, 5)])
def test_the_running_loss_is_what_transformers_filter_gives(loss, global_step, last_logged):
    trainer = SimpleNamespace(_tr_loss=torch.tensor(6.0), state=SimpleNamespace(global_step=global_step), _globalstep_last_logged=last_logged)
    added = trainer._tr_loss + filtered(trainer, torch.tensor(loss), wanted=True)
    assert added.item() == pytest.approx(transformers_adds(6.0, loss, global_step, last_logged))


def test_without_the_users_filter_the_loss_is_added_as_it_is():
    trainer = SimpleNamespace(_tr_loss=torch.tensor(6.0), state=SimpleNamespace(global_step=2), _globalstep_last_logged=0)
    assert torch.isnan(filtered(trainer, torch.tensor(float("nan")), wanted=False))


def test_evaluation_and_saved_arguments_see_the_users_flag():
    args = SimpleNamespace(logging_nan_inf_filter=False)
    with users_flag(args, True):
        assert args.logging_nan_inf_filter is True
    assert args.logging_nan_inf_filter is False
