"""`halo launch reward`: one process against stock `trl.RewardTrainer`, and the refusals before start (every split the
method declares against one process: tests/test_equivalence_matrix.py)."""

from __future__ import annotations

import re

import pytest
import torch

from halo_core.testing.compare import assert_close
from launch_kit import GLOBAL_BATCH, STEPS, TINY, logged, weights, write_run

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

SEQ_CLS = "AutoModelForSequenceClassification"


@pytest.fixture(scope="module")
def run_file(method_runs):
    return method_runs.config("reward")


@pytest.fixture(scope="module")
def single(method_runs):
    """The one-process run the equivalence matrix compares every layout against (tests/test_equivalence_matrix.py)."""
    return method_runs.single("reward")


def test_one_process_equals_stock_reward_trainer(single, run_file, tmp_path):
    """Stock TRL on one process over the model Halo's random_init builds (seeded, then from_config, num_labels=1)."""
    import datasets
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer
    from trl import RewardConfig, RewardTrainer

    args = RewardConfig(output_dir=str(tmp_path / "stock"), per_device_train_batch_size=GLOBAL_BATCH, max_steps=STEPS, lr_scheduler_type="constant",
                        warmup_steps=0, logging_steps=1, save_strategy="no", seed=5, max_grad_norm=1.0, bf16=False, report_to="none",
                        optim="sgd", learning_rate=0.5, use_cpu=True)
    config = AutoConfig.from_pretrained(TINY, num_labels=1)
    torch.manual_seed(5)
    model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    data = datasets.load_dataset("json", data_files=str(run_file.parent / "preference.jsonl"), split="train")
    trainer = RewardTrainer(model=model, args=args, train_dataset=data, processing_class=AutoTokenizer.from_pretrained(TINY))
    trainer.train()
    stock = [e for e in trainer.state.log_history if "loss" in e]
    for key in ("loss", "accuracy", "margin"):
        assert logged(single, key) == pytest.approx([e[key] for e in stock], abs=1e-5, rel=1e-6), key
    saved = weights(single, SEQ_CLS)
    assert saved.keys() == model.state_dict().keys()
    for key, tensor in model.state_dict().items():
        assert_close(saved[key], tensor, f"{key} after {STEPS} SGD steps, Halo against stock", rtol=1e-4)


def test_cp_is_refused_before_start(run_file):
    """The score is read at each sequence's last non-pad token, which only one CP rank's chunk holds."""
    from halo_core.errors import ConfigError
    from halo_core.trainers.run_config import check_layout, load_run_config, parse_overrides
    from trl import RewardConfig

    run = load_run_config("reward", RewardConfig, run_file, parse_overrides(["--context_parallel_size=2"]))
    with pytest.raises(ConfigError, match=re.escape("method 'reward' cannot train with cp=2 yet (it supports ['ep', 'etp', 'tp']); set context_parallel_size to 1")):
        check_layout(run, 2)


def test_data_without_pairs_is_refused_before_start(tmp_path):
    """In process (``tests/test_classify.py`` runs the CLI's ``--dry-run`` refusal end to end)."""
    from halo_core.errors import ConfigError
    from halo_core.trainers.run_checks import check_run
    from halo_core.trainers.run_config import load_run_config
    from trl import RewardConfig

    with pytest.raises(ConfigError, match=re.escape("lacks 'chosen'")) as caught:
        check_run(load_run_config("reward", RewardConfig, write_run(tmp_path, "labelled")))
    assert "\n" not in str(caught.value) and "columns: {old: new}" in str(caught.value)
