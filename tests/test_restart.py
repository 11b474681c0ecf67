"""Interrupt and restart (issue 43, item 8): Ctrl-C ends with the last checkpoint and the command that resumes it; a
fresh start into a run folder that holds checkpoints or a model is refused unless resumed or ``overwrite_output_dir``;
a resume says which checkpoint it picked. Ctrl-C is SIGINT to the launch's process group, as a terminal sends it."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trl import SFTConfig
from typer.testing import CliRunner

from conftest import run_halo
from halo_cli.main import _typer_app
from halo_core.errors import ConfigError
from halo_core.trainers.parts import restart
from halo_core.trainers.run_config import load_run_config, parse_overrides

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

TINY = Path(__file__).resolve().parents[1] / "templates" / "configs" / "tiny-qwen3-moe.yaml"
#: The embedded default opts in to overwriting (so the README's commands run twice); a run of one's own does not.
MINE = ["--overwrite_output_dir=false", "--max_steps=1000", "--per_device_train_batch_size=4", "--save_strategy=steps", "--save_steps=2"]


def interrupted(tmp_path: Path, nproc: int, *extra: str):
    """A real launch, SIGINT to its process group once its first checkpoint is complete; its output and folder."""
    out = tmp_path / "run"
    launcher = ["sft", str(TINY), "--nproc", str(nproc)]
    command = [sys.executable, "-m", "halo_cli", "launch", *launcher, "--", f"--output_dir={out}", *MINE, *extra]
    with open(tmp_path / "stdout", "w") as stdout, open(tmp_path / "stderr", "w") as stderr:  # files: a full pipe would stall it
        launch = subprocess.Popen(command, stdout=stdout, stderr=stderr, cwd=tmp_path, start_new_session=True)
        deadline = time.monotonic() + 300
        while not (out / "checkpoint-2").is_dir() and launch.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if launch.poll() is None:
            os.killpg(launch.pid, signal.SIGINT)
        try:
            code = launch.wait(timeout=120)
        finally:
            try:
                os.killpg(launch.pid, 0)
                left = True  # a process of the launch's group is still there
                os.killpg(launch.pid, signal.SIGKILL)
            except ProcessLookupError:
                left = False
    return code, (tmp_path / "stderr").read_text(), out, left


@pytest.fixture(scope="module")
def interrupted_two(tmp_path_factory):
    return interrupted(tmp_path_factory.mktemp("interrupted"), 2)


def check_the_ending(code: int, stderr: str, out: Path, left: bool, nproc: int, *extra: str) -> str:
    assert code == 130, stderr[-3000:]
    assert "Traceback" not in stderr and not left, stderr[-3000:]
    latest = max(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    resume = ["halo", "launch", "sft", str(TINY), "--nproc", str(nproc), "--", f"--output_dir={out}", *MINE, *extra,
              f"--resume_from_checkpoint={latest}"]
    assert stderr.strip().splitlines()[-1] == f"interrupted (SIGINT); the last complete checkpoint is {latest}; resume with: {shlex.join(resume)}"
    return stderr.strip().splitlines()[-1]


def test_ctrl_c_ends_with_the_checkpoint_and_the_command_that_resumes_it(interrupted_two):
    check_the_ending(*interrupted_two, 2)


def test_ctrl_c_on_one_process_ends_the_same_way(tmp_path):
    """One process trains in the launcher itself."""
    check_the_ending(*interrupted(tmp_path, 1, "--expert_parallel_size=1"), 1, "--expert_parallel_size=1")


def test_a_fresh_start_into_the_interrupted_run_is_refused_and_its_resume_command_works(interrupted_two, tmp_path):
    _, stderr, out, _ = interrupted_two
    refused = run_halo("launch", "sft", str(TINY), "--nproc", "2", "--dry-run", "--", f"--output_dir={out}", *MINE, cwd=tmp_path)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr
    latest = max(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert f"output_dir '{out}' holds checkpoints (the latest: {latest}), which a fresh start would overwrite" in lines[0]
    assert "resume_from_checkpoint: true" in lines[0] and "overwrite_output_dir: true" in lines[0]
    command = shlex.split(stderr.strip().splitlines()[-1].split("resume with: ")[1])
    assert command[:2] == ["halo", "launch"]
    split = command.index("--")  # the command as printed, dry-run (in this process: a second start costs 7 s)
    resumed = CliRunner().invoke(_typer_app, [*command[1:split], "--dry-run", *command[split:]])
    assert resumed.exit_code == 0, resumed.output[-3000:]
    assert resumed.stdout.splitlines()[0] == f"resuming from {latest}"


def run_with(tmp_path, *overrides):
    return load_run_config("sft", SFTConfig, TINY, parse_overrides([f"--output_dir={tmp_path / 'out'}", *overrides]))


@pytest.mark.parametrize("holds", ["checkpoint-3", "config.json", "adapter_config.json"])
def test_an_output_dir_holding_checkpoints_or_a_model_is_refused_unless_opted_in_or_resumed(tmp_path, holds):
    out = tmp_path / "out"
    out.mkdir()
    if holds.startswith("checkpoint"):
        (out / holds).mkdir()
    else:
        (out / holds).write_text("{}")
    with pytest.raises(ConfigError, match=r"output_dir '.*out' holds (checkpoints|a saved model)") as refused:
        restart.check_output_dir(run_with(tmp_path, "--overwrite_output_dir=false"))
    assert "overwrite_output_dir: true" in str(refused.value)
    restart.check_output_dir(run_with(tmp_path, "--overwrite_output_dir=true"))
    restart.check_output_dir(run_with(tmp_path, "--overwrite_output_dir=false", f"--resume_from_checkpoint={out}"))


def test_an_output_dir_with_other_files_or_none_at_all_is_a_fresh_start(tmp_path):
    restart.check_output_dir(run_with(tmp_path, "--overwrite_output_dir=false"))  # absent
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    (tmp_path / "out" / ".tmp-checkpoints" / "checkpoint-4").mkdir(parents=True)  # half written by an interrupted save
    restart.check_output_dir(run_with(tmp_path, "--overwrite_output_dir=false"))


def test_the_resume_command_keeps_the_users_overrides_but_an_earlier_resume(tmp_path):
    (tmp_path / "out" / "checkpoint-6").mkdir(parents=True)
    run = run_with(tmp_path)
    overrides = ["--max_steps", "9", "--resume_from_checkpoint", "x", "--resume-from-checkpoint=y", "--seed=1"]
    line = restart.interrupted_line(run, ["sft", "my run.yaml", "--nproc", "2"], overrides)
    assert line.endswith(f"resume with: halo launch sft 'my run.yaml' --nproc 2 -- --max_steps 9 --seed=1 "
                         f"--resume_from_checkpoint={tmp_path / 'out' / 'checkpoint-6'}")
    empty = run_with(tmp_path, f"--output_dir={tmp_path / 'empty'}")
    assert "before any checkpoint was complete" in restart.interrupted_line(empty, ["sft", "r.yaml"], [])
