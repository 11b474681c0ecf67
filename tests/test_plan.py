"""``halo plan``: the model's config found without a download (a recipe's copy beside the YAML), the JSON fields, the
refusal when no config is anywhere, ``--suggest``, and the activation estimate's terms. Its tensor bytes are held to
the launched layouts' real tensors in ``test_launch_layouts.py`` (every launch there writes them)."""

import json
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from halo_cli.main import _typer_app
from launch_kit import TINY, uneven_rows


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    """A recipe as ``templates/recipes/<model>/sft.yaml`` lays one out: a hub id nobody has downloaded, the model's
    ``config.json`` beside it."""
    folder = tmp_path_factory.mktemp("recipe")
    shutil.copy(TINY / "config.json", folder / "config.json")
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in uneven_rows("completion", 8)))
    (folder / "sft.yaml").write_text("model_name_or_path: halo-tests/not-downloaded-moe\ndataset:\n  - path: rows.jsonl\n"
                                     "max_length: 256\nper_device_train_batch_size: 2\nexpert_parallel_size: 2\n")
    return folder / "sft.yaml"


def plan(*args):
    result = CliRunner().invoke(_typer_app, ["plan", *map(str, args)])
    assert result.exit_code == 0, result.output
    return result.output


def test_json_from_the_config_beside_the_yaml(recipe):
    got = json.loads(plan(recipe, "--nproc", "2", "--json"))
    assert "beside the YAML" in got["config_source"]
    assert got["family"] == "qwen3-moe" and got["layout"]["ep"] == 2 and got["layout"]["dp"] == 2
    for key in ("parameters", "gradients", "optimizer", "activations", "total"):
        assert isinstance(got["per_gpu"][key], int) and got["per_gpu"][key] > 0, key
    per = got["per_gpu"]
    static = lambda p: sum(v for k, v in p.items() if k not in ("total", "gradients", "activations"))  # noqa: E731
    assert per["total"] == static(per) + max(per["gradients"], per["activations"])  # freed gradients, then activations
    accumulating = json.loads(plan(recipe, "--nproc", "2", "--json", "--", "--gradient_accumulation_steps=2"))["per_gpu"]
    assert accumulating["total"] == static(accumulating) + accumulating["gradients"] + accumulating["activations"]
    assert got["fits"] is True and got["checkpoint_bytes"] > got["model_bytes"] > got["per_gpu"]["parameters"]
    tight = json.loads(plan(recipe, "--nproc", "2", "--json", "--gpu-memory", "0.0001"))
    assert tight["fits"] is False


def test_text_names_the_source_and_the_verdict(recipe):
    out = plan(recipe, "--nproc", "2", "--gpu-memory", "16")
    assert "beside the YAML" in out and "fits in 16.00 GiB per GPU (--gpu-memory)" in out


@pytest.mark.slow  # a fresh `halo` interpreter loading the stack
def test_no_config_anywhere_is_one_line_exit_2(recipe, tmp_path):
    lone = tmp_path / "sft.yaml"
    lone.write_text(recipe.read_text())
    shutil.copy(recipe.parent / "rows.jsonl", tmp_path / "rows.jsonl")
    result = subprocess.run([sys.executable, "-m", "halo_cli", "plan", str(lone), "--nproc", "2"], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "model_name_or_path 'halo-tests/not-downloaded-moe'" in result.stderr
    assert "config.json beside the YAML" in result.stderr


def test_suggest_lists_fitting_layouts_best_first(recipe):
    got = json.loads(plan(recipe, "--nproc", "2", "--json", "--suggest", "--gpu-memory", "1"))
    found = got["suggestions"]
    assert found and all(s["total"] + s["save_extra_bytes"] <= 2**30 and s["reason"] for s in found)
    first = found[0]["layout"]
    assert not first["gradient_checkpointing"] and not first["shard_parameters"]  # the fastest that fits comes first
    assert {(s["layout"]["ep"], s["layout"]["tp"], s["layout"]["cp"]) for s in found} >= {(1, 1, 1), (2, 1, 1)}


def test_activation_terms():
    """cp divides the tokens; tp and etp the split widths; checkpointing keeps layer inputs; a budget its share."""
    from transformers import AutoConfig

    from halo_core.memory_plan import activations

    config = AutoConfig.from_pretrained(TINY)
    whole = activations(config, 512, 2)
    assert activations(config, 256, 2) * 2 == pytest.approx(whole, rel=1e-6)
    assert activations(config, 512, 2, tp=2) < whole and activations(config, 512, 2, etp=2) < whole
    assert activations(config, 512, 2, checkpointing=True) < activations(config, 512, 2, budget=0.9) < whole
