"""Shared fixtures: real installed plugin distributions in a temporary site folder (no mocked importlib)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from halo_core.registry import reset_caches

_counter = itertools.count()
TESTS_DIR = Path(__file__).parent
# Spawned ranks import their worker functions from test modules by name.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")]))

PLUGIN_SOURCE = """
from halo_core import Family, hookimpl

@hookimpl
def halo_family():
    return Family(name={name!r}, model_types={model_types!r}, version="1.0", api_version={api_version!r}, splits=frozenset({splits!r}))
"""


class PluginSite:
    """A folder on ``sys.path`` (and on ``PYTHONPATH`` for subprocesses) holding plugin distributions with dist-info."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        monkeypatch.syspath_prepend(str(root))
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))

    def add(self, dist: str, source: str, *, entry: str | None = None, version: str = "1.0", group: str = "halo.families", attr: str = "") -> str:
        """Install a one-module distribution declaring one entry point (``group``); returns the module name."""
        module = f"halo_test_plugin_{next(_counter)}_{os.getpid()}"
        (self.root / f"{module}.py").write_text(textwrap.dedent(source))
        info = self.root / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        target = f"{module}:{attr}" if attr else module
        (info / "entry_points.txt").write_text(f"[{group}]\n{entry or dist} = {target}\n")
        reset_caches()  # the process loaded its plugins and methods once; this one was installed since
        return module

    def add_family(self, dist: str, name: str, model_types: tuple[str, ...], *, api_version: int | str = 1, splits=("ep",), extra: str = "") -> str:
        source = PLUGIN_SOURCE.format(name=name, model_types=tuple(model_types), api_version=api_version, splits=set(splits)) + textwrap.dedent(extra)
        return self.add(dist, source, entry=name)


@pytest.fixture
def plugin_site(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    yield PluginSite(site, monkeypatch)
    reset_caches()


def run_halo(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run the real CLI in a fresh interpreter (fresh entry-point scan), capturing output."""
    return subprocess.run(
        [sys.executable, "-m", "halo_cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        timeout=300,
    )


@pytest.fixture(scope="session")
def method_runs(tmp_path_factory):
    """Each method's run file and one-process reference (``launch_kit.MethodRuns``), made once for the whole session:
    the equivalence matrix and the method's own file (stock trainer, precomputed reference) compare against the same run."""
    from launch_kit import MethodRuns

    return MethodRuns(tmp_path_factory)
