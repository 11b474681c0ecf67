"""Supervised fine-tuning: ``HaloSFTTrainer(DistributedTrainerMixin, trl.SFTTrainer)`` and the ``sft`` method."""

from __future__ import annotations

import torch
from trl import SFTConfig, SFTTrainer

from halo_core.errors import HaloError
from halo_core.integrations import trl as _trl_seams  # noqa: F401  (checks the SFTTrainer attributes read here)
from halo_core.parallel.layout_state import layout_of
from halo_core.trainers.method import Method
from halo_core.trainers.mixin import DistributedTrainerMixin, sharing
from halo_core.trainers.run_config import RunConfig


class HaloSFTTrainer(DistributedTrainerMixin, SFTTrainer):
    """TRL's SFTTrainer on a Halo layout; with a processor and an ``images`` column, TRL's vision-language path (its
    ``DataCollatorForVisionLanguageModeling``), the pixels and grids passed to the model as the collator makes them."""

    def __init__(self, *args, **kwargs):
        from halo_core.methods import sft_data

        if kwargs.get("train_dataset") is not None and kwargs.get("args") is not None:
            sft_data.check_loaded(kwargs["train_dataset"], kwargs["args"].dataset_text_field)
        super().__init__(*args, **kwargs)
        # transformers' vision-language classes declare accepts_loss_kwargs = False (their own loss reads no token
        # count), so the Trainer counts no tokens and stock TRL divides each micro-batch by its own: the loss then
        # changes with how the global batch is split over ranks and accumulation steps (at ep=2 on two processes, by
        # 4e-4 on the tiny Qwen3-VL-MoE's first step). TRL's SFT loss never is the model's own (it divides the fused
        # head's log-probs itself, by num_items_in_batch where given), so count the global batch's tokens for every
        # model, as for text models: one process with batch 4 and two with batch 2 train alike.
        self.model_accepts_loss_kwargs = True

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self._is_vision_dataset and "pixel_values" not in inputs and layout_of(self.model).dims.dp > 1:
            # The other ranks run the vision tower, whose FSDP2 units gather their weights over every rank; this one would not.
            raise HaloError("a batch of image data holds no image on this rank; at more than one process every row needs one "
                            "(the vision tower's FSDP2 gathers would not match the other ranks'); drop the rows without images")
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


def check(run: RunConfig, args, world: int = 1) -> None:
    from halo_core.methods import sft_data

    sft_data.check(run, args, world)


METHOD = Method(name="sft", config_class=SFTConfig, run=run, trainer=HaloSFTTrainer, splits=frozenset({"ep", "cp", "tp", "etp"}),
                images=True, check=check)
