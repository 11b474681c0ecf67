"""What a launch leaves and prints besides training: no temporary folders, no alarms Halo has shown harmless, where the model went."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from halo_cli import launch

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

TINY = Path(__file__).resolve().parents[1] / "templates" / "configs" / "tiny-qwen3-moe.yaml"


def test_a_two_process_launch_cleans_up_stays_quiet_and_names_the_saved_model(tmp_path):
    temp = tmp_path / "tmp"  # the launcher's and torchrun's temporary folders go here (TMPDIR), away from other runs'
    temp.mkdir()
    out = tmp_path / "run"
    command = [sys.executable, "-m", "halo_cli", "launch", "sft", str(TINY), "--nproc", "2", "--",
               f"--output_dir={out}", "--max_steps=2", "--save_strategy=steps", "--save_steps=1"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=600, env={**os.environ, "TMPDIR": str(temp)})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert not list(temp.glob("halo-run-*")) and not list(temp.glob("torchelastic_*")), list(temp.iterdir())
    assert result.stdout.strip().splitlines()[-1] == f"saved the model to {out}"
    assert result.stdout.count("saved the model to") == 1  # rank 0 only, and not for checkpoints
    assert "can cause backward to fail or produce wrong gradients" not in result.stderr
    assert "FutureWarning" not in result.stderr, result.stderr  # the bundled config uses no deprecated key


@pytest.mark.parametrize("ending", ["fails", "interrupted"])
def test_the_run_folder_goes_however_the_workers_end(tmp_path, monkeypatch, ending, capsys):
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
    from torch.distributed.launcher import api

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    seen = []

    def elastic_launch(config, entrypoint):
        def workers(spec):
            seen.append((config.start_method, spec))
            assert list(tmp_path.iterdir())  # torchrun's log folder is there while the workers run
            if ending == "interrupted":
                raise KeyboardInterrupt
            raise ChildFailedError("halo-worker", {0: ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(tmp_path / "none"))})
        return workers

    monkeypatch.setattr(api, "elastic_launch", elastic_launch)
    plan = SimpleNamespace(to_json=lambda: {"method": "sft"}, run=SimpleNamespace(method="sft"))
    if ending == "interrupted":
        with pytest.raises(KeyboardInterrupt):
            launch._torchrun(plan, 2, 1, 0, None)
    else:
        assert launch._torchrun(plan, 2, 1, 0, None) == 1
        assert "halo-worker FAILED" in capsys.readouterr().err
    assert seen == [("fork", {"method": "sft"})]  # no CUDA here: forked from the launcher, which has imported the worker
    # torch's own inductor cache (torchinductor_USER) lands in the temp folder the first time a process asks for it
    # (alone, this test's launcher is that process): it is torch's, not the run's
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith("torchinductor_")] == []


def test_where_cuda_is_in_play_the_workers_come_from_a_fork_server_and_train(tmp_path, monkeypatch):
    """The GPU road, on the CPU: CUDA is faked in the launcher only, so it starts its workers from a fork server
    (a fresh interpreter, which sees no GPU and trains on gloo) instead of forking itself."""
    import json

    import torch

    from halo_core.trainers.method import get_method
    from halo_core.trainers.run_config import load_run_config, parse_overrides
    from halo_core.trainers.run_plan import RunPlan

    out = tmp_path / "run"
    overrides = parse_overrides([f"--output_dir={out}", "--max_steps=2", "--logging_steps=1", "--save_strategy=steps", "--save_steps=2"])
    run = load_run_config("sft", get_method("sft").config_class, TINY, overrides)
    started = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr("multiprocessing.set_forkserver_preload", lambda modules: started.append(modules))
    monkeypatch.chdir(tmp_path)
    assert launch._torchrun(RunPlan(run, 2), 2, 1, 0, None) == 0
    assert started == [["halo_core.trainers.worker", "halo_core.methods.sft"]]
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert [entry["step"] for entry in state["log_history"] if "loss" in entry] == [1, 2]
    assert (out / "model.safetensors").is_file()
