"""Training data from the run's ``dataset`` sources: local files, saved folders or hub ids, mixed by ``parts/mixture.py``."""

from __future__ import annotations

from pathlib import Path

from halo_core.errors import ConfigError
from halo_core.trainers.arguments import DatasetSource

_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def load_source(source: DatasetSource):
    import datasets

    path = Path(source.path)
    if path.is_dir():
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            loaded = loaded[source.split]
        loaded = loaded.to_iterable_dataset() if source.streaming else loaded
    elif path.suffix in _FORMATS:
        loaded = datasets.load_dataset(_FORMATS[path.suffix], data_files=str(path), split="train", streaming=source.streaming)
    else:
        loaded = datasets.load_dataset(source.path, source.name, data_dir=source.data_dir, data_files=source.data_files,
                                       split=source.split, streaming=source.streaming)
    loaded = loaded.select_columns(source.columns) if source.columns else loaded
    loaded = loaded.rename_columns(source.rename_columns) if source.rename_columns else loaded
    if source.streaming:
        return loaded  # rows are read as training goes; image paths stay paths
    return local_paths(images_from_paths(loaded, path.parent), path.parent) if path.suffix in (".jsonl", ".json") else loaded


#: Columns naming a local file or folder an environment reads (``swe``'s repository, ``search_qa``'s corpus).
PATH_COLUMNS = ("repo", "corpus")


def local_paths(loaded, folder: Path):
    """A JSON source's ``PATH_COLUMNS``, as its images: a relative path that exists beside the file is taken from
    the file's folder, so bundled rows work from any working directory."""
    for column in PATH_COLUMNS:
        if column in loaded.column_names and loaded.features[column].dtype in ("string", "large_string"):
            beside = lambda v: str(folder / v) if v and not Path(v).is_absolute() and (folder / v).exists() else v  # noqa: E731
            loaded = loaded.map(lambda row: {column: beside(row[column])}, keep_in_memory=True)
    return loaded


def _kept(source: DatasetSource, names) -> list[str]:
    """Column names as the source ends up with them: TRL's ``columns`` kept, then ``rename_columns`` applied."""
    kept = [n for n in names if not source.columns or n in source.columns]
    return [source.rename_columns.get(n, n) for n in kept]


def image_paths(value, folder: Path) -> list[str]:
    """A row's ``images`` (a list) or ``image`` (one) value as file paths, relative ones taken from ``folder``."""
    values = value if isinstance(value, list) else [value]
    return [str(folder / v) if isinstance(v, str) and not Path(v).is_absolute() else v for v in values]


def images_from_paths(loaded, folder: Path):
    """A JSON source names its images by file path, relative to the file: cast to ``datasets.Image``, so a row
    holds the decoded images TRL's vision collator takes (as a hub or saved dataset with image features does)."""
    import datasets

    from halo_core.trainers.parts.processor import IMAGE_COLUMNS

    for column in IMAGE_COLUMNS:
        feature = loaded.features.get(column)
        inner = getattr(feature, "feature", feature)
        if not (isinstance(inner, datasets.Value) and inner.dtype in ("string", "large_string")):
            continue  # already images (or not paths): as loaded
        single = feature is inner
        loaded = loaded.map(lambda row: {column: image_paths(row[column], folder)[0] if single else image_paths(row[column], folder)},
                            keep_in_memory=True)
        loaded = loaded.cast_column(column, datasets.Image() if single else datasets.List(datasets.Image()))
    return loaded


def local_file(source: DatasetSource) -> Path:
    """The file a source reads: its ``path``, or TRL's builder form's one local file (``path: json, data_files: x.jsonl``)."""
    files = source.data_files
    if source.path in ("json", "parquet") and isinstance(files, str) and Path(files).is_file():
        return Path(files)
    return Path(source.path)


def first_rows(source: DatasetSource, count: int | None = 64) -> list[dict] | None:
    """The first rows of a local ``.jsonl`` source (every row with ``count=None``), read without ``datasets`` (for checks
    before start); else ``None``."""
    import json

    path = local_file(source)
    if path.suffix != ".jsonl" or not path.is_file():
        return None
    rows = []
    with path.open() as lines:
        for line in lines:
            if line.strip():
                row = json.loads(line)
                rows.append({source.rename_columns.get(k, k): v for k, v in row.items() if not source.columns or k in source.columns})
                if len(rows) == count:
                    break
    return rows


def local_columns(source: DatasetSource) -> set[str] | None:
    """The column names of a local source after its renames, read cheaply; ``None`` for a hub dataset."""
    path = local_file(source)
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
    return set(_kept(source, names))


def load_sources(sources: list[DatasetSource], seed: int = 42, stopping_strategy: str = "first_exhausted"):
    """The sources as one dataset (``parts/mixture.py``: concatenated, by TRL's ``fraction`` or by ``weight``)."""
    from halo_core.trainers.parts.mixture import mix

    return mix([load_source(s) for s in sources], sources, seed, stopping_strategy)


def check_columns(run, needed: tuple[str, ...]) -> None:
    """Each local dataset source has the columns the method reads (hub datasets are checked when loaded). Here, not in
    ``run_checks``, so that the evaluation checks (``eval_checks``) can hold ``eval_dataset`` to it too."""
    for source in run.halo.dataset:
        columns = local_columns(source)
        if columns is None:
            continue
        missing = [need for need in needed if not any(name in columns for name in need.split("|"))]
        if missing:
            wanted = ", ".join(" or ".join(repr(name) for name in need.split("|")) for need in missing)
            raise ConfigError(
                f"{run.source}: dataset {source.path!r} lacks {wanted}, which method {run.method!r} needs (it has {sorted(columns)}); "
                f"rename one with the source's rename_columns: {{old: new}}, or pick the method that fits the data"
            )
