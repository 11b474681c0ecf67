"""The data keys of a run's YAML as a TRL user writes them, and the mixtures Halo refuses before start.

TRL's ``DatasetMixtureConfig`` (``trl/scripts/utils.py``) names the sources ``datasets:`` and sets ``streaming`` for the
whole mixture; Halo's ``dataset:`` takes the same source keys, so both spellings are read. A source's ``columns`` is
TRL's list of columns to keep; Halo's old rename map under that name is refused with the key it moved to.
"""

from __future__ import annotations

from typing import Any

from halo_core.errors import ConfigError

#: Methods whose trainer reads a streamed (``datasets.IterableDataset``) training set.
STREAMING_METHODS = ("sft",)


def trl_mixture(merged: dict[str, Any], where: str) -> dict[str, Any]:
    """``datasets:`` (TRL's name) as ``dataset:``; a top-level ``streaming:`` (TRL's, for the whole mixture) on every source;
    TRL's ``dataset_name``/``dataset_config``/``dataset_train_split``/``dataset_streaming`` as one source."""
    merged = dict(merged)
    if "dataset_name" in merged:  # TRL's ScriptArguments: one hub dataset (dataset_test_split: the evaluation keys')
        if "dataset" in merged or "datasets" in merged:
            raise ConfigError(f"{where}: dataset_name and dataset/datasets are both set; keep one (dataset_name is TRL's one-source form)")
        merged["dataset"] = [{"path": merged.pop("dataset_name"), "name": merged.pop("dataset_config", None),
                              "split": merged.pop("dataset_train_split", "train"), "streaming": merged.pop("dataset_streaming", False)}]
    if "datasets" in merged:
        if "dataset" in merged:
            raise ConfigError(f"{where}: both dataset and datasets are set; keep one (datasets is TRL's name for the same list of sources)")
        merged["dataset"] = merged.pop("datasets")
    if "streaming" in merged:
        streaming = merged.pop("streaming")
        if not isinstance(streaming, bool):
            raise ConfigError(f"{where}: streaming must be true or false, got {streaming!r}")
        raw = merged.get("dataset")
        raw = [raw] if isinstance(raw, (str, dict)) else raw
        if isinstance(raw, list):
            merged["dataset"] = [{**({"path": e} if isinstance(e, str) else e), "streaming": streaming} if isinstance(e, (str, dict)) else e
                                 for e in raw]
    return merged


def check_entry(entry: dict[str, Any], index: int, where: str, field: str = "dataset") -> None:
    """A source key in Halo's old meaning: ``columns`` as a rename map."""
    columns = entry.get("columns")
    if isinstance(columns, dict):
        mapping = "{" + ", ".join(f"{k}: {v}" for k, v in columns.items()) + "}"
        raise ConfigError(f"{where}: {field}[{index}].columns is TRL's list of columns to keep; write the rename map "
                          f"{mapping} as rename_columns: {mapping}")


def check_mixture(sources: list, method: str, trainer: dict[str, Any], stopping_strategy: str, where: str) -> None:
    """``fraction`` and ``weight``: on every source or on none, not both, positive; streaming where the method reads it."""
    from halo_core.trainers.parts.mixture import STOPPING_STRATEGIES

    for key in ("fraction", "weight"):
        given = [getattr(s, key) is not None for s in sources]
        if any(given) and not all(given):
            missing = [i for i, g in enumerate(given) if not g]
            raise ConfigError(f"{where}: {key} is set on some sources but not on dataset{missing}; set it on every source or on none")
        bad = [(i, getattr(s, key)) for i, s in enumerate(sources) if getattr(s, key) is not None and getattr(s, key) < 0]
        if bad or (all(given) and not sum(getattr(s, key) for s in sources) > 0):
            raise ConfigError(f"{where}: dataset[{bad[0][0] if bad else 0}].{key}={bad[0][1] if bad else 0} must be 0 or above, "
                              f"and the sources' {key}s must not all be 0")
    if sources[0].fraction is not None and sources[0].weight is not None:
        raise ConfigError(f"{where}: the sources set both fraction (TRL's: the first rows of each, no repeats) and weight "
                          f"(rows sampled in proportion); keep one")
    if stopping_strategy not in STOPPING_STRATEGIES:
        raise ConfigError(f"{where}: dataset_stopping_strategy={stopping_strategy!r} must be one of {', '.join(STOPPING_STRATEGIES)}")
    streamed = [i for i, s in enumerate(sources) if s.streaming]
    if not streamed:
        return
    if sources[0].fraction is not None:
        raise ConfigError(f"{where}: fraction needs each source's length, which a streamed source does not know (as in TRL); "
                          f"use weight, or streaming: false")
    if method not in STREAMING_METHODS:
        raise ConfigError(f"{where}: method {method!r} does not train on streamed data yet (only {', '.join(STREAMING_METHODS)} does); "
                          f"set streaming: false on dataset{streamed}")
    if not isinstance(trainer.get("max_steps"), int) or trainer["max_steps"] < 1:
        raise ConfigError(f"{where}: a streamed dataset has no length, so the run needs max_steps (a positive number of steps), "
                          f"got {trainer.get('max_steps', -1)!r}; set max_steps")


def resolve_data_files(entry: dict[str, Any], base) -> dict[str, Any]:
    """``data_files`` read relative to the YAML file's folder where they exist there, as ``path`` is."""
    def resolve(name):
        return str((base / name).resolve()) if isinstance(name, str) and (base / name).exists() else name

    files = entry.get("data_files")
    if isinstance(files, dict):
        return {**entry, "data_files": {k: resolve(v) for k, v in files.items()}}
    if isinstance(files, list):
        return {**entry, "data_files": [resolve(f) for f in files]}
    return {**entry, "data_files": resolve(files)} if files is not None else entry
