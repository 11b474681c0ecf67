"""What a user does with the wheels: install halo-core and one family from them, train the embedded default, load it.

The new environment holds no editable install and no source tree: its halo is the wheels' alone, so a package
the wheel leaves out fails here as it would for the user. torch, transformers, TRL and the rest cannot be
downloaded in CI; this environment's copies are exposed to the new one through a folder of links that skips
everything halo.
"""

import json
import os
import subprocess
import sys
import sysconfig
from fnmatch import fnmatch
from pathlib import Path

import pytest

from halo_cli.wheels import build_wheels

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

HALO_ENTRIES = ("halo_*", "halo-*", "__editable__*", "*.pth", "*.egg-link")


def run(*command, cwd: Path):
    # No PYTHONPATH (the tests put the source tree on it) and a cwd outside the repository: only the wheels' halo.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=600, cwd=cwd, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def environment_without_halo(tmp_path: Path) -> Path:
    env = tmp_path / "env"
    run(sys.executable, "-m", "venv", "--without-pip", env, cwd=tmp_path)
    third_party = tmp_path / "third-party"
    third_party.mkdir()
    for site in {Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib")}:
        for entry in site.iterdir():
            if not any(fnmatch(entry.name, pattern) for pattern in HALO_ENTRIES) and not (third_party / entry.name).exists():
                (third_party / entry.name).symlink_to(entry)
    site_packages(env).joinpath("third_party.pth").write_text(f"{third_party}\n")
    return env


def site_packages(env: Path) -> Path:
    return next(env.glob("lib/python*/site-packages"))


def test_wheels_install_alone_train_the_embedded_default_and_uninstall(tmp_path):
    """Wheels of halo-core and one family install beside the CPU torch already there (nothing else), find the family,
    train the embedded default and uninstall."""
    dist = tmp_path / "dist"
    built = build_wheels(dist, only=["halo-core", "halo-plugin-qwen3-moe"])
    assert sorted(w.name.split("-")[0] for w in built) == ["halo_core", "halo_plugin_qwen3_moe"]
    env = environment_without_halo(tmp_path)
    halo = env / "bin" / "halo"
    pip = [sys.executable, "-m", "pip", "--python", env / "bin" / "python"]
    install = [*pip, "install", "-q", "--no-index", "--no-deps", "--find-links", dist]

    # The README's install from wheels: with torch's CPU build already there, pip installs halo-core and a family and
    # nothing else (no torch of PyPI's, no CUDA packages); --no-index makes any other need an error.
    report = tmp_path / "report.json"
    run(*pip, "install", "--dry-run", "-q", "--no-index", "--report", report, "--find-links", dist, "halo-core", "halo-plugin-qwen3-moe", cwd=tmp_path)
    planned = sorted(item["metadata"]["name"] for item in json.loads(report.read_text())["install"])
    assert planned == ["halo-core", "halo-plugin-qwen3-moe"], planned

    run(*install, "halo-core", cwd=tmp_path)
    assert json.loads(run(halo, "families", "list", "--json", cwd=tmp_path)) == []
    run(*install, "halo-plugin-qwen3-moe", cwd=tmp_path)
    rows = json.loads(run(halo, "families", "list", "--json", cwd=tmp_path))
    assert [(r["name"], r["model_types"], r["status"]) for r in rows] == [("qwen3-moe", ["qwen3_moe"], "ok")]

    located = run(env / "bin" / "python", "-c", "import halo_core, halo_cli.templates as t; print(halo_core.__file__); print(t.__file__)", cwd=tmp_path)
    core, templates = map(Path, located.split())
    assert core.is_relative_to(site_packages(env)) and templates.is_relative_to(site_packages(env)), located

    config = templates.parent / "configs" / "tiny-qwen3-moe.yaml"
    out = tmp_path / "run"
    overrides = [f"--output_dir={out}", "--max_steps=2", "--save_strategy=no", "--expert_parallel_size=1", "--logging_steps=1"]
    log = run(halo, "launch", "sft", config, "--", *overrides, cwd=tmp_path)
    assert "'loss'" in log and log.strip().splitlines()[-1] == f"saved the model to {out}", log

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.model_type == "qwen3_moe"
    assert AutoTokenizer.from_pretrained(out)("1+1=")["input_ids"]

    run(*pip, "uninstall", "-y", "-q", "halo-plugin-qwen3-moe", cwd=tmp_path)
    assert json.loads(run(halo, "families", "list", "--json", cwd=tmp_path)) == []

