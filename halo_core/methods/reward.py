"""Reward modelling: ``HaloRewardTrainer(DistributedTrainerMixin, trl.RewardTrainer)`` and the ``reward`` method.

The family's backbone under a one-output sequence-classification head (``score``, read at the last
non-pad token), trained with TRL's Bradley-Terry loss on chosen/rejected pairs; TRL's tokenisation,
collator, loss and metrics run unchanged. The mixin pools a TP group's pairs (``parts.pool``).
"""

from __future__ import annotations

from trl import RewardConfig, RewardTrainer

from halo_core.trainers.method import Method
from halo_core.trainers.mixin import DistributedTrainerMixin
from halo_core.trainers.run_config import RunConfig


class HaloRewardTrainer(DistributedTrainerMixin, RewardTrainer):
    """TRL's RewardTrainer on a Halo layout."""

    halo_sequence_loss = True
    halo_row_groups = 2  # the collator stacks every chosen row, then every rejected one


def run(run: RunConfig) -> None:
    from halo_core.trainers.runtime import train

    train(run, HaloRewardTrainer, RewardConfig, num_labels=lambda args: 1)  # one scalar reward per sequence


def check(run: RunConfig, args, world: int = 1) -> None:
    from halo_core.methods.classify import check_sequence_class

    check_sequence_class(run)


# No cp: the score is read at each sequence's last non-pad token, which one CP chunk holds.
METHOD = Method(name="reward", config_class=RewardConfig, run=run, trainer=HaloRewardTrainer, sequence_classification=True, splits=frozenset({"ep", "tp", "etp"}),
                columns=("chosen", "rejected"), check=check)
