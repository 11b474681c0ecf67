"""``output_dir`` must be writable and have room for one checkpoint, checked before any process starts."""

import re
import shutil
import subprocess
from collections import namedtuple
from pathlib import Path

import pytest
from trl import SFTConfig

from conftest import run_halo
from halo_core.errors import ConfigError
from halo_core.trainers.parts.output_room import SMALL_FILES, check_output_dir, checkpoint_bytes
from halo_core.trainers.run_config import load_run_config, parse_overrides

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "templates" / "configs" / "tiny-qwen3-moe.yaml"
MODEL = ROOT / "templates" / "tiny" / "model"
Usage = namedtuple("Usage", "total used free")


def run_with(*overrides):
    return load_run_config("sft", SFTConfig, TINY, parse_overrides(list(overrides)))


@pytest.fixture(scope="module")
def parameters():
    """The tiny model's parameters, counted on a real (not meta) build."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(MODEL))
    return sum(p.numel() for p in model.parameters())


def other_files():
    return sum(p.stat().st_size for p in MODEL.iterdir())  # config, tokenizer, chat template: no weights in it


@pytest.mark.parametrize(
    "overrides, bytes_per_parameter",
    [
        ([], 4 + 4 + 4),  # float32 weights, AdamW's exp_avg and exp_avg_sq in float32
        (["--bf16=true"], 2 + 2 + 2),  # AdamWBF16: bf16 weights and moments
        (["--bf16=true", "--adamw_bf16_kahan=true"], 2 + 3 * 2),  # and its compensation buffer
        (["--optim=sgd"], 4),  # no momentum: no state
        (["--optim=sgd", "--optim_args=momentum=0.9"], 4 + 4),
        (["--save_only_model=true"], 4),
        (["--save_strategy=no"], 4),  # the final save into output_dir: the model alone
        (["--use_peft=true"], 4),  # a random-init LoRA run writes its whole base; adapters not counted
    ],
    ids=["adamw", "adamw-bf16", "kahan", "sgd", "sgd-momentum", "save-only-model", "no-checkpoints", "lora-random-base"],
)
def test_the_checkpoint_size_is_the_weights_and_the_optimizer_state_the_run_keeps(parameters, overrides, bytes_per_parameter):
    needed, parts = checkpoint_bytes(run_with(*overrides))
    assert needed == parameters * bytes_per_parameter + other_files() + SMALL_FILES, parts


def test_a_full_filesystem_is_refused_with_the_free_and_the_needed_bytes(tmp_path, monkeypatch):
    needed, _ = checkpoint_bytes(run_with())
    out = tmp_path / "not" / "yet" / "there"
    free = {"bytes": needed - 1}
    seen = []

    def disk_usage(path):
        seen.append(Path(path))
        return Usage(10 * needed, 0, free["bytes"])

    monkeypatch.setattr(shutil, "disk_usage", disk_usage)
    with pytest.raises(ConfigError) as refused:
        check_output_dir(run_with(f"--output_dir={out}"))
    message = str(refused.value)
    assert f"output_dir '{out}'" in message and f"has {needed - 1} bytes free" in message and f"needs about {needed} bytes" in message, message
    assert "\n" not in message and seen == [tmp_path]  # the nearest folder that exists: where the run will create it
    free["bytes"] = needed
    check_output_dir(run_with(f"--output_dir={out}"))  # just enough
    assert not out.exists()


def test_a_model_that_cannot_be_counted_skips_the_size_check(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(1, 1, 0))
    run = run_with(f"--output_dir={tmp_path}", "--model_name_or_path=some-org/some-model", "--random_init=false")
    assert checkpoint_bytes(run) is None
    check_output_dir(run)


def test_an_output_dir_under_a_file_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match=re.escape(f"output_dir '{tmp_path}/notes.txt/run' cannot be created: {tmp_path}/notes.txt is a file")):
        check_output_dir(run_with(f"--output_dir={tmp_path / 'notes.txt' / 'run'}"))


def mounted(folder: Path, options: str):
    """A tmpfs at ``folder`` (root with CAP_SYS_ADMIN); skips the test where mounting is refused."""
    folder.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True, text=True)
    if done.returncode != 0:
        folder.rmdir()
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}): needs root with CAP_SYS_ADMIN")
    return folder


@pytest.fixture
def small_filesystem(tmp_path):
    folder = mounted(tmp_path / "small", "size=64k")
    yield folder
    subprocess.run(["umount", str(folder)], check=True)


@pytest.fixture
def read_only_filesystem(tmp_path):
    folder = mounted(tmp_path / "ro", "ro,size=64k")
    yield folder
    subprocess.run(["umount", str(folder)], check=True)


def test_a_read_only_mount_is_refused_even_for_root(read_only_filesystem):
    with pytest.raises(ConfigError, match=re.escape(f"output_dir '{read_only_filesystem}/run' is not writable ({read_only_filesystem}: read-only filesystem)")):
        check_output_dir(run_with(f"--output_dir={read_only_filesystem / 'run'}"))


@pytest.mark.slow  # a fresh `halo` interpreter loading the stack
def test_the_launcher_refuses_a_full_filesystem_before_start(small_filesystem, tmp_path):
    out = small_filesystem / "run"
    result = run_halo("launch", "sft", str(TINY), "--nproc", "2", "--dry-run", "--", f"--output_dir={out}", cwd=tmp_path)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stdout[-2000:] + result.stderr
    free = shutil.disk_usage(small_filesystem).free
    assert re.search(rf"output_dir '{out}': its filesystem \({small_filesystem}\) has {free} bytes free .* needs about \d+ bytes", lines[0]), lines[0]
    assert not out.exists()


def test_the_launcher_refuses_an_output_dir_it_cannot_create_before_start(tmp_path, monkeypatch, capsys):
    """The CLI in this process (a second interpreter would add 15 s), with starting the workers made to fail."""
    from halo_cli import launch, main

    monkeypatch.setattr(launch, "_torchrun", lambda *args: pytest.fail("the workers were started"))
    (tmp_path / "notes.txt").write_text("x")
    out = tmp_path / "notes.txt" / "run"
    monkeypatch.setattr("sys.argv", ["halo", "launch", "sft", str(TINY), "--nproc", "2", "--", f"--output_dir={out}"])
    with pytest.raises(SystemExit) as ended:
        main.app()
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert ended.value.code == 2 and len(lines) == 1 and "is a file, not a folder" in lines[0], lines
