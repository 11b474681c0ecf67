"""Run-level refusals (the model source, the method's config, the optimizer's and dataloader's ranges), before any process starts."""

import re
from pathlib import Path

import pytest
from huggingface_hub import constants

from conftest import run_halo
from halo_core.errors import ConfigError, LayoutError
from halo_core.parallel.config import ParallelConfig, ParallelDims
from halo_core.parallel.plan import LayoutPlan
from halo_core.trainers.run_checks import check_model_source, check_run
from halo_core.trainers.run_config import check_layout
from test_run_config import TINY, load

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "templates" / "configs").glob("*.yaml"))


def method_of(config: Path) -> str:
    """A bundled config ends in its method's name: ``tiny-qwen3-moe-dpo.yaml``, ``tiny-offline-grpo.yaml``; SFT's has none."""
    from halo_core.trainers.method import known_methods

    ending = [m for m in known_methods() if config.stem.endswith(f"-{m}")]
    return max(ending, key=len) if ending else "sft"


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_the_bundled_configs_pass(config, tmp_path, monkeypatch):
    """Run, as the README says, from a folder where the SFT default has left ``runs/tiny-qwen3-moe`` (GRPO and SDPG start
    from it): here its model folder stands in for it."""
    from halo_core.trainers.method import get_method
    from halo_core.trainers.run_config import load_run_config, parse_overrides

    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "tiny-qwen3-moe").symlink_to(TINY.parents[1] / "tiny" / "model")
    monkeypatch.chdir(tmp_path)

    method = method_of(config)
    run = load_run_config(method, get_method(method).config_class, config, parse_overrides([]))
    found = re.search(rf"halo launch \S+ templates/configs/{re.escape(config.name)} --nproc (\d+)", config.read_text())
    world = int(found[1]) if found else 2
    check_run(run, world)  # the world its header launches it with (--nproc 2 where none): a method's own checks may read it
    check_layout(run, world)


def test_every_method_has_a_bundled_config():
    from halo_core.trainers.method import known_methods

    assert sorted({method_of(c) for c in CONFIGS}) == known_methods()


@pytest.mark.parametrize(
    "overrides, field, value",
    [
        (["--learning_rate=0"], "learning_rate", 0),
        (["--learning_rate=-1e-3"], "learning_rate", -1e-3),
        (["--per_device_train_batch_size=0"], "per_device_train_batch_size", 0),
        (["--per_device_eval_batch_size=0"], "per_device_eval_batch_size", 0),
        (["--gradient_accumulation_steps=0"], "gradient_accumulation_steps", 0),
        (["--max_steps=0"], "max_steps", 0),
        (["--max_steps=-2"], "max_steps", -2),
        (["--max_steps=-1", "--num_train_epochs=0"], "num_train_epochs", 0),
        (["--logging_steps=-1"], "logging_steps", -1),
        (["--save_steps=0"], "save_steps", 0),
        (["--eval_strategy=steps", "--eval_steps=-5"], "eval_steps", -5),
        (["--weight_decay=-0.1"], "weight_decay", -0.1),
        (["--adam_beta1=1.0"], "adam_beta1", 1.0),
        (["--adam_beta2=-0.1"], "adam_beta2", -0.1),
        (["--adam_epsilon=-1e-8"], "adam_epsilon", -1e-8),
        (["--max_grad_norm=-1"], "max_grad_norm", -1),
        (["--dataloader_num_workers=-1"], "dataloader_num_workers", -1),
        (["--seed=-1"], "seed", -1),
        ([f"--seed={2**32}"], "seed", 2**32),
        (["--data_seed=-3"], "data_seed", -3),
        (["--max_length=0"], "max_length", 0),
        (["--dataset_num_proc=0"], "dataset_num_proc", 0),
        (["--ddp_timeout=0"], "ddp_timeout", 0),
    ],
)
def test_numbers_the_optimizer_or_dataloader_would_refuse(overrides, field, value):
    with pytest.raises(ConfigError, match=re.escape(f"{field}={value!r} must be ")) as caught:
        check_run(load(overrides))
    assert f"-- --{field}=VALUE" in str(caught.value)


