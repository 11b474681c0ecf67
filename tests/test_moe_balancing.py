"""MoE load metrics' definitions and DeepSeek-V3's aux-loss-free balancing (``moe_bias_update_rate``).

The layouts' equality of ``moe/*`` and of ``moe_load.jsonl`` with one process is checked on every layout of
``test_launch_layouts.py`` (no launch of its own); here: the definitions, the bias rule on a hand-built skewed
router, the refusal before start, and one launched pair (one process, EP2) of a GLM-4 MoE whose saved bias stock
transformers reads back as the rule applied to the logged global loads.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from launch_kit import OPTIMIZERS, ROOT, STEPS, TINY, launch, logged, uneven_rows, write_run

from halo_core.errors import ConfigError
from halo_core.trainers.parts import moe_bias
from halo_core.trainers.parts.moe_load import load_metrics

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

RATE = 0.01


def test_metrics_follow_their_definitions():
    rows = [[4, 0, 2, 2], [2, 2, 2, 2]]
    metrics = load_metrics(rows)
    assert metrics["moe/load_max"] == pytest.approx(2.0)  # 4 over the first layer's mean 2
    assert metrics["moe/load_cv"] == pytest.approx((2 ** 0.5 / 2 + 0.0) / 2)  # population std sqrt(2) over 2; 0
    assert metrics["moe/dead_experts"] == pytest.approx(1 / 8)


def test_the_bias_rule_moves_each_expert_by_the_rate_toward_the_mean():
    bias = torch.zeros(4)
    moe_bias.update(bias, torch.tensor([10.0, 0.0, 2.0, 3.0]), RATE)  # mean 3.75
    assert bias.tolist() == pytest.approx([-RATE, RATE, RATE, RATE])
    moe_bias.update(bias, torch.tensor([1.0, 1.0, 1.0, 1.0]), RATE)  # balanced: unchanged
    assert bias.tolist() == pytest.approx([-RATE, RATE, RATE, RATE])


def test_a_skewed_router_is_balanced_by_the_bias():
    """GLM-4 MoE's own router, its weights pulling every token to experts 0 and 1: the rule alone spreads them."""
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeTopkRouter

    from halo_core.tiny import tiny_config

    router = Glm4MoeTopkRouter(tiny_config("glm4_moe"))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        router.weight.normal_(0, 0.1, generator=generator)
        router.weight[:2] += 0.5
    tokens = torch.randn(256, router.hidden_dim, generator=generator).abs()

    def loads():
        _, _, chosen = router(tokens)
        return torch.bincount(chosen.reshape(-1), minlength=router.num_experts).float()

    first = loads()
    for _ in range(120):
        before = router.e_score_correction_bias.clone()
        counts = loads()
        moe_bias.update(router.e_score_correction_bias, counts, RATE)
        torch.testing.assert_close(router.e_score_correction_bias - before, RATE * torch.sign(counts.mean() - counts), atol=1e-6, rtol=0)
    last = loads()
    assert first[:2].sum() / first.sum() > 0.9 and first.max() / first.mean() > 3
    assert last.max() / last.mean() < 1.5 and (last > 0).all()


def test_families_without_the_bias_are_refused_naming_those_that_have_it():
    run = SimpleNamespace(source="run.yaml", halo=SimpleNamespace(moe_bias_update_rate=RATE, model_name_or_path=str(TINY)))
    with pytest.raises(ConfigError, match=r"moe_bias_update_rate=0.01 .* qwen3_moe has none.*deepseek_v3.*glm4_moe"):
        moe_bias.check_key(run)
    run.halo.moe_bias_update_rate = -1
    with pytest.raises(ConfigError, match="moe_bias_update_rate=-1 must be 0"):
        moe_bias.check_key(run)


def test_the_refusal_comes_before_start_in_one_line(tmp_path):
    """`halo launch --dry-run` (in this process: a second interpreter costs seconds) refuses it with a ``ConfigError``
    (which ``halo``'s entry point prints as one line, exit 2) before anything starts."""
    from typer.testing import CliRunner

    from halo_cli.main import _typer_app

    config = write_run(tmp_path, "completion")
    result = CliRunner().invoke(_typer_app, ["launch", "sft", str(config), "--nproc", "2", "--dry-run", "--",
                                             f"--output_dir={tmp_path / 'out'}", f"--moe_bias_update_rate={RATE}"])
    message = str(result.exception)
    assert isinstance(result.exception, ConfigError), result.output[-2000:]
    assert "moe_bias_update_rate=0.01" in message and "glm4_moe" in message and "\n" not in message


