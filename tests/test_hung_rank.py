"""A frozen rank (SIGSTOP) ends the run within ``ddp_timeout``, with one line naming the step, and leaves nothing running."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil  # accelerate's dependency
import pytest

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

TINY = Path(__file__).resolve().parents[1] / "templates" / "configs" / "tiny-qwen3-moe.yaml"
TIMEOUT_S = 5
#: How long the launch may take once a rank froze: ddp_timeout, torch's 30 s between SIGTERM and SIGKILL for a worker
#: that has not gone (a stopped one acts on nothing else), and a wide margin for a loaded machine.
ENDS_WITHIN_S = TIMEOUT_S + 90


def _workers(launcher: psutil.Process, count: int, deadline: float) -> list[psutil.Process]:
    while time.monotonic() < deadline:
        children = launcher.children()
        if len(children) == count:
            return children
        time.sleep(0.2)
    raise AssertionError(f"the launcher did not start {count} workers")


def test_a_frozen_rank_ends_the_run_with_one_line_naming_the_step(tmp_path):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "halo_cli", "launch", "sft", str(TINY), "--nproc", "2", "--", f"--output_dir={out}",
               "--max_steps=100000", "--logging_steps=1", "--save_strategy=no", f"--ddp_timeout={TIMEOUT_S}", "--disable_tqdm=true"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
    workers: list[psutil.Process] = []
    try:
        logged = 0
        for line in launcher.stdout:  # rank 0 prints a log line per step
            logged += "'loss'" in line
            if logged:
                break
        assert logged, "the run ended before its first step: " + launcher.stderr.read()[-3000:]
        workers = _workers(psutil.Process(launcher.pid), 2, time.monotonic() + 30)
        frozen = workers[-1]
        frozen.send_signal(signal.SIGSTOP)
        rest, errors = launcher.communicate(timeout=ENDS_WITHIN_S)  # torch's default would hang 1800 s
    finally:
        for process in [*workers, psutil.Process(launcher.pid)] if launcher.poll() is None else workers:
            try:
                process.kill()  # only what this test started, should the run still be going
            except psutil.NoSuchProcess:
                pass
    logged += rest.count("'loss'")
    assert launcher.returncode != 0, errors[-3000:]
    lines = [line for line in errors.splitlines() if "ddp_timeout" in line]
    assert len(lines) == 1 and "Traceback" not in errors and "halo-worker FAILED" not in errors, errors[-3000:]
    step = re.search(rf"rank \d: a collective did not complete within ddp_timeout={TIMEOUT_S} s at global step (\d+) ", lines[0])
    assert step, lines[0]
    assert logged <= int(step[1]) <= logged + 1, (logged, lines[0])  # the step the healthy rank was in (or logging)
    time.sleep(1)
    left = [w.pid for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"workers still running after the launch ended: {left}"
