"""``resume_from_checkpoint`` is refused before start unless it names a checkpoint; ``true`` means the latest one."""

from pathlib import Path

import pytest
from trl import SFTConfig

from conftest import run_halo
from halo_core.errors import ConfigError
from halo_core.trainers.parts.resume import check_resume
from halo_core.trainers.run_config import load_run_config, parse_overrides

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "templates" / "configs" / "tiny-qwen3-moe.yaml"


def run_with(*overrides):
    return load_run_config("sft", SFTConfig, TINY, parse_overrides(list(overrides)))


def fake_checkpoint(folder, files=("trainer_state.json", "model.safetensors")):
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    for name in files:
        if name.endswith(".safetensors"):
            save_file({}, folder / name)  # a well-formed file (a truncated one is refused: test_checkpoint_integrity.py)
        else:
            (folder / name).write_text("{}")
    return folder


@pytest.mark.parametrize(
    "files, message",
    [
        (None, "does not exist; set resume_from_checkpoint to a checkpoint-N folder"),
        ((), "is not a checkpoint (it has no trainer_state.json and no model.safetensors or model.safetensors.index.json)"),
        (("model.safetensors",), "is not a checkpoint (it has no trainer_state.json);"),
        (("trainer_state.json", "config.json"), "is not a checkpoint (it has no model.safetensors or model.safetensors.index.json);"),
        (("trainer_state.json", "model.safetensors", "optimizer.rank0.pt"), "holds its optimizer state as pickles"),
    ],
    ids=["missing", "empty", "no-state", "no-weights", "pickled-optimizer"],
)
def test_a_folder_that_is_not_a_checkpoint_is_refused(tmp_path, files, message):
    folder = tmp_path / "checkpoint-3"
    if files is not None:
        fake_checkpoint(folder, files)
    with pytest.raises(ConfigError, match="resume_from_checkpoint") as refused:
        check_resume(run_with(f"--resume_from_checkpoint={folder}"))
    assert message in str(refused.value) and str(folder) in str(refused.value)


def test_true_resolves_to_the_latest_checkpoint_in_output_dir(tmp_path):
    for step in (2, 10):
        fake_checkpoint(tmp_path / f"checkpoint-{step}")
    (tmp_path / ".tmp-checkpoints" / "checkpoint-12").mkdir(parents=True)  # half written: not a candidate
    run = run_with("--resume_from_checkpoint=true", f"--output_dir={tmp_path}")
    check_resume(run)
    assert run.trainer["resume_from_checkpoint"] == str(tmp_path / "checkpoint-10")
    assert SFTConfig(**run.trainer, use_cpu=True).resume_from_checkpoint == str(tmp_path / "checkpoint-10")  # what the worker gets


@pytest.mark.parametrize("output_dir", ["empty", "absent"])
def test_true_without_a_checkpoint_is_refused(tmp_path, output_dir):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=rf"resume_from_checkpoint: true resumes from the latest checkpoint-N in output_dir '.*{output_dir}', which has none"):
        check_resume(run_with("--resume_from_checkpoint=true", f"--output_dir={tmp_path / output_dir}"))


def test_false_or_absent_means_a_fresh_start():
    for run in (run_with("--resume_from_checkpoint=false"), run_with()):
        check_resume(run)
        assert "resume_from_checkpoint" not in run.trainer


@pytest.mark.slow  # a fresh `halo` interpreter loading the stack
@pytest.mark.parametrize("dry_run", [["--dry-run"], []], ids=["dry-run", "launch"])
def test_the_cli_refuses_a_bad_resume_before_starting(tmp_path, dry_run):
    out = tmp_path / "out"
    result = run_halo("launch", "sft", str(TINY), "--nproc", "2", *dry_run, "--", f"--output_dir={out}", f"--resume_from_checkpoint={tmp_path / 'nope'}")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "resume_from_checkpoint" in lines[0] and "does not exist" in lines[0], result.stderr
    assert not out.exists()


@pytest.mark.slow  # a fresh `halo` interpreter loading the stack
def test_the_dry_run_shows_the_checkpoint_true_resolved_to(tmp_path):
    fake_checkpoint(tmp_path / "checkpoint-4")
    result = run_halo("launch", "sft", str(TINY), "--nproc", "2", "--dry-run", "--", f"--output_dir={tmp_path}", "--resume_from_checkpoint=true")
    assert result.returncode == 0, result.stderr
    assert f"resume_from_checkpoint: {tmp_path / 'checkpoint-4'}" in " ".join(result.stdout.split())  # YAML may wrap it
