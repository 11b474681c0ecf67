"""The run's sources as one training set: TRL's ``fraction`` mixture, Halo's ``weight`` sampling, or concatenation;
streamed where a source asks for it.

Every rank builds the same dataset from the same seed, so the rows and their order do not depend on the layout: the
stock sampler (map-style) or accelerate's ``IterableDatasetShard`` (streamed) then deals the global batch's per-device
batches to the ranks in the same way, so one process with batch 4 and two with batch 2 train on the same rows.
"""

from __future__ import annotations

from halo_core.trainers.arguments import DatasetSource

STOPPING_STRATEGIES = ("first_exhausted", "all_exhausted")


def fractions(parts: list, sources: list[DatasetSource]) -> list:
    """TRL's ``get_dataset``: shares normalised to one; the mixture's size the largest no source is oversampled at,
    the first ``round(share * size)`` rows of each kept."""
    total = sum(s.fraction for s in sources)
    shares = [s.fraction / total for s in sources]
    size = min(len(part) / share for part, share in zip(parts, shares) if share > 0)
    return [part.select(range(round(share * size))) for part, share in zip(parts, shares)]


def mix(parts: list, sources: list[DatasetSource], seed: int, stopping_strategy: str = "first_exhausted"):
    """One dataset of the loaded ``parts``: weighted (seeded interleaving), by fraction, or concatenated in order."""
    import datasets

    if any(s.streaming for s in sources):
        parts = [p if isinstance(p, datasets.IterableDataset) else p.to_iterable_dataset() for p in parts]
    if sources[0].fraction is not None:
        parts = fractions(parts, sources)
    if sources[0].weight is not None:
        total = sum(s.weight for s in sources)
        return datasets.interleave_datasets(parts, probabilities=[s.weight / total for s in sources], seed=seed,
                                            stopping_strategy=stopping_strategy)
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def seed_of(args) -> int:
    """The seed that draws the weighted sources: transformers' ``data_seed`` where set, else ``seed``."""
    data_seed = getattr(args, "data_seed", None)
    return data_seed if data_seed is not None else args.seed


def prepare_args(args, dataset) -> None:
    """A streamed dataset is read by every rank and cut by accelerate's ``IterableDatasetShard`` (rank r keeps the r-th
    per-device batch of each global batch, as the map-style sampler deals them), rather than read whole on rank 0 and
    broadcast batch by batch (accelerate's default for iterable data, which also trains alike): no rank waits on one
    reader, and each rank pads only its own rows."""
    import datasets

    if isinstance(dataset, datasets.IterableDataset):
        args.accelerator_config.dispatch_batches = False
