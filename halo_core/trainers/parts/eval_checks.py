"""Evaluation keys refused before start, in one line each: an evaluation schedule with no evaluation data, two ways
of naming the evaluation set at once, a held-out size out of range, a test split of a file that has none."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from halo_core.errors import ConfigError
from halo_core.trainers.parts.data import check_columns
from halo_core.trainers.parts.evaluation import has_eval_data

_NAMED = ("eval_dataset", "test_split_size", "dataset_test_split")


def check_eval(run, args, needed: tuple[str, ...] = ()) -> None:
    """``needed``: the columns the method reads (``Method.columns``), which ``eval_dataset`` sources need too."""
    halo, where = run.halo, run.source
    if halo.eval_dataset and needed:
        check_columns(replace(run, halo=replace(halo, dataset=halo.eval_dataset)), needed)
    named = [k for k, on in zip(_NAMED, (bool(halo.eval_dataset), halo.test_split_size is not None, bool(halo.dataset_test_split))) if on]
    if len(named) > 1:
        raise ConfigError(f"{where}: {' and '.join(named)} both name the evaluation set; keep one of them")
    size = halo.test_split_size
    if size is not None and not (0 < size < 1 or (float(size).is_integer() and size >= 1)):
        raise ConfigError(f"{where}: test_split_size: {size} must be a fraction between 0 and 1 or a row count of 1 or more "
                          f"(the rows of the training sources held out for evaluation), e.g. 0.05")
    if halo.dataset_test_split:
        files = [s.path for s in halo.dataset if Path(s.path).is_file()]
        if files:
            raise ConfigError(f"{where}: dataset_test_split: {halo.dataset_test_split!r} names a split of each dataset source, and "
                              f"{files[0]} is a file with none; name its evaluation file under eval_dataset, or use test_split_size")
    strategy = str(getattr(getattr(args, "eval_strategy", "no"), "value", getattr(args, "eval_strategy", "no")))
    evaluates = strategy != "no" or getattr(args, "eval_on_start", False) or getattr(args, "load_best_model_at_end", False)
    if evaluates and not has_eval_data(halo):
        key = "eval_strategy: " + strategy if strategy != "no" else "eval_on_start: true" if getattr(args, "eval_on_start", False) else "load_best_model_at_end: true"
        raise ConfigError(f"{where}: {key} evaluates, and the run names no evaluation data; add eval_dataset (sources as under "
                          f"dataset), test_split_size (e.g. 0.05 of the training rows) or dataset_test_split")
