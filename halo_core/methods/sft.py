"""Supervised fine-tuning: ``HaloSFTTrainer(DistributedTrainerMixin, trl.SFTTrainer)`` and the ``sft`` method."""

from __future__ import annotations

import torch
from trl import SFTConfig, SFTTrainer

from halo_core.trainers.method import Method
from halo_core.trainers.mixin import DistributedTrainerMixin, sharing
from halo_core.trainers.run_config import RunConfig


class HaloSFTTrainer(DistributedTrainerMixin, SFTTrainer):
    """TRL's SFTTrainer on a Halo layout."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        counted = self._total_train_tokens
        result = super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
        if model.training and sharing(self.model) > 1:
            # TRL counted the pooled, re-padded inputs the CP x TP group computed on; count this rank's own batch instead.
            own = inputs["attention_mask"].sum() if "attention_mask" in inputs else torch.tensor(inputs["position_ids"].size(1))
            self._halo_count_own_tokens(counted, own)
        return result


def run(run: RunConfig) -> None:
    from halo_core.trainers.runtime import train

    train(run, HaloSFTTrainer, SFTConfig)


METHOD = Method(name="sft", config_class=SFTConfig, run=run, trainer=HaloSFTTrainer, splits=frozenset({"ep", "cp", "tp", "etp"}))
