"""A damaged checkpoint is named before start (a file missing, short, or a small file's bytes changed) or by the rank
that reads the damaged part; what a checkpoint cannot restore is said in one line. Each case starts from copies of
one real checkpoint of a two-process ep=2 launch."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from trl import SFTConfig

from halo_core.errors import ConfigError
from halo_core.parallel import manifest
from halo_core.trainers.parts.resume import check_resume
from halo_core.trainers.run_config import load_run_config, parse_overrides
from launch_kit import ROOT, launch, write_run

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A run at ep=2 on two processes, checkpoints at steps 1, 2 and 3."""
    folder = tmp_path_factory.mktemp("saved")
    config = write_run(folder, "completion")
    out = launch("sft", config, folder / "run", 2, "--expert_parallel_size=2", "--save_steps=1")
    return config, out


@pytest.fixture
def copy(saved, tmp_path):
    _, out = saved
    target = tmp_path / "checkpoint-3"
    shutil.copytree(out / "checkpoint-3", target)
    return target


def resume(config: Path, folder: Path):
    run = load_run_config("sft", SFTConfig, config, parse_overrides([f"--resume_from_checkpoint={folder}", f"--output_dir={folder.parent}/out"]))
    check_resume(run)
    return run


def test_the_checkpoint_holds_a_manifest_of_every_file(saved):
    _, out = saved
    written = manifest.check(out / "checkpoint-3")
    assert written["step"] == 3 and written["holds"] == ["optimizer", "scheduler", "trainer_state"]
    assert {"model.safetensors", "config.json", "optimizer/exp_avg.safetensors", "optimizer/optimizer.json", "scheduler.pt",
            "rng_state_0.pth", "rng_state_1.pth", "trainer_state.json"} <= set(written["files"])


def test_a_truncated_weights_file_is_refused_before_any_process_starts(saved, copy):
    config, _ = saved
    path = copy / "model.safetensors"
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size - 100)
    command = [sys.executable, "-m", "halo_cli", "launch", "sft", str(config), "--nproc", "2", "--dry-run", "--",
               f"--resume_from_checkpoint={copy}", "--expert_parallel_size=2"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert f"{path} has" in result.stderr and "truncated" in result.stderr
    (copy / manifest.MANIFEST).unlink()  # a checkpoint without a manifest (an older Halo's): its header says how long it is
    with pytest.raises(ConfigError, match=r"model.safetensors has \d+ bytes but its header describes \d+ \(truncated\)"):
        resume(config, copy)


@pytest.mark.parametrize("damage, message", [
    ("optimizer.json", r"optimizer/optimizer.json is damaged: its bytes differ from what was written"),
    ("scheduler", r"scheduler.pt is missing \(the checkpoint's manifest lists it\)"),
    ("rng", r"rng_state_1.pth is missing"),
    ("optimizer", r"optimizer/exp_avg.safetensors is missing"),
], ids=["damaged-optimizer-json", "no-scheduler", "no-rng-of-rank-1", "no-optimizer-state"])
def test_a_damaged_or_incomplete_checkpoint_is_refused_naming_the_file(saved, copy, damage, message):
    """Before, each of these resumed silently (a fresh optimizer, a restarted warm-up, other random draws) or failed in
    every rank with a library error that named no file."""
    config, _ = saved
    if damage == "optimizer.json":
        path = copy / "optimizer" / "optimizer.json"
        text = path.read_text()
        path.write_text(text.replace('"lr": ', '"lr":-', 1) if '"lr": ' in text else text[:-1] + " ")
    elif damage == "scheduler":
        (copy / "scheduler.pt").unlink()
    elif damage == "rng":
        (copy / "rng_state_1.pth").unlink()
    else:
        shutil.rmtree(copy / "optimizer")
    with pytest.raises(ConfigError, match=message):
        resume(config, copy)


def test_a_weights_only_checkpoint_resumes_saying_so(saved, copy, capsys):
    """What ``save_only_model: true`` writes (weights, trainer state, no optimizer, scheduler or RNG state), with the
    manifest its saver writes; and a checkpoint with no manifest at all."""
    config, _ = saved
    written = manifest.read(copy)
    for name in ("scheduler.pt", "rng_state_0.pth", "rng_state_1.pth", manifest.MANIFEST):
        (copy / name).unlink()
    shutil.rmtree(copy / "optimizer")
    records = [[f, k, *part] for f, e in written["files"].items() if f.startswith("model") for k, parts in e.get("tensors", {}).items() for part in parts]
    manifest.write(copy, records, step=3)
    resume(config, copy)
    assert "was saved with save_only_model (no optimizer, scheduler or RNG state): resuming its weights only" in capsys.readouterr().out
    (copy / manifest.MANIFEST).unlink()
    resume(config, copy)
    assert f"{copy} has no {manifest.MANIFEST}" in capsys.readouterr().out


def test_a_damaged_part_is_named_by_the_rank_that_reads_it(saved, copy, tmp_path):
    """Bytes of an expert only rank 1 reads (experts 4-7 at ep=2) changed in place: the sizes all match, so the
    launcher lets it start, and rank 1 names the file and the tensor when it reads them."""
    config, _ = saved
    path = copy / "model.safetensors"
    entry = manifest.header(path)["model.layers.1.mlp.experts.7.down_proj.weight"]
    start = 8 + int.from_bytes(path.read_bytes()[:8], "little") + entry["data_offsets"][0]
    with open(path, "r+b") as handle:
        handle.seek(start)
        handle.write(b"\xff\xff\xff\x7f")
    command = [sys.executable, "-m", "halo_cli", "launch", "sft", str(config), "--nproc", "2", "--",
               f"--resume_from_checkpoint={copy}", "--expert_parallel_size=2", f"--output_dir={tmp_path / 'out'}",
               "--max_steps=4", "--per_device_train_batch_size=2", "--bf16=false", "--report_to=none"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode != 0
    assert f"error: {path}: model.layers.1.mlp.experts.7.down_proj.weight" in result.stderr and "CRC-32" in result.stderr, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out" / "checkpoint-4").exists()


def test_the_manifest_names_a_tensor_no_rank_wrote(tmp_path):
    """A save that left part of a tensor unwritten (it would read as zeros) is not vouched for."""
    import torch
    from safetensors.torch import save_file

    save_file({"a": torch.ones(4, 2)}, tmp_path / "model.safetensors")
    with pytest.raises(manifest.ManifestError, match="a has 8 elements but the ranks wrote 4 of them"):
        manifest.write(tmp_path, [["model.safetensors", "a", [0, 0], [2, 2], 0, 0]])
    assert manifest.read(tmp_path) is None
