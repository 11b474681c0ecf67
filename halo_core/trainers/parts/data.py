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


def first_rows(source: DatasetSource, count: int = 64) -> list[dict] | None:
    """The first rows of a local ``.jsonl`` source, read without ``datasets`` (for checks before start); else ``None``."""
    import json

    path = Path(source.path)
    if path.suffix != ".jsonl" or not path.is_file():
        return None
    rows = []
    with path.open() as lines:
        for line in lines:
            if line.strip():
                row = json.loads(line)
                rows.append({source.columns.get(k, k): v for k, v in row.items()})
                if len(rows) == count:
                    break
    return rows


def local_columns(source: DatasetSource) -> set[str] | None:
    """The column names of a local source after its renames, read cheaply; ``None`` for a hub dataset."""
    path = Path(source.path)
    if path.suffix == ".jsonl" and path.is_file():
        rows = first_rows(source, 1)
        return set(rows[0]) if rows else set()
    if path.suffix == ".parquet" and path.is_file():
        import pyarrow.parquet as pq

        names = pq.read_schema(path).names
    elif path.is_dir():
        names = load_source(DatasetSource(str(path), source.split)).column_names
    else:
        return None
    return {source.columns.get(n, n) for n in names}


def load_sources(sources: list[DatasetSource]):
    import datasets

    parts = [load_source(s) for s in sources]
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