def test_the_edges_of_the_ranges_are_accepted():
    check_run(load(["--max_steps=-1", "--num_train_epochs=0.5", "--weight_decay=0", "--adam_beta1=0", "--max_grad_norm=0", f"--seed={2**32 - 1}", "--save_steps=0.5"]))
    check_run(load(["--save_strategy=no", "--save_steps=0", "--logging_strategy=no", "--logging_steps=0"]))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["--lr_scheduler_type=cosin"], "lr_scheduler_type='cosin' is refused by SFTConfig: cosin is not a valid SchedulerType, please select one of ['linear'"),
        (["--warmup_steps=-1"], "warmup_steps=-1 is refused by SFTConfig: Got warmup_steps = -1, Expected value warmup_steps >= 0; change warmup_steps"),
        (["--logging_steps=0"], "logging_steps=0 is refused by SFTConfig: logging strategy IntervalStrategy.STEPS requires non-zero --logging_steps"),
        (["--dataloader_prefetch_factor=2"], "dataloader_prefetch_factor=2 is refused by SFTConfig: --dataloader_prefetch_factor can only be set"),
    ],
)
def test_the_methods_own_config_refusals_name_the_field(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        check_run(load(overrides))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("value", ["../nope/model", "./model", "/no/such/model", "models/qwen/tiny", "~/models/tiny", "models\\tiny"])
def test_a_path_that_does_not_exist_is_refused_online_too(monkeypatch, value):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    looked = "no such folder" if value.startswith("/") else "looked in "
    with pytest.raises(ConfigError, match=re.escape(f"model_name_or_path {value!r} is not a local folder ({looked}")):
        check_model_source(load([f"--model_name_or_path={value}"]))


def test_a_missing_path_names_each_folder_once_and_an_absolute_one_gets_no_relative_advice(monkeypatch, tmp_path):
    """Run from the YAML file's folder, the two places looked in are one (once printed "looked in X and X"); an absolute
    path was looked for only where it points, so the fix is not a relative path."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.chdir(TINY.parent)
    with pytest.raises(ConfigError) as relative:
        check_model_source(load(["--model_name_or_path=./nope"]))
    assert f"(looked in {TINY.parent}); give the folder that holds config.json relative to the YAML file or the current folder" in str(relative.value)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as both:
        check_model_source(load(["--model_name_or_path=./nope"]))
    assert f"(looked in {TINY.parent} and {tmp_path.resolve()})" in str(both.value)
    with pytest.raises(ConfigError) as absolute:
        check_model_source(load([f"--model_name_or_path={tmp_path / 'nope'}"]))
    assert str(absolute.value).endswith("is not a local folder (no such folder); give the full path of the folder that holds config.json")
    with pytest.raises(ConfigError) as dataset:
        load([f"--dataset={tmp_path / 'missing.jsonl'}"])
    assert str(dataset.value).endswith(f"'{tmp_path / 'missing.jsonl'}' does not exist (no such file or folder)")
    with pytest.raises(ConfigError) as dataset:
        load(["--dataset=missing.jsonl"])
    assert str(dataset.value).endswith(f"'missing.jsonl' does not exist (looked in {TINY.parent}, the YAML file's folder)")


def test_a_file_is_not_a_model_folder():
    with pytest.raises(ConfigError, match=re.escape(f"model_name_or_path {str(TINY)!r} is a file")):
        check_model_source(load([f"--model_name_or_path={TINY}"]))


def test_a_quantised_checkpoint_is_refused_naming_its_method(tmp_path):
    """Halo reads unquantised weights: an fp8 release's raw values would load without their scales."""
    import json

    from halo_core import ParallelConfig, from_pretrained
    from halo_core.parallel.loading import CheckpointError
    from halo_core.tiny import tiny_model

    tiny_model("qwen3_moe").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}))
    with pytest.raises(ConfigError, match=re.escape("is a quantised checkpoint (config.json: quantization_config 'fp8')")) as caught:
        check_model_source(load([f"--model_name_or_path={tmp_path}"]))
    assert "\n" not in str(caught.value)
    with pytest.raises(CheckpointError, match="quantised checkpoint"):
        from_pretrained(tmp_path, ParallelConfig())


