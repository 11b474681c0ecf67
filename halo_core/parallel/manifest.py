"""``halo-manifest.json``: what a saved folder holds, written last, so a reader can tell a whole save from a broken one.

Every file with its size; for a safetensors file Halo wrote in parts, each part's place, CRC-32 and writer (a rank reading
its experts checks those parts only: a 235B checkpoint is terabytes and no single process reads it all); for every
other file the CRC-32 of the whole (they are small: configs, the scheduler, RNG states, the trainer's state). The
launcher checks, before any process starts, that every file is there at its size and that the small files are
intact; each rank checks the parts it reads as it reads them (``loading``, ``optimizer_state``).

While a save is written, each rank leaves the records of its parts beside the files (``.halo-parts-rank<r>.json``);
rank 0 merges them into the manifest once every rank's are there.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from pathlib import Path

from halo_core.errors import HaloError

MANIFEST = "halo-manifest.json"
FORMAT = "halo-manifest-1"
_PARTS = ".halo-parts-rank{}.json"
#: What a checkpoint may hold besides its weights, by the file that shows it (transformers' and Halo's names).
STATES = {"optimizer": "optimizer/optimizer.json", "scheduler": "scheduler.pt", "trainer_state": "trainer_state.json"}


class ManifestError(HaloError):
    """A saved folder that is not what its manifest says."""


def file_crc(path: Path) -> int:
    crc = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 24):
            crc = zlib.crc32(chunk, crc)
    return crc


def leave_parts(folder: Path, rank: int, records: list[list] | None, error: str | None = None) -> None:
    """This rank's records of the parts it wrote, for rank 0 to merge (written after its files are synced), or the
    error that stopped it (rank 0 then stops waiting and names it)."""
    path = Path(folder) / _PARTS.format(rank)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(records if error is None else {"error": error}))
    os.replace(tmp, path)


def take_parts(folder: Path, world: int, timeout: float | None = None) -> list[list]:
    """Every rank's records (waiting up to ``timeout`` seconds for ranks still writing), removed from the folder."""
    paths = [Path(folder) / _PARTS.format(r) for r in range(world)]
    deadline = None if timeout is None else time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        if deadline is not None and time.monotonic() > deadline:
            missing = [r for r, p in enumerate(paths) if not p.exists()]
            raise ManifestError(f"{folder}: ranks {missing} did not finish writing their parts within {timeout:.0f} s")
        time.sleep(0.05)
    records = []
    for rank, path in enumerate(paths):
        left = json.loads(path.read_text())
        path.unlink()
        if isinstance(left, dict):
            raise ManifestError(f"{folder}: rank {rank} could not write its parts: {left['error']}")
        records.extend(left)
    return records


def write(folder: Path, records: list[list], **info) -> dict:
    """The manifest of everything under ``folder`` (rank 0, once every file is written), written last and atomically."""
    folder = Path(folder)
    parted: dict[str, dict] = {}
    for file, key, offset, shape, crc, rank in records:
        parted.setdefault(file, {}).setdefault(key, []).append([offset, shape, crc, rank])
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = path.relative_to(folder).as_posix()
        if name == MANIFEST or path.name.startswith(".halo-parts-"):
            continue
        entry = {"size": path.stat().st_size}
        if name in parted:
            entry["tensors"] = parted.pop(name)
            _check_covered(path, entry["tensors"])
        else:
            entry["crc32"] = file_crc(path)
        files[name] = entry
    if parted:
        raise ManifestError(f"{folder}: parts were recorded for {sorted(parted)[:3]}, which are not there")
    manifest = {"format": FORMAT, **info, "holds": sorted(k for k, f in STATES.items() if f in files), "files": files}
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, folder / MANIFEST)
    return manifest


def header(path: Path) -> dict:
    """A safetensors file's header (tensor -> dtype, shape, data_offsets), read without its data."""
    with open(path, "rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        return json.loads(handle.read(length))


def _check_covered(path: Path, parts: dict[str, list]) -> None:
    """Every tensor of the file was written whole by the ranks' parts (a part no rank wrote would read as zeros)."""
    for key, entry in header(path).items():
        if key == "__metadata__":
            continue
        numel = 1
        for size in entry["shape"]:
            numel *= size
        written = 0
        for _, shape, *_ in parts.get(key, ()):
            count = 1
            for size in shape:
                count *= size
            written += count
        if written != numel:
            raise ManifestError(f"{path}: {key} has {numel} elements but the ranks wrote {written} of them")


def read(folder: str | Path) -> dict | None:
    """The manifest of ``folder``, or ``None`` (a folder written by transformers, or by an older Halo)."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except ValueError as exc:
        raise ManifestError(f"{path} is not valid JSON ({exc}); the checkpoint's manifest is damaged") from None
    if manifest.get("format") != FORMAT:
        raise ManifestError(f"{path} is in format {manifest.get('format')!r}, not {FORMAT!r} which this Halo reads")
    return manifest


def check(folder: str | Path) -> dict | None:
    """Every file the manifest lists is there at its size, and every small file is intact; a ``ManifestError``
    naming the first that is not. Reads the small files only (the tensors' parts are checked as they are read)."""
    folder = Path(folder)
    manifest = read(folder)
    if manifest is None:
        return None
    for name, entry in manifest["files"].items():
        path = folder / name
        if not path.is_file():
            raise ManifestError(f"{path} is missing (the checkpoint's manifest lists it)")
        size = path.stat().st_size
        if size != entry["size"]:
            raise ManifestError(f"{path} has {size} bytes, not the {entry['size']} written (truncated or overwritten)")
        if "crc32" in entry and file_crc(path) != entry["crc32"]:
            raise ManifestError(f"{path} is damaged: its bytes differ from what was written (CRC-32 mismatch)")
    return manifest


def parts_of(manifest: dict | None, file: str) -> dict[str, list] | None:
    """Tensor -> recorded parts of ``file`` (a path relative to the manifest's folder), or ``None`` if not recorded."""
    if manifest is None:
        return None
    entry = manifest["files"].get(file)
    return None if entry is None else entry.get("tensors")
