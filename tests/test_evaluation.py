"""Evaluation (issue 44): ``eval_dataset``, TRL's ``test_split_size`` and ``dataset_test_split``, transformers' eval keys.

The logged ``eval_loss`` is the whole evaluation set's token-level mean on every layout: each split of SFT gives one
process's numbers (float32, rows of uneven lengths, an evaluation set of 7 rows that leaves the last batch of a rank
filled with repeats, plain-text evaluation rows under prompt/completion training). ``load_best_model_at_end`` reads
the best checkpoint through Halo's sharded loader (the EP run). Bad keys are refused before start in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import run_halo
from launch_kit import STEPS, TINY, TWO_RANKS, launch, logged, uneven_rows, weights, write_run

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

EVAL_ROWS = 7  # two ranks of two rows each: the last batch holds one repeat (accelerate's even batches)
EVAL = ["--eval_strategy=steps", "--eval_steps=1", "--per_device_eval_batch_size=2", "--optim=sgd", "--learning_rate=0.5"]
#: The EP run also keeps the best checkpoint: "best" by the highest eval loss, the first step's, so the result is not the last step's.
BEST = ["--save_steps=1", "--load_best_model_at_end=true", "--metric_for_best_model=eval_loss", "--greater_is_better=true"]


@pytest.fixture(scope="module")
def run_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("evaluation")
    rows = uneven_rows("labelled", count=EVAL_ROWS, seed=3)
    (folder / "eval.jsonl").write_text("".join(json.dumps({"text": r["text"]}) + "\n" for r in rows))  # plain text
    return write_run(folder, "completion", "eval_dataset:\n  - path: eval.jsonl\n")


def eval_losses(output_dir: Path) -> list[float]:
    state = json.loads((output_dir / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
    return [entry["eval_loss"] for entry in state["log_history"] if "eval_loss" in entry]


@pytest.fixture(scope="module")
def single(run_file):
    return launch("sft", run_file, run_file.parent / "one", 1, *EVAL)


@pytest.mark.parametrize("name", ["ep2", "tp2", "cp2"])
def test_sft_layout_logs_the_single_process_eval_loss(single, run_file, name):
    nproc, extra = TWO_RANKS[name]
    out = launch("sft", run_file, run_file.parent / name, nproc, *EVAL, *extra, *(BEST if name == "ep2" else []))
    expected = eval_losses(single)
    assert len(expected) == STEPS
    assert eval_losses(out) == pytest.approx(expected, abs=1e-5)
    assert logged(out, "loss") == pytest.approx(logged(single, "loss"), abs=1e-5)
    if name == "ep2":
        state = json.loads((out / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
        assert state["best_model_checkpoint"].endswith("checkpoint-1"), state["best_model_checkpoint"]
        final, best, last = weights(out), weights(out / "checkpoint-1"), weights(out / f"checkpoint-{STEPS}")
        assert all(torch.equal(final[k], best[k]) for k in best)
        assert any(not torch.equal(final[k], last[k]) for k in last)


def test_test_split_size_holds_out_seeded_rows_of_the_training_sources(tmp_path):
    from halo_core.trainers.parts.evaluation import datasets_for
    from test_run_config import load

    config = write_run(tmp_path, "completion", "test_split_size: 0.25\n")
    run = load(path=config)
    train, held = datasets_for(run, seed=5)
    again_train, again = datasets_for(run, seed=5)
    assert (len(train), len(held)) == (48, 16)
    assert held["prompt"] == again["prompt"] and held["completion"] == again["completion"]
    seen = {json.dumps(r, sort_keys=True) for r in train}
    assert not any(json.dumps(r, sort_keys=True) in seen for r in held)


def test_the_embedded_sft_default_evaluates_on_held_out_rows():
    from halo_core.trainers.method import get_method
    from halo_core.trainers.parts.evaluation import datasets_for
    from halo_core.trainers.run_checks import method_config
    from halo_core.trainers.run_config import load_run_config

    config = Path(__file__).resolve().parents[1] / "templates" / "configs" / "tiny-qwen3-moe.yaml"
    run = load_run_config("sft", get_method("sft").config_class, config, {})
    args = method_config(run, 2)
    assert str(args.eval_strategy.value) == "steps" and args.eval_steps < args.max_steps
    train, held = datasets_for(run, args.seed)
    assert len(held) == 64 and not {r[0]["content"] for r in held["prompt"]} & {r[0]["content"] for r in train["prompt"]}


def test_an_eval_schedule_without_eval_data_is_refused_before_start(tmp_path):
    config = write_run(tmp_path, "completion", "eval_strategy: steps\neval_steps: 2\n")
    result = run_halo("launch", "sft", str(config), "--nproc", "2", "--dry-run", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "eval_strategy: steps evaluates, and the run names no evaluation data" in lines[0], result.stderr


def dpo_run(config):
    from halo_core.trainers.method import get_method
    from halo_core.trainers.run_config import load_run_config

    return load_run_config("dpo", get_method("dpo").config_class, config, {})


@pytest.mark.parametrize("extra, message", [
    ("eval_on_start: true\n", "eval_on_start: true evaluates, and the run names no evaluation data"),
    ("eval_dataset: [completion.jsonl]\ntest_split_size: 0.1\n", "eval_dataset and test_split_size both name the evaluation set"),
    ("test_split_size: 1.5\n", "test_split_size: 1.5 must be a fraction between 0 and 1 or a row count"),
    ("dataset_test_split: test\n", "dataset_test_split: 'test' names a split of each dataset source"),
    ("eval_dataset: [missing.jsonl]\n", "eval_dataset[0].path 'missing.jsonl' does not exist"),
    ("eval_dataset: [completion.jsonl]\n", "completion.jsonl' lacks 'chosen', 'rejected', which method 'dpo' needs"),
])
def test_wrong_eval_keys_are_refused_in_one_line(tmp_path, extra, message):
    from halo_core.errors import ConfigError
    from halo_core.trainers.run_checks import check_run
    from test_run_config import load

    dpo = "'dpo'" in message  # a DPO run over preference rows, its eval set of SFT rows
    config = write_run(tmp_path, "preference" if dpo else "completion", extra)
    if dpo:
        (tmp_path / "completion.jsonl").write_text("".join(json.dumps(r) + "\n" for r in uneven_rows("completion", 4)))
    with pytest.raises(ConfigError) as refused:
        check_run(load(path=config) if not dpo else dpo_run(config), 2)
    assert message in str(refused.value) and "\n" not in str(refused.value)


#: method -> logged eval metrics beside eval_loss. Their losses are each row's own: the stock mean over rows is one
#: process's on every layout where the evaluation set fills every batch (8 rows, 2 a rank, 2 ranks). The runs are the
#: equivalence matrix's (``launch_kit.MATRIX``: these methods' runs evaluate every step, ``with_eval``), not launched again.
SEQUENCE = {"dpo": ("eval_rewards/margins", "eval_rewards/accuracies", "eval_rewards/chosen"), "classify": ("eval_accuracy",)}


@pytest.mark.parametrize("method", sorted(SEQUENCE))
def test_sequence_methods_report_their_eval_metrics_equal_on_tp2(method_runs, method):
    from launch_kit import EVAL_FIELDS, MATRIX

    assert set(EVAL_FIELDS) <= set(MATRIX[method].args)  # evaluation every step, two rows a rank
    one, tp2 = method_runs.single(method), method_runs.layout(method, "tp2")

    def metrics(out):
        state = json.loads((out / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
        return [[e[k] for k in ("eval_loss", *SEQUENCE[method])] for e in state["log_history"] if "eval_loss" in e]

    expected = metrics(one)
    assert len(expected) == STEPS
    assert metrics(tp2) == [pytest.approx(row, abs=1e-5) for row in expected]


def test_grpo_evaluates_its_prompts_with_routing_replay(tmp_path):
    """GRPOTrainer's evaluation (generation and rewards on the evaluation prompts) with routing replay on: each evaluation
    batch's loss replays its routes, and the next batch generates on live routes (it failed on the second batch)."""
    import datasets
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from halo_core.methods.grpo import HaloGRPOConfig, HaloGRPOTrainer
    from launch_kit import TINY

    torch.manual_seed(5)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY), dtype=torch.float32)
    args = HaloGRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, per_device_eval_batch_size=2, max_steps=1,
                          save_strategy="no", seed=5, bf16=False, report_to="none", use_cpu=True, num_generations=2,
                          max_completion_length=6, reward_funcs=["grpo_rewards.token_sum"], router_aux_loss_coef=0.0)
    assert args.routing_replay
    rows = datasets.Dataset.from_list(uneven_rows("prompts", count=3, seed=4))
    trainer = HaloGRPOTrainer(model=model, args=args, train_dataset=rows, eval_dataset=rows, processing_class=AutoTokenizer.from_pretrained(TINY))
    metrics = trainer.evaluate()
    assert "eval_reward" in metrics and "eval_completions/mean_length" in metrics, sorted(metrics)
