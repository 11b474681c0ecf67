"""One family installed on its own from wheels by name (`--find-links`), listed, then uninstalled."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from halo_cli.wheels import build_wheels

# What `halo families list` imports besides halo itself: pure-Python packages, exposed to the new environment
# from this one. torch & co. are absent on purpose, hence --no-deps below: listing families needs none of them.
LISTING_DEPENDENCIES = ("pluggy", "typer", "rich", "markdown_it", "mdurl", "pygments", "shellingham", "yaml", "typing_extensions", "click", "annotated_doc",
                        "pydantic", "pydantic_core", "annotated_types", "typing_inspection")


def run(*command):
    result = subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def core_only_environment(tmp_path: Path) -> Path:
    env = tmp_path / "env"
    run(sys.executable, "-m", "venv", "--without-pip", env)
    deps = tmp_path / "deps"
    deps.mkdir()
    for name in LISTING_DEPENDENCIES:
        spec = importlib.util.find_spec(name)
        if spec is None:
            continue
        origin = Path(spec.origin)
        target = origin.parent if origin.name == "__init__.py" else origin
        (deps / target.name).symlink_to(target)
    next(env.glob("lib/python*/site-packages")).joinpath("listing_deps.pth").write_text(str(deps) + "\n")
    return env


def test_a_family_installs_from_wheels_alone_and_uninstalls(tmp_path):
    dist = tmp_path / "dist"
    built = build_wheels(dist, only=["halo-core", "halo-plugin-laguna"])
    assert sorted(w.name.split("-")[0] for w in built) == ["halo_core", "halo_plugin_laguna"]
    env = core_only_environment(tmp_path)
    pip = [sys.executable, "-m", "pip", "--python", env / "bin" / "python"]

    run(*pip, "install", "-q", "--no-index", "--no-deps", "--find-links", dist, "halo-core")
    assert json.loads(run(env / "bin" / "halo", "families", "list", "--json")) == []

    run(*pip, "install", "-q", "--no-index", "--no-deps", "--find-links", dist, "halo-plugin-laguna")
    rows = json.loads(run(env / "bin" / "halo", "families", "list", "--json"))
    assert [(r["name"], r["model_types"], r["status"]) for r in rows] == [("laguna", ["laguna"], "ok")]

    run(*pip, "uninstall", "-y", "-q", "halo-plugin-laguna")
    assert json.loads(run(env / "bin" / "halo", "families", "list", "--json")) == []
