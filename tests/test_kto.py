"""`halo launch kto`: one process against stock `trl.KTOTrainer` (with and without the MoE aux loss), the
precomputed reference under TP against one process, the refusals before start, and the embedded default
(every declared split against one process: tests/test_equivalence_matrix.py).

The global batch is 4 in every layout (launch_kit). KTO's KL term is estimated from completions rotated
within the rows that TRL's gather averages together, the global batch (``halo_core.methods.kto``), so
one process at batch 4 and two at batch 2 see the same KL pairs and the same estimate.
float32, gloo, SGD: logged losses within 1e-5, weights within 1e-4 relative.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import torch

from halo_core.testing.compare import assert_close
from launch_kit import GLOBAL_BATCH, OPTIMIZERS, STEPS, TINY, launch, logged, weights

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

AUX = ["--router_aux_loss_coef=0.5"]  # after launch_kit.COMMON's 0.0, so it wins


@pytest.fixture(scope="module")
def run_file(method_runs) -> Path:
    return method_runs.config("kto")


@pytest.fixture(scope="module")
def single(method_runs, run_file, tmp_path_factory):
    """One process, run on first use: ``plain`` (no aux loss: the run the equivalence matrix compares every layout
    against, tests/test_equivalence_matrix.py) and ``aux`` (router_aux_loss_coef 0.5)."""
    done = {}

    def get(name: str) -> Path:
        if name not in done:
            done[name] = (method_runs.single("kto") if name == "plain"
                          else launch("kto", run_file, tmp_path_factory.mktemp(f"single-{name}") / "run", 1, *OPTIMIZERS["sgd"], *AUX))
        return done[name]

    return get


def _stock(run_file: Path, output_dir: Path, aux_coef: float) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """Stock TRL in this process, from the model Halo's build_model makes (seeded random init), with a copied reference."""
    import datasets
    from transformers import AutoConfig, AutoTokenizer
    from trl import KTOConfig, KTOTrainer

    from halo_core.parallel.loading import model_class_for

    config = AutoConfig.from_pretrained(TINY)
    torch.manual_seed(5)
    model = model_class_for(config).from_config(config, dtype=torch.float32)
    ref_model = copy.deepcopy(model).requires_grad_(False).eval()
    args = KTOConfig(output_dir=str(output_dir), use_cpu=True, per_device_train_batch_size=GLOBAL_BATCH, max_steps=STEPS,
                     lr_scheduler_type="constant", warmup_steps=0, logging_steps=1, save_strategy="no", router_aux_loss_coef=aux_coef,
                     seed=5, max_grad_norm=1.0, bf16=False, report_to="none", optim="sgd", learning_rate=0.5)
    data = datasets.load_dataset("json", data_files=str(run_file.parent / "unpaired.jsonl"), split="train")
    trainer = KTOTrainer(model=model, ref_model=ref_model, args=args, train_dataset=data, processing_class=AutoTokenizer.from_pretrained(TINY))
    trainer.train()
    return [e for e in trainer.state.log_history if "loss" in e], {k: v.detach().clone() for k, v in model.state_dict().items()}


