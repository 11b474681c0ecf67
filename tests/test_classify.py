"""`halo launch classify`: one process against stock `transformers.Trainer` on `AutoModelForSequenceClassification`,
the head built from a causal checkpoint, and the refusals before start (every split the method declares against one
process: tests/test_equivalence_matrix.py)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from conftest import run_halo
from halo_core.errors import ConfigError
from halo_core.testing.compare import assert_close
from launch_kit import GLOBAL_BATCH, STEPS, TINY, logged, weights, write_run

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

SEQ_CLS = "AutoModelForSequenceClassification"
LABELS = 3


@pytest.fixture(scope="module")
def run_file(method_runs):
    return method_runs.config("classify")


@pytest.fixture(scope="module")
def single(method_runs):
    """The one-process run the equivalence matrix compares every layout against (tests/test_equivalence_matrix.py)."""
    return method_runs.single("classify")


def test_one_process_equals_stock_trainer(single, run_file, tmp_path):
    """Stock transformers on one process: the model Halo's random_init builds (seeded, then from_config), the
    text tokenised as a transformers user maps it, Trainer's default collator."""
    import datasets
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path / "stock"), per_device_train_batch_size=GLOBAL_BATCH, max_steps=STEPS, lr_scheduler_type="constant",
                             warmup_steps=0, logging_steps=1, save_strategy="no", seed=5, max_grad_norm=1.0, bf16=False, report_to="none",
                             optim="sgd", learning_rate=0.5, use_cpu=True)
    tokenizer = AutoTokenizer.from_pretrained(TINY)
    torch.manual_seed(5)
    model = AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(TINY, num_labels=LABELS), dtype=torch.float32)
    data = datasets.load_dataset("json", data_files=str(run_file.parent / "labelled.jsonl"), split="train")
    data = data.map(lambda b: tokenizer(b["text"], truncation=True, max_length=1024), batched=True, remove_columns=["text"])
    trainer = Trainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    trainer.train()
    stock = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert logged(single, "loss") == pytest.approx(stock, abs=1e-5, rel=1e-6)
    saved = weights(single, SEQ_CLS)
    assert saved.keys() == model.state_dict().keys()
    for key, tensor in model.state_dict().items():
        assert_close(saved[key], tensor, f"{key} after {STEPS} SGD steps, Halo against stock", rtol=1e-4)


def test_a_causal_checkpoint_loads_under_a_fresh_head(tmp_path):
    """The backbone is read from a causal LM's checkpoint; ``score`` (which it lacks) starts from the seed,
    as transformers' own from_pretrained initialises it after ``torch.manual_seed``."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    from halo_core.parallel.config import ParallelConfig
    from halo_core.parallel.loading import from_pretrained

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY)).save_pretrained(tmp_path / "causal")
    ours = from_pretrained(tmp_path / "causal", ParallelConfig(), num_labels=LABELS, pad_token_id=0, seed=7)
    torch.manual_seed(7)
    theirs = AutoModelForSequenceClassification.from_pretrained(tmp_path / "causal", num_labels=LABELS, dtype=torch.float32)
    assert type(ours) is type(theirs) and ours.config.num_labels == LABELS and ours.config.pad_token_id == 0
    expected = theirs.state_dict()
    for key, tensor in ours.state_dict().items():
        assert torch.equal(tensor, expected[key]), key
    assert ours.score.weight.std() > 0


def _check(run_file, tmp_path, overrides=(), rows=None):
    from halo_core.trainers.run_checks import check_run
    from halo_core.trainers.run_config import load_run_config, parse_overrides
    from halo_core.methods.classify import ClassifyConfig

    if rows is not None:
        (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        overrides = [*overrides, f"--dataset={tmp_path / 'rows.jsonl'}"]
    check_run(load_run_config("classify", ClassifyConfig, run_file, parse_overrides(list(overrides))))


@pytest.mark.parametrize(
    "overrides, rows, message",
    [
        (["--num_labels=1"], None, "num_labels=1 must be at least 2"),
        (["--num_labels=2"], None, "row 3 has label=2, not an int in [0, 2) (num_labels=2)"),
        ([], [{"text": "a", "label": 0}, {"text": "b", "label": 1.5}], "row 2 has label=1.5, not an int in [0, 3)"),
        ([], [{"text": "a", "label": True}], "row 1 has label=True, not an int"),
        ([], [{"text": "a", "label": "1"}], "row 1 has label='1', not an int"),
        ([], [{"text": "a", "labels": 1}], "lacks 'label'"),
    ],
)
def test_labels_and_num_labels_are_checked_before_start(run_file, tmp_path, overrides, rows, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        _check(run_file, tmp_path, overrides, rows)
    assert "\n" not in str(caught.value)


def test_cli_dry_run_refuses_a_missing_num_labels_in_one_line(tmp_path):
    config = write_run(tmp_path, "labelled")
    result = run_halo("launch", "classify", str(config), "--nproc", "2", "--dry-run", "--", f"--output_dir={tmp_path / 'out'}")
    assert result.returncode == 2 and "num_labels is not set" in result.stderr and "num_labels: N" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()
