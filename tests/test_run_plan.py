"""The launcher's one RunPlan: the method config built once and the model config read once per launch, the plan
shipped to the workers as JSON, and the check modules importable each on its own with no import hidden in a function
to dodge a cycle."""

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoConfig
from trl import SFTConfig
from typer.testing import CliRunner

from halo_cli.main import _typer_app
from halo_core.errors import ConfigError
from halo_core.trainers.method import get_method
from halo_core.trainers.run_config import load_run_config, parse_overrides
from halo_core.trainers.run_plan import RunPlan

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "templates" / "configs"

#: The modules of the checks before start, and the one that holds the run and its method config.
CHECK_MODULES = (
    "halo_core.trainers.run_config",
    "halo_core.trainers.run_plan",
    "halo_core.trainers.run_checks",
    "halo_core.trainers.image_checks",
    "halo_core.lora.checks",
    "halo_core.trainers.parts.eval_checks",
    "halo_core.trainers.parts.output_room",
    "halo_core.trainers.parts.global_batch",
)


@pytest.mark.parametrize("config", ["tiny-qwen3-moe.yaml", "tiny-qwen3-moe-lora.yaml"])
def test_a_dry_run_builds_the_method_config_once_and_reads_the_model_config_once(config, monkeypatch, tmp_path):
    """Every check before start (ranges, layout precision, LoRA's grouped-GEMM rows, the checkpoint's size) reads
    the plan's; before, a plain run built its config 3 times and read config.json twice (LoRA: 4 and 3)."""
    builds, reads = [], []
    init, read = SFTConfig.__init__, AutoConfig.from_pretrained.__func__

    def counted_init(self, *args, **kwargs):
        builds.append(kwargs.get("max_steps"))
        init(self, *args, **kwargs)

    def counted_read(cls, *args, **kwargs):
        reads.append(args[0])
        return read(cls, *args, **kwargs)

    monkeypatch.setattr(SFTConfig, "__init__", counted_init)
    monkeypatch.setattr(AutoConfig, "from_pretrained", classmethod(counted_read))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(_typer_app, ["launch", "sft", str(CONFIGS / config), "--nproc", "2", "--dry-run", "--",
                                             f"--output_dir={tmp_path / 'out'}"])
    assert result.exit_code == 0, result.output
    assert "layout: world 2" in result.output
    assert len(builds) == 1, builds
    assert len(reads) == 1, reads


def test_the_plan_goes_to_a_worker_as_json_and_comes_back_the_same():
    run = load_run_config("sft", SFTConfig, CONFIGS / "tiny-qwen3-moe.yaml", parse_overrides(["--bf16=false"]))
    from halo_core.trainers.run_config import check_layout

    plan = RunPlan(run, 2)
    plan.layout = check_layout(run, 2, run_plan=plan)
    data = plan.to_json()
    shipped = json.loads(json.dumps(data))  # plain JSON: no torch or transformers objects
    assert shipped == data
    back = RunPlan.from_json(shipped)
    assert back.to_json() == data
    assert back.run == run and back.world == 2 and back.bf16 is False
    assert back.layout == plan.layout and back.layout["dims"].ep == 2


def test_a_worker_refuses_a_world_the_plan_was_not_checked_for():
    run = load_run_config("sft", SFTConfig, CONFIGS / "tiny-qwen3-moe.yaml", {})
    plan = RunPlan.from_json(RunPlan(run, 2, bf16=False).to_json())
    plan.check_world({"WORLD_SIZE": "2"})
    with pytest.raises(ConfigError, match=r"checked for 2 process\(es\) and this worker is one of WORLD_SIZE=3; start it with `halo launch"):
        plan.check_world({"WORLD_SIZE": "3"})


def test_a_resumed_run_that_changes_its_accumulation_rebuilds_the_plans_method_config(tmp_path):
    """``global_batch.keep`` changes ``gradient_accumulation_steps``: the plan's config is the one the workers build."""
    from halo_core.trainers.parts import global_batch

    checkpoint = tmp_path / "checkpoint-1"
    checkpoint.mkdir()
    (checkpoint / global_batch.RECORD).write_text(json.dumps({"global_batch": 8}))
    run = load_run_config("sft", get_method("sft").config_class, CONFIGS / "tiny-qwen3-moe.yaml",
                          parse_overrides([f"--resume_from_checkpoint={checkpoint}", "--per_device_train_batch_size=2",
                                           "--gradient_accumulation_steps=1"]))
    plan = RunPlan(run, 2)
    assert plan.args.gradient_accumulation_steps == 1
    global_batch.keep(run, 2, plan)
    assert plan.args.gradient_accumulation_steps == 2 == run.trainer["gradient_accumulation_steps"]


@pytest.mark.parametrize("module", CHECK_MODULES)
def test_each_check_module_imports_alone(module):
    """A fresh interpreter imports it first: nothing relies on another module having been imported before."""
    done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_no_check_module_imports_another_inside_a_function():
    """An import of one check module by another inside a function is how the old circle was kept alive (run_config ->
    run_checks -> lora.checks -> run_checks ...); each imports the others it needs at the top, so a cycle would fail
    at import (the test above) rather than hide."""
    hidden = []
    for module in CHECK_MODULES:
        path = Path(importlib.util.find_spec(module).origin)
        tree = ast.parse(path.read_text())
        for function in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for node in ast.walk(function):
                if isinstance(node, ast.ImportFrom):
                    names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
                else:
                    names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
                hidden += [f"{module}.{function.name} imports {name}" for name in names if name in CHECK_MODULES]
    assert hidden == []
