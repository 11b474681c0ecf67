"""Kahneman-Tversky optimisation: ``HaloKTOTrainer(DistributedTrainerMixin, trl.KTOTrainer)`` and the ``kto`` method.

TRL's loss, reference handling and metrics run unchanged; the mixin pools a CP x TP group's rows
(the completions, their ``KL_*`` mismatched twins and the per-row ``label``) and splits the fused
head's sequences over CP (``parts.pool``), as for DPO.

The KL term. KTO's reference point is a batch-level estimate of KL(policy || reference), read from
mismatched (prompt, completion) pairs: TRL rotates the completions by one within each block of
``per_device_train_batch_size`` rows of the (sequentially sampled) data, and at every step averages
``KL_logps - ref_KL_logps`` over each rank's rows and then over every rank (``gather_for_metrics``).
So stock TRL on N ranks rotates within each rank's rows but averages over all N ranks' rows: the
estimate depends on how the global batch is cut into per-device batches, and two processes at
batch 2 see other KL pairs than one process at batch 4. Halo rotates within the rows the gather
averages together instead, the global batch of one micro-step (``per_device_train_batch_size`` x
the world: with a sequential sampler, accelerate hands rank r the r-th per-device block of each
such run of consecutive rows). The KL pairs and the gathered estimate are then those of one process
at the global batch, whatever the layout; on one process nothing changes from stock TRL. (Every
rank has equally many rows, so the mean of the ranks' means is the global mean; a CP x TP pool
repeats its mean on each of its ranks, which leaves the mean over ranks unchanged.) An eval
dataset keeps TRL's pairing.
"""

from __future__ import annotations

from pathlib import Path

import trl.trainer.kto_trainer
from trl import KTOConfig, KTOTrainer

from halo_core.errors import ConfigError
from halo_core.integrations.trl import hashing_shards
from halo_core.trainers.method import Method
from halo_core.trainers.mixin import DistributedTrainerMixin, sharing
from halo_core.trainers.run_config import RunConfig

#: The loss types TRL's KTOTrainer implements (its config accepts any string; the first step would fail).
LOSS_TYPES = ("kto", "apo_zero_unpaired")


def _rotate_within(block: dict) -> dict:
    """TRL's KL completions, (x_1, y_n), (x_2, y_1), ..., (x_n, y_{n-1}), over one block of rows."""
    completions = block["completion_ids"]
    return {"KL_completion_ids": completions[-1:] + completions[:-1]}


class HaloKTOTrainer(DistributedTrainerMixin, KTOTrainer):
    """TRL's KTOTrainer on a Halo layout; the reference policy is laid out as the policy is, and the KL
    pairs follow the global batch (module docstring), so every layout computes one process's loss."""

    halo_sequence_loss = True
    halo_row_groups = 1  # one row per example; the KL_* rows sit in their own tensors, row for row

    def __init__(self, *args, **kwargs):
        with hashing_shards(trl.trainer.kto_trainer):  # precompute_ref_log_probs' cache key, over the layout's shards
            super().__init__(*args, **kwargs)

    def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
        dataset = super()._prepare_dataset(dataset, processing_class, args, dataset_name)
        world = args.world_size
        if not self.calculate_KL or dataset_name != "train" or world == 1:
            return dataset
        from trl.trainer.utils import global_then_local_main_first

        with global_then_local_main_first():
            return dataset.map(_rotate_within, batched=True, batch_size=args.per_device_train_batch_size * world)

    def compute_ref_log_probs(self, model, inputs):
        """``precompute_ref_log_probs``' pass, pooled like training so every TP rank runs the same rows."""
        if sharing(self.model) == 1:
            return super().compute_ref_log_probs(model, inputs)
        pooled, own = self.halo_pool(inputs)
        logps, kl_logps = super().compute_ref_log_probs(model, pooled)
        return logps[own], None if kl_logps is None else kl_logps[own]


def check(run: RunConfig, args, world: int = 1) -> None:
    """KTO's own refusals before start: labels that are not booleans, weights and loss types TRL would take
    and then fail on (or train nonsense with), and what TRL's trainer refuses in every rank at once."""
    from halo_core.trainers.parts.data import first_rows

    where = run.source
    for field in ("desirable_weight", "undesirable_weight"):
        value = getattr(args, field)
        if not value > 0:
            raise ConfigError(f"{where}: {field}={value!r} must be above 0 (it scales the loss of that kind of row; 1.0 weighs both kinds evenly), "
                              f"e.g. 1.0; set it in the YAML or with -- --{field}=VALUE")
    if args.loss_type not in LOSS_TYPES:
        raise ConfigError(f"{where}: loss_type={args.loss_type!r} is not one KTOTrainer implements; choose among "
                          f"{', '.join(map(repr, LOSS_TYPES))}")
    if args.loss_type != "apo_zero_unpaired":  # these estimate the KL term from mismatched pairs within a batch
        if args.per_device_train_batch_size < 2:
            raise ConfigError(f"{where}: per_device_train_batch_size={args.per_device_train_batch_size} must be at least 2 "
                              f"with loss_type {args.loss_type!r} (its KL term pairs rows of a batch); raise it, or use "
                              f"loss_type 'apo_zero_unpaired'")
        if args.train_sampling_strategy != "sequential":
            raise ConfigError(f"{where}: train_sampling_strategy={args.train_sampling_strategy!r} must be 'sequential' with "
                              f"loss_type {args.loss_type!r} (the KL pairs are fixed in data order); remove the field")
    for source in run.halo.dataset:
        for number, row in enumerate(first_rows(source, 100_000) or [], start=1):
            label = row.get("label")
            if not isinstance(label, bool):
                raise ConfigError(
                    f"{where}: dataset {source.path!r} row {number} has label={label!r}, but kto needs a boolean label "
                    f"(true: a desirable completion, false: an undesirable one); write JSON true or false in {Path(source.path).name}"
                )


def run(run: RunConfig) -> None:
    from halo_core.trainers.runtime import train

    # With precompute_ref_log_probs TRL scores the data with the policy itself before the first step.
    train(run, HaloKTOTrainer, KTOConfig, reference=lambda args: not args.precompute_ref_log_probs)


METHOD = Method(name="kto", config_class=KTOConfig, run=run, trainer=HaloKTOTrainer, splits=frozenset({"ep", "cp", "tp", "etp"}),
                columns=("prompt", "completion", "label"), check=check)
