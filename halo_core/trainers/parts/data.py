"""Training data from the run's ``dataset`` sources: local files, saved folders or hub ids, concatenated."""

from __future__ import annotations

from pathlib import Path

from halo_core.trainers.arguments import DatasetSource

_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def load_source(source: DatasetSource):
    import datasets

    path = Path(source.path)
    if path.is_dir():
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            loaded = loaded[source.split]
    elif path.suffix in _FORMATS:
        loaded = datasets.load_dataset(_FORMATS[path.suffix], data_files=str(path), split="train")
    else:
        loaded = datasets.load_dataset(source.path, source.name, split=source.split)
    return loaded.rename_columns(source.columns) if source.columns else loaded


def load_sources(sources: list[DatasetSource]):
    import datasets

    parts = [load_source(s) for s in sources]
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
