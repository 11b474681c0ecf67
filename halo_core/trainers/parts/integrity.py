"""A saved folder checked before any process starts: every file there at its size, the small ones intact.

Without this a truncated safetensors file or a damaged ``optimizer.json`` failed only once every rank had built
the model, with library errors that named no file. The manifest (``parallel.manifest``) lists what a Halo save
wrote; a folder without one (written by transformers, or by a Halo before the manifest) still gets the check that
needs none: each safetensors file as long as its own header says.
"""

from __future__ import annotations

import json
from pathlib import Path

from halo_core.errors import ConfigError
from halo_core.parallel import manifest


def check_folder(folder: str | Path, where: str, field: str) -> dict | None:
    """Refuse (``ConfigError``, one line) a folder some file of which is missing, short or damaged; its manifest."""
    folder = Path(folder)
    try:
        written = manifest.check(folder)
    except manifest.ManifestError as exc:
        raise ConfigError(f"{where}: {field}: {exc}; re-copy the folder, or use another checkpoint") from None
    if written is None:
        for path in sorted(folder.rglob("*.safetensors")):
            _check_length(path, where, field)
    return written


def _check_length(path: Path, where: str, field: str) -> None:
    size = path.stat().st_size
    try:
        with open(path, "rb") as handle:
            length = int.from_bytes(handle.read(8), "little")
            header = json.loads(handle.read(length))
        length += 8
        end = max((e["data_offsets"][1] for k, e in header.items() if k != "__metadata__"), default=0)
    except (ValueError, OSError, KeyError, TypeError) as exc:
        raise ConfigError(f"{where}: {field}: {path} is not a readable safetensors file ({type(exc).__name__}); re-copy it") from None
    if length + end != size:
        raise ConfigError(f"{where}: {field}: {path} has {size} bytes but its header describes {length + end} (truncated); re-copy it")


def resume_notes(folder: str | Path, written: dict | None) -> list[str]:
    """What a resume from ``folder`` cannot restore, one line each (printed before start)."""
    folder = Path(folder)
    if written is None:
        notes = [f"{folder} has no {manifest.MANIFEST} (saved before Halo wrote one): its files' sizes were checked, not their bytes"]
        if not (folder / "optimizer").is_dir():
            notes.append(f"{folder} holds no optimizer state: resuming its weights only, with a fresh optimizer and scheduler")
        return notes
    if "optimizer" not in written.get("holds", ()):
        return [f"{folder} was saved with save_only_model (no optimizer, scheduler or RNG state): resuming its weights "
                f"only, with a fresh optimizer and warm-up"]
    return []


def check_model(run) -> None:
    """The weights a run starts from, where they are a local folder it reads (not a random initialisation)."""
    folder = Path(run.halo.model_name_or_path)
    if not run.halo.random_init and folder.is_dir():
        check_folder(folder, run.source, "model_name_or_path")
