"""`halo launch sft` on image data (TRL's `images` column and conversational `messages`): a tiny Qwen3-VL-MoE with
its text experts split over two processes (ep=2) and its vision tower under FSDP2 trains as one process does, and
leaves the composite checkpoint with its processor; image data a run cannot train is refused before any process starts.

The launches are real (`halo launch`, gloo, float32, SGD): rows of uneven text lengths, each with one of the
bundled pictures at four sizes (1, 2, 2 or 4 image tokens), so every batch is padded and the ranks' pixel tensors
differ in size.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from halo_core.errors import ConfigError
from halo_core.testing.compare import assert_close
from launch_kit import OPTIMIZERS, ROOT, STEPS, launch, logged, weights

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

VL_MODEL = ROOT / "templates" / "tiny" / "vl-model"
IMAGES = ROOT / "templates" / "tiny" / "data" / "images"
CONFIG = ROOT / "templates" / "configs" / "tiny-qwen3-vl-moe-sft.yaml"
COMPOSITE = "Qwen3VLMoeForConditionalGeneration"


def image_rows(count: int = 24, seed: int = 13) -> list[dict]:
    """Questions of 1 to 24 numbers about one bundled picture each, answered with a few numbers and its colour."""
    draw = random.Random(seed)
    names = sorted(p.name for p in IMAGES.glob("*.png"))
    rows = []
    for _ in range(count):
        name = draw.choice(names)
        numbers = " ".join(str(draw.randrange(100)) for _ in range(draw.choice([1, 3, 8, 24])))
        rows.append({"images": [f"images/{name}"], "messages": [
            {"role": "user", "content": f"After {numbers}, what colour is this?"},
            {"role": "assistant", "content": f"{numbers} then {name.split('-')[0]}."}]})
    return rows


def write_vlm_run(folder: Path, rows: list[dict] | None = None, model: Path = VL_MODEL) -> Path:
    """A run over the tiny vision-language model (random init) and ``rows``, the pictures copied beside them."""
    shutil.copytree(IMAGES, folder / "images", dirs_exist_ok=True)
    (folder / "images.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (rows or image_rows())))
    config = folder / "run.yaml"
    config.write_text(f"model_name_or_path: {model}\nrandom_init: true\ndataset:\n  - path: images.jsonl\n")
    return config


@pytest.fixture(scope="module")
def run_file(tmp_path_factory):
    return write_vlm_run(tmp_path_factory.mktemp("images"))


@pytest.fixture(scope="module")
def single(run_file):
    """One process; a checkpoint after every step, so the vision tower's moves can be seen."""
    return launch("sft", run_file, run_file.parent / "single", 1, *OPTIMIZERS["sgd"], "--save_steps=1")


def test_the_data_pads_every_batch_and_its_images_differ_in_size(run_file):
    """Guard on the fixture: TRL's vision collator over these rows pads, and the image grids differ."""
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    from halo_core.trainers.arguments import DatasetSource
    from halo_core.trainers.parts.data import load_source
    from halo_core.trainers.parts.processor import load_processor

    rows = list(load_source(DatasetSource(str(run_file.parent / "images.jsonl"))))
    batch = DataCollatorForVisionLanguageModeling(load_processor(str(VL_MODEL)))(rows[:8])
    assert {"pixel_values", "image_grid_thw", "mm_token_type_ids"} <= set(batch)
    assert (batch["attention_mask"].sum(-1) < batch["input_ids"].shape[1]).sum() >= 4
    assert len({tuple(g) for g in batch["image_grid_thw"].tolist()}) >= 3


def test_expert_parallel_run_on_images_matches_one_process(single, run_file):
    """ep=2 at --nproc 2 (each rank its half of the experts, the vision tower sharded by FSDP2, each rank its own
    images) against one process on the same global batch: losses within 1e-5, every weight after three SGD
    steps, vision tower included, and the checkpoint loads as the composite with its processor."""
    out = launch("sft", run_file, run_file.parent / "ep2", 2, *OPTIMIZERS["sgd"], "--expert_parallel_size=2")
    expected = logged(single, "loss")
    assert len(expected) == STEPS and logged(out, "loss") == pytest.approx(expected, abs=1e-5, rel=0)
    assert logged(out, "num_tokens") == logged(single, "num_tokens")
    reference, trained = weights(single, COMPOSITE), weights(out, COMPOSITE)
    vision = [n for n in reference if n.startswith("model.visual.")]
    assert vision and set(trained) == set(reference)
    for name, tensor in trained.items():
        assert_close(tensor, reference[name], f"{name} after {STEPS} SGD steps at ep=2 on images")
    # The images reached the loss: the steps moved the vision tower (from step 1's weights to the last step's).
    first = weights(single / "checkpoint-1", COMPOSITE)
    still = [n for n in vision if torch.equal(first[n], reference[n])]
    assert not still, f"the steps left vision parameters {still[:4]} where they were"

    from transformers import Qwen3VLMoeForConditionalGeneration

    from halo_core.trainers.parts.processor import load_processor

    model = Qwen3VLMoeForConditionalGeneration.from_pretrained(out)
    assert type(model).__name__ == COMPOSITE and model.config.model_type == "qwen3_vl_moe"
    processor = load_processor(str(out))
    assert type(processor).__name__ == "Qwen3VLProcessor" and processor.tokenizer.pad_token == "<pad>"
    stored = json.loads((out / "processor_config.json").read_text())
    assert stored["processor_class"] == "Qwen3VLProcessor" and stored["video_processor"]["video_processor_type"] == "Qwen3VLVideoProcessor"


