"""`halo launch dpo`: one process against stock `trl.DPOTrainer`, the MoE auxiliary loss kept, the precomputed reference
under TP and resuming on ep2 against one process (every declared split: tests/test_equivalence_matrix.py)."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from halo_core.testing.compare import assert_close
from launch_kit import GLOBAL_BATCH, OPTIMIZERS, STEPS, TINY, launch, logged, uneven_rows, weights

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

@pytest.fixture(scope="module")
def run_file(method_runs):
    return method_runs.config("dpo")


@pytest.fixture(scope="module")
def single(method_runs):
    """The one-process run the equivalence matrix compares every layout against (tests/test_equivalence_matrix.py)."""
    return method_runs.single("dpo")


def test_pairs_differ_in_length_within_every_batch(run_file):
    rows = uneven_rows("preference")
    lengths = [(len(r["chosen"][0]["content"]), len(r["rejected"][0]["content"])) for r in rows[:GLOBAL_BATCH * STEPS]]
    assert len({c for c, _ in lengths} | {r for _, r in lengths}) >= 5 and any(c != r for c, r in lengths)


def test_precomputed_reference_log_probs_match_the_kept_reference_under_tp(single, run_file, tmp_path):
    """TRL scores the data with the untrained policy before step one; pooled over the TP group like training."""
    out = launch("dpo", run_file, tmp_path / "run", 2, *OPTIMIZERS["sgd"], "--tensor_parallel_size=2", "--precompute_ref_log_probs=true")
    assert logged(out, "loss") == pytest.approx(logged(single, "loss"), abs=1e-5, rel=0)


def _stock(run_file, out, aux: float) -> tuple[list[dict], dict]:
    """Stock TRL on one process: the model Halo's random_init builds (seeded, then from_config), its copy as reference."""
    import datasets
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    args = DPOConfig(output_dir=str(out), per_device_train_batch_size=GLOBAL_BATCH, max_steps=STEPS, lr_scheduler_type="constant", warmup_steps=0,
                     logging_steps=1, save_strategy="no", router_aux_loss_coef=aux, seed=5, max_grad_norm=1.0, bf16=False, report_to="none",
                     optim="sgd", learning_rate=0.5, use_cpu=True)
    torch.manual_seed(5)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY), dtype=torch.float32)
    data = datasets.load_dataset("json", data_files=str(run_file.parent / "preference.jsonl"), split="train")
    trainer = DPOTrainer(model=model, ref_model=copy.deepcopy(model), args=args, train_dataset=data, processing_class=AutoTokenizer.from_pretrained(TINY))
    trainer.train()
    return [e for e in trainer.state.log_history if "loss" in e], model.state_dict()


@pytest.fixture(scope="module")
def with_aux(run_file):
    return launch("dpo", run_file, run_file.parent / "single-aux", 1, *OPTIMIZERS["sgd"], "--router_aux_loss_coef=0.3")


@pytest.mark.parametrize("aux", [0.0, 0.3])
def test_one_process_equals_stock_dpo_trainer(single, with_aux, run_file, tmp_path, aux):
    """With the router's auxiliary loss on, both add router_aux_loss_coef x aux_loss (TRL PR 6208)."""
    out = with_aux if aux else single
    stock_logs, stock_weights = _stock(run_file, tmp_path / "stock", aux)
    for key in ["loss", "rewards/margins"] + (["aux_loss"] if aux else []):
        assert logged(out, key) == pytest.approx([e[key] for e in stock_logs], abs=1e-5, rel=1e-6), key
    for key, tensor in weights(out).items():
        assert_close(tensor, stock_weights[key], f"{key} after {STEPS} SGD steps, Halo against stock", rtol=1e-4)


def test_the_auxiliary_loss_is_not_dropped(single, with_aux):
    """Step one runs on the same weights with and without the coefficient: the losses differ by coef x aux_loss."""
    aux = logged(with_aux, "aux_loss")[0]
    assert aux > 0.1  # the coefficient weighs something real
    assert logged(with_aux, "loss")[0] - logged(single, "loss")[0] == pytest.approx(0.3 * aux, abs=1e-5)


def test_resuming_on_ep2_continues_the_single_process_run_against_the_initial_reference(single, run_file, tmp_path):
    """Stopped after step 2 and resumed: the third step is one process's, so the reference stayed the initial
    policy (not the checkpoint's) and the optimizer and data order came back exactly."""
    out = tmp_path / "run"
    launch("dpo", run_file, out, 2, *OPTIMIZERS["sgd"], "--expert_parallel_size=2", "--max_steps=2", "--save_steps=2")
    launch("dpo", run_file, out, 2, *OPTIMIZERS["sgd"], "--expert_parallel_size=2", f"--resume_from_checkpoint={out / 'checkpoint-2'}")
    assert logged(out, "loss") == pytest.approx(logged(single, "loss"), abs=1e-5, rel=0)
    expected = weights(single)
    for key, tensor in weights(out).items():
        assert_close(tensor, expected[key], f"{key} after a resumed third step", rtol=1e-4)


def test_compile_layers_compiles_the_reference_too_and_keeps_the_loss(run_file, tmp_path):
    """The frozen reference's forward runs every step: under compile_layers its layers share the policy's compilation."""
    import datasets
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig

    from halo_core.methods.dpo import HaloDPOTrainer

    torch._dynamo.reset()
    data = datasets.Dataset.from_list(uneven_rows("preference")[:4])
    losses = {}
    for compiled in (False, True):
        torch.manual_seed(5)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY), dtype=torch.float32)
        args = DPOConfig(output_dir=str(tmp_path / str(compiled)), use_cpu=True, bf16=False, report_to="none", router_aux_loss_coef=0.0)
        trainer = HaloDPOTrainer(model=model, ref_model=copy.deepcopy(model), args=args, train_dataset=data,
                                 processing_class=AutoTokenizer.from_pretrained(TINY), compile_layers=compiled)
        layers = trainer.ref_model.model.layers
        assert all(hasattr(layer.forward, "__func__") and hasattr(layer.forward.__func__, "_torchdynamo_orig_callable") for layer in layers) == compiled
        batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
        losses[compiled] = trainer.compute_loss(trainer.model, batch).item()
    assert losses[True] == pytest.approx(losses[False], rel=1e-5)
