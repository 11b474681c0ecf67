"""Supervised fine-tuning: ``HaloSFTTrainer(DistributedTrainerMixin, trl.SFTTrainer)`` and the ``sft`` method."""

from __future__ import annotations

from trl import SFTConfig, SFTTrainer

from halo_core.trainers.method import Method
from halo_core.trainers.mixin import DistributedTrainerMixin
from halo_core.trainers.run_config import RunConfig


class HaloSFTTrainer(DistributedTrainerMixin, SFTTrainer):
    """TRL's SFTTrainer on a Halo layout."""


def run(run: RunConfig) -> None:
    from halo_core.trainers.parts.data import load_sources
    from halo_core.trainers.runtime import build_model, build_tokenizer, init_distributed, method_args

    init_distributed()
    args = method_args(SFTConfig, run.trainer)
    model = build_model(run.halo, args)
    trainer = HaloSFTTrainer(
        model=model,
        args=args,
        train_dataset=load_sources(run.halo.dataset),
        processing_class=build_tokenizer(run.halo),
        parallel_config=run.halo.parallel_config(),
        adamw_bf16_kahan=run.halo.adamw_bf16_kahan,
        compile_layers=run.halo.compile_layers,
        activation_memory_budget=run.halo.activation_memory_budget,
    )
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    trainer.save_model()


METHOD = Method(name="sft", config_class=SFTConfig, run=run, splits=frozenset({"ep", "cp", "tp", "etp"}))
