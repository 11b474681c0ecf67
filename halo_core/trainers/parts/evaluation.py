"""Evaluation: the run's evaluation set, and an evaluation loss that is the same number on every layout.

The evaluation set comes from ``eval_dataset`` (sources as ``dataset``), TRL's ``test_split_size`` (rows of the training
sources held out, drawn with the run's ``seed``: ``datasets.train_test_split``) or TRL's ``dataset_test_split`` (that split
of each training source).

transformers' ``evaluation_loop`` logs the mean over rows of each batch's mean loss: a rank's batch of short rows
weighs as much as a batch of long ones, so the number moves with the per-device batch and the process count. For a
token-level loss (SFTTrainer's) Halo logs instead every evaluation token's loss over the
whole set divided by their count, computed as the training loss is (the global batch's token count passed as
``num_items_in_batch``), whatever the layout. accelerate repeats the first rows to fill the last batch of every rank;
their labels are masked here, so they count nowhere. A sequence-level loss (preference, reward, classification) is
each row's own: the stock mean over rows, which drops the repeats (``gather_for_metrics``), is already layout-free.
"""

from __future__ import annotations

IGNORE = -100


def datasets_for(run, seed: int, data_seed: int | None = None):
    """``(train, eval)``: the training set and the evaluation set (``None`` without one) the run's keys name;
    ``seed`` holds out ``test_split_size``, ``data_seed`` (``seed`` when unset, as in transformers) draws
    weighted sources (``parts/mixture.py``)."""
    from halo_core.trainers.parts.data import load_sources

    halo = run.halo
    data_seed = seed if data_seed is None else data_seed
    train = load_sources(halo.dataset, data_seed, halo.dataset_stopping_strategy)
    if halo.eval_dataset:
        return train, load_sources(halo.eval_dataset)
    if halo.dataset_test_split:
        from dataclasses import replace

        return train, load_sources([replace(s, split=halo.dataset_test_split) for s in halo.dataset])
    if halo.test_split_size is not None:
        size = halo.test_split_size
        size = int(size) if float(size) >= 1 else float(size)
        parts = train.train_test_split(test_size=size, seed=seed, shuffle=True)
        return parts["train"], parts["test"]
    return train, None


def has_eval_data(halo) -> bool:
    return bool(halo.eval_dataset) or bool(halo.dataset_test_split) or halo.test_split_size is not None


class TokenLoss:
    """Sums of an evaluation's token losses and token counts (each batch's, over every rank)."""

    def __init__(self):
        self.total = None  # this rank's part of the token-loss sum
        self.tokens = 0  # the evaluation's tokens over every rank (the same number on each)

    def prepare(self, trainer, inputs: dict):
        """The batch's repeated rows masked, and the global batch's token count (``num_items_in_batch``)."""
        import torch
        import torch.distributed as dist

        labels = inputs.get("labels")
        if labels is None:
            return None
        labels = inputs["labels"] = _mask_repeats(trainer, labels)
        counted = inputs["shift_labels"] if "shift_labels" in inputs else labels[..., 1:] if trainer._loss_shifts_labels else labels
        count = counted.ne(IGNORE).sum().to(trainer.args.device, torch.float32)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(count)
        return count

    def add(self, loss, count, trainer) -> None:
        """``loss``: the mixin's value for this rank (the global batch's mean times the data-parallel ranks, spread
        over the ranks as the training loss is); back to this rank's share of the token-loss sum."""
        import torch.distributed as dist

        from halo_core.parallel.layout_state import layout_of

        dims = layout_of(trainer.model).dims
        world = dist.get_world_size() if dist.is_initialized() else 1
        part = loss.detach().float() * dims.cp * count / world
        self.total = part if self.total is None else self.total + part
        self.tokens += float(count)

    def mean(self) -> float | None:
        import torch.distributed as dist

        if self.total is None or self.tokens == 0:
            return None
        total = self.total.clone()
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(total)
        return total.item() / self.tokens


