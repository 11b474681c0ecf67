"""``templates/recipes/<model>/<method>.yaml``: every recipe passes the checks ``halo launch --dry-run`` makes before
start, offline, on the world its header names. The model's hub id is not downloadable here, so the layout is checked
against the ``config.json`` kept beside the recipe (the published figures), as the model would be read."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from launch_kit import ROOT

RECIPES = sorted((ROOT / "templates" / "recipes").glob("*/*.yaml"))


def _world(text: str) -> int:
    nproc = int(re.search(r"^# nproc: (\d+)$", text, re.M)[1])
    nnodes = re.search(r"^# nnodes: (\d+)$", text, re.M)
    return nproc * (int(nnodes[1]) if nnodes else 1)


def test_at_least_ten_runs_over_six_families():
    families = {(p.parent / "config.json").read_text().split('"model_type": "')[1].split('"')[0] for p in RECIPES}
    assert len(RECIPES) >= 10 and len(families) >= 6, (len(RECIPES), families)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_header_says_what_halo_plan_says(recipe):
    """The ``# halo plan:`` line is ``halo plan``'s summary line for the header's world (its default 80 GiB GPU, the
    ``config.json`` beside the recipe), so a change to the recipe, the model's config or the planner shows here."""
    from halo_cli.plan import DEFAULT_GPU_GIB, GIB, figures, model_config, summary
    from halo_core.trainers.method import get_method
    from halo_core.trainers.run_config import load_run_config

    text = recipe.read_text()
    method = re.search(r"halo launch (\S+) ", text)[1]
    run = load_run_config(method, get_method(method).config_class, recipe)
    config, source = model_config(run)
    assert "beside the YAML" in source  # offline: the published figures kept with the recipe
    result = figures(run, _world(text), config, gpu_bytes=int(DEFAULT_GPU_GIB * GIB))
    header = re.search(r"^# halo plan: (.*)$", text, re.M)[1]
    assert result["fits"], header
    assert header == summary(result), f"{recipe}: the header says\n  {header}\nhalo plan says\n  {summary(result)}"


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_recipe_passes_the_checks_before_start(recipe):
    from halo_core.trainers.method import get_method
    from halo_core.trainers.run_checks import check_ranges, method_config
    from halo_core.trainers.run_config import check_layout, load_run_config

    text = recipe.read_text()
    method = re.search(r"halo launch (\S+) ", text)[1]
    assert "# halo plan:" in text and (recipe.parent / "config.json").is_file()
    world = _world(text)
    run = load_run_config(method, get_method(method).config_class, recipe)
    assert "/" in run.halo.model_name_or_path and not Path(run.halo.model_name_or_path).exists()  # the hub id
    check_ranges(run, method_config(run, world))
    local = dataclasses.replace(run, halo=dataclasses.replace(run.halo, model_name_or_path=str(recipe.parent)))
    layout = check_layout(local, world)
    assert layout["family"] is not None and layout["dims"].ep == run.halo.expert_parallel_size


def test_the_gsm8k_grpo_recipe_rewards_the_answer_not_only_its_shape():
    """Its reward reads GSM8K's ``answer`` column (``exact_answer``: the completion's last number against the
    reference's final one), as TRL's accuracy rewards grade a completion against the row's reference."""
    import inspect

    from halo_core.rl.rewards import exact_answer, resolve
    from halo_core.trainers.method import get_method
    from halo_core.trainers.run_config import load_run_config

    recipe = ROOT / "templates" / "recipes" / "qwen3-30b-a3b" / "grpo.yaml"
    run = load_run_config("grpo", get_method("grpo").config_class, recipe)
    assert run.halo.dataset[0].path == "openai/gsm8k"
    functions = [resolve(name) for name in run.trainer["reward_funcs"]]
    assert any("answer" in inspect.signature(f).parameters for f in functions), run.trainer["reward_funcs"]
    row = "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = $<<0.2*50=10>>10.\n#### 10"
    assert [exact_answer(None, [c], answer=[row])[0] for c in ("She earned $10.", "0.2 per minute")] == [1.0, 0.0]