def _halo_logs(output_dir: Path) -> list[dict]:
    state = json.loads((output_dir / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
    return [entry for entry in state["log_history"] if "loss" in entry]


@pytest.mark.parametrize("name, coef", [("plain", 0.0), ("aux", 0.5)])
def test_one_process_is_stock_trl(single, run_file, tmp_path, name, coef):
    """Same model, data and seed: Halo's one-process run logs stock KTOTrainer's losses (and KL, rewards) and ends
    on its weights; with a nonzero router_aux_loss_coef the MoE aux loss is in both (not dropped)."""
    out = single(name)
    stock_logs, stock_weights = _stock(run_file, tmp_path / "stock", coef)
    halo_logs = _halo_logs(out)
    assert len(halo_logs) == STEPS
    for key in ("loss", "kl", "rewards/chosen", "rewards/rejected"):
        got, want = [e[key] for e in halo_logs], [e[key] for e in stock_logs]
        assert got == pytest.approx(want, abs=1e-5, rel=0), key
    if coef:
        assert all(e["aux_loss"] > 0 for e in halo_logs)
        assert [e["aux_loss"] for e in halo_logs] == pytest.approx([e["aux_loss"] for e in stock_logs], abs=1e-5, rel=0)
    else:
        assert "aux_loss" not in halo_logs[0]
    for key, tensor in weights(out).items():
        assert_close(tensor, stock_weights[key], f"{key} after {STEPS} SGD steps, Halo against stock KTOTrainer", rtol=1e-4)


def test_precomputed_reference_under_tp_is_the_kept_reference(single, run_file, tmp_path):
    """precompute_ref_log_probs (no reference model; the policy scores the data first, pooled over the TP group)
    at tp2 trains as one process with a kept reference: the reference is the initial policy either way."""
    out = launch("kto", run_file, tmp_path / "run", 2, *OPTIMIZERS["sgd"], "--tensor_parallel_size=2", "--precompute_ref_log_probs=true")
    reference = single("plain")
    for key in ("loss", "kl", "rewards/margins"):
        assert logged(out, key) == pytest.approx(logged(reference, key), abs=1e-5, rel=0), key
    expected = weights(reference)
    for key, tensor in weights(out).items():
        assert_close(tensor, expected[key], f"{key} after {STEPS} SGD steps, tp2 with precomputed reference log-probs", rtol=1e-4)


def test_kl_pairs_follow_the_global_batch():
    """Two ranks at batch 2 rotate the completions within each run of 4 rows, as one process at batch 4 does."""
    from halo_core.methods.kto import _rotate_within

    import datasets

    data = datasets.Dataset.from_dict({"completion_ids": [[i] for i in range(8)]})
    rotated = data.map(_rotate_within, batched=True, batch_size=4)["KL_completion_ids"]
    assert rotated == [[3], [0], [1], [2], [7], [4], [5], [6]]


def _unpaired(folder: Path, rows: list[dict]) -> Path:
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "run.yaml").write_text(f"model_name_or_path: {TINY}\nrandom_init: true\ndataset:\n  - path: data.jsonl\n")
    return folder / "run.yaml"


ROW = {"prompt": "1 + 1 =", "completion": " 2", "label": True}


@pytest.mark.parametrize(
    "rows, message",
    [
        ([{"prompt": "1 + 1 =", "completion": " 2"}], "lacks 'label', which method 'kto' needs"),
        ([ROW, {**ROW, "label": 1}], "row 2 has label=1, but kto needs a boolean label"),
    ],
)
def test_bad_data_is_refused_in_one_line(tmp_path, rows, message):
    """In process (the exit path, one line and exit 2 under --dry-run, is the CLI test's in test_classify)."""
    from halo_core.errors import ConfigError
    from halo_core.trainers.run_checks import check_run
    from halo_core.trainers.run_config import load_run_config, parse_overrides
    from trl import KTOConfig

    with pytest.raises(ConfigError) as caught:
        check_run(load_run_config("kto", KTOConfig, _unpaired(tmp_path, rows), parse_overrides([])))
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "rows, overrides, message",
    [
        ([ROW, {**ROW, "label": "good"}], [], "row 2 has label='good', but kto needs a boolean label"),
        ([ROW, {**ROW, "label": None}], [], "row 2 has label=None, but kto needs a boolean label"),
        ([ROW], ["--undesirable_weight=0"], "undesirable_weight=0 must be above 0"),
        ([ROW], ["--desirable_weight=-1"], "desirable_weight=-1 must be above 0"),
        ([ROW], ["--loss_type=sigmoid"], "loss_type='sigmoid' is not one KTOTrainer implements"),
        ([ROW], ["--per_device_train_batch_size=1"], "per_device_train_batch_size=1 must be at least 2 with loss_type 'kto'"),
        ([ROW], ["--train_sampling_strategy=random"], "train_sampling_strategy='random' must be 'sequential'"),
        ([ROW], ["--beta=0"], "beta=0 must be above 0"),
    ],
)
def test_check_refuses_what_kto_cannot_train(tmp_path, rows, overrides, message):
    from trl import KTOConfig

    from halo_core.errors import ConfigError
    from halo_core.trainers.run_checks import check_run
    from halo_core.trainers.run_config import load_run_config, parse_overrides

    run = load_run_config("kto", KTOConfig, _unpaired(tmp_path, rows), parse_overrides(list(overrides)))
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_run(run)


def test_check_accepts_apo_zero_at_batch_1(tmp_path):
    from trl import KTOConfig

    from halo_core.trainers.run_checks import check_run
    from halo_core.trainers.run_config import load_run_config, parse_overrides

    overrides = ["--loss_type=apo_zero_unpaired", "--per_device_train_batch_size=1"]
    check_run(load_run_config("kto", KTOConfig, _unpaired(tmp_path, [ROW]), parse_overrides(overrides)))