def _mask_repeats(trainer, labels):
    """accelerate fills the last batch of each rank with the first rows again; ``gather_for_metrics`` keeps the first
    ``remainder`` rows of the gathered batch (ranks in order). The others' labels are masked."""
    import torch.distributed as dist

    state = trainer.accelerator.gradient_state
    remainder = getattr(state, "remainder", -1)
    if not state.end_of_dataloader or remainder is None or remainder <= 0:
        return labels
    rank = dist.get_rank() if dist.is_initialized() else 0
    rows = labels.shape[0]
    keep = max(0, min(rows, remainder - rank * rows))
    if keep == rows:
        return labels
    labels = labels.clone()
    labels[keep:] = IGNORE
    return labels


def load_best(trainer) -> None:
    """``load_best_model_at_end``: the best checkpoint's weights read by Halo's loader (every rank its own shards), where
    transformers' would read one whole state dict into a laid-out model."""
    from halo_core.parallel.layout_state import layout_of
    from halo_core.parallel.loading import load_into

    folder = trainer.state.best_model_checkpoint
    if layout_of(trainer.model).adapters is not None:
        from halo_core.lora.peft_format import load_adapter

        load_adapter(trainer._halo_laid_out, folder)
    else:
        load_into(trainer._halo_laid_out, folder)


def counts_tokens(trainer) -> bool:
    """Whether the trainer's evaluation loss is SFTTrainer's token loss, which Halo recomputes (``TokenLoss``): the model
    divides by the ``num_items_in_batch`` it is passed (transformers' ``average_tokens_across_devices``). Trainers with a
    loss of their own (GKD's divergence, embeddings' in-batch losses) keep the stock number."""
    from trl import SFTTrainer

    from halo_core.trainers.mixin import DistributedTrainerMixin

    after = type(trainer).__mro__[type(trainer).__mro__.index(DistributedTrainerMixin) + 1:]
    owner = next((c for c in after if "compute_loss" in vars(c)), None)
    return (owner is SFTTrainer and not trainer.halo_sequence_loss and not trainer.halo_shared_batch and trainer.model_accepts_loss_kwargs
            and trainer.args.average_tokens_across_devices and trainer.compute_loss_func is None)


def loop(trainer, run_loop, metric_key_prefix: str):
    """transformers' ``evaluation_loop`` (``run_loop``), its loss replaced by the whole set's token-level mean."""
    trainer._halo_eval_tokens = TokenLoss() if counts_tokens(trainer) else None
    try:
        output = run_loop()
        tokens = trainer._halo_eval_tokens
        mean = tokens.mean() if tokens is not None else None
        if mean is not None:
            output.metrics[f"{metric_key_prefix}_loss"] = mean
        return output
    finally:
        trainer._halo_eval_tokens = None


def loss(trainer, model, inputs, compute, return_outputs: bool):
    """An evaluation batch's loss by ``compute(inputs, num_items_in_batch)``, with the repeats masked and the global
    token count passed, added to the evaluation's sums."""
    tokens = trainer._halo_eval_tokens
    count = tokens.prepare(trainer, inputs)
    result = compute(inputs, count)
    if count is not None:
        tokens.add(result[0] if return_outputs else result, count, trainer)
    return result


def own_rows(outputs, own):
    """A pooled forward's ``logits`` cut to this rank's own rows (``parts.pool``), which its labels describe: the
    evaluation loop gathers both over the ranks for ``compute_metrics``."""
    logits = outputs.get("logits") if isinstance(outputs, dict) else None
    if logits is not None and logits.dim() >= 1 and logits.shape[0] > own.numel():
        outputs["logits"] = logits.index_select(0, own.to(logits.device))
    return outputs


def accuracy(prediction) -> dict:
    """``compute_metrics`` of ``classify``: the share of evaluation rows whose highest logit is their label (every row
    once: transformers' loop drops the repeats that fill the last batch)."""
    import numpy as np

    logits, labels = prediction.predictions, prediction.label_ids
    logits = logits[0] if isinstance(logits, tuple) else logits
    return {"accuracy": float((np.asarray(logits).argmax(-1) == np.asarray(labels)).mean())}