def test_cli_dry_run_refuses_images_for_a_text_only_model_in_one_line(tmp_path):
    config = write_vlm_run(tmp_path, model=ROOT / "templates" / "tiny" / "model")
    command = [sys.executable, "-m", "halo_cli", "launch", "sft", str(config), "--nproc", "2", "--dry-run", "--", f"--output_dir={tmp_path / 'out'}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert "has images (column 'images')" in result.stderr and "is a text-only model (qwen3_moe" in result.stderr
    assert "train image rows on a vision-language model" in result.stderr
    assert not (tmp_path / "out").exists()


def _check(config: Path, overrides: list[str] = (), method: str = "sft", world: int = 2) -> None:
    from halo_core.trainers.method import get_method
    from halo_core.trainers.run_checks import check_run
    from halo_core.trainers.run_config import load_run_config, parse_overrides

    check_run(load_run_config(method, get_method(method).config_class, config, parse_overrides(list(overrides))), world)


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["--packing=true"], "packing: true is not supported for image rows"),
        (["--padding_free=true"], "padding_free: true is not supported for image rows"),
        (["--context_parallel_size=2"], "context_parallel_size=2 splits each sample's tokens"),
        (["--tensor_parallel_size=2"], "tensor_parallel_size=2 splits each sample's tokens"),
        (["--max_length=64", "--truncation_mode=keep_end"], "truncation_mode: keep_end could cut the image tokens"),
        (["--use_peft=true"], "use_peft: true on a vision-language model is not supported by Halo yet"),
    ],
)
def test_settings_that_cannot_train_images_are_refused_with_their_field(overrides, says):
    with pytest.raises(ConfigError) as caught:
        _check(CONFIG, overrides)
    line = str(caught.value)
    assert says in line and "has images (column 'images')" in line and "\n" not in line


def test_rows_a_run_cannot_read_are_refused_with_their_row(tmp_path):
    rows = image_rows(4)
    rows[2]["images"] = ["images/missing.png"]
    with pytest.raises(ConfigError, match=r"row 3: image 'images/missing.png' does not exist \(looked for .*images/missing.png\)"):
        _check(write_vlm_run(tmp_path, rows))
    rows[2]["images"] = []
    with pytest.raises(ConfigError, match="row 3 has no image; at more than one process every row needs one"):
        _check(write_vlm_run(tmp_path, rows))
    _check(write_vlm_run(tmp_path, rows), world=1)  # one process: TRL collates a batch without images


def test_image_data_for_a_method_that_trains_text_only_is_refused(tmp_path):
    config = write_vlm_run(tmp_path, [{**r, "prompt": [], "completion": [], "label": True} for r in image_rows(4)])
    with pytest.raises(ConfigError, match="has images \\(column 'images'\\), and method 'kto' trains on text only in Halo"):
        _check(config, method="kto")


def test_a_model_folder_without_processor_settings_is_refused(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(VL_MODEL / name, folder / name)
    with pytest.raises(ConfigError, match="has no processor settings \\(processor_config.json or preprocessor_config.json\\)"):
        _check(write_vlm_run(tmp_path, model=folder))


def test_stock_auto_processor_needs_torchvision_where_none_imports():
    """What methods/sft.md tells a user: in this CPU setup (no torchvision) stock ``AutoProcessor`` cannot load
    Qwen3-VL's processor, its video part needing torchvision, and Halo's ``load_processor`` loads it; where torchvision
    imports, the stock call does. Fails, so the page gets rewritten, once transformers builds it without torchvision."""
    from transformers import AutoProcessor
    from transformers.utils import is_torchvision_available

    if is_torchvision_available():
        assert type(AutoProcessor.from_pretrained(VL_MODEL)).__name__ == "Qwen3VLProcessor"
        return
    with pytest.raises(ImportError, match="Qwen3VLVideoProcessor requires the Torchvision library"):
        AutoProcessor.from_pretrained(VL_MODEL)


def test_the_processor_loads_as_its_own_class_and_saves_whole(tmp_path):
    """Without torchvision (this project's CPU setup) Qwen3-VL's processor loads without its video part; saved, it
    is the stock class with the video settings it was stored with."""
    from halo_core.trainers.parts.processor import load_processor

    processor = load_processor(str(VL_MODEL))
    assert type(processor).__name__ == "Qwen3VLProcessor"
    processor.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "processor_config.json").read_text()) == json.loads((VL_MODEL / "processor_config.json").read_text())
