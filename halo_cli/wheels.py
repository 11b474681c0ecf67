"""``halo build-wheels``: wheels of halo-core and every plugin under plugins/, ready to publish or to install by name.

    halo build-wheels --out dist/
    pip install --find-links dist/ halo-plugin-laguna
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from halo_core.errors import HaloError


def project_root() -> Path:
    root = Path(__file__).resolve().parents[1]
    if not (root / "plugins").is_dir() or not (root / "pyproject.toml").is_file():
        raise HaloError("halo build-wheels runs from a source checkout (pyproject.toml and plugins/ beside halo_cli/)")
    return root


def build_wheels(out: Path, only: list[str] | None = None) -> list[Path]:
    """Build wheels (no dependencies) for the core and each plugin (or the ``only`` distributions) into ``out``."""
    root = project_root()
    sources = [root, *sorted(p for p in (root / "plugins").iterdir() if (p / "pyproject.toml").is_file())]
    if only:
        sources = [s for s in sources if (s.name if s != root else "halo-core") in only]
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.glob("*.whl"))
    leftovers = {s: set(s.glob("*.egg-info")) | set(s.glob("build")) for s in sources}
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), *map(str, sources)]
    try:
        if subprocess.call(command) != 0:
            raise HaloError(f"building wheels failed: {' '.join(command)}")
    finally:  # setuptools builds in the source tree; its metadata there would shadow the installed one
        for source, existing in leftovers.items():
            for path in (set(source.glob("*.egg-info")) | set(source.glob("build"))) - existing:
                shutil.rmtree(path, ignore_errors=True)
    return sorted(set(out.glob("*.whl")) - before) or sorted(out.glob("*.whl"))


def command(
    out: Annotated[Path, typer.Option("--out", help="Folder for the wheels.")] = Path("dist"),
) -> None:
    """Build wheels of halo-core and every bundled family plugin."""
    for wheel in build_wheels(out):
        typer.echo(wheel)