@pytest.mark.parametrize("value", ["org--x/model", "org/mo del", "org/model.git"])
def test_a_malformed_hub_id_is_refused_online_too(monkeypatch, value):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(ConfigError, match=re.escape(f"model_name_or_path {value!r} is neither a local folder")) as caught:
        check_model_source(load([f"--model_name_or_path={value}"]))
    assert "nor a hub id" in str(caught.value)


def _cache_holding(cache: Path, repo_id: str) -> Path:
    """A Hugging Face hub cache laid out as huggingface_hub writes it, holding ``repo_id``'s config.json."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text("{}")
    return cache


def test_offline_a_hub_id_must_be_cached(monkeypatch, tmp_path):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(_cache_holding(tmp_path, "org/cached")))
    check_model_source(load(["--model_name_or_path=org/cached"]))
    with pytest.raises(ConfigError, match=re.escape(f"model_name_or_path 'org/absent' is neither a local folder")) as caught:
        check_model_source(load(["--model_name_or_path=org/absent"]))
    assert f"nor in the Hugging Face cache {tmp_path}" in str(caught.value) and "`hf download org/absent`" in str(caught.value)


def test_online_a_hub_id_not_yet_cached_is_left_to_download_where_the_hub_serves_it(monkeypatch, tmp_path):
    import huggingface_hub

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    asked = []
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", lambda url, timeout: asked.append(url))
    check_model_source(load(["--model_name_or_path=org/not-yet"]))
    assert asked and "org/not-yet" in asked[0] and asked[0].endswith("config.json")


def test_online_a_cached_hub_id_asks_the_hub_nothing(monkeypatch, tmp_path):
    import huggingface_hub

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(_cache_holding(tmp_path, "org/cached")))
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", lambda *a, **k: pytest.fail("asked the hub for a cached id"))
    check_model_source(load(["--model_name_or_path=org/cached"]))


def test_online_a_hub_id_neither_cached_nor_served_is_refused_before_start(monkeypatch, tmp_path):
    """Without HF_HUB_OFFLINE and without a network (or for an id the hub does not know) every rank's from_pretrained
    would retry for about a minute and fail with a traceback each: the launcher finds out first, in one line."""
    import time

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    started = time.monotonic()
    with pytest.raises(ConfigError) as caught:  # the real hub: unreachable here, and it knows no such id where it is reachable
        check_model_source(load(["--model_name_or_path=halo-test-absent/no-such-model-3f9c1e"]))
    assert time.monotonic() - started < 15
    assert "nor in the Hugging Face cache" in str(caught.value) and "and the hub does not serve it (" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_hub_that_does_not_answer_is_given_up_on_in_bounded_time(monkeypatch, tmp_path):
    import time

    import huggingface_hub

    from halo_core.trainers import run_checks

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(run_checks, "HUB_PROBE_SECONDS", 0.5)
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", lambda *a, **k: time.sleep(30))
    started = time.monotonic()
    with pytest.raises(ConfigError, match=re.escape("does not serve it (no answer from ")):
        check_model_source(load(["--model_name_or_path=org/slow"]))
    assert time.monotonic() - started < 5


def test_ep_that_does_not_divide_the_experts_names_the_degrees_that_do():
    with pytest.raises(ConfigError, match=re.escape("the model has 8 experts, which expert_parallel_size=3 does not divide; choose expert_parallel_size among [1, 2]")):
        check_layout(load(["--expert_parallel_size=3"]), 6)
    dims = ParallelDims(world=8, dp=8, ep=3, etp=2)  # ep * etp must fit dp = 8
    with pytest.raises(LayoutError, match=re.escape("has 8 experts, which ep=3 does not divide; choose ep among [1, 2, 4]")):
        LayoutPlan(ParallelConfig(ep=3, etp=2), dims, "qwen3_moe").check_experts("block", 8)


@pytest.mark.slow  # a fresh `halo` interpreter loading the stack
@pytest.mark.parametrize(
    "overrides, env, message",
    [
        (["--learning_rate=-1"], {}, "learning_rate=-1 must be above 0"),
        (["--model_name_or_path=org/absent", "--random_init=false"], {"HF_HUB_OFFLINE": "1"}, "model_name_or_path 'org/absent' is neither a local folder"),
        (["--model_name_or_path=halo-test-absent/no-such-model-3f9c1e", "--random_init=false"], {"HF_HUB_OFFLINE": "0"}, "and the hub does not serve it"),
    ],
)
def test_cli_dry_run_refuses_in_one_line(tmp_path, overrides, env, message):
    result = run_halo("launch", "sft", str(TINY), "--nproc", "2", "--dry-run", "--", f"--output_dir={tmp_path / 'out'}", *overrides, env={"HF_HUB_CACHE": str(tmp_path / "hub"), **env})
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # a fresh `halo` interpreter loading the stack
def test_cli_dry_run_finds_a_hub_id_in_the_cache_hf_hub_cache_names(tmp_path):
    cache = _cache_holding(tmp_path / "hub", "org/cached")
    overrides = ["--model_name_or_path=org/cached", "--random_init=false", "--expert_parallel_size=1"]
    result = run_halo("launch", "sft", str(TINY), "--dry-run", "--", *overrides, env={"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)})
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["--sdpa_backends=[cudnn, flsh]"], "sdpa_backends: ['cudnn', 'flsh'] must name each of cudnn, flash, efficient, math at most once"),
        (["--sdpa_backends=[math, math]"], "sdpa_backends: ['math', 'math'] must name each"),
        (["--overlap_optimizer_step=true", "--bf16=false"], "overlap_optimizer_step: true overlaps AdamWBF16's step, which trains with bf16: true"),
        (["--overlap_optimizer_step=true", "--bf16=true"], "overlap_optimizer_step: true needs shard_parameters: false"),
        (["--overlap_optimizer_step=true", "--bf16=true", "--shard_parameters=false"], "runs the step on a CUDA side stream, and this machine has no GPU"),
    ],
)
def test_the_step_keys_are_refused_before_start(overrides, message):
    import torch

    if "no GPU" in message and torch.cuda.is_available():
        pytest.skip("the machine has a GPU: nothing to refuse")
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        check_run(load(overrides))
    assert "\n" not in str(caught.value)


def test_sdpa_backends_decide_the_attention_kernel():
    """``sdpa_backends`` is PyTorch's ``sdpa_kernel`` around training: the full list falls through to a back-end this
    machine has and gives math's result; a list of only a back-end the CPU lacks fails, so the list is applied."""
    from halo_core.trainers.runtime import attention_backends

    import torch
    import torch.nn.functional as F

    q = torch.randn(1, 2, 8, 4)
    with attention_backends(["math"]):
        out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    with attention_backends(["cudnn", "flash", "efficient", "math"]):
        assert torch.allclose(F.scaled_dot_product_attention(q, q, q, is_causal=True), out, atol=1e-6)
    with attention_backends(["efficient"]), pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, q, q, is_causal=True)


def test_overlap_is_refused_with_a_server_engine():
    """A server engine reads the weights for its sync outside any forward, where nothing waits for the side stream."""
    from halo_core.methods.grpo import HaloGRPOConfig
    from halo_core.trainers.run_config import load_run_config, parse_overrides

    config = Path(__file__).resolve().parents[1] / "templates" / "configs" / "tiny-grpo.yaml"
    run = load_run_config("grpo", HaloGRPOConfig, config, parse_overrides([
        f"--model_name_or_path={config.parent.parent / 'tiny' / 'model'}", "--overlap_optimizer_step=true", "--bf16=true", "--shard_parameters=false",
        "--rollout_engine=vllm", "--engine_urls=[http://localhost:8000]"]))
    with pytest.raises(ConfigError, match=re.escape("overlap_optimizer_step: true leaves the step running while the weights would be read for sync to the vllm servers")):
        check_run(run)
