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
            self._total_train_tokens = counted + self.accelerator.gather_for_metrics(own.to(self.args.device)).sum().item()
            self._metrics["train"]["num_tokens"] = [self._total_train_tokens]
        return result


def run(run: RunConfig) -> None:
    from halo_core.trainers.parts.data import load_sources
    from halo_core.trainers.runtime import build_model, build_tokenizer, init_distributed, method_args

    init_distributed()
    args = method_args(SFTConfig, run.trainer)
    parallel = run.halo.parallel_config()
    model = build_model(run.halo, args, parallel)
    trainer = HaloSFTTrainer(
        model=model,
        args=args,
        train_dataset=load_sources(run.halo.dataset),
        processing_class=build_tokenizer(run.halo),
        parallel_config=parallel,
        adamw_bf16_kahan=run.halo.adamw_bf16_kahan,
        compile_layers=run.halo.compile_layers,
        activation_memory_budget=run.halo.activation_memory_budget,
    )
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    trainer.save_model()


METHOD = Method(name="sft", config_class=SFTConfig, run=run, splits=frozenset({"ep", "cp", "tp", "etp"}))
