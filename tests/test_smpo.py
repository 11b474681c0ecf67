"""SMPO has no stock trainer: its loss against a direct implementation of the formula on hand-built
log-probs (margin schedule and floor included), the trainer's loss against the formula on a real
model's log-probs (every declared split against one process through `halo launch smpo`: tests/test_equivalence_matrix.py)."""

from __future__ import annotations

import math

import pytest
import torch

from halo_core.methods.smpo import LOSSES, margin_at, smpo_loss
from launch_kit import TINY

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)


def _direct(chosen: list[float], rejected: list[float], beta, margin, r, floor, kind) -> float:
    """The issue's formula, one pair at a time."""
    shape = {"smooth_lower_bound": lambda u: max(0.0, -u) ** 2, "hinge": lambda u: max(0.0, 1 - u),
             "sigmoid": lambda u: math.log1p(math.exp(-u)), "ipo": lambda u: u * u}[kind]
    terms = []
    for c, j in zip(chosen, rejected):
        z = c - max(j, floor) - margin
        terms.append(shape(beta * z) + r * -c + (1 - r) * -j)
    return sum(terms) / len(terms)


@pytest.mark.parametrize("kind", sorted(LOSSES))
def test_the_loss_is_the_formula_with_its_floor(kind):
    chosen = [-0.4, -1.9, -3.0, -0.2]
    rejected = [-0.9, -5.0, -1.0, -2.29]  # -5.0 sits below the floor: the margin term sees -2.3
    kwargs = dict(beta=1.2, margin=0.2, sft_ratio=0.8, min_log_prob=-2.3)
    loss, _ = smpo_loss(torch.tensor(chosen, dtype=torch.float64), torch.tensor(rejected, dtype=torch.float64), loss_type=kind, **kwargs)
    assert loss.item() == pytest.approx(_direct(chosen, rejected, 1.2, 0.2, 0.8, -2.3, kind), rel=1e-12)


def test_the_floor_stops_the_margin_term_only():
    """Below the floor, the rejected log-prob's gradient is the CE anchor's alone: -(1 - r) / n."""
    chosen = torch.tensor([-1.0], requires_grad=True)
    rejected = torch.tensor([-4.0], requires_grad=True)
    loss, _ = smpo_loss(chosen, rejected, beta=1.2, margin=0.35, sft_ratio=0.8, min_log_prob=-2.3)
    loss.backward()
    assert rejected.grad.item() == pytest.approx(-0.2)


def test_the_margin_ramps_linearly_over_the_run():
    assert [margin_at(s, 4, 0.1, 0.5) for s in range(6)] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0.5])


def test_the_trainer_computes_the_formula_on_the_models_log_probs(tmp_path):
    """One forward over chosen and rejected; means over each completion's own tokens, padding excluded."""
    import datasets
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from halo_core.methods.smpo import HaloSMPOTrainer, SMPOConfig

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY), dtype=torch.float32)
    rows = [{"prompt": "1 2", "chosen": " 3 4 5 6", "rejected": " 9"}, {"prompt": "7", "chosen": " 8", "rejected": " 0 0 0 0 0"}]
    args = SMPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", router_aux_loss_coef=0.0, initial_margin=0.1)
    trainer = HaloSMPOTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows), processing_class=AutoTokenizer.from_pretrained(TINY))
    assert trainer.ref_model is None  # reference-free: no second copy of the weights
    trainer.state.max_steps = 10
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    loss = trainer.compute_loss(trainer.model, batch)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
        token = torch.log_softmax(logits.double(), -1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
        mask = batch["completion_mask"][:, 1:].double()
        means = ((token * mask).sum(1) / mask.sum(1)).tolist()
    assert mask.sum(1).tolist() != [mask.sum(1)[0].item()] * 4  # the completions differ in length
    expected = _direct(means[:2], means[2:], 1.2, 0.1, 0.8, -2.3, "smooth_lower_bound")
    assert loss.item() == pytest.approx(expected, rel=1e-5)

