"""Direct preference optimisation: ``HaloDPOTrainer(DistributedTrainerMixin, trl.DPOTrainer)`` and the ``dpo`` method.

TRL's loss, reference handling and metrics run unchanged; the mixin pools a CP x TP group's
preference pairs and splits the fused head's sequences over CP (``parts.pool``).
"""

from __future__ import annotations

import trl.trainer.dpo_trainer
from trl import DPOConfig, DPOTrainer

from halo_core.integrations.trl import hashing_shards

from halo_core.trainers.method import Method
from halo_core.trainers.mixin import DistributedTrainerMixin, sharing
from halo_core.trainers.run_config import RunConfig


class HaloDPOTrainer(DistributedTrainerMixin, DPOTrainer):
    """TRL's DPOTrainer on a Halo layout; the reference policy is laid out as the policy is."""

    halo_sequence_loss = True
    halo_row_groups = 2  # the collator stacks every chosen row, then every rejected one

    def __init__(self, *args, **kwargs):
        with hashing_shards(trl.trainer.dpo_trainer):
            super().__init__(*args, **kwargs)

    def compute_ref_log_probs(self, model, inputs):
        """``precompute_ref_log_probs``' pass, pooled like training so every TP rank runs the same rows."""
        if sharing(self.model) == 1:
            return super().compute_ref_log_probs(model, inputs)
        pooled, own = self.halo_pool(inputs)
        chosen, rejected = super().compute_ref_log_probs(model, pooled)
        pairs = own[: own.numel() // 2]
        return chosen[pairs], rejected[pairs]


def run(run: RunConfig) -> None:
    from halo_core.trainers.runtime import train

    # With precompute_ref_log_probs TRL scores the data with the policy itself before the first step.
    train(run, HaloDPOTrainer, DPOConfig, reference=lambda args: not args.precompute_ref_log_probs)


METHOD = Method(name="dpo", config_class=DPOConfig, run=run, trainer=HaloDPOTrainer, splits=frozenset({"ep", "cp", "tp", "etp"}), columns=("chosen", "rejected"))