def _glm4_moe_folder(folder: Path) -> Path:
    """A tiny GLM-4 MoE config (both layers MoE) with the tiny template's tokenizer."""
    from halo_core.tiny import tiny_config

    config = tiny_config("glm4_moe", {"vocab_size": json.loads((TINY / "config.json").read_text())["vocab_size"], "first_k_dense_replace": 0})
    folder.mkdir(parents=True)
    config.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (TINY / name).exists():
            shutil.copy(TINY / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def glm_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("glm")
    model = _glm4_moe_folder(root / "model")
    # plain-text rows here (the layouts' module covers prompt/completion ones): padding left out of the counts too
    (root / "text.jsonl").write_text("".join(json.dumps({"text": row["text"]}) + "\n" for row in uneven_rows("labelled")))
    config = root / "run.yaml"
    config.write_text(f"model_name_or_path: {model}\nrandom_init: true\ndataset:\n  - path: text.jsonl\n")
    asked = (*OPTIMIZERS["sgd"], f"--moe_bias_update_rate={RATE}")
    return {"single": launch("sft", config, root / "single", 1, *asked), "ep2": launch("sft", config, root / "ep2", 2, *asked, "--expert_parallel_size=2")}


def test_the_saved_bias_is_the_rule_over_the_global_loads_and_stock_transformers_reads_it(glm_runs):
    from transformers import AutoModelForCausalLM

    single, ep2 = glm_runs["single"], glm_runs["ep2"]
    assert logged(ep2, "loss") == pytest.approx(logged(single, "loss"), abs=1e-5, rel=0)
    for key in ("moe/load_max", "moe/load_cv", "moe/dead_experts"):
        assert logged(ep2, key) == pytest.approx(logged(single, key), abs=1e-6, rel=0), key
    lines = [json.loads(line) for line in (ep2 / "moe_load.jsonl").read_text().splitlines()]
    assert lines == [json.loads(line) for line in (single / "moe_load.jsonl").read_text().splitlines()] and len(lines) == STEPS
    tokens = logged(single, "num_tokens")  # real tokens (attention mask) per step, times top-2, in every layer
    assert [{sum(c) for c in line["counts"]} for line in lines] == [{2 * (b - a)} for a, b in zip([0] + tokens, tokens)]
    for out in (single, ep2):
        model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
        for layer, name in enumerate(lines[0]["layers"]):
            expected = torch.zeros(len(lines[0]["counts"][layer]))
            for line in lines:  # logging_steps=1: one line per optimizer step, the global batch's loads
                moe_bias.update(expected, torch.tensor(line["counts"][layer], dtype=torch.float32), RATE)
            gate = model.get_submodule(name.rpartition(".")[0]).gate
            assert expected.abs().sum() > 0
            torch.testing.assert_close(gate.e_score_correction_bias, expected, atol=1e-7, rtol=0)


def test_one_process_aux_loss_is_transformers_own():
    """Unpatched, on one process, the global-batch loss is the stock function's value, with and without a mask."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func as stock

    from halo_core.trainers.parts.moe_aux import global_loss

    generator = torch.Generator().manual_seed(1)
    logits = tuple(torch.randn(12, 8, generator=generator) for _ in range(3))
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    for attention_mask in (None, mask):
        torch.testing.assert_close(global_loss(None, logits, 8, 2, attention_mask), stock(logits, 8, 2, attention_mask), atol=1e-6, rtol=0)


def test_the_heatmap_reads_each_expert_against_its_layer_mean(tmp_path):
    """The picture's numbers (drawing needs matplotlib, an optional extra): 1 is a fair share, 0 dead."""
    sys.path.insert(0, str(ROOT / "bench"))
    from moe_heatmap import load_ratios

    from halo_core.trainers.parts.moe_load import write_counts

    write_counts(str(tmp_path), 1, ["a", "b"], [[9, 9], [9, 9]])  # an earlier run's line, replaced by a fresh start's
    write_counts(str(tmp_path), 1, ["a", "b"], [[2, 2], [4, 0]], first=True)
    write_counts(str(tmp_path), 2, ["a", "b"], [[3, 1], [0, 0]])
    steps, labels, rows = load_ratios(tmp_path / "moe_load.jsonl")
    assert steps == [1, 2] and labels == ["a/0", "a/1", "b/0", "b/1"]
    assert rows == [[1.0, 1.5], [1.0, 0.5], [2.0, 0.0], [0.0, 0.0]]
