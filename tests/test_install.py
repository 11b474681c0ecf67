"""install.sh's editable step prints nothing when it succeeds, so a warning that matters stands out."""

import os
import subprocess
from pathlib import Path

import pytest

from test_wheels import environment_without_halo

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

ROOT = Path(__file__).resolve().parents[1]


def test_the_editable_install_of_install_sh_prints_nothing(tmp_path):
    """One plugin installed by install.sh's own ``editable`` function (the script sourced: its functions only) into
    a new environment: no output at all, where the same pip command without the function prints setuptools' box."""
    env = environment_without_halo(tmp_path)
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    environ["HALO_VENV_PYTHON"] = str(env / "bin" / "python")

    def install(command: str) -> subprocess.CompletedProcess:
        script = f'source "$0" && {command} --no-deps -e "$1"'
        return subprocess.run(["bash", "-c", script, ROOT / "install.sh", ROOT / "plugins" / "halo-plugin-qwen3-moe"],
                              capture_output=True, text=True, timeout=300, cwd=tmp_path, env=environ)

    plain = install("pip install -q --no-build-isolation")
    assert plain.returncode == 0 and "Editable installation" in plain.stderr, plain.stderr  # setuptools still boxes it
    quiet = install("editable")
    assert quiet.returncode == 0 and (quiet.stdout, quiet.stderr) == ("", "")
